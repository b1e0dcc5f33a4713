// The ganc spec (ganc.json inside the archive): phases, inputs, optimizers, buffer policy.
#pragma once

#include "frontend/SpecSchema.h"
#include "support/Status.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ganc::frontend {

/// The spec schema version this build writes; it reads versions 1 and 2 (docs/spec.md).
/// Version 2 adds the training-step fields (precision, accumulate, clip_grad_norm,
/// loss_scalers, loss_scaler, sync_batch_norm, non_finite, zero); a version
/// 1 spec that uses one is refused, so an older ganc never silently ignores them.
constexpr int kSpecVersion = 2;

/// The dtype a phase's forward runs in under autocast (torch.autocast's rules); parameters
/// and optimizer state stay in their own dtype.
enum class Precision { Float32, BFloat16, Float16 };

/// The spec's name of a precision ("float32", "bfloat16", "float16").
const char *precisionName(Precision precision);
/// The precision a spec name means ("float32" for a name that is none: the spec's reader has
/// refused those).
Precision precisionOf(const std::string &name);

/// One input of a phase method, in argument order.
/// Where a phase input comes from.
enum class InputSource {
  Data,        ///< "data": the step's batch
  Labels,      ///< "labels": the batch's class labels
  Normal,      ///< "normal": standard normal noise of `shape`
  Uniform,     ///< "uniform": uniform [0, 1) noise of `shape` (gradient-penalty weights)
  Categorical, ///< "categorical": random class ids
  Fade,        ///< "fade": the current stage's fade-in weight, a 0-dim tensor in [0, 1]
  Output,      ///< "output": a tensor an earlier phase of the step computed
  Controller,  ///< "controller": a controller's value (ADA's p), a 0-dim tensor
};

/// The spec's name of a source, and the source of a name (nullopt for an unknown one).
const char *inputSourceName(InputSource source);
std::optional<InputSource> parseInputSource(const std::string &name);

/// The dtype of every phase input (the spec's "dtype").
enum class InputDtype { Float32, Float64, BFloat16, Float16 };

struct InputSpec {
  std::string name;
  InputSource source = InputSource::Data;
  /// Per-sample shape of the noise (the batch dimension is added at run time).
  std::vector<int64_t> shape;
  /// Number of classes of labels and categorical inputs.
  int64_t classes = 0;
  /// An `output` input: the phase that computes it and its name there ("output":
  /// "forward.fake" is producer "forward", value "fake").
  std::string producer, value;
  /// An `output` input taken detached (no gradient into what computed it; the default), or
  /// through its graph: this phase's backward continues into the section that computed it.
  bool detach = defaultOf<bool>("input", "detach");
  /// A `controller` input: the controller's name.
  std::string controller;
  /// A `data` input of a data set with fields (`data.fields`): the field it takes.
  std::string field;
  /// Whether the input is an integer tensor of class ids.
  bool isClassIds() const {
    return source == InputSource::Labels || source == InputSource::Categorical;
  }
  /// The step's batch or its labels (the inputs that make a phase read data).
  bool readsData() const { return source == InputSource::Data || source == InputSource::Labels; }
};

/// A named part of every sample (`data.fields`: pix2pix's "A" and "B"). The fields are kept
/// packed along their first (channel) dimension, in the spec's order: `offset` is where this
/// one starts there.
struct DataField {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
};

/// "A, B": the fields' names, for messages.
inline std::string fieldNames(const std::vector<DataField> &fields) {
  std::string names;
  for (const DataField &f : fields)
    names += (names.empty() ? "" : ", ") + f.name;
  return names;
}

/// One stage of a progressively grown GAN. In stage k every stage attribute holds k.
struct StageSpec {
  std::string name;
  /// Training steps spent in this stage; 0 for the last stage (it runs to the end).
  int64_t steps = 0;
  /// The fade-in weight is min(1, t / fadeSteps) at the stage's step t (1 when 0).
  int64_t fadeSteps = defaultOf<int64_t>("stage", "fade_steps");
  /// Submodule paths ("generator.blocks.2") the stage adds: the compiler checks that the
  /// stage uses them and that no earlier stage does.
  std::vector<std::string> grows;
};

/// Progressive growing: the int module attributes that select the stage, and the stages.
struct StagesSpec {
  /// Qualified attribute paths ("generator.stage").
  std::vector<std::string> attributes;
  std::vector<StageSpec> list;

  /// The stage training step `step` falls in, and the step at which that stage began.
  std::pair<size_t, int64_t> at(int64_t step) const;
  /// The fade-in weight at training step `step`.
  double fade(int64_t step) const;
};

struct PhaseSpec {
  std::string name;
  std::string method;
  std::vector<std::string> updates;
  int64_t interval = defaultOf<int64_t>("phase", "interval");
  std::vector<InputSpec> inputs;
  /// Micro-batches per step: gradients of the first k-1 are summed locally, the last one's
  /// backward all-reduces; each micro-batch's loss is divided by k (the mean).
  int64_t accumulate = defaultOf<int64_t>("phase", "accumulate");
  /// Autocast dtype of the phase's forward (the spec's phase or model-wide "precision").
  Precision precision = Precision::Float32;
  /// The dynamic loss scaler the phase's loss is scaled by ("" for none).
  std::string lossScaler;
  /// Tensors the method hands to later phases of the step, by name.
  std::vector<std::string> outputs;
  /// A section: a phase that trains nothing (no `updates`) and has no loss; its method
  /// returns the values `outputs` names, computed once per step for the phases after it.
  bool isSection() const { return updates.empty(); }
  /// The sections whose graph this phase's backward continues into (its `output` inputs
  /// taken with "detach": false), in input order.
  std::vector<std::string> throughSections() const;
};

/// A dynamic loss scaler, torch.amp.GradScaler's hyper-parameters; phases naming the same
/// scaler share it.
struct LossScalerSpec {
  double initScale = defaultOf<double>("scaler", "init_scale");
  double growthFactor = defaultOf<double>("scaler", "growth_factor");
  double backoffFactor = defaultOf<double>("scaler", "backoff_factor");
  int64_t growthInterval = defaultOf<int64_t>("scaler", "growth_interval");
};

/// torch.nn.utils.clip_grad_norm_ over a submodule's used, all-reduced gradients.
struct ClipSpec {
  double maxNorm = 0;
  /// The p of the p-norm; infinity for the max norm.
  double normType = defaultOf<double>("clip", "norm_type");
};

/// A learning-rate schedule: one of torch.optim.lr_scheduler's, stepped once per training
/// step. Fields unused by a type keep torch's defaults.
struct LrScheduleSpec {
  /// "constant" (ConstantLR), "linear" (LinearLR: warm-up), "step" (StepLR), "cosine"
  /// (CosineAnnealingLR), "exponential" (ExponentialLR).
  std::string type;
  double factor = defaultOf<double>("schedule", "factor");            // constant
  double startFactor = defaultOf<double>("schedule", "start_factor"); // linear
  double endFactor = defaultOf<double>("schedule", "end_factor");     // linear
  int64_t totalIters = defaultOf<int64_t>("schedule", "total_iters"); // constant, linear
  int64_t stepSize = 0;                                               // step
  double gamma = defaultOf<double>("schedule", "gamma");              // step, exponential
  int64_t tMax = 0;                                                   // cosine
  double etaMin = defaultOf<double>("schedule", "eta_min");           // cosine
};

/// torch.optim hyper-parameters of one submodule's optimizer.
/// One optimizer group: the parameters it steps and torch.optim's hyper-parameters for them.
struct OptimizerSpec {
  /// Paths of the submodules and parameters it steps ("params"; by default its own key).
  std::vector<std::string> params;
  std::string type; // adam, adamw, sgd, rmsprop
  double lr = 2e-4;
  double beta1 = defaultOf<std::vector<double>>("optimizer", "betas")[0];
  double beta2 = defaultOf<std::vector<double>>("optimizer", "betas")[1];
  double eps = defaultOf<double>("optimizer", "eps");
  double weightDecay = 0.0;
  double momentum = defaultOf<double>("optimizer", "momentum");
  bool amsgrad = defaultOf<bool>("optimizer", "amsgrad");         // adam, adamw
  bool nesterov = defaultOf<bool>("optimizer", "nesterov");       // sgd
  double dampening = defaultOf<double>("optimizer", "dampening"); // sgd
  double alpha = defaultOf<double>("optimizer", "alpha");         // rmsprop
  bool centered = defaultOf<bool>("optimizer", "centered");       // rmsprop
  /// After each step, the parameters stepped clamped to [-c, c] ("clamp_weights").
  std::optional<double> clampWeights;
  /// Whether it takes betas (Adam and AdamW).
  bool hasBetas() const { return type == "adam" || type == "adamw"; }
  /// Clip the gradients this optimizer steps over (before it steps).
  std::optional<ClipSpec> clip;
  /// The learning rate's schedule ("lr_schedule"); none: lr stays as it is.
  std::optional<LrScheduleSpec> schedule;
};

/// What the sample grid draws: a submodule's forward on fixed noise, or a method of the GAN on
/// the inputs it names.
struct SampleSpec {
  std::string submodule;
  std::vector<int64_t> noiseShape;
  /// > 0: a class-conditional submodule, called with (z, labels), labels cycling 0..classes-1.
  int64_t classes = 0;
  /// Instead: a method of the GAN ("sample_rows") called with `inputs` (fixed noise, class ids
  /// cycling through the classes, the data set's first samples and their labels); it returns
  /// images, or a tuple of image batches that the grid shows side by side, a row per sample.
  std::string method;
  std::vector<InputSpec> inputs;
  /// Run in training mode (pix2pix draws with dropout on), its buffers restored afterwards;
  /// false: eval mode.
  bool train = false;
};

/// A value adjusted during training from what a phase logs and fed to phases as an input:
/// StyleGAN2-ADA's augmentation probability (type "ada"). Every `interval` steps, with the
/// mean m of the phases' logged `statistic` (each run's value weighed alike) since the last
/// adjustment over every rank,
/// p = max(0, p + sign(m - target) * images / (speedKimg * 1000)), images being the
/// interval's images over every rank.
struct ControllerSpec {
  std::string type = defaultOf<std::string>("controller", "type");
  /// The phases whose logged statistic it reads (the spec's `phase`, or its `phases`).
  std::vector<std::string> phases;
  std::string statistic;
  double target = defaultOf<double>("controller", "target");
  int64_t interval = defaultOf<int64_t>("controller", "interval");
  double speedKimg = defaultOf<double>("controller", "speed_kimg");
  double initial = defaultOf<double>("controller", "initial");
};

/// An exponential moving average of a trained submodule, kept in a frozen copy of it.
struct EmaSpec {
  std::string submodule; // the trained one, e.g. "generator"
  std::string copy;      // its copy in the archive, e.g. "generator_ema"
  /// beta = 0.5 ** (images per step / halfLifeImages) (StyleGAN2's ema_kimg), or a fixed
  /// beta when halfLifeImages is 0.
  double halfLifeImages = defaultOf<double>("ema", "half_life_images");
  /// StyleGAN2-ADA's ema_rampup: the half-life is at most rampup * the images trained so far
  /// (0: none).
  double rampup = defaultOf<double>("ema", "rampup");
  double beta = defaultOf<double>("ema", "beta");
};

struct Spec {
  int version = kSpecVersion;
  std::string name;
  int64_t batchSize = 0; // per rank
  /// One sample's shape; with `dataFields`, theirs packed along the first dimension.
  std::vector<int64_t> dataShape;
  /// The named parts of a sample (`data.fields`); empty: a sample is one tensor.
  std::vector<DataField> dataFields;
  /// How an image of a folder or zip holds the fields: "side_by_side" (left to right, as
  /// pix2pix's A|B images), or empty (an image is a sample).
  std::string dataLayout;
  /// The field `name` of `dataFields` (null when there is none of that name).
  const DataField *dataField(const std::string &name) const {
    for (const DataField &f : dataFields)
      if (f.name == name)
        return &f;
    return nullptr;
  }
  /// The per-sample shape of a `data` input: its field's, or the whole sample's.
  const std::vector<int64_t> &sampleShape(const InputSpec &input) const {
    const DataField *f = input.field.empty() ? nullptr : dataField(input.field);
    return f ? f->shape : dataShape;
  }
  /// Classes of the dataset's labels (0: unlabelled).
  int64_t dataClasses = defaultOf<int64_t>("data", "classes");
  /// The data set doubled with every image mirrored left to right (StyleGAN's --mirror).
  bool dataXflip = defaultOf<bool>("data", "xflip");
  /// dtype of every phase input, data and noise alike: float32 (default), float64,
  /// bfloat16 or float16; it must match the model's parameters.
  InputDtype inputDtype = InputDtype::Float32;
  /// Model-wide autocast dtype (a phase's own "precision" overrides it).
  Precision precision = precisionOf(defaultOf<std::string>("spec", "precision"));
  /// Dynamic loss scalers by name ("loss_scalers").
  std::map<std::string, LossScalerSpec> lossScalers;
  /// Submodules whose batch norms use statistics over every rank's batch ("sync_batch_norm").
  std::vector<std::string> syncBatchNorm;
  /// What a non-finite loss or gradient does in a phase without a loss scaler ("non_finite"):
  /// "stop" training, or "skip" the optimizer step (counted), as a loss scaler would.
  std::string nonFinite = defaultOf<std::string>("spec", "non_finite");
  /// Sharded optimizer state ("zero"): 0 off, 1 (optimizer state sharded across ranks) or 2
  /// (gradients reduce-scattered as well).
  int zero = defaultOf<int>("spec", "zero");
  std::vector<PhaseSpec> phases;
  /// Optimizer groups by name. loadArchive adds a default (Adam) group for every `updates`
  /// path whose parameters no declared group steps.
  std::map<std::string, OptimizerSpec> optimizers;
  /// "broadcast" (rank 0's buffers before every phase, like DDP) or "local".
  std::string buffers = defaultOf<std::string>("spec", "buffers");
  std::optional<SampleSpec> sample;
  std::optional<EmaSpec> ema;
  std::optional<StagesSpec> stages;
  /// Controllers by name ("controllers").
  std::map<std::string, ControllerSpec> controllers;
  /// The JSON text as stored in the archive.
  std::string text;

  /// The phase named `name`, or null.
  const PhaseSpec *findPhase(const std::string &name) const;
  /// Every path some phase updates, sorted.
  std::vector<std::string> updatedPaths() const;
};

/// Parses and validates spec JSON; errors name the field ("phase 'd': interval must be ...").
Expected<Spec> parseSpec(const std::string &json);

} // namespace ganc::frontend
