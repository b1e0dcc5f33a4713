// How the kernels of the phase graphs' node passes write what a memset or a copy node writes
// (backend/cuda/FillKernel.cu): plain C++, so the arithmetic is tested on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

namespace ganc::backend {

/// A memset as a grid of words: `height` rows `pitch` bytes apart from `dst`, each `width`
/// words of `wordBytes` (1, 2 or 4) set to the low `wordBytes` bytes of `word`.
struct FillPlan {
  unsigned wordBytes = 1;
  uint32_t word = 0;
  size_t width = 0;
  size_t height = 0;
  size_t pitch = 0;
};

/// The plan for cudaMemset2D's arguments (value: the element's, its low `elementSize` bytes;
/// width in elements): four-byte words where every row starts and ends on a four-byte
/// boundary, else the element itself. Nothing (no plan) for an element size other than 1, 2
/// or 4, or a memset of no element.
inline std::optional<FillPlan> planFill(uintptr_t dst, size_t pitch, unsigned value,
                                        unsigned elementSize, size_t width, size_t height) {
  if ((elementSize != 1 && elementSize != 2 && elementSize != 4) || width == 0 || height == 0)
    return std::nullopt;
  FillPlan plan;
  plan.height = height;
  plan.pitch = height > 1 ? pitch : 0;
  const uint32_t element = elementSize == 4 ? value : value & ((1u << (8 * elementSize)) - 1);
  const size_t rowBytes = width * elementSize;
  if (dst % 4 == 0 && rowBytes % 4 == 0 && plan.pitch % 4 == 0) {
    plan.wordBytes = 4;
    plan.word = elementSize == 1   ? element * 0x01010101u
                : elementSize == 2 ? element | element << 16
                                   : element;
    plan.width = rowBytes / 4;
  } else {
    plan.wordBytes = elementSize;
    plan.word = element;
    plan.width = width;
  }
  return plan;
}

/// What the kernel does, on host memory (the tests' reference for it).
inline void fillOnHost(char *dst, const FillPlan &plan) {
  for (size_t row = 0; row < plan.height; ++row)
    for (size_t i = 0; i < plan.width; ++i)
      std::memcpy(dst + row * plan.pitch + i * plan.wordBytes, &plan.word, plan.wordBytes);
}

/// A device-to-device copy as a grid of words: `height` rows of `width` words of `wordBytes`
/// (1, 2, 4 or 16), row r read at `src + r * srcPitch` and written at `dst + r * dstPitch`.
struct CopyPlan {
  unsigned wordBytes = 1;
  size_t width = 0;
  size_t height = 0;
  size_t srcPitch = 0;
  size_t dstPitch = 0;
};

/// The plan for a copy of `height` rows of `widthBytes` bytes each (a cudaMemcpy2D's
/// arguments, the pitches unused for one row): the widest word (16, 4, 2 or 1 bytes) that
/// both addresses, both pitches (of more than one row) and the row width are multiples of.
/// Nothing (no plan) for a copy of no byte.
inline std::optional<CopyPlan> planCopy(uintptr_t dst, size_t dstPitch, uintptr_t src,
                                        size_t srcPitch, size_t widthBytes, size_t height) {
  if (widthBytes == 0 || height == 0)
    return std::nullopt;
  CopyPlan plan;
  plan.height = height;
  plan.dstPitch = height > 1 ? dstPitch : 0;
  plan.srcPitch = height > 1 ? srcPitch : 0;
  const uintptr_t all = dst | src | plan.dstPitch | plan.srcPitch | widthBytes;
  for (unsigned word : {16u, 4u, 2u, 1u})
    if (all % word == 0) {
      plan.wordBytes = word;
      break;
    }
  plan.width = widthBytes / plan.wordBytes;
  return plan;
}

/// What the copy kernel does, on host memory (the tests' reference for it).
inline void copyOnHost(char *dst, const char *src, const CopyPlan &plan) {
  for (size_t row = 0; row < plan.height; ++row)
    std::memcpy(dst + row * plan.dstPitch, src + row * plan.srcPitch, plan.width * plan.wordBytes);
}

} // namespace ganc::backend
