// The phase attribute table: PhaseAttrs.def's rows made into parsers, printers, the
// verifier's rules and `ganc explain`'s lines.
#include "ir/PhaseAttrs.h"
#include "support/TextFormat.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <sstream>
#include <type_traits>
#include <utility>

namespace ganc::ir {
namespace {

// ---- how one member reads and prints -------------------------------------------------------

std::string text(int64_t v, bool) { return std::to_string(v); }
std::string text(double v, bool) { return formatDouble(v); }
std::string text(const std::string &v, bool word) { return word ? v : quote(v); }
std::string text(const std::vector<std::string> &names, bool) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i)
    s += (i ? ", " : "") + names[i];
  return s + "]";
}

Status read(AttrReader &r, int64_t &v, bool) { return r.integer(v); }
Status read(AttrReader &r, double &v, bool) { return r.number(v); }
Status read(AttrReader &r, std::string &v, bool word) { return word ? r.word(v) : r.string(v); }
Status read(AttrReader &r, std::vector<std::string> &v, bool) { return r.nameList(v); }

/// What a member reads as, for the docs: "\"TEXT\"", "N", "X", "WORD" or "[NAMES]".
std::string placeholder(const int64_t *, bool) { return "N"; }
std::string placeholder(const double *, bool) { return "X"; }
std::string placeholder(const std::string *, bool word) { return word ? "WORD" : "\"TEXT\""; }
std::string placeholder(const std::vector<std::string> *, bool) { return "[NAMES]"; }

/// The words of a syntax string.
std::vector<std::string> tokens(const char *syntax) {
  std::vector<std::string> out;
  std::istringstream in(syntax);
  for (std::string word; in >> word;)
    out.push_back(word);
  return out;
}

bool isSlot(const std::string &token) { return token == "{}" || token == "{w}"; }

/// The syntax with each slot replaced by slots[i](whether it is a bare word), in order.
std::string render(const char *syntax, const std::vector<std::function<std::string(bool)>> &slots) {
  std::string out;
  size_t next = 0;
  for (const std::string &token : tokens(syntax)) {
    out += out.empty() ? "" : " ";
    out += isSlot(token) ? slots.at(next++)(token == "{w}") : token;
  }
  return out;
}

/// The line after the keyword: the syntax with each slot replaced by its member's text.
template <typename Owner, typename... Members>
std::string printFields(const Owner &o, const char *syntax, Members... members) {
  std::vector<std::function<std::string(bool)>> slots;
  (slots.push_back([&o, members](bool word) { return text(o.*members, word); }), ...);
  return render(syntax, slots);
}

/// The syntax with each slot shown as its member's placeholder.
template <typename Owner, typename... Members>
std::string formFields(const char *syntax, Members... members) {
  std::vector<std::function<std::string(bool)>> slots;
  (slots.push_back([](bool word) {
    using Member = std::remove_reference_t<decltype(std::declval<Owner>().*members)>;
    return placeholder(static_cast<const Member *>(nullptr), word);
  }),
   ...);
  return render(syntax, slots);
}

template <typename Owner, typename... Members>
Status parseFields(Owner &o, AttrReader &r, const char *syntax, Members... members) {
  std::vector<std::function<Status(bool)>> slots;
  (slots.push_back([&o, &r, members](bool word) { return read(r, o.*members, word); }), ...);
  size_t next = 0;
  for (const std::string &token : tokens(syntax))
    GANC_TRY(isSlot(token) ? slots.at(next++)(token == "{w}") : r.expectWord(token));
  return Status::ok();
}

// ---- the verifier's rules ------------------------------------------------------------------

Status noCheck(const Phase &, const Module &) { return Status::ok(); }

Status checkUpdates(const Phase &p, const Module &) {
  return p.updates.empty() ? Status::error("updates no submodule") : Status::ok();
}

Status checkInterval(const Phase &p, const Module &) {
  if (p.interval < 1)
    return Status::error("interval must be at least 1, got " + std::to_string(p.interval));
  return Status::ok();
}

Status checkAccumulate(const Phase &p, const Module &) {
  if (p.accumulate < 1)
    return Status::error("accumulate must be at least 1, got " + std::to_string(p.accumulate));
  return Status::ok();
}

Status checkAutocast(const Phase &p, const Module &) {
  if (!p.autocast.empty() && p.autocast != "bf16" && p.autocast != "f16")
    return Status::error("autocast to " + p.autocast + ": only bf16 and f16 are autocast dtypes");
  return Status::ok();
}

Status checkLossScaler(const Phase &p, const Module &m) {
  if (!p.lossScaler.empty() &&
      std::none_of(m.lossScalers.begin(), m.lossScalers.end(),
                   [&](const LossScaler &l) { return l.name == p.lossScaler; }))
    return Status::error("uses undeclared loss scaler \"" + p.lossScaler + "\"");
  return Status::ok();
}

Status checkBucketCaps(const Phase &p, const Module &) {
  if (p.bucketCapBytes < 0 || p.firstBucketCapBytes < 0)
    return Status::error("bucket caps must not be negative");
  return Status::ok();
}

Status checkTuned(const Phase &p, const Module &) {
  if (p.tunedRanks < 0 || !(p.tunedExposedSeconds >= 0) || !(p.defaultExposedSeconds >= 0))
    return Status::error("tuned needs ranks >= 1 and exposed seconds >= 0");
  return Status::ok();
}

Status checkDoubleBackward(const Phase &p, const Module &) {
  if (!p.doubleBackward.empty() && p.doubleBackward != "filters" && p.doubleBackward != "grouped" &&
      p.doubleBackward != "pytorch")
    return Status::error("double_backward is filters, grouped or pytorch, not '" +
                         p.doubleBackward + "'");
  if (p.jointGroupedConvolutions < -1)
    return Status::error("joint_grouped_convolutions is a count, not " +
                         std::to_string(p.jointGroupedConvolutions));
  return Status::ok();
}

Status checkFused(const Phase &p, const Module &) {
  if (p.fusedResamplings < 0 || p.fusedBiasActs < 0)
    return Status::error("fused counts must not be negative");
  return Status::ok();
}

Status checkClip(const Phase &p, const Module &m) {
  for (const ClipGradNorm &clip : p.clips) {
    if (std::none_of(m.parameters.begin(), m.parameters.end(),
                     [&](const Tensor &t) { return t.group == clip.group && p.trains(t.name); }))
      return Status::error("clips optimizer group '" + clip.group +
                           "', which steps no parameter the phase trains");
    if (!(clip.maxNorm > 0) || !(clip.normType > 0))
      return Status::error("clip_grad_norm of '" + clip.group +
                           "' needs a positive max_norm and norm_type");
  }
  return Status::ok();
}

// ---- `ganc explain` ------------------------------------------------------------------------

std::string noExplain(const Phase &) { return ""; }

std::string explainAccumulate(const Phase &p) {
  if (p.accumulate <= 1)
    return "";
  const std::string k = std::to_string(p.accumulate);
  return "accumulate: " + k + " micro-batches per step, each loss divided by " + k +
         "; gradients summed locally, all-reduced once, in the last backward";
}

/// 'a', 'b' and 'c'.
std::string quotedList(const std::vector<std::string> &names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "'" : i + 1 == names.size() ? " and '" : ", '") + names[i] + "'";
  return text;
}

std::string explainThrough(const Phase &p) {
  return p.through.empty() ? ""
                           : "backward continues into section " + quotedList(p.through) +
                                 " (run once per step before this phase; its parameters reached "
                                 "are used here)";
}

std::string explainOutputs(const Phase &p) {
  return p.outputs.empty()
             ? ""
             : "hands " + quotedList(p.outputs) + " to later phases of the step, detached";
}

std::string explainAutocast(const Phase &p) {
  if (p.autocast.empty())
    return "";
  return "autocast: forward in " + p.autocast +
         " (torch.autocast rules; parameters and optimizer state stay float32)";
}

std::string explainLossScaler(const Phase &p) {
  if (p.lossScaler.empty())
    return "";
  return "loss scaling: by scaler " + p.lossScaler +
         " (loss x scale; gradients unscaled after the all-reduce; on inf/NaN the step is "
         "skipped and the scale backs off)";
}

std::string explainDoubleBackward(const Phase &p) {
  if (p.doubleBackward.empty())
    return "";
  if (p.doubleBackward == "pytorch")
    return "double backward: the phase differentiates inside itself; its grouped convolutions "
           "keep PyTorch's double backward, one convolution per group (--double-backward "
           "pytorch)";
  return "double backward: the phase differentiates inside itself; its grouped convolutions "
         "run as ganc::convolution, whose second derivative is ganc's " +
         std::string(p.doubleBackward == "filters"
                         ? "where the weight takes no gradient (FIR filters: bit for bit "
                           "PyTorch's)"
                         : "for every one (to rounding)") +
         " (ganc train --double-backward pytorch runs PyTorch's)";
}

std::string explainFused(const Phase &p) {
  if (p.fusedResamplings + p.fusedBiasActs == 0)
    return "";
  return "fused: " + std::to_string(p.fusedResamplings) +
         " resampling(s) as ganc::upfirdn2d (pad, zero insertion, FIR filter, stride in one "
         "kernel), " +
         std::to_string(p.fusedBiasActs) +
         " bias + activation(s) as ganc::bias_act; their derivatives are the same ops "
         "(ganc train runs them so on CUDA; on the CPU, or with --fusion off, as written)";
}

std::string explainNotFused(const Phase &p) {
  std::string lines;
  std::map<std::pair<std::string, std::string>, int> counted; // the same reason once, counted
  for (const NotFused &miss : p.notFused)
    ++counted[{miss.pattern, miss.why}];
  for (const auto &[miss, count] : counted) {
    lines += lines.empty() ? "" : "\n";
    lines += "not fused: " + miss.first + " x" + std::to_string(count) + ": " + miss.second;
  }
  return lines;
}

std::string explainClip(const Phase &p) {
  std::string lines;
  for (const ClipGradNorm &clip : p.clips) {
    lines += lines.empty() ? "" : "\n";
    lines += "clip_grad_norm: " + clip.group + " to " + formatDouble(clip.maxNorm) + " (" +
             (std::isinf(clip.normType) ? std::string("max") : formatDouble(clip.normType)) +
             "-norm over its used, all-reduced gradients)";
  }
  return lines;
}

} // namespace

const std::vector<PhaseAttr> &phaseAttrs() {
  static const std::vector<PhaseAttr> table = {
#define GANC_PHASE_ATTR(KEYWORD, SYNTAX, SHOWN, CHECK, EXPLAIN, HELP, ...)                         \
  PhaseAttr{#KEYWORD,                                                                              \
            SYNTAX,                                                                                \
            HELP,                                                                                  \
            [](const Phase &p) -> std::vector<std::string> {                                       \
              if (!(SHOWN))                                                                        \
                return {};                                                                         \
              return {std::string(#KEYWORD) + " " + printFields(p, SYNTAX, __VA_ARGS__)};          \
            },                                                                                     \
            [](Phase &p, AttrReader &r) { return parseFields(p, r, SYNTAX, __VA_ARGS__); },        \
            CHECK,                                                                                 \
            EXPLAIN,                                                                               \
            [] { return formFields<Phase>(SYNTAX, __VA_ARGS__); }},
#define GANC_PHASE_ATTR_EACH(KEYWORD, SYNTAX, LIST, CHECK, EXPLAIN, HELP, ...)                     \
  PhaseAttr{#KEYWORD,                                                                              \
            SYNTAX,                                                                                \
            HELP,                                                                                  \
            [](const Phase &p) {                                                                   \
              std::vector<std::string> lines;                                                      \
              for (const auto &element : p.*(LIST))                                                \
                lines.push_back(std::string(#KEYWORD) + " " +                                      \
                                printFields(element, SYNTAX, __VA_ARGS__));                        \
              return lines;                                                                        \
            },                                                                                     \
            [](Phase &p, AttrReader &r) {                                                          \
              (p.*(LIST)).emplace_back();                                                          \
              return parseFields((p.*(LIST)).back(), r, SYNTAX, __VA_ARGS__);                      \
            },                                                                                     \
            CHECK,                                                                                 \
            EXPLAIN,                                                                               \
            [] {                                                                                   \
              using Element =                                                                      \
                  std::remove_reference_t<decltype(*(std::declval<Phase>().*(LIST)).begin())>;     \
              return formFields<Element>(SYNTAX, __VA_ARGS__);                                     \
            }},
#include "ir/PhaseAttrs.def"
  };
  return table;
}

const PhaseAttr *findPhaseAttr(const std::string &keyword) {
  for (const PhaseAttr &attr : phaseAttrs())
    if (keyword == attr.keyword)
      return &attr;
  return nullptr;
}

} // namespace ganc::ir
