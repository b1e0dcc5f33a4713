// A fast content digest: FNV-1a over 8-byte words (the tail byte by byte). A key for caches and
// a digest for comparing files between ranks, not a security hash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ganc {

/// FNV-1a's offset basis: where a digest starts.
inline constexpr uint64_t kDigestStart = 0xcbf29ce484222325ULL;

/// `h` carried on over `size` bytes at `data`.
inline uint64_t digestWords(uint64_t h, const void *data, size_t size) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  const auto *bytes = static_cast<const unsigned char *>(data);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ word) * kPrime;
  }
  for (; i < size; ++i)
    h = (h ^ bytes[i]) * kPrime;
  return h;
}

} // namespace ganc
