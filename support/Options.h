// Command-line options declared once: each option's name, value, help and what it sets, in one
// table per command, from which the parser, `--help` and docs/cli.md are made.
#pragma once

#include "support/Status.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ganc {

/// What an option's setter throws for a bad value; the parser makes it the error line.
struct OptionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What the setter helpers below make: how an option sets its target, and how a record of
/// the run shows the value it set (run.json: the option table's record column).
template <typename Target> struct Stored {
  std::function<void(const std::string &flag, const std::string &value, Target &)> set;
  std::function<nlohmann::json(const Target &)> record;
};

/// One option of a command.
template <typename Target> struct Option {
  using Setter = std::function<void(const std::string &flag, const std::string &value, Target &)>;
  using Recorder = std::function<nlohmann::json(const Target &)>;
  Option(std::string name, std::string value, std::string help, Setter set,
         std::vector<std::string> aliases = std::vector<std::string>())
      : name(std::move(name)), value(std::move(value)), help(std::move(help)), set(std::move(set)),
        aliases(std::move(aliases)) {}
  /// An option made by a setter helper: recorded as it shows its value.
  Option(std::string name, std::string value, std::string help, Stored<Target> stored,
         std::vector<std::string> aliases = std::vector<std::string>())
      : Option(std::move(name), std::move(value), std::move(help), std::move(stored.set),
               std::move(aliases)) {
    record = std::move(stored.record);
  }
  /// "--steps"; other spellings ("-o") in `aliases`.
  std::string name;
  /// The value's placeholder in help ("N", "on|off"); empty for a flag that takes none.
  std::string value;
  /// One paragraph; `--help` and docs/cli.md wrap it.
  std::string help;
  /// Sets the target from the value ("" for a flag); throws OptionError naming `flag`.
  Setter set;
  std::vector<std::string> aliases;
  /// The value the option set, as a run's record shows it; empty: not recorded.
  Recorder record;
};

/// The record of `target`'s options (run.json's "options"): each recorded option under its
/// name without the dashes, `-` as `_` ("--log-every": "log_every").
template <typename Target>
nlohmann::json recordOf(const std::vector<Option<Target>> &table, const Target &target) {
  nlohmann::json record = nlohmann::json::object();
  for (const Option<Target> &option : table) {
    if (!option.record)
      continue;
    std::string key = option.name.substr(option.name.find_first_not_of('-'));
    std::replace(key.begin(), key.end(), '-', '_');
    record[key] = option.record(target);
  }
  return record;
}

/// The documentation side of an option, independent of its target.
struct OptionDoc {
  std::string name, value, help;
  std::vector<std::string> aliases;
};

/// What every command's help and parser share, without the target type.
struct CommandDoc {
  /// "ganc train".
  std::string name;
  /// The usage lines after the name ("PLAN --model MODEL.pt [options]"), one per form.
  std::vector<std::string> synopsis;
  /// A paragraph (or several, separated by blank lines) before the options.
  std::string description;
  std::vector<OptionDoc> options;
  /// Text after the options, printed as it is.
  std::string notes;

  /// The `--help` text: usage, description, the options with their help wrapped.
  std::string usage() const;
  /// The command's section of docs/cli.md.
  std::string markdown() const;
};

/// Splits "--flag=value" into ("--flag", "value"); anything else is (arg, nullopt-like "").
/// Returns whether there was an '='.
bool splitInlineValue(const std::string &arg, std::string &flag, std::string &value);

/// A command's table: its documentation, its options and what a positional argument sets.
template <typename Target> struct Command {
  CommandDoc doc;
  std::vector<Option<Target>> options;
  /// Each argument that is not an option, in order; throws OptionError. Null: none allowed.
  std::function<void(const std::string &argument, Target &)> positional;

  /// Reads `args` into `target`: "--flag value" and "--flag=value" alike; "-h" and "--help"
  /// set *help (and nothing else is checked). Errors are one line: the unknown option, the
  /// missing or bad value.
  Status parse(const std::vector<std::string> &args, Target &target, bool &help) const {
    for (size_t i = 0; i < args.size(); ++i) {
      std::string flag, value;
      const bool inlined = splitInlineValue(args[i], flag, value);
      if (flag == "-h" || flag == "--help") {
        help = true;
        continue;
      }
      const Option<Target> *option = find(flag);
      try {
        if (!option && flag.size() > 1 && flag[0] == '-')
          return Status::error("unknown option '" + flag + "' (see " + doc.name + " --help)");
        if (!option) {
          if (!positional)
            return Status::error("unexpected argument '" + args[i] + "'");
          positional(args[i], target);
          continue;
        }
        if (option->value.empty() && inlined)
          return Status::error(flag + " takes no value");
        if (!option->value.empty() && !inlined) {
          if (i + 1 >= args.size())
            return Status::error(flag + " needs a value (" + option->value + ")");
          value = args[++i];
        }
        option->set(flag, value, target);
      } catch (const std::exception &e) {
        return Status::error(e.what());
      }
    }
    return Status::ok();
  }

  const Option<Target> *find(const std::string &flag) const {
    for (const Option<Target> &option : options) {
      if (option.name == flag)
        return &option;
      for (const std::string &alias : option.aliases)
        if (alias == flag)
          return &option;
    }
    return nullptr;
  }

  /// The documentation with every option's.
  CommandDoc documented() const {
    CommandDoc d = doc;
    for (const Option<Target> &o : options)
      d.options.push_back({o.name, o.value, o.help, o.aliases});
    return d;
  }
};

// ---- values, checked: each throws OptionError naming the flag ------------------------------

/// An integer in [low, high].
int64_t integerIn(const std::string &flag, const std::string &text, int64_t low, int64_t high);
/// A finite number in [low, high).
double realIn(const std::string &flag, const std::string &text, double low, double high);
/// A finite number > 0.
double positive(const std::string &flag, const std::string &text);
/// "KEY=VALUE" as (KEY, VALUE); without '=' as ("", VALUE).
std::pair<std::string, std::string> keyed(const std::string &text);
/// The comma-separated items of a value ("a.so,b.so"), empty ones dropped.
std::vector<std::string> listOf(const std::string &text);

/// Whether `path` names an existing regular file.
bool isFile(const std::string &path);
/// "a, b or c".
std::string alternatives(const std::vector<std::string> &words);

/// One of `choices` (word, value): an enum's spellings on the command line.
template <typename T>
T choice(const std::string &flag, const std::string &text,
         const std::vector<std::pair<std::string, T>> &choices) {
  std::vector<std::string> words;
  for (const auto &[word, value] : choices) {
    if (word == text)
      return value;
    words.push_back(word);
  }
  throw OptionError(flag + " takes " + alternatives(words) + ", not '" + text + "'");
}

/// The placeholder of a choice option: "a|b|c".
template <typename T> std::string choiceValue(const std::vector<std::pair<std::string, T>> &c) {
  std::string s;
  for (const auto &entry : c)
    s += (s.empty() ? "" : "|") + entry.first;
  return s;
}

// ---- setters for the common cases -----------------------------------------------------------

/// Records a member as it is (a number, text, bool or list).
template <typename Target, typename T> auto recordMember(T Target::*member) {
  return [member](const Target &t) { return nlohmann::json(t.*member); };
}
/// A setter the table writes by hand, recorded by `record`.
template <typename Target, typename Set, typename Record>
Stored<Target> recorded(Set set, Record record) {
  return {std::move(set), std::move(record)};
}

/// Stores the value as it is.
template <typename Target> Stored<Target> storeText(std::string Target::*member) {
  return {[member](const std::string &, const std::string &v, Target &t) { t.*member = v; },
          recordMember(member)};
}
/// Sets a bool member true (a flag without a value).
template <typename Target> Stored<Target> storeTrue(bool Target::*member) {
  return {[member](const std::string &, const std::string &, Target &t) { t.*member = true; },
          recordMember(member)};
}
/// An integer in [low, high] into an integral member.
template <typename Target, typename Int>
Stored<Target> storeInteger(Int Target::*member, int64_t low, int64_t high) {
  return {[=](const std::string &flag, const std::string &v, Target &t) {
            t.*member = static_cast<Int>(integerIn(flag, v, low, high));
          },
          recordMember(member)};
}
/// One of `choices` into a member; recorded by its word.
template <typename Target, typename T>
Stored<Target> storeChoice(T Target::*member, std::vector<std::pair<std::string, T>> choices) {
  return {[=](const std::string &flag, const std::string &v, Target &t) {
            t.*member = choice(flag, v, choices);
          },
          [=](const Target &t) {
            for (const auto &[word, value] : choices)
              if (value == t.*member)
                return nlohmann::json(word);
            return nlohmann::json(nullptr);
          }};
}
/// Items of a comma-separated value appended to a list member (the option may repeat).
template <typename Target> Stored<Target> appendList(std::vector<std::string> Target::*member) {
  return {[member](const std::string &, const std::string &v, Target &t) {
            for (std::string &item : listOf(v))
              (t.*member).push_back(std::move(item));
          },
          recordMember(member)};
}

/// Appends the files a value names: the value itself where a file of that name exists (a
/// path may hold a comma), else each comma-separated item.
template <typename Target> Stored<Target> appendPaths(std::vector<std::string> Target::*member) {
  return {[member](const std::string &, const std::string &v, Target &t) {
            if (isFile(v)) {
              (t.*member).push_back(v);
              return;
            }
            for (std::string &item : listOf(v))
              (t.*member).push_back(std::move(item));
          },
          recordMember(member)};
}

/// "on" and "off" as a bool.
inline const std::vector<std::pair<std::string, bool>> &onOff() {
  static const std::vector<std::pair<std::string, bool>> c = {{"on", true}, {"off", false}};
  return c;
}

} // namespace ganc
