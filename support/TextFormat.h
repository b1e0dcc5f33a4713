// Helpers shared by the printer and other writers of ganc text (plans, reports).
#pragma once

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace ganc {

/// The shortest decimal text that reads back to exactly `value`, always marked as a float.
std::string formatDouble(double value);
/// `text` in double quotes with '"', '\' and newlines escaped.
std::string quote(const std::string &text);
/// Seconds as StyleGAN's tick lines write them: "42s", "3m 05s", "2h 01m 05s", "1d 02h 03m".
std::string formatDuration(double seconds);

/// The whole of `text` as a decimal int64, or nullopt when it is not one or out of range
/// (never an exception: edited plans and IR files reach this).
inline std::optional<int64_t> parseInt64(const std::string &text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    return std::nullopt;
  return value;
}

/// The whole of `text` as a finite decimal double ("16", "0.5", "1e-3"), or nullopt when it
/// is not one (never an exception: command-line values reach this). Hexadecimal ("0x10"),
/// leading spaces, "inf" and "nan" are not numbers here, as they are to strtod.
inline std::optional<double> parseDouble(const std::string &text) {
  double value = 0;
  auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::general);
  if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

/// The comma-separated items of a command-line value ("a.so,b.so"), empty ones dropped.
inline std::vector<std::string> splitList(const std::string &text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos)
      comma = text.size();
    if (comma > start)
      items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

} // namespace ganc
