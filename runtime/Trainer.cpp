// One rank's training loop.
#include "runtime/Trainer.h"

#include "backend/Device.h"
#include "backend/Executor.h"
#ifdef GANC_WITH_CUDA
#include "backend/cuda/CudaGraphExecutor.h"
#endif
#include "frontend/Frontend.h"
#include "runtime/Data.h"
#include "runtime/Distributed.h"
#include "runtime/Image.h"
#include "runtime/Optimizer.h"

#include <torch/serialize.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace ganc::runtime {

namespace fs = std::filesystem;

namespace {

std::string firstLine(const std::exception &e) {
  const c10::Error *ce = dynamic_cast<const c10::Error *>(&e);
  std::string s = ce ? ce->msg() : e.what();
  return s.substr(0, s.find('\n'));
}

Status writeFileAtomically(const std::string &path, const std::vector<char> &bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out.flush())
      return Status::error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::error("cannot rename " + tmp + " to " + path);
  return Status::ok();
}

Expected<std::vector<char>> readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(path + ": cannot open");
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class Trainer {
public:
  explicit Trainer(const TrainOptions &options) : o_(options) {}

  Status run(bool &started) {
    auto rank = rankFromEnvironment();
    if (!rank)
      return rank.status();
    rank_ = *rank;
    GANC_TRY(setUp());
    started = true;
    return loop();
  }

private:
  std::string where() const { return "rank " + std::to_string(rank_.rank); }

  Status setUp() {
    int threads = o_.threads;
    if (threads <= 0) {
      int local = rank_.worldSize;
      if (const char *l = std::getenv("LOCAL_WORLD_SIZE"))
        local = std::max(1, std::atoi(l));
      threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / local);
    }
    torch::set_num_threads(threads);

    auto planText = readFile(o_.plan);
    if (!planText)
      return planText.status();
    auto plan = ir::parse(std::string(planText->begin(), planText->end()));
    if (!plan)
      return plan.status().withContext(o_.plan + ": not a ganc plan");
    plan_ = plan.take();
    GANC_TRY(ir::verify(*plan_).withContext(o_.plan + ": invalid plan"));
    auto archive = frontend::loadArchive(o_.model);
    if (!archive)
      return archive.status();
    archive_ = std::make_unique<frontend::Archive>(archive.take());
    if (archive_->identity != plan_->identity)
      return Status::error(o_.plan + " was compiled from another model (identity " +
                           plan_->identity + "), not " + o_.model + " (identity " +
                           archive_->identity + "); run ganc compile " + o_.model + " again");
    const frontend::Spec &spec = archive_->spec;
    GANC_TRY(setUpDevice());
    backend::ExecutorOptions options;
    options.device = device_;
    options.broadcastBuffers = spec.buffers == "broadcast";
    if (spec.stages) {
      // Every stage's phases are specialised now; switching stage later only picks them.
      for (size_t s = 0; s < spec.stages->list.size(); ++s)
        for (const frontend::PhaseSpec &phase : spec.phases) {
          auto graph = frontend::stageGraph(*archive_, phase, s);
          if (!graph)
            return graph.status();
          options.stageGraphs[ir::phaseKey(phase.name, spec.stages->list[s].name)] = graph.take();
        }
      fade_ = torch::ones({}, at::TensorOptions(device_).dtype(frontend::inputScalarType(spec)));
    }
    if (device_.is_cuda()) {
#ifdef GANC_WITH_CUDA
      backend::CudaOptions cuda;
      cuda.useGraphs = o_.cudaGraphs;
      cuda.warmupIterations = o_.warmup;
      auto executor = backend::CudaGraphExecutor::create(*plan_, archive_->module, group_.backend,
                                                         options, cuda);
      if (!executor)
        return executor.status().withContext(o_.plan);
      eager_ = &(*executor)->eager();
      executor_ = executor.take();
#endif
    } else {
      auto executor =
          backend::EagerExecutor::create(*plan_, archive_->module, group_.backend, options);
      if (!executor)
        return executor.status().withContext(o_.plan);
      eager_ = executor->get();
      executor_ = executor.take();
    }
    eager_->broadcastState();

    for (const auto &[sub, optSpec] : spec.optimizers)
      optimizers_.emplace(sub, Optimizer(optSpec, device_));
    for (const auto &phase : plan_->phases)
      for (const std::string &name : phase->used)
        ownerOf_[name] = plan_->findParameter(name)->owner;

    bool needsData = false;
    for (const frontend::PhaseSpec &p : spec.phases)
      for (const frontend::InputSpec &in : p.inputs)
        needsData |= in.source == "data" || in.source == "labels";
    if (needsData) {
      if (o_.data.empty())
        return Status::error("the spec's phases read data: give --data PATH (a torch.save "
                             "tensor file or a folder of images)");
      auto data = loadDataset(o_.data, spec.dataShape);
      if (!data)
        return data.status();
      data_ = data->samples.to(frontend::inputScalarType(spec));
      labels_ = data->labels;
      bool needsLabels = false;
      for (const frontend::PhaseSpec &p : spec.phases)
        for (const frontend::InputSpec &in : p.inputs)
          needsLabels |= in.source == "labels";
      if (needsLabels && !labels_.defined())
        return Status::error("--data " + o_.data +
                             ": the spec's phases read labels, and the data "
                             "has none (save {'images': ..., 'labels': ...})");
      if (needsLabels) {
        int64_t top = labels_.max().item<int64_t>(), bottom = labels_.min().item<int64_t>();
        if (bottom < 0 || top >= spec.dataClasses)
          return Status::error("--data " + o_.data + ": labels span " + std::to_string(bottom) +
                               ".." + std::to_string(top) + ", the spec declares " +
                               std::to_string(spec.dataClasses) + " classes");
        labelBatch_ = std::make_unique<backend::StagedBatch>(std::vector<int64_t>{spec.batchSize},
                                                             torch::kLong, device_);
      }
      batches_ = std::make_unique<ShardedBatches>(data_.size(0), rank_.rank, rank_.worldSize,
                                                  spec.batchSize, o_.seed);
      if (batches_->batchesPerEpoch() == 0)
        return Status::error("--data " + o_.data + ": " + std::to_string(data_.size(0)) +
                             " samples are too few for " + std::to_string(rank_.worldSize) +
                             " ranks of batch " + std::to_string(spec.batchSize));
      std::vector<int64_t> shape = {spec.batchSize};
      shape.insert(shape.end(), spec.dataShape.begin(), spec.dataShape.end());
      batch_ = std::make_unique<backend::StagedBatch>(shape, data_.scalar_type(), device_,
                                                      channelsLast_);
    }
    inputType_ = frontend::inputScalarType(spec);
    noise_ = backend::noiseGenerator(device_, o_.seed + static_cast<uint64_t>(rank_.rank));
    if (rank_.rank == 0) {
      std::error_code ec;
      fs::create_directories(o_.outDir, ec);
      if (ec)
        return Status::error("--out " + o_.outDir + ": " + ec.message());
      if (!o_.dumpDir.empty())
        fs::create_directories(o_.dumpDir, ec);
    }
    if (spec.ema) {
      const frontend::EmaSpec &ema = *spec.ema;
      emaBeta_ = ema.halfLifeImages > 0
                     ? std::pow(0.5, static_cast<double>(spec.batchSize * rank_.worldSize) /
                                         ema.halfLifeImages)
                     : ema.beta;
      auto trained = archive_->module.attr(ema.submodule).toModule();
      auto average = archive_->module.attr(ema.copy).toModule();
      auto tp = trained.named_parameters(), ap = average.named_parameters();
      for (auto a = ap.begin(), t = tp.begin(); a != ap.end(); ++a, ++t) {
        emaAverages_.push_back((*a).value);
        emaTrained_.push_back((*t).value);
      }
      auto tb = trained.named_buffers(), ab = average.named_buffers();
      for (auto a = ab.begin(), t = tb.begin(); a != ab.end() && t != tb.end(); ++a, ++t) {
        emaBufferAverages_.push_back((*a).value);
        emaBufferTrained_.push_back((*t).value);
      }
    }
    if (!o_.resume.empty())
      GANC_TRY(resume());
    return Status::ok();
  }

  /// CPU ranks use Gloo; GPU ranks NCCL, one GPU each (cuda:LOCAL_RANK), the model moved
  /// there before the executor binds its parameters.
  Status setUpDevice() {
    std::chrono::seconds timeout(o_.timeoutSeconds);
    if (o_.device == "cpu") {
      device_ = c10::kCPU;
      if (o_.memoryFormat == "channels_last")
        channelsLast_ = backend::toChannelsLast(archive_->module);
      auto group = createGlooGroup(rank_, timeout);
      if (!group)
        return group.status();
      group_ = *group;
      return Status::ok();
    }
    if (o_.device != "cuda")
      return Status::error("--device takes cpu or cuda, not '" + o_.device + "'");
#ifdef GANC_WITH_CUDA
    if (!backend::cudaAvailable())
      return Status::error("--device cuda: no GPU is visible to this process");
    if (rank_.localRank >= static_cast<int>(torch::cuda::device_count()))
      return Status::error("--device cuda: LOCAL_RANK " + std::to_string(rank_.localRank) +
                           " has no GPU (" + std::to_string(torch::cuda::device_count()) +
                           " visible)");
    device_ = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank_.localRank));
    // cuBLAS is deterministic on one stream only with a fixed workspace; it reads this
    // before its first handle is made, so it is set before anything runs on the GPU.
    if (o_.deterministic)
      setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicCuDNN(o_.deterministic);
    at::globalContext().setBenchmarkCuDNN(o_.cudnnBenchmark && !o_.deterministic);
    if (o_.deterministic)
      at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
    archive_->module.to(device_);
    if (o_.memoryFormat != "contiguous")
      channelsLast_ = backend::toChannelsLast(archive_->module);
    auto group = createNcclGroup(rank_, timeout);
    if (!group)
      return group.status();
    group_ = *group;
    return Status::ok();
#else
    return Status::error("--device cuda: this ganc was built without the CUDA backend");
#endif
  }

  std::vector<at::Tensor> inputsFor(const frontend::PhaseSpec &phase) {
    std::vector<at::Tensor> inputs;
    for (const frontend::InputSpec &in : phase.inputs) {
      if (in.source == "data") {
        inputs.push_back(batch_->tensor());
      } else if (in.source == "fade") {
        inputs.push_back(fade_); // set before the phase runs, outside any capture
      } else if (in.source == "labels") {
        inputs.push_back(labelBatch_->tensor());
      } else if (in.source == "categorical") {
        inputs.push_back(torch::randint(in.classes, {archive_->spec.batchSize}, noise_,
                                        at::TensorOptions(device_).dtype(torch::kLong)));
      } else {
        // Drawn in float32 and cast, like the eager reference; on CUDA this runs inside the
        // captured graph and every replay draws anew.
        std::vector<int64_t> shape = {archive_->spec.batchSize};
        shape.insert(shape.end(), in.shape.begin(), in.shape.end());
        at::TensorOptions options(device_);
        inputs.push_back((in.source == "uniform" ? torch::rand(shape, noise_, options)
                                                 : torch::randn(shape, noise_, options))
                             .to(inputType_));
      }
    }
    return inputs;
  }

  /// Rank 0 writes the phase's all-reduced gradients (still in the buckets after the step:
  /// the optimizer only reads them). Outside the executor, so it is never captured.
  Status dumpGradients(int64_t step, const std::string &key, const std::string &phase) {
    const backend::PhaseReducer &reducer = executor_->reducer(key);
    c10::Dict<std::string, at::Tensor> grads;
    for (size_t i = 0; i < reducer.usedNames().size(); ++i)
      grads.insert(reducer.usedNames()[i], reducer.gradient(i).cpu().clone());
    return writeFileAtomically(o_.dumpDir + "/grads_step" + std::to_string(step) + "_" + phase +
                                   ".pt",
                               torch::pickle_save(grads));
  }

  /// After every step: the average copy moves toward the trained submodule (StyleGAN2's
  /// p_ema = p.lerp(p_ema, beta)); its buffers are copied. Every rank does it identically.
  void updateEma() {
    if (emaAverages_.empty())
      return;
    torch::NoGradGuard noGrad;
    // Multi-tensor kernels: a handful of launches for the whole copy, not two per tensor.
    at::_foreach_copy_(emaAverages_, at::_foreach_lerp(emaTrained_, emaAverages_, emaBeta_));
    if (!emaBufferAverages_.empty())
      at::_foreach_copy_(emaBufferAverages_, emaBufferTrained_);
  }

  /// Rank 0's inputs of a phase (CPU only: on CUDA the inputs are made inside the capture).
  void dumpInputs(int64_t step, const frontend::PhaseSpec &phase,
                  const std::vector<at::Tensor> &inputs) {
    c10::Dict<std::string, at::Tensor> named;
    for (size_t i = 0; i < inputs.size(); ++i)
      named.insert(phase.inputs[i].name, inputs[i].clone());
    writeFileAtomically(o_.dumpDir + "/inputs_step" + std::to_string(step) + "_" + phase.name +
                            ".pt",
                        torch::pickle_save(named));
  }

  /// For a progressive GAN: switches to the stage `step` falls in (its plans were all built
  /// at start-up) and sets the fade-in weight. Returns the stage's name ("" without stages).
  std::string enterStage(int64_t step) {
    const auto &stages = archive_->spec.stages;
    if (!stages)
      return "";
    auto [index, begin] = stages->at(step);
    const frontend::StageSpec &stage = stages->list[index];
    if (index != stage_) {
      stage_ = index;
      frontend::setStageAttributes(archive_->module, *stages, index);
      if (rank_.rank == 0)
        std::cout << "stage " << stage.name << " from step " << step
                  << (stage.fadeSteps
                          ? ", fading in over " + std::to_string(stage.fadeSteps) + " steps"
                          : std::string())
                  << std::endl;
    }
    torch::NoGradGuard noGrad;
    fade_.fill_(stages->fade(step));
    return stage.name;
  }

  void optimizerStep(const backend::PhaseReducer &reducer) {
    std::map<std::string, std::pair<std::vector<std::string>, std::vector<at::Tensor>>> byOwner;
    for (size_t i = 0; i < reducer.usedNames().size(); ++i) {
      auto &entry = byOwner[ownerOf_.at(reducer.usedNames()[i])];
      entry.first.push_back(reducer.usedNames()[i]);
      entry.second.push_back(reducer.usedParameters()[i]);
    }
    for (auto &[owner, params] : byOwner)
      optimizers_.at(owner).step(params.first, params.second);
  }

  Status loop() {
    const frontend::Spec &spec = archive_->spec;
    auto start = std::chrono::steady_clock::now();
    int64_t imagesSinceLog = 0;
    auto lastLog = start;
    std::map<std::string, double> lastLoss;
    std::ofstream history;
    if (rank_.rank == 0) {
      std::string path = o_.outDir + "/loss_history.csv";
      bool fresh = o_.resume.empty() || !fs::exists(path);
      history.open(path, fresh ? std::ios::trunc : std::ios::app);
      if (fresh)
        history << "step,phase,loss\n";
    }
    std::vector<double> stepSeconds, workSeconds, runHostSeconds, replayHostSeconds,
        replayLaunchSeconds;
    backend::PhaseTimer timer(device_);
    struct PendingLoss {
      int64_t step;
      std::string phase;
      at::Tensor loss;
    };
    std::vector<PendingLoss> pendingLosses;
    for (int64_t step = step_; step < o_.steps; ++step) {
      auto stepStart = std::chrono::steady_clock::now();
      double work = 0;
      bool staged = false;
      std::string stage = enterStage(step);
      for (const frontend::PhaseSpec &phase : spec.phases) {
        if (step % phase.interval != 0)
          continue;
        const std::string key = ir::phaseKey(phase.name, stage);
        bool wantsData = false;
        for (const auto &in : phase.inputs)
          wantsData |= in.source == "data" || in.source == "labels";
        if (wantsData && !staged) {
          at::Tensor indices = batches_->next();
          batch_->stage(data_.index_select(0, indices));
          if (labelBatch_)
            labelBatch_->stage(labels_.index_select(0, indices));
          staged = true;
          imagesSinceLog += spec.batchSize * rank_.worldSize;
        }
        at::Tensor loss;
        auto runStart = std::chrono::steady_clock::now();
        timer.begin();
        try {
          loss = executor_->run(
              key,
              [&] {
                std::vector<at::Tensor> inputs = inputsFor(phase);
                if (!o_.dumpDir.empty() && rank_.rank == 0 && !device_.is_cuda())
                  dumpInputs(step, phase, inputs);
                return inputs;
              },
              [&](const std::string &name, const backend::PhaseReducer &r) {
                auto t = std::chrono::steady_clock::now();
                optimizerStep(r);
                work += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
              });
          double host =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - runStart).count();
          timer.end(static_cast<size_t>(step - step_));
          work += executor_->lastWorkSeconds();
          runHostSeconds.push_back(host);
          if (executor_->lastRun().replayed) {
            replayHostSeconds.push_back(host);
            replayLaunchSeconds.push_back(executor_->lastRun().launchSeconds);
          }
        } catch (const std::exception &e) {
          return Status::error(where() + ": phase '" + phase.name + "', step " +
                               std::to_string(step) + ": " + firstLine(e));
        }
        if (!o_.dumpDir.empty() && rank_.rank == 0)
          GANC_TRY(dumpGradients(step, key, phase.name));
        // Losses stay on the device until a progress line needs them: reading one per
        // phase would make the host wait for the GPU every step.
        pendingLosses.push_back({step, phase.name, loss.clone()});
      }
      updateEma();
      stepSeconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - stepStart).count());
      workSeconds.push_back(work);
      int64_t done = step + 1;
      if (done % o_.logEvery == 0 || done == o_.steps) {
        for (const PendingLoss &p : pendingLosses) {
          lastLoss[p.phase] = p.loss.item<double>();
          if (history.is_open())
            history << p.step << "," << p.phase << "," << lastLoss[p.phase] << "\n";
        }
        pendingLosses.clear();
      }
      if (rank_.rank == 0 && (done % o_.logEvery == 0 || done == o_.steps)) {
        auto now = std::chrono::steady_clock::now();
        double seconds = std::chrono::duration<double>(now - lastLog).count();
        std::ostringstream line;
        line << "step " << done << "/" << o_.steps;
        for (const auto &[name, value] : lastLoss) {
          char buffer[64];
          std::snprintf(buffer, sizeof(buffer), "  %s %.4f", name.c_str(), value);
          line << buffer;
        }
        char rate[64];
        std::snprintf(rate, sizeof(rate), "  %.1f img/s",
                      seconds > 0 ? imagesSinceLog / seconds : 0.0);
        std::cout << line.str() << rate << std::endl;
        history.flush();
        imagesSinceLog = 0;
        lastLog = now;
      }
      bool last = done == o_.steps;
      if (o_.sampleEvery > 0 && (done % o_.sampleEvery == 0 || last))
        GANC_TRY(writeSamples(done, last));
      if (o_.checkpointEvery > 0 && (done % o_.checkpointEvery == 0 || last))
        GANC_TRY(writeCheckpoint(done));
    }
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timer.onDevice()) {
      // On the GPU the work is the phases' device time; the host only launched it.
      timer.collect(/*wait=*/true);
      workSeconds = timer.secondsPerStep();
      workSeconds.resize(stepSeconds.size(), 0.0);
    }
    if (rank_.rank == 0)
      GANC_TRY(writeTiming(stepSeconds, workSeconds, runHostSeconds, replayHostSeconds,
                           replayLaunchSeconds, wall));
    if (!o_.dumpDir.empty() && rank_.rank == 0) {
      c10::Dict<std::string, at::Tensor> params;
      for (const auto &[name, p] : eager_->parameters())
        params.insert(name, p.detach().cpu().clone());
      for (const auto &b : archive_->module.named_buffers(true))
        params.insert(b.name, b.value.detach().cpu().clone());
      GANC_TRY(writeFileAtomically(o_.dumpDir + "/params_final.pt", torch::pickle_save(params)));
    }
    return Status::ok();
  }

  /// Per step: wall time, the work (CPU: host time in the model's forward and backward,
  /// all-reduce waits and the optimizer; CUDA: the GPU time of the step's phases, read from
  /// events) and the rest, which is ganc's own overhead (on CUDA, the time the GPU waited
  /// for the host). Per phase run: host time; per replay: what it cost the CPU, and the part
  /// of that inside PyTorch's graph launch.
  Status writeTiming(const std::vector<double> &steps, const std::vector<double> &work,
                     const std::vector<double> &runHost, const std::vector<double> &replayHost,
                     const std::vector<double> &replayLaunch, double wall) {
    auto list = [](std::ostream &out, const std::vector<double> &v) {
      out << "[";
      for (size_t i = 0; i < v.size(); ++i)
        out << (i ? ", " : "") << v[i];
      out << "]";
    };
    std::vector<double> overhead;
    for (size_t i = 0; i < steps.size(); ++i)
      overhead.push_back(std::max(0.0, steps[i] - work[i]));
    std::ofstream out(o_.outDir + "/timing.json");
    out << "{\"device\": \"" << (device_.is_cuda() ? "cuda" : "cpu") << "\", \"step_seconds\": ";
    list(out, steps);
    out << ", \"work_seconds\": ";
    list(out, work);
    out << ", \"overhead_seconds\": ";
    list(out, overhead);
    out << ", \"run_host_seconds\": ";
    list(out, runHost);
    out << ", \"replay_host_seconds\": ";
    list(out, replayHost);
    out << ", \"replay_launch_seconds\": ";
    list(out, replayLaunch);
    out << ", \"wall_seconds\": " << wall << "}\n";
    return out ? Status::ok() : Status::error("cannot write " + o_.outDir + "/timing.json");
  }

  Status writeSamples(int64_t step, bool last) {
    const auto &sample = archive_->spec.sample;
    if (!sample || rank_.rank != 0)
      return Status::ok();
    auto fixed = at::detail::createCPUGenerator(1234);
    std::vector<int64_t> shape = {o_.samples};
    shape.insert(shape.end(), sample->noiseShape.begin(), sample->noiseShape.end());
    at::Tensor z = torch::randn(shape, fixed).to(inputType_).to(device_);
    // Sample in eval mode so that BatchNorm statistics are not touched by sampling.
    torch::jit::Module generator = archive_->module.attr(sample->submodule).toModule();
    at::Tensor images;
    {
      torch::NoGradGuard noGrad;
      generator.eval();
      std::vector<c10::IValue> args{z};
      if (sample->classes > 0)
        args.emplace_back(
            torch::arange(o_.samples, torch::kLong).remainder(sample->classes).to(device_));
      images = generator.forward(args).toTensor();
      generator.train();
    }
    std::string path = o_.outDir + "/samples_step" + std::to_string(step) + ".png";
    GANC_TRY(writeSampleGrid(images, path));
    GANC_TRY(writeSampleGrid(images, o_.outDir + "/samples.png"));
    if (last)
      std::cout << "samples: " << fs::absolute(o_.outDir + "/samples.png").string() << std::endl;
    return Status::ok();
  }

  /// All ranks take part (their noise generator states are gathered); rank 0 writes.
  Status writeCheckpoint(int64_t step) {
    // NCCL gathers device tensors only: the byte state travels through the device.
    at::Tensor state = noise_.get_state().to(device_);
    std::vector<std::vector<at::Tensor>> gathered(1);
    for (int r = 0; r < rank_.worldSize; ++r)
      gathered[0].push_back(torch::empty_like(state));
    std::vector<at::Tensor> input{state};
    group_.backend->allgather(gathered, input)->wait();
    for (at::Tensor &t : gathered[0])
      t = t.cpu();
    if (rank_.rank != 0)
      return Status::ok();
    c10::impl::GenericDict ckpt = makeDict();
    ckpt.insert("format", std::string("ganc-checkpoint"));
    ckpt.insert("version", int64_t{1});
    ckpt.insert("step", step);
    ckpt.insert("identity", plan_->identity);
    ckpt.insert("spec", archive_->spec.text);
    std::map<std::string, c10::Dict<std::string, at::Tensor>> stateDicts;
    auto add = [&](const std::string &name, const at::Tensor &t) {
      size_t dot = name.find('.');
      std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
      std::string rest = dot == std::string::npos ? name : name.substr(dot + 1);
      stateDicts[owner.empty() ? "model" : owner].insert(rest, t.detach().cpu().clone());
    };
    for (const auto &p : archive_->module.named_parameters(true))
      add(p.name, p.value);
    for (const auto &b : archive_->module.named_buffers(true))
      add(b.name, b.value);
    for (auto &[owner, dict] : stateDicts)
      ckpt.insert(owner, dict);
    c10::impl::GenericDict optimizers = makeDict();
    for (const auto &[sub, opt] : optimizers_)
      optimizers.insert(sub, opt.stateDict());
    ckpt.insert("optimizers", optimizers);
    c10::impl::GenericDict rng = makeDict();
    rng.insert("noise", c10::List<at::Tensor>(gathered[0]));
    rng.insert("world_size", int64_t{rank_.worldSize});
    rng.insert("seed", static_cast<int64_t>(o_.seed));
    if (batches_) {
      rng.insert("data_epoch", batches_->epoch());
      rng.insert("data_cursor", batches_->cursor());
    }
    ckpt.insert("rng", rng);
    return writeFileAtomically(o_.outDir + "/checkpoint.pt", torch::pickle_save(ckpt));
  }

  Status resume() {
    auto bytes = readFile(o_.resume);
    if (!bytes)
      return bytes.status().withContext("--resume");
    c10::impl::GenericDict ckpt = makeDict();
    try {
      ckpt = torch::pickle_load(*bytes).toGenericDict();
    } catch (const std::exception &e) {
      return Status::error("--resume " + o_.resume + ": not a ganc checkpoint (" + firstLine(e) +
                           ")");
    }
    if (!ckpt.contains("format") || ckpt.at("format").toStringRef() != "ganc-checkpoint")
      return Status::error("--resume " + o_.resume + ": not a ganc checkpoint");
    if (ckpt.at("identity").toStringRef() != plan_->identity)
      return Status::error("--resume " + o_.resume + ": written for another model");
    auto rng = ckpt.at("rng").toGenericDict();
    if (rng.at("world_size").toInt() != rank_.worldSize)
      return Status::error("--resume " + o_.resume + ": written by " +
                           std::to_string(rng.at("world_size").toInt()) + " ranks, resuming on " +
                           std::to_string(rank_.worldSize) + " would change the noise streams");
    torch::NoGradGuard noGrad;
    auto restore = [&](const std::string &name, at::Tensor t) {
      size_t dot = name.find('.');
      std::string owner = dot == std::string::npos ? "model" : name.substr(0, dot);
      std::string rest = dot == std::string::npos ? name : name.substr(dot + 1);
      t.copy_(ckpt.at(owner).toGenericDict().at(rest).toTensor());
    };
    for (const auto &p : archive_->module.named_parameters(true))
      restore(p.name, p.value);
    for (const auto &b : archive_->module.named_buffers(true))
      restore(b.name, b.value);
    auto optimizers = ckpt.at("optimizers").toGenericDict();
    for (auto &[sub, opt] : optimizers_) {
      opt.loadStateDict(optimizers.at(sub).toGenericDict());
    }
    noise_.set_state(rng.at("noise").toTensorList().get(rank_.rank));
    if (batches_ && rng.contains("data_epoch"))
      batches_->seek(rng.at("data_epoch").toInt(), rng.at("data_cursor").toInt());
    step_ = ckpt.at("step").toInt();
    if (rank_.rank == 0)
      std::cout << "resumed from " << o_.resume << " at step " << step_ << std::endl;
    return Status::ok();
  }

  TrainOptions o_;
  RankInfo rank_;
  std::unique_ptr<ir::Module> plan_;
  std::unique_ptr<frontend::Archive> archive_;
  ProcessGroup group_;
  c10::Device device_ = c10::kCPU;
  /// 4-D parameters, buffers and the data batch are NHWC (--memory-format).
  bool channelsLast_ = false;
  std::unique_ptr<backend::PhaseExecutor> executor_;
  backend::EagerExecutor *eager_ = nullptr;
  std::unique_ptr<backend::StagedBatch> batch_, labelBatch_;
  at::Tensor labels_;
  std::map<std::string, Optimizer> optimizers_;
  std::map<std::string, std::string> ownerOf_;
  at::Tensor data_;
  std::unique_ptr<ShardedBatches> batches_;
  at::Generator noise_;
  c10::ScalarType inputType_ = c10::kFloat;
  int64_t step_ = 0;
  /// The current stage (a progressive GAN's), and the fade-in weight its phases read.
  size_t stage_ = static_cast<size_t>(-1);
  at::Tensor fade_;
  double emaBeta_ = 0;
  /// The EMA copy's parameters and buffers, and the trained submodule's, in the same order.
  std::vector<at::Tensor> emaAverages_, emaTrained_, emaBufferAverages_, emaBufferTrained_;
};

} // namespace

Status train(const TrainOptions &options, bool &started) {
  started = false;
  try {
    return Trainer(options).run(started);
  } catch (const std::exception &e) {
    return Status::error(firstLine(e));
  }
}

} // namespace ganc::runtime
