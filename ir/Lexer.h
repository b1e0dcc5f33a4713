// The tokens of ganc's IR text: names, quoted strings, integers, numbers, punctuation, with
// the line they are on for errors. The parser (Parser.cpp) reads the IR with them.
#pragma once

#include "support/Status.h"
#include "support/TextFormat.h"

#include <cctype>
#include <cstdlib>
#include <string>

namespace ganc::ir {

class Lexer {
protected:
  explicit Lexer(const std::string &text) : text_(text) {}

  void skipSpace() {
    while (pos_ < text_.size()) {
      if (std::isspace(static_cast<unsigned char>(text_[pos_]))) {
        if (text_[pos_] == '\n')
          ++line_;
        ++pos_;
      } else if (text_.compare(pos_, 2, "//") == 0) {
        while (pos_ < text_.size() && text_[pos_] != '\n')
          ++pos_;
      } else {
        break;
      }
    }
  }

  Status error(const std::string &message) const { return errorAt(line_, message); }

  Status errorAt(int line, const std::string &message) const {
    return Status::error("line " + std::to_string(line) + ": " + message);
  }

  bool peek(char c) {
    skipSpace();
    return pos_ < text_.size() && text_[pos_] == c;
  }

  Status expect(char c) {
    if (!peek(c))
      return error(std::string("expected '") + c + "'" +
                   (pos_ < text_.size() ? std::string(", got '") + text_[pos_] + "'" : ""));
    ++pos_;
    return Status::ok();
  }

  static bool isNameChar(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  }

  /// Names of ops, types and keywords; "::" may appear inside ("aten::conv2d"), a lone ':' not.
  std::string identifier() {
    skipSpace();
    size_t start = pos_;
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ':') {
        if (text_.compare(pos_, 2, "::") != 0)
          break;
        pos_ += 2;
        continue;
      }
      if (!isNameChar(c))
        break;
      ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  bool peekWord(const std::string &word) {
    skipSpace();
    return text_.compare(pos_, word.size(), word) == 0 &&
           (pos_ + word.size() >= text_.size() || !isNameChar(text_[pos_ + word.size()]));
  }

  Status expectWord(const std::string &word) {
    if (!peekWord(word))
      return error("expected '" + word + "'");
    pos_ += word.size();
    return Status::ok();
  }

  /// A name without a sigil (an owner, a group, a stage's submodule): an identifier, or a
  /// quoted string where the printer quoted it.
  std::string bareName() {
    if (peek('"')) {
      std::string out;
      return string(out) ? out : std::string();
    }
    return identifier();
  }

  /// A name after its sigil: bare (letters, digits, '_', '.'), or a quoted string for any
  /// other name (the printer quotes those).
  Status sigilName(char sigil, std::string &out) {
    GANC_TRY(expect(sigil));
    if (pos_ < text_.size() && text_[pos_] == '"') {
      GANC_TRY(string(out));
      if (out.empty())
        return error(std::string("expected a name after '") + sigil + "'");
      return Status::ok();
    }
    size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                   text_[pos_] == '_' || text_[pos_] == '.'))
      ++pos_;
    if (start == pos_)
      return error(std::string("expected a name after '") + sigil + "'");
    out = text_.substr(start, pos_ - start);
    return Status::ok();
  }

  Status symbol(std::string &out) { return sigilName('@', out); }

  Status string(std::string &out) {
    GANC_TRY(expect('"'));
    out.clear();
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (c == '\\' && pos_ < text_.size()) {
        c = text_[pos_++];
        if (c == 'n')
          c = '\n';
      }
      out += c;
    }
    if (pos_ >= text_.size())
      return error("unterminated string");
    ++pos_;
    return Status::ok();
  }

  Status integer(int64_t &out) {
    skipSpace();
    size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-')
      ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])))
      ++pos_;
    if (start == pos_ || (pos_ == start + 1 && text_[start] == '-'))
      return error("expected an integer");
    auto value = parseInt64(text_.substr(start, pos_ - start));
    if (!value)
      return error("integer " + text_.substr(start, pos_ - start) + " is out of range");
    out = *value;
    return Status::ok();
  }

  /// A floating-point number as formatDouble prints it ("2.0", "1e-06", "inf").
  Status number(double &out) {
    skipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                   text_[pos_] == '.' || text_[pos_] == '-' || text_[pos_] == '+'))
      ++pos_;
    std::string token = text_.substr(start, pos_ - start);
    char *end = nullptr;
    out = std::strtod(token.c_str(), &end);
    if (token.empty() || end != token.c_str() + token.size())
      return error("expected a number, got '" + token + "'");
    return Status::ok();
  }

  const std::string &text_;
  size_t pos_ = 0;
  int line_ = 1;
};

} // namespace ganc::ir
