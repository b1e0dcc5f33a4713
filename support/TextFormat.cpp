// Numbers and strings as ganc's text formats write them (plans, reports, messages).
#include "support/TextFormat.h"

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

} // namespace ganc
