// Helpers shared by the printer and other writers of ganc text (plans, reports).
#pragma once

#include <string>

namespace ganc::ir {

/// The shortest decimal text that reads back to exactly `value`, always marked as a float.
std::string formatDouble(double value);
/// `text` in double quotes with '"', '\' and newlines escaped.
std::string quote(const std::string &text);

} // namespace ganc::ir
