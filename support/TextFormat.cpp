// Numbers and strings as ganc's text formats write them (plans, reports, messages).
#include "support/TextFormat.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace ganc {

std::string formatDouble(double value) {
  char buffer[64];
  // Shortest form that reads back to the same double, always with a '.' or exponent so that
  // the parser knows it is a float.
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::strtod(buffer, nullptr) == value)
      break;
  }
  std::string s = buffer;
  if (s.find_first_of(".eEn") == std::string::npos)
    s += ".0";
  return s;
}

std::string quote(const std::string &text) {
  std::string s = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\')
      s += '\\';
    if (c == '\n') {
      s += "\\n";
      continue;
    }
    s += c;
  }
  return s + "\"";
}

std::string formatDuration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(seconds, 0.0)));
  char text[48];
  if (s < 60)
    std::snprintf(text, sizeof(text), "%llds", s);
  else if (s < 3600)
    std::snprintf(text, sizeof(text), "%lldm %02llds", s / 60, s % 60);
  else if (s < 86400)
    std::snprintf(text, sizeof(text), "%lldh %02lldm %02llds", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(text, sizeof(text), "%lldd %02lldh %02lldm", s / 86400, s / 3600 % 24,
                  s / 60 % 60);
  return text;
}

} // namespace ganc
