// The table of phase attributes (PhaseAttrs.def): how each reads and prints in the text form,
// the verifier's rule and the line `ganc explain` gives it.
#pragma once

#include "ir/Module.h"

#include <string>
#include <vector>

namespace ganc::ir {

/// What an attribute's parser reads from: the IR parser's tokens.
class AttrReader {
public:
  virtual ~AttrReader() = default;
  virtual Status integer(int64_t &out) = 0;
  virtual Status number(double &out) = 0;
  /// A quoted string.
  virtual Status string(std::string &out) = 0;
  /// A bare word (an identifier); an empty one is an error.
  virtual Status word(std::string &out) = 0;
  /// "[a, b.c]": names without a sigil.
  virtual Status nameList(std::vector<std::string> &out) = 0;
  virtual Status expectWord(const std::string &word) = 0;
};

/// One row of PhaseAttrs.def.
struct PhaseAttr {
  /// The word that opens the attribute's line.
  const char *keyword;
  /// The rest of the line: `{}` a member, `{w}` a member as a bare word, else literal words.
  const char *syntax;
  /// What the attribute means (docs/ir.md and `ganc-opt --attributes`).
  const char *help;
  /// The lines after the indentation ("interval 4"), none when the attribute is not shown.
  std::vector<std::string> (*print)(const Phase &);
  /// Reads what follows the keyword into the phase (an _EACH row appends one element).
  Status (*parse)(Phase &, AttrReader &);
  /// The verifier's rule; the error does not name the phase (the verifier adds it).
  Status (*check)(const Phase &, const Module &);
  /// `ganc explain`'s line for it ("" for none), without indentation or newline.
  std::string (*explain)(const Phase &);
  /// The line's form for the docs: `syntax` with each member as a placeholder ("N", "X",
  /// "\"TEXT\"", "WORD", "[NAMES]").
  std::string (*form)();
};

/// Every phase attribute, in the order the printer writes them.
const std::vector<PhaseAttr> &phaseAttrs();
/// The row opened by `keyword`, or null.
const PhaseAttr *findPhaseAttr(const std::string &keyword);

} // namespace ganc::ir
