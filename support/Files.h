// File helpers every layer shares: read a whole file, write one atomically, check a zip
// container before LibTorch parses it.
#pragma once

#include "ir/Module.h"
#include "support/Status.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ganc {

/// The bytes of `path` (a regular file); errors give the OS reason.
Expected<std::vector<char>> readFile(const std::string &path);

/// The text of `path`, or of standard input when `path` is "-".
Expected<std::string> readTextOrStdin(const std::string &path);

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so a failed
/// write never leaves a truncated file where a good one was; the temporary file is removed
/// when anything fails, and the error gives the OS reason ("No space left on device"). The
/// data is synced before the rename, so after a crash `path` holds the old or the new file.
Status writeFileAtomically(const std::string &path, const std::vector<char> &bytes);
Status writeFileAtomically(const std::string &path, const std::string &text);

/// Checks that `bytes` are a whole, undamaged zip archive, the container torch.save,
/// torch.jit.save and LibTorch's pickle_save write: the end record and the central directory
/// lie inside the file, every entry's local header and data do too, and every stored entry
/// matches its CRC-32. LibTorch's reader trusts these fields: it reads past the buffer on a
/// truncated file and loads flipped bytes without a word. Callers name the file.
/// A sealed archive (sealZipArchive) is also checked against its whole-file CRC-32, which
/// covers the zip's own records too. With `names`, the entries' names are listed there.
Status checkZipArchive(const std::vector<char> &bytes, std::vector<std::string> *names = nullptr);

/// `bytes` (a zip archive just written by LibTorch, with no comment) with the CRC-32 of all
/// its bytes stored as the archive's comment, a field every zip reader (torch.load
/// included) skips: what ganc's checkpoints carry.
std::vector<char> sealZipArchive(std::vector<char> bytes);

/// The files of a zip archive whose names `wanted` accepts, checked as checkZipArchive checks
/// them, stored entries as they are and deflated ones inflated (zlib) and checked against
/// their CRC-32. Directories are skipped. Where the wanted entries declare more than
/// `maxBytes` in all, nothing is inflated and the error says so (a zip bomb declares
/// gigabytes in a few kilobytes).
Expected<std::vector<std::pair<std::string, std::vector<char>>>>
readZipEntries(const std::vector<char> &bytes,
               const std::function<bool(const std::string &)> &wanted,
               uint64_t maxBytes = UINT64_MAX);

/// This process's resident memory in GB (StyleGAN's cpumem), or 0 where /proc has none.
double residentGigabytes();

} // namespace ganc
