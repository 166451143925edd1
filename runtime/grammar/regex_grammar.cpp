#include "runtime/grammar/regex_grammar.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include "runtime/grammar/gbnf.h"
#include "runtime/text/unicode.h"
#include "specrun/error.hpp"

namespace specrun::grammar {

namespace {

using Ranges = std::vector<CodePointRange>;

const Ranges kDigits = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

Ranges sorted_merged(Ranges ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.first < b.first; });
  Ranges out;
  for (const CodePointRange& range : ranges) {
    if (!out.empty() && range.first <= out.back().last + 1) {
      out.back().last = std::max(out.back().last, range.last);
    } else {
      out.push_back(range);
    }
  }
  return out;
}

// The complement of `ranges` within [0, limit].
Ranges complement(const Ranges& ranges, uint32_t limit) {
  Ranges out;
  uint32_t next = 0;
  for (const CodePointRange& range : sorted_merged(ranges)) {
    if (range.first > limit) break;
    if (range.first > next) out.push_back({next, range.first - 1});
    next = range.last + 1;
  }
  if (next <= limit) out.push_back({next, limit});
  return out;
}

// A code point in a JSON string's body: itself, or its escape where JSON needs one.
std::string json_escape(uint32_t code_point) {
  switch (code_point) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      break;
  }
  char buffer[8];
  std::snprintf(buffer, sizeof(buffer), "\\u%04x", code_point);
  return buffer;
}

bool needs_json_escape(uint32_t code_point) {
  return code_point < 0x20 || code_point == '"' || code_point == '\\';
}

std::string encode(uint32_t code_point) {
  std::string out;
  text::append_utf8(out, code_point);
  return out;
}

// One character of `ranges` as it appears in a JSON string's body: a class of the characters
// written as themselves, and an alternative for each that JSON escapes.
std::string class_expression(const Ranges& ranges) {
  Ranges plain;
  std::vector<std::string> alternatives;
  for (const CodePointRange& range : sorted_merged(ranges)) {
    uint32_t first = range.first;
    while (first <= range.last && first < 0x20) alternatives.push_back(json_escape(first++));
    if (first > range.last) continue;
    for (uint32_t c = first; c <= range.last; ++c) {
      if (c == '"' || c == '\\') {
        if (c > first) plain.push_back({first, c - 1});
        alternatives.push_back(json_escape(c));
        first = c + 1;
      }
      if (c > '\\') break;
    }
    if (first <= range.last) plain.push_back({first, range.last});
  }
  std::string out;
  if (!plain.empty()) out = gbnf_class(plain);
  for (const std::string& escape : alternatives) {
    out += (out.empty() ? "" : " | ") + gbnf_literal(escape);
  }
  if (out.empty()) return "[^\\x00-\\U0010FFFF]";  // an empty class: nothing matches
  return "(" + out + ")";
}

class RegexParser {
 public:
  RegexParser(const std::string& pattern, const std::string& where, const std::string& string_char)
      : where_(where), string_char_(string_char) {
    size_t i = 0;
    while (i < pattern.size()) {
      const auto byte = static_cast<uint8_t>(pattern[i]);
      int length = byte < 0x80 ? 1 : byte < 0xE0 ? 2 : byte < 0xF0 ? 3 : 4;
      uint32_t code_point = length == 1   ? byte
                            : length == 2 ? byte & 0x1F
                            : length == 3 ? byte & 0x0F
                                          : byte & 0x07;
      for (int k = 1; k < length && i + static_cast<size_t>(k) < pattern.size(); ++k) {
        code_point = (code_point << 6) | (static_cast<uint8_t>(pattern[i + k]) & 0x3F);
      }
      text_.push_back(code_point);
      i += static_cast<size_t>(length);
    }
  }

  std::string parse() {
    bool anchored_start = false;
    bool anchored_end = false;
    if (!text_.empty() && text_.front() == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    if (text_.size() > pos_ && text_.back() == '$' &&
        (text_.size() < 2 || text_[text_.size() - 2] != '\\')) {
      anchored_end = true;
      text_.pop_back();
    }
    size_t branches = 0;
    std::string body = parse_alternation(branches);
    if (pos_ < text_.size()) fail("unmatched ')'");
    if (branches > 1 && (anchored_start || anchored_end)) {
      fail("an anchor beside a top-level '|' (write ^(a|b)$)");
    }
    std::string out = "(" + body + ")";
    if (!anchored_start) out = string_char_ + "* " + out;
    if (!anchored_end) out += " " + string_char_ + "*";
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("JSON schema: " + where_ + ": pattern, at character " + std::to_string(pos_ + 1) +
                ": " + what);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  uint32_t peek() const { return at_end() ? 0 : text_[pos_]; }

  std::string parse_alternation(size_t& branches) {
    std::string out = parse_sequence();
    branches = 1;
    while (!at_end() && peek() == '|') {
      ++pos_;
      out += " | " + parse_sequence();
      ++branches;
    }
    return out;
  }

  std::string parse_sequence() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      std::string atom = parse_atom();
      atom = parse_quantifier(atom);
      out += (out.empty() ? "" : " ") + atom;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string parse_quantifier(const std::string& atom) {
    if (at_end()) return atom;
    std::string out;
    const uint32_t c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      out = "(" + atom + ")" + std::string(1, static_cast<char>(c));
    } else if (c == '{') {
      const size_t start = pos_;
      ++pos_;
      auto number = [&]() -> std::optional<long> {
        if (at_end() || peek() < '0' || peek() > '9') return std::nullopt;
        long value = 0;
        while (!at_end() && peek() >= '0' && peek() <= '9') {
          value = value * 10 + (peek() - '0');
          if (value > kMaxRepetition)
            fail("repetition bound above " + std::to_string(kMaxRepetition));
          ++pos_;
        }
        return value;
      };
      const auto low = number();
      if (!low) {
        pos_ = start;
        fail("'{' that is not a repetition {m}, {m,} or {m,n} (escape it as \\{)");
      }
      std::optional<long> high = low;
      if (peek() == ',') {
        ++pos_;
        high = number();
      }
      if (peek() != '}') fail("expected '}' to close the repetition");
      ++pos_;
      if (high && *high < *low) fail("repetition {m,n} with n < m");
      out = "(" + atom + "){" + std::to_string(*low) +
            (high == low ? "" : "," + (high ? std::to_string(*high) : "")) + "}";
    } else {
      return atom;
    }
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
    if (!at_end() && (peek() == '+' || peek() == '*' || peek() == '{')) {
      fail("a quantifier after a quantifier (possessive or nested repetition) is not supported");
    }
    return out;
  }

  std::string parse_atom() {
    const uint32_t c = peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (peek() == '?') {
          if (pos_ + 1 < text_.size() && text_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            fail(
                "lookarounds and named or flagged groups ((?=, (?!, (?<, (?P, (?i) are not "
                "supported");
          }
        }
        size_t branches = 0;
        std::string inner = parse_alternation(branches);
        if (peek() != ')') fail("expected ')' to close the group");
        ++pos_;
        return "(" + inner + ")";
      }
      case '[':
        return class_expression(parse_class());
      case '.':
        ++pos_;
        return class_expression(complement({{'\n', '\n'}}, 0x10FFFF));
      case '^':
      case '$':
        fail("anchors are supported only at the start (^) and end ($) of the pattern");
      case '*':
      case '+':
      case '?':
      case '{':
        fail("a quantifier with nothing to repeat");
      case '\\': {
        bool negated = false;
        const Ranges ranges = parse_escape(/*in_class=*/false, negated);
        if (!negated) return class_expression(ranges);
        Ranges excluded = ranges;
        excluded.push_back({0, 0x1F});  // Python's \s has \x1c-\x1f: printable ASCII only
        return class_expression(complement(excluded, 0x7E));
      }
      default:
        ++pos_;
        return needs_json_escape(c) ? gbnf_literal(json_escape(c)) : gbnf_literal(encode(c));
    }
  }

  // After a '\\': the characters it stands for; `negated` for \D \W \S (their complements in
  // printable ASCII: Python's \W excludes Unicode letters, so only ASCII is surely outside \w).
  Ranges parse_escape(bool in_class, bool& negated) {
    ++pos_;
    if (at_end()) fail("a trailing '\\'");
    const uint32_t c = peek();
    ++pos_;
    negated = false;
    switch (c) {
      case 'd':
        return kDigits;
      case 'w':
        return kWord;
      case 's':
        return kSpace;
      case 'D':
      case 'W':
      case 'S':
        if (in_class) fail("\\D, \\W and \\S inside a class are not supported");
        negated = true;
        return c == 'D' ? kDigits : c == 'W' ? kWord : kSpace;
      case 't':
        return {{'\t', '\t'}};
      case 'n':
        return {{'\n', '\n'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case 'x':
      case 'u': {
        const int digits = c == 'x' ? 2 : 4;
        uint32_t value = 0;
        for (int k = 0; k < digits; ++k) {
          const uint32_t h = peek();
          const int digit = h >= '0' && h <= '9'   ? static_cast<int>(h - '0')
                            : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
                            : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10)
                                                   : -1;
          if (digit < 0)
            fail("expected hex digits after \\" + std::string(1, static_cast<char>(c)));
          value = value * 16 + static_cast<uint32_t>(digit);
          ++pos_;
        }
        return {{value, value}};
      }
      case 'b':
      case 'B':
      case 'A':
      case 'Z':
      case 'z':
        if (in_class && c == 'b') return {{'\b', '\b'}};
        fail("\\" + std::string(1, static_cast<char>(c)) +
             " (a boundary or anchor) is not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
          fail("unknown escape \\" + std::string(1, static_cast<char>(c)));
        }
        return {{c, c}};  // escaped punctuation: itself
    }
  }

  Ranges parse_class() {
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges ranges;
    bool first = true;
    while (true) {
      if (at_end()) fail("unterminated character class: expected ']'");
      if (peek() == ']' && !first) break;
      first = false;
      Ranges item;
      if (peek() == '\\') {
        bool escape_negated = false;
        const size_t at = pos_;
        item = parse_escape(/*in_class=*/true, escape_negated);
        if (negated && item.size() > 1) {
          pos_ = at;
          fail("\\d, \\w or \\s inside a negated class is not supported");
        }
      } else {
        item = {{peek(), peek()}};
        ++pos_;
      }
      if (item.size() == 1 && item[0].first == item[0].last && peek() == '-' &&
          pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        Ranges high;
        if (peek() == '\\') {
          bool escape_negated = false;
          high = parse_escape(/*in_class=*/true, escape_negated);
        } else {
          high = {{peek(), peek()}};
          ++pos_;
        }
        if (high.size() != 1 || high[0].first != high[0].last || high[0].first < item[0].first) {
          fail("bad character range in a class");
        }
        item[0].last = high[0].first;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    ++pos_;  // ']'
    return negated ? complement(ranges, 0x10FFFF) : ranges;
  }

  const std::string& where_;        // the pattern's JSON path, for errors
  const std::string& string_char_;  // the rule of any JSON string character
  std::vector<uint32_t> text_;      // the pattern's code points
  size_t pos_ = 0;                  // the next one
};

}  // namespace

std::string regex_to_gbnf(const std::string& pattern, const std::string& where,
                          const std::string& string_char) {
  return RegexParser(pattern, where, string_char).parse();
}

}  // namespace specrun::grammar
