// Option tables: checked values, and the help and docs/cli.md text made from a command's table.
#include "support/Options.h"

#include "support/TextFormat.h"
#include <sys/stat.h>

#include <sstream>

namespace ganc {

namespace {

constexpr size_t kWidth = 94;      // help lines stay within this
constexpr size_t kHelpColumn = 26; // where an option's help starts

/// `text` wrapped into lines of at most `width` characters (words are never split).
std::vector<std::string> wrap(const std::string &text, size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string line;
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      lines.push_back(line);
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty())
    lines.push_back(line);
  return lines;
}

std::string spelled(const OptionDoc &o) {
  std::string s = o.name;
  for (const std::string &alias : o.aliases)
    s = alias + ", " + s;
  return o.value.empty() ? s : s + " " + o.value;
}

} // namespace

bool splitInlineValue(const std::string &arg, std::string &flag, std::string &value) {
  const size_t eq = arg.find('=');
  if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
    flag = arg;
    value.clear();
    return false;
  }
  flag = arg.substr(0, eq);
  value = arg.substr(eq + 1);
  return true;
}

std::string CommandDoc::usage() const {
  std::ostringstream out;
  for (size_t i = 0; i < synopsis.size(); ++i)
    out << (i ? "       " : "usage: ") << name << " " << synopsis[i] << "\n";
  std::istringstream paragraphs(description);
  std::string paragraph, line;
  auto flush = [&] {
    if (paragraph.empty())
      return;
    out << "\n";
    for (const std::string &l : wrap(paragraph, kWidth))
      out << l << "\n";
    paragraph.clear();
  };
  while (std::getline(paragraphs, line)) {
    if (line.empty())
      flush();
    else
      paragraph += (paragraph.empty() ? "" : " ") + line;
  }
  flush();
  if (!options.empty())
    out << "\n";
  for (const OptionDoc &o : options) {
    std::string head = "  " + spelled(o);
    std::vector<std::string> help = wrap(o.help, kWidth - kHelpColumn);
    size_t first = 0;
    if (head.size() + 2 <= kHelpColumn && !help.empty()) {
      out << head << std::string(kHelpColumn - head.size(), ' ') << help[0] << "\n";
      first = 1;
    } else {
      out << head << "\n";
    }
    for (size_t k = first; k < help.size(); ++k)
      out << std::string(kHelpColumn, ' ') << help[k] << "\n";
  }
  if (!notes.empty())
    out << "\n" << notes << (notes.back() == '\n' ? "" : "\n");
  return out.str();
}

std::string CommandDoc::markdown() const {
  std::ostringstream out;
  out << "## " << name << "\n\n```\n";
  for (const std::string &s : synopsis)
    out << name << " " << s << "\n";
  out << "```\n\n" << description << (description.empty() ? "" : "\n\n");
  if (!options.empty()) {
    out << "| option | meaning |\n| --- | --- |\n";
    for (const OptionDoc &o : options) {
      std::string help = o.help;
      for (size_t at = help.find('|'); at != std::string::npos; at = help.find('|', at + 2))
        help.replace(at, 1, "\\|");
      std::string name = spelled(o);
      for (size_t at = name.find('|'); at != std::string::npos; at = name.find('|', at + 2))
        name.replace(at, 1, "\\|");
      out << "| `" << name << "` | " << help << " |\n";
    }
    out << "\n";
  }
  if (!notes.empty())
    out << notes << (notes.back() == '\n' ? "" : "\n") << "\n";
  return out.str();
}

int64_t integerIn(const std::string &flag, const std::string &text, int64_t low, int64_t high) {
  const std::optional<int64_t> n = parseInt64(text);
  if (!n || *n < low || *n > high)
    throw OptionError(flag + " takes an integer from " + std::to_string(low) + " to " +
                      std::to_string(high) + ", not '" + text + "'");
  return *n;
}

double realIn(const std::string &flag, const std::string &text, double low, double high) {
  const std::optional<double> v = parseDouble(text);
  if (!v || !(*v >= low) || !(*v < high))
    throw OptionError(flag + " takes a number in [" + formatDouble(low) + ", " +
                      formatDouble(high) + "), not '" + text + "'");
  return *v;
}

double positive(const std::string &flag, const std::string &text) {
  const std::optional<double> v = parseDouble(text);
  if (!v || !(*v > 0))
    throw OptionError(flag + " takes a positive number, not '" + text + "'");
  return *v;
}

std::pair<std::string, std::string> keyed(const std::string &text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos)
    return {"", text};
  return {text.substr(0, eq), text.substr(eq + 1)};
}

std::vector<std::string> listOf(const std::string &text) { return splitList(text); }

std::string alternatives(const std::vector<std::string> &words) {
  std::string list;
  for (size_t k = 0; k < words.size(); ++k)
    list += (k == 0 ? "" : k + 1 == words.size() ? " or " : ", ") + words[k];
  return list;
}

bool isFile(const std::string &path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

} // namespace ganc
