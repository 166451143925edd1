#include "runtime/grammar/gbnf.h"

#include <cstdio>
#include <map>
#include <optional>
#include <vector>

#include "runtime/text/unicode.h"
#include "specrun/error.hpp"

namespace specrun::grammar {

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string utf8_of(uint32_t code_point) {
  std::string out;
  text::append_utf8(out, code_point);
  return out;
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  std::shared_ptr<const Grammar> parse(const std::string& root_rule) {
    skip_space();
    if (at_end()) fail("the grammar is empty: expected a rule such as 'root ::= ...'");
    while (!at_end()) {
      parse_rule();
      skip_space();
    }
    return builder_.build(root_rule, source_);
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }

  // "line L, column C" of byte offset `at`, the column counting characters from 1.
  std::string where(size_t at) const {
    size_t line = 1;
    size_t column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else if ((static_cast<uint8_t>(text_[i]) & 0xC0) != 0x80) {
        ++column;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    throw Error(source_ + ": " + where(at) + ": " + what);
  }

  // What is at the current position, for "expected X, found Y".
  std::string found() const {
    if (at_end()) return "the end of the input";
    const char c = peek();
    if (c == '\n') return "the end of the line";
    if (static_cast<uint8_t>(c) < 0x20 || static_cast<uint8_t>(c) >= 0x80) return "a character";
    return "'" + std::string(1, c) + "'";
  }

  // Spaces, tabs, newlines and comments.
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // Whether a rule definition (`name ::=`) starts here: the end of the previous rule's body.
  bool at_rule_start() const {
    size_t at = pos_;
    while (at < text_.size() && is_name_char(text_[at])) ++at;
    if (at == pos_) return false;
    while (at < text_.size() && (text_[at] == ' ' || text_[at] == '\t')) ++at;
    return text_.substr(at, 3) == "::=";
  }

  void parse_rule() {
    const size_t start = pos_;
    const std::string name = parse_name();
    if (name.empty()) fail("expected a rule name (letters, digits, '-', '_'), found " + found());
    while (peek() == ' ' || peek() == '\t') ++pos_;
    if (text_.substr(pos_, 3) != "::=") {
      fail("expected '::=' after rule name '" + name + "', found " + found());
    }
    pos_ += 3;
    const uint32_t rule = builder_.rule(name);
    if (builder_.is_defined(rule)) {
      fail_at(start, "rule '" + name + "' is defined twice (first at " + defined_at_[rule] + ")");
    }
    defined_at_[rule] = where(start);
    builder_.define(rule, where(start));
    parse_alternates(rule, /*nested=*/false);
    if (!at_end() && peek() == ')') fail("unmatched ')'");
  }

  void parse_alternates(uint32_t rule, bool nested) {
    builder_.add_alternative(rule, parse_sequence(nested));
    while (peek() == '|') {
      ++pos_;
      builder_.add_alternative(rule, parse_sequence(nested));
    }
  }

  std::vector<Symbol> parse_sequence(bool nested) {
    std::vector<Symbol> sequence;
    while (true) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')') break;
      if (!nested && at_rule_start()) break;
      const size_t item_start = pos_;
      std::vector<Symbol> item = parse_item();
      while (true) {
        const char c = peek();
        if (c == '*') {
          ++pos_;
          item = repeat(item, 0, std::nullopt, item_start);
        } else if (c == '+') {
          ++pos_;
          item = repeat(item, 1, std::nullopt, item_start);
        } else if (c == '?') {
          ++pos_;
          item = repeat(item, 0, 1, item_start);
        } else if (c == '{') {
          const auto [low, high] = parse_bounds();
          item = repeat(item, low, high, item_start);
        } else {
          break;
        }
      }
      sequence.insert(sequence.end(), item.begin(), item.end());
    }
    return sequence;
  }

  std::vector<Symbol> parse_item() {
    const char c = peek();
    std::vector<Symbol> item;
    if (c == '"') {
      ++pos_;
      std::string literal;
      while (true) {
        if (at_end()) fail("unterminated string literal: expected '\"'");
        if (peek() == '"') break;
        literal += utf8_of(parse_char());
      }
      ++pos_;
      GrammarBuilder::append_literal(literal, item);
    } else if (c == '[') {
      ++pos_;
      bool negated = false;
      if (peek() == '^') {
        negated = true;
        ++pos_;
      }
      std::vector<CodePointRange> ranges;
      while (true) {
        if (at_end()) fail("unterminated character class: expected ']'");
        if (peek() == ']') break;
        const uint32_t first = parse_char();
        uint32_t last = first;
        if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
          ++pos_;
          const size_t at = pos_;
          last = parse_char();
          if (last < first) fail_at(at, "character range is out of order (end before start)");
        }
        ranges.push_back({first, last});
      }
      ++pos_;
      builder_.append_class(std::move(ranges), negated, item);
    } else if (c == '.') {
      ++pos_;
      builder_.append_class({}, /*negated=*/true, item);
    } else if (c == '(') {
      ++pos_;
      const uint32_t group = builder_.fresh_rule("group", where(pos_ - 1));
      parse_alternates(group, /*nested=*/true);
      if (peek() != ')') fail("expected ')' to close the group, found " + found());
      ++pos_;
      item.push_back(Symbol::of_rule(group));
    } else if (is_name_char(c)) {
      const size_t start = pos_;
      const std::string name = parse_name();
      const uint32_t rule = builder_.rule(name);
      builder_.note_reference(rule, where(start));
      item.push_back(Symbol::of_rule(rule));
    } else {
      fail("expected a rule name, a string, a character class, '(' or '.', found " + found());
    }
    return item;
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  uint32_t parse_char() {
    const size_t start = pos_;
    const auto byte = static_cast<uint8_t>(peek());
    if (byte == '\\') {
      ++pos_;
      const char escape = peek();
      if (at_end()) fail("unterminated escape sequence");
      ++pos_;
      switch (escape) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
          return static_cast<uint8_t>(escape);
        case 'x':
          return parse_hex(2, start);
        case 'u':
          return parse_hex(4, start);
        case 'U':
          return parse_hex(8, start);
        default:
          fail_at(start, "unknown escape '\\" + std::string(1, escape) +
                             "' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH)");
      }
    }
    int length = 1;
    uint32_t code_point = byte;
    if (byte >= 0xF0 && byte < 0xF8) {
      length = 4;
      code_point = byte & 0x07;
    } else if (byte >= 0xE0) {
      length = 3;
      code_point = byte & 0x0F;
    } else if (byte >= 0xC2) {
      length = 2;
      code_point = byte & 0x1F;
    } else if (byte >= 0x80) {
      fail("invalid UTF-8 in the grammar");
    }
    if (byte >= 0xF8) fail("invalid UTF-8 in the grammar");
    ++pos_;
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<uint8_t>(peek());
      if (at_end() || (next & 0xC0) != 0x80) fail_at(start, "invalid UTF-8 in the grammar");
      code_point = (code_point << 6) | (next & 0x3F);
      ++pos_;
    }
    return code_point;
  }

  uint32_t parse_hex(int digits, size_t start) {
    uint32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      const int digit = hex_value(peek());
      if (digit < 0) {
        fail("expected " + std::to_string(digits) + " hex digits in the escape, found " + found());
      }
      value = value * 16 + static_cast<uint32_t>(digit);
      ++pos_;
    }
    if (value > 0x10FFFF) fail_at(start, "escape names no Unicode code point (above U+10FFFF)");
    return value;
  }

  // {m}, {m,}, {m,n}
  std::pair<int, std::optional<int>> parse_bounds() {
    const size_t start = pos_;
    ++pos_;
    auto number = [&]() -> std::optional<int> {
      while (peek() == ' ') ++pos_;
      if (peek() < '0' || peek() > '9') return std::nullopt;
      long value = 0;
      while (peek() >= '0' && peek() <= '9') {
        value = value * 10 + (peek() - '0');
        if (value > kMaxRepetition) {
          fail_at(start, "repetition bound above " + std::to_string(kMaxRepetition));
        }
        ++pos_;
      }
      while (peek() == ' ') ++pos_;
      return static_cast<int>(value);
    };
    const std::optional<int> low = number();
    if (!low) fail("expected a number in the repetition bounds {m,n}, found " + found());
    std::optional<int> high = low;
    if (peek() == ',') {
      ++pos_;
      high = number();
    }
    if (peek() != '}') fail("expected '}' to close the repetition bounds, found " + found());
    ++pos_;
    if (high && *high < *low) fail_at(start, "repetition bounds {m,n} with n < m");
    return {*low, high};
  }

  // `item` repeated between `low` and `high` (unbounded: nullopt) times, as rules llama.cpp
  // writes: x{2,4} is x x x-opt, x-opt ::= x x-opt2 | (empty), ...; x* is x-star ::= x x-star |
  // (empty), right-recursive so that the matcher's stacks do not grow with the count.
  std::vector<Symbol> repeat(const std::vector<Symbol>& item, int low, std::optional<int> high,
                             size_t item_start) {
    Symbol unit;
    if (item.size() == 1) {
      unit = item[0];
    } else {
      const uint32_t wrapper = builder_.fresh_rule("group", where(item_start));
      builder_.add_alternative(wrapper, item);
      unit = Symbol::of_rule(wrapper);
    }
    std::vector<Symbol> out(static_cast<size_t>(low), unit);
    if (!high) {
      const uint32_t star = builder_.fresh_rule("repeat", where(item_start));
      builder_.add_alternative(star, {unit, Symbol::of_rule(star)});
      builder_.add_alternative(star, {});
      out.push_back(Symbol::of_rule(star));
    } else if (*high > low) {
      std::optional<uint32_t> inner;
      for (int k = 0; k < *high - low; ++k) {
        const uint32_t optional = builder_.fresh_rule("optional", where(item_start));
        std::vector<Symbol> body = {unit};
        if (inner) body.push_back(Symbol::of_rule(*inner));
        builder_.add_alternative(optional, std::move(body));
        builder_.add_alternative(optional, {});
        inner = optional;
      }
      out.push_back(Symbol::of_rule(*inner));
    }
    return out;
  }

  std::string_view text_;                       // the grammar's text
  const std::string& source_;                   // names it in errors
  size_t pos_ = 0;                              // byte offset of the next character
  GrammarBuilder builder_;                      // the rules so far
  std::map<uint32_t, std::string> defined_at_;  // rule -> where its definition starts
};

// A code point as GBNF writes it inside a literal or class.
std::string gbnf_char(uint32_t code_point, bool in_class) {
  char buffer[16];
  switch (code_point) {
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\\':
      return "\\\\";
    case '"':
      return "\\\"";
    default:
      break;
  }
  if (in_class &&
      (code_point == ']' || code_point == '[' || code_point == '-' || code_point == '^')) {
    return "\\" + std::string(1, static_cast<char>(code_point));
  }
  if (code_point < 0x20 || code_point == 0x7F) {
    std::snprintf(buffer, sizeof(buffer), "\\x%02X", code_point);
    return buffer;
  }
  return utf8_of(code_point);
}

}  // namespace

std::string gbnf_literal(std::string_view utf8) {
  std::string out = "\"";
  for (const char c : utf8) {
    const auto byte = static_cast<uint8_t>(c);
    out += byte >= 0x80 ? std::string(1, c) : gbnf_char(byte, false);
  }
  return out + "\"";
}

std::string gbnf_class(const std::vector<CodePointRange>& ranges, bool negated) {
  std::string out = negated ? "[^" : "[";
  for (const CodePointRange& range : ranges) {
    out += gbnf_char(range.first, true);
    if (range.last > range.first) out += "-" + gbnf_char(range.last, true);
  }
  return out + "]";
}

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, const std::string& source,
                                          const std::string& root_rule) {
  return Parser(text, source).parse(root_rule);
}

}  // namespace specrun::grammar
