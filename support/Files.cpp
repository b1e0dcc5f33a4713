// Reading and atomically writing files; checking zip containers; reading and stamping plans.
#include "support/Files.h"

#include <zlib.h>

#include <functional>
#include <iostream>
#include <sstream>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

namespace ganc {

namespace {

std::string osReason() { return std::strerror(errno); }

/// Writes all of `bytes` to `fd`, retrying short writes and interrupted calls.
bool writeAll(int fd, const char *data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

} // namespace

Expected<std::vector<char>> readFile(const std::string &path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; it is
  // then refused below as not a regular file (reads of a regular file ignore the flag).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status::error(path + ": cannot open (" + osReason() + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(path + ": not a regular file");
  }
  std::vector<char> bytes(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      std::string reason = n < 0 ? osReason() : "the file shrank while it was read";
      ::close(fd);
      return Status::error(path + ": cannot read (" + reason + ")");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return bytes;
}

Expected<std::string> readTextOrStdin(const std::string &path) {
  if (path == "-") {
    std::stringstream buffer;
    buffer << std::cin.rdbuf();
    return buffer.str();
  }
  auto bytes = readFile(path);
  if (!bytes)
    return bytes.status();
  return std::string(bytes->begin(), bytes->end());
}

Status writeFileAtomically(const std::string &path, const std::vector<char> &bytes) {
  const std::string tmp = path + ".tmp";
  auto fail = [&](int fd) {
    const std::string reason = osReason();
    if (fd >= 0)
      ::close(fd);
    std::remove(tmp.c_str());
    return Status::failure("cannot write " + path + " (" + reason + ")");
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fail(-1);
  // fsync before the rename: after a crash the name holds the old file or the whole new one.
  if (!writeAll(fd, bytes.data(), bytes.size()) || ::fsync(fd) != 0)
    return fail(fd);
  if (::close(fd) != 0)
    return fail(-1);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(-1);
  return Status::ok();
}

Status writeFileAtomically(const std::string &path, const std::string &text) {
  return writeFileAtomically(path, std::vector<char>(text.begin(), text.end()));
}

namespace {

/// Little-endian reads, bounded by the buffer: a zip archive's numbers are all in its bytes.
class ZipReader {
public:
  ZipReader(const std::vector<char> &bytes) : bytes_(bytes) {}
  bool has(uint64_t offset, uint64_t size) const {
    return offset <= bytes_.size() && size <= bytes_.size() - offset;
  }
  uint64_t le(uint64_t offset, int width) const {
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i)
      v = (v << 8) | static_cast<unsigned char>(bytes_[offset + static_cast<uint64_t>(i)]);
    return v;
  }
  uint32_t crc(uint64_t offset, uint64_t size) const {
    uLong c = crc32(0L, Z_NULL, 0);
    const auto *p = reinterpret_cast<const Bytef *>(bytes_.data() + offset);
    while (size > 0) {
      uInt chunk = static_cast<uInt>(std::min<uint64_t>(size, 1u << 30));
      c = crc32(c, p, chunk);
      p += chunk;
      size -= chunk;
    }
    return static_cast<uint32_t>(c);
  }
  uint64_t size() const { return bytes_.size(); }

private:
  const std::vector<char> &bytes_;
};

constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kCentralSignature = 0x02014b50;
constexpr uint32_t kLocalSignature = 0x04034b50;
constexpr uint64_t kEndSize = 22;
constexpr uint64_t kCentralSize = 46;
constexpr uint64_t kLocalSize = 30;

/// Where the central directory is and how many entries it has, and the archive's comment.
struct Directory {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t entries = 0;
  uint64_t comment = 0;
};

/// The comment sealZipArchive writes: the CRC-32 of every byte before it.
constexpr const char *kSealPrefix = "ganc-crc32 ";
constexpr uint64_t kSealSize = 19;

Expected<Directory> findDirectory(const ZipReader &zip) {
  if (zip.size() < kEndSize)
    return Status::error("not a zip archive (the container torch writes), or truncated: "
                         "too short");
  // The end record is the last thing in the file, before a comment of at most 64 KiB.
  uint64_t lowest = zip.size() > kEndSize + 0xffff ? zip.size() - kEndSize - 0xffff : 0;
  for (uint64_t at = zip.size() - kEndSize + 1; at-- > lowest;) {
    if (zip.le(at, 4) != kEndSignature || at + kEndSize + zip.le(at + 20, 2) != zip.size())
      continue;
    Directory dir{zip.le(at + 16, 4), zip.le(at + 12, 4), zip.le(at + 10, 2), at + kEndSize};
    bool zip64 = dir.offset == 0xffffffff || dir.size == 0xffffffff || dir.entries == 0xffff;
    if (zip64) {
      if (at < 20 || zip.le(at - 20, 4) != kZip64LocatorSignature)
        return Status::error("damaged file: zip64 end record is missing");
      uint64_t end64 = zip.le(at - 12, 8);
      if (!zip.has(end64, 56) || zip.le(end64, 4) != kZip64EndSignature)
        return Status::error("damaged file: zip64 end record is out of bounds");
      dir = Directory{zip.le(end64 + 48, 8), zip.le(end64 + 40, 8), zip.le(end64 + 32, 8),
                      dir.comment};
    }
    if (!zip.has(dir.offset, dir.size))
      return Status::error("damaged file: the central directory lies beyond the end of the file");
    return dir;
  }
  return Status::error("not a zip archive (the container torch writes), or truncated: "
                       "no end-of-archive record");
}

/// An entry's sizes and local-header offset, with zip64's 64-bit values where the 32-bit
/// fields say 0xffffffff.
struct Entry {
  uint64_t compressed = 0;
  uint64_t uncompressed = 0;
  uint64_t local = 0;
  uint32_t crc = 0;
  uint16_t method = 0;
  std::string name;
};

Status readZip64Extra(const ZipReader &zip, uint64_t extra, uint64_t extraSize, Entry &entry) {
  for (uint64_t at = extra; at + 4 <= extra + extraSize;) {
    uint64_t id = zip.le(at, 2), size = zip.le(at + 2, 2);
    if (at + 4 + size > extra + extraSize)
      return Status::error("entry '" + entry.name + "': extra field out of bounds");
    if (id == 0x0001) {
      uint64_t field = at + 4;
      for (uint64_t *value : {&entry.uncompressed, &entry.compressed, &entry.local}) {
        if (*value != 0xffffffff)
          continue;
        if (field + 8 > at + 4 + size)
          return Status::error("entry '" + entry.name + "': zip64 field out of bounds");
        *value = zip.le(field, 8);
        field += 8;
      }
    }
    at += 4 + size;
  }
  return Status::ok();
}

/// Checks one entry's local header and bounds (and a stored entry's CRC-32); `data` is where
/// its bytes start.
Status checkEntry(const ZipReader &zip, const Entry &entry, uint64_t &data) {
  const std::string where = "entry '" + entry.name + "'";
  if (!zip.has(entry.local, kLocalSize) || zip.le(entry.local, 4) != kLocalSignature)
    return Status::error(where + ": local header out of bounds or damaged");
  data = entry.local + kLocalSize + zip.le(entry.local + 26, 2) + zip.le(entry.local + 28, 2);
  if (!zip.has(data, entry.compressed))
    return Status::error(where + ": data runs past the end of the file (truncated?)");
  // Stored entries (what torch writes) are checked against their CRC-32; torch records 0 when
  // CRC computation was switched off (torch.serialization.set_crc32_options).
  if (entry.method == 0) {
    if (entry.compressed != entry.uncompressed)
      return Status::error(where + ": stored sizes disagree");
    if (entry.crc != 0 && zip.crc(data, entry.compressed) != entry.crc)
      return Status::error(where + ": CRC-32 mismatch (the file is corrupted)");
  }
  return Status::ok();
}

Status damaged(const Status &s) { return Status::error("damaged file: " + s.message()); }

/// Calls `visit` with every entry of the central directory and where its data starts, after
/// checking it.
Status walkEntries(const std::vector<char> &bytes, const ZipReader &zip, const Directory &dir,
                   const std::function<Status(const Entry &, uint64_t)> &visit) {
  uint64_t at = dir.offset, end = dir.offset + dir.size;
  for (uint64_t i = 0; i < dir.entries; ++i) {
    if (at + kCentralSize > end || zip.le(at, 4) != kCentralSignature)
      return damaged(Status::error("central directory entry " + std::to_string(i) + " is damaged"));
    Entry entry;
    entry.method = static_cast<uint16_t>(zip.le(at + 10, 2));
    entry.crc = static_cast<uint32_t>(zip.le(at + 16, 4));
    entry.compressed = zip.le(at + 20, 4);
    entry.uncompressed = zip.le(at + 24, 4);
    entry.local = zip.le(at + 42, 4);
    uint64_t nameSize = zip.le(at + 28, 2), extraSize = zip.le(at + 30, 2);
    uint64_t next = at + kCentralSize + nameSize + extraSize + zip.le(at + 32, 2);
    if (next > end)
      return damaged(Status::error("central directory entry " + std::to_string(i) + " is damaged"));
    entry.name.assign(bytes.data() + at + kCentralSize, nameSize);
    if (Status s = readZip64Extra(zip, at + kCentralSize + nameSize, extraSize, entry); !s)
      return damaged(s);
    uint64_t data = 0;
    if (Status s = checkEntry(zip, entry, data); !s)
      return damaged(s);
    GANC_TRY(visit(entry, data));
    at = next;
  }
  return Status::ok();
}

/// A deflated entry's bytes, inflated with zlib and checked against its CRC-32.
Expected<std::vector<char>> inflateEntry(const std::vector<char> &bytes, const Entry &entry,
                                         uint64_t data) {
  constexpr uint64_t kLimit = uint64_t{1} << 31;
  if (entry.uncompressed > kLimit || entry.compressed > kLimit)
    return Status::error("entry '" + entry.name + "': larger than 2 GiB");
  std::vector<char> out(entry.uncompressed);
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) // raw deflate, as zip stores it
    return Status::error("zlib: cannot start inflating");
  stream.next_in = reinterpret_cast<Bytef *>(const_cast<char *>(bytes.data() + data));
  stream.avail_in = static_cast<uInt>(entry.compressed);
  stream.next_out = reinterpret_cast<Bytef *>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  int result = inflate(&stream, Z_FINISH);
  const uint64_t produced = stream.total_out;
  inflateEnd(&stream);
  if (result != Z_STREAM_END || produced != entry.uncompressed)
    return damaged(Status::error("entry '" + entry.name + "' does not inflate to its size"));
  uLong c = crc32(0L, reinterpret_cast<const Bytef *>(out.data()), static_cast<uInt>(out.size()));
  if (entry.crc != 0 && static_cast<uint32_t>(c) != entry.crc)
    return damaged(
        Status::error("entry '" + entry.name + "': CRC-32 mismatch (the file is corrupted)"));
  return out;
}

} // namespace

Expected<std::vector<std::pair<std::string, std::vector<char>>>>
readZipEntries(const std::vector<char> &bytes,
               const std::function<bool(const std::string &)> &wanted, uint64_t maxBytes) {
  ZipReader zip(bytes);
  auto dir = findDirectory(zip);
  if (!dir)
    return dir.status();
  uint64_t declared = 0;
  GANC_TRY(walkEntries(bytes, zip, *dir, [&](const Entry &entry, uint64_t) -> Status {
    if (!entry.name.empty() && entry.name.back() != '/' && wanted(entry.name))
      declared += entry.uncompressed;
    return Status::ok();
  }));
  if (declared > maxBytes)
    return Status::error("its entries would inflate to " + std::to_string(declared >> 20) +
                         " MiB, more than the " + std::to_string(maxBytes >> 20) +
                         " MiB allowed for an archive of " + std::to_string(bytes.size() >> 10) +
                         " KiB (a zip bomb?)");
  std::vector<std::pair<std::string, std::vector<char>>> files;
  Status walked = walkEntries(bytes, zip, *dir, [&](const Entry &entry, uint64_t data) -> Status {
    if (!entry.name.empty() && entry.name.back() == '/')
      return Status::ok(); // a directory
    if (!wanted(entry.name))
      return Status::ok();
    if (entry.method == 0) {
      files.emplace_back(
          entry.name,
          std::vector<char>(bytes.begin() + static_cast<int64_t>(data),
                            bytes.begin() + static_cast<int64_t>(data + entry.compressed)));
      return Status::ok();
    }
    if (entry.method != 8)
      return Status::error("entry '" + entry.name + "': compression method " +
                           std::to_string(entry.method) +
                           " (ganc reads stored and deflated entries)");
    auto inflated = inflateEntry(bytes, entry, data);
    if (!inflated)
      return inflated.status();
    files.emplace_back(entry.name, inflated.take());
    return Status::ok();
  });
  if (!walked)
    return walked;
  return files;
}

Status checkZipArchive(const std::vector<char> &bytes, std::vector<std::string> *names) {
  ZipReader zip(bytes);
  auto bad = [](const Status &s) { return damaged(s); };
  auto dir = findDirectory(zip);
  if (!dir)
    return dir.status();
  if (bytes.size() - dir->comment == kSealSize) {
    if (std::memcmp(bytes.data() + dir->comment, kSealPrefix, std::strlen(kSealPrefix)) != 0)
      return bad(Status::error("the seal (the archive's comment) is damaged"));
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", zip.crc(0, dir->comment));
    if (std::memcmp(bytes.data() + dir->comment + std::strlen(kSealPrefix), hex, 8) != 0)
      return bad(
          Status::error("the file's CRC-32 does not match its seal (the file is corrupted)"));
  }
  return walkEntries(bytes, zip, *dir, [names](const Entry &entry, uint64_t) {
    if (names)
      names->push_back(entry.name);
    return Status::ok();
  });
}

std::vector<char> sealZipArchive(std::vector<char> bytes) {
  ZipReader zip(bytes);
  auto dir = findDirectory(zip);
  if (!dir || dir->comment != bytes.size())
    return bytes; // not a fresh torch archive: left as it is, checked entry by entry on load
  // The end record's comment length first: the CRC covers every byte before the comment.
  bytes[bytes.size() - 2] = static_cast<char>(kSealSize);
  bytes[bytes.size() - 1] = 0;
  char seal[kSealSize + 1];
  std::snprintf(seal, sizeof(seal), "%s%08x", kSealPrefix, zip.crc(0, bytes.size()));
  bytes.insert(bytes.end(), seal, seal + kSealSize);
  return bytes;
}

double residentGigabytes() {
  std::ifstream statm("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (!(statm >> pages >> resident))
    return 0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1e9;
}

} // namespace ganc
