#include "runtime/chat/jinja_lexer.h"

#include <charconv>
#include <cstdio>
#include <limits>
#include <system_error>

#include "runtime/chat/jinja_unicode.h"

namespace specrun::chat::jinja {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Jinja normalizes \r\n and \r to \n and drops one trailing newline before lexing.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : source_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < source_.size()) lex_text();
    push(TokenType::kEnd, "");
    return std::move(tokens_);
  }

 private:
  enum class Tag { kVariable, kBlock, kComment, kRaw };

  [[noreturn]] void fail(const std::string& message) const { throw SyntaxError{message, line_}; }

  void advance_to(size_t target) {
    for (; pos_ < target; ++pos_) {
      if (source_[pos_] == '\n') ++line_;
    }
  }

  bool at(size_t offset, std::string_view text) const {
    return source_.compare(offset, text.size(), text) == 0;
  }

  Token& push(TokenType type, std::string text) {
    Token token;
    token.type = type;
    token.text = std::move(text);
    token.line = line_;
    tokens_.push_back(std::move(token));
    return tokens_.back();
  }

  // Skips Unicode whitespace from pos_; returns whether the last character skipped was '\n'.
  bool skip_space() {
    bool newline_last = false;
    while (pos_ < source_.size()) {
      const CodePoint point = decode_at(source_, pos_);
      if (!is_space(point.value)) break;
      newline_last = point.value == '\n';
      advance_to(pos_ + point.size);
    }
    return newline_last;
  }

  // `{% raw %}` (with its whitespace control) starting at `offset`: the end of the tag, or npos.
  size_t raw_begin_end(size_t offset, bool& strip_after) const {
    size_t i = offset + 2;
    if (i < source_.size() && (source_[i] == '-' || source_[i] == '+')) ++i;
    while (i < source_.size() && is_space(decode_at(source_, i).value)) {
      i += decode_at(source_, i).size;
    }
    if (!at(i, "raw")) return std::string::npos;
    i += 3;
    while (i < source_.size() && is_space(decode_at(source_, i).value)) {
      i += decode_at(source_, i).size;
    }
    strip_after = at(i, "-%}");
    if (strip_after) return i + 3;
    if (at(i, "%}")) return i + 2;
    return std::string::npos;
  }

  // Template text up to the next tag, with the tag's whitespace control applied to it, then the
  // tag.
  void lex_text() {
    size_t tag_at = pos_;
    Tag tag = Tag::kVariable;
    for (; tag_at + 1 < source_.size(); ++tag_at) {
      if (source_[tag_at] != '{') continue;
      const char next = source_[tag_at + 1];
      if (next == '{') {
        tag = Tag::kVariable;
        break;
      }
      if (next == '#') {
        tag = Tag::kComment;
        break;
      }
      if (next == '%') {
        bool unused = false;
        tag = raw_begin_end(tag_at, unused) != std::string::npos ? Tag::kRaw : Tag::kBlock;
        break;
      }
    }
    if (tag_at + 1 >= source_.size()) {  // no tag: the rest is text
      push(TokenType::kData, source_.substr(pos_));
      advance_to(source_.size());
      return;
    }
    const char sign = tag_at + 2 < source_.size() ? source_[tag_at + 2] : '\0';
    std::string_view text(source_.data() + pos_, tag_at - pos_);
    text = apply_left_control(text, sign, tag != Tag::kVariable);
    if (!text.empty()) push(TokenType::kData, std::string(text));
    advance_to(tag_at);
    switch (tag) {
      case Tag::kVariable:
        advance_to(pos_ + 2 + (sign == '-' || sign == '+' ? 1 : 0));
        push(TokenType::kVariableBegin, "{{");
        lex_inside(TokenType::kVariableEnd);
        break;
      case Tag::kBlock:
        advance_to(pos_ + 2 + (sign == '-' || sign == '+' ? 1 : 0));
        push(TokenType::kBlockBegin, "{%");
        lex_inside(TokenType::kBlockEnd);
        break;
      case Tag::kComment:
        lex_comment();
        break;
      case Tag::kRaw:
        lex_raw();
        break;
    }
  }

  // `{%-` strips all whitespace before the tag; without `+`, lstrip_blocks strips the spaces
  // between the start of the line and a block or comment tag.
  std::string_view apply_left_control(std::string_view text, char sign, bool lstrip) const {
    if (sign == '-') return strip_space(text, false, true);
    if (sign == '+' || !lstrip) return text;
    const size_t newline = text.rfind('\n');
    const size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    if ((line_start > 0 || line_starting_) && all_space(text.substr(line_start))) {
      return text.substr(0, line_start);
    }
    return text;
  }

  void lex_comment() {
    const int start_line = line_;
    for (size_t i = pos_ + 2; i + 1 < source_.size(); ++i) {
      if (source_[i] == '+' && at(i + 1, "#}")) {
        advance_to(i + 3);
        line_starting_ = false;
        return;
      }
      if (source_[i] == '-' && at(i + 1, "#}")) {
        advance_to(i + 3);
        line_starting_ = skip_space();
        return;
      }
      if (at(i, "#}")) {
        advance_to(i + 2);
        finish_block_end();
        return;
      }
    }
    throw SyntaxError{"missing end of comment tag ('#}')", start_line};
  }

  // After `%}` or `#}`: trim_blocks removes one newline.
  void finish_block_end() {
    line_starting_ = false;
    if (pos_ < source_.size() && source_[pos_] == '\n') {
      advance_to(pos_ + 1);
      line_starting_ = true;
    }
  }

  void lex_raw() {
    const int start_line = line_;
    bool strip_after = false;
    advance_to(raw_begin_end(pos_, strip_after));
    line_starting_ = strip_after ? skip_space() : false;
    for (size_t i = pos_; i + 1 < source_.size(); ++i) {
      if (!at(i, "{%")) continue;
      size_t j = i + 2;
      const char sign = j < source_.size() ? source_[j] : '\0';
      if (sign == '-' || sign == '+') ++j;
      while (j < source_.size() && is_space(decode_at(source_, j).value)) {
        j += decode_at(source_, j).size;
      }
      if (!at(j, "endraw")) continue;
      j += 6;
      while (j < source_.size() && is_space(decode_at(source_, j).value)) {
        j += decode_at(source_, j).size;
      }
      const bool keep = at(j, "+%}");
      const bool strip = at(j, "-%}");
      if (!keep && !strip && !at(j, "%}")) continue;
      std::string_view text(source_.data() + pos_, i - pos_);
      text = apply_left_control(text, sign, true);
      if (!text.empty()) push(TokenType::kData, std::string(text));
      advance_to(j + (keep || strip ? 3 : 2));
      if (strip) {
        line_starting_ = skip_space();
      } else if (keep) {
        line_starting_ = false;
      } else {
        finish_block_end();
      }
      return;
    }
    throw SyntaxError{"missing end of raw block ('{% endraw %}')", start_line};
  }

  // The tokens of one {{ }} or {% %} up to its end, which is only recognized with brackets
  // balanced (so `{{ {'a': {'b': 1}}}}` ends at the last two braces).
  void lex_inside(TokenType end) {
    const int start_line = line_;
    std::string brackets;  // the closing brackets expected, innermost last
    const std::string_view close = end == TokenType::kBlockEnd ? "%}" : "}}";
    while (true) {
      if (pos_ >= source_.size()) {
        throw SyntaxError{
            "unexpected end of template inside a tag: missing '" + std::string(close) + "'",
            start_line};
      }
      if (brackets.empty()) {
        if (end == TokenType::kBlockEnd && source_[pos_] == '+' && at(pos_ + 1, close)) {
          advance_to(pos_ + 3);
          push(end, std::string(close));
          line_starting_ = false;
          return;
        }
        if (source_[pos_] == '-' && at(pos_ + 1, close)) {
          advance_to(pos_ + 3);
          push(end, std::string(close));
          line_starting_ = skip_space();
          return;
        }
        if (at(pos_, close)) {
          advance_to(pos_ + 2);
          push(end, std::string(close));
          if (end == TokenType::kBlockEnd) {
            finish_block_end();
          } else {
            line_starting_ = false;
          }
          return;
        }
      }
      const CodePoint point = decode_at(source_, pos_);
      if (is_space(point.value)) {
        skip_space();
        continue;
      }
      const char c = source_[pos_];
      if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t i = pos_;
        while (i < source_.size() && is_name_char(source_[i])) ++i;
        push(TokenType::kName, source_.substr(pos_, i - pos_));
        advance_to(i);
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(brackets);
      }
    }
  }

  // `\d+(_\d+)*` from `i`: its end, or npos when there is no digit.
  size_t digits_end(size_t i) const {
    if (i >= source_.size() || !is_digit(source_[i])) return std::string::npos;
    while (true) {
      while (i < source_.size() && is_digit(source_[i])) ++i;
      if (i + 1 < source_.size() && source_[i] == '_' && is_digit(source_[i + 1])) {
        ++i;
        continue;
      }
      return i;
    }
  }

  // The end of a float literal at pos_ (Jinja's float_re), or npos.
  size_t float_end() const {
    if (pos_ > 0 && source_[pos_ - 1] == '.') return std::string::npos;
    const size_t whole = digits_end(pos_);
    size_t i = whole;
    bool fraction = false;
    if (i < source_.size() && source_[i] == '.') {
      const size_t after = digits_end(i + 1);
      if (after != std::string::npos) {
        i = after;
        fraction = true;
      }
    }
    if (i < source_.size() && (source_[i] == 'e' || source_[i] == 'E')) {
      size_t j = i + 1;
      if (j < source_.size() && (source_[j] == '+' || source_[j] == '-')) ++j;
      const size_t after = digits_end(j);
      if (after != std::string::npos) return after;
    }
    return fraction ? i : std::string::npos;
  }

  void lex_number() {
    const size_t float_stop = float_end();
    if (float_stop != std::string::npos) {
      std::string digits;
      for (size_t i = pos_; i < float_stop; ++i) {
        if (source_[i] != '_') digits += source_[i];
      }
      Token& token = push(TokenType::kFloat, source_.substr(pos_, float_stop - pos_));
      const auto parsed =
          std::from_chars(digits.data(), digits.data() + digits.size(), token.number);
      if (parsed.ec == std::errc::result_out_of_range) {
        // Python reads an exponent past the double range as inf, one below it as 0.0.
        const size_t e = digits.find_first_of("eE");
        const bool negative_exponent =
            e != std::string::npos && e + 1 < digits.size() && digits[e + 1] == '-';
        token.number = negative_exponent ? 0.0 : std::numeric_limits<double>::infinity();
      }
      advance_to(float_stop);
      return;
    }
    // Jinja's integer_re: 0b/0o/0x followed by (_?digit)+, [1-9](_?\d)*, or 0(_?0)*.
    const size_t size = source_.size();
    const auto lower = [&](size_t at) {
      return at < size ? static_cast<char>(source_[at] | 0x20) : '\0';
    };
    const auto digit_value = [](char c) -> int {
      c = static_cast<char>(c | 0x20);
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return 99;
    };
    std::string digits;
    // (_?digit)+ from `start` in `base`, `only_zero` for 0(_?0)*: the end, or npos for none.
    const auto take = [&](size_t start, int base, bool only_zero) {
      size_t j = start;
      bool any = false;
      while (true) {
        const size_t digit_at = j < size && source_[j] == '_' ? j + 1 : j;
        if (digit_at >= size || digit_value(source_[digit_at]) >= base ||
            (only_zero && source_[digit_at] != '0')) {
          break;
        }
        digits += source_[digit_at];
        j = digit_at + 1;
        any = true;
      }
      return any ? j : std::string::npos;
    };
    int base = 10;
    size_t end = std::string::npos;
    const char prefix = lower(pos_ + 1);
    if (source_[pos_] == '0' && (prefix == 'b' || prefix == 'o' || prefix == 'x')) {
      base = prefix == 'b' ? 2 : prefix == 'o' ? 8 : 16;
      end = take(pos_ + 2, base, false);
      if (end == std::string::npos) digits.clear();
    }
    if (end == std::string::npos) {
      base = 10;
      digits = source_.substr(pos_, 1);
      const bool zero = source_[pos_] == '0';
      end = take(pos_ + 1, 10, zero);
      if (end == std::string::npos) end = pos_ + 1;
      if (zero) digits = "0";
    }
    int64_t value = 0;
    for (const char c : digits) {
      const int digit = digit_value(c);
      if (value > (std::numeric_limits<int64_t>::max() - digit) / base) {
        fail("integer literal " + source_.substr(pos_, end - pos_) + " exceeds 64 bits");
      }
      value = value * base + digit;
    }
    Token& token = push(TokenType::kInteger, source_.substr(pos_, end - pos_));
    token.integer = value;
    advance_to(end);
  }

  // A quoted literal, unescaped as Jinja does: Python's unicode-escape decoding of the text.
  void lex_string() {
    const char quote = source_[pos_];
    size_t end = pos_ + 1;
    while (end < source_.size() && source_[end] != quote) {
      end += source_[end] == '\\' ? 2 : 1;
    }
    if (end >= source_.size()) fail("unterminated string literal");
    const std::string_view body(source_.data() + pos_ + 1, end - pos_ - 1);
    std::string value;
    for (size_t i = 0; i < body.size();) {
      if (body[i] != '\\') {
        const size_t size = decode_at(body, i).size;
        value.append(body.substr(i, size));
        i += size;
        continue;
      }
      const CodePoint escaped = decode_at(body, i + 1);
      i += 1 + escaped.size;
      const auto hex = [&](int count) {
        char32_t code = 0;
        for (int k = 0; k < count; ++k, ++i) {
          const char c = i < body.size() ? static_cast<char>(body[i] | 0x20) : '\0';
          int digit = -1;
          if (c >= '0' && c <= '9') digit = c - '0';
          if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
          if (digit < 0) {
            fail(count == 2   ? "truncated \\xXX escape"
                 : count == 4 ? "truncated \\uXXXX escape"
                              : "truncated \\UXXXXXXXX escape");
          }
          code = code * 16 + static_cast<char32_t>(digit);
        }
        if (code > 0x10FFFF) fail("illegal Unicode character");
        return code;
      };
      switch (escaped.value) {
        case '\n':
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'n':
          value += '\n';
          break;
        case 'r':
          value += '\r';
          break;
        case 't':
          value += '\t';
          break;
        case 'v':
          value += '\v';
          break;
        case 'x':
          append_utf8(value, hex(2));
          break;
        case 'u':
          append_utf8(value, hex(4));
          break;
        case 'U':
          append_utf8(value, hex(8));
          break;
        case 'N':
          fail("named Unicode escapes (\\N{...}) are not supported");
        default:
          if (escaped.value >= '0' && escaped.value <= '7') {
            char32_t code = escaped.value - '0';
            for (int k = 0; k < 2 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++k) {
              code = code * 8 + static_cast<char32_t>(body[i++] - '0');
            }
            append_utf8(value, code);
          } else if (escaped.value >= 0x80) {
            // Jinja first writes a non-ASCII character as its \x, \u or \U escape, so a
            // backslash before one stays a backslash followed by that escape's text.
            char buffer[16];
            if (escaped.value <= 0xFF) {
              std::snprintf(buffer, sizeof(buffer), "\\x%02x",
                            static_cast<unsigned>(escaped.value));
            } else if (escaped.value <= 0xFFFF) {
              std::snprintf(buffer, sizeof(buffer), "\\u%04x",
                            static_cast<unsigned>(escaped.value));
            } else {
              std::snprintf(buffer, sizeof(buffer), "\\U%08x",
                            static_cast<unsigned>(escaped.value));
            }
            value += buffer;
          } else {
            value += '\\';
            append_utf8(value, escaped.value);
          }
      }
    }
    push(TokenType::kString, std::move(value));
    advance_to(end + 1);
  }

  void lex_operator(std::string& brackets) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const std::string_view op : kTwo) {
      if (at(pos_, op)) {
        push(TokenType::kOperator, std::string(op));
        advance_to(pos_ + 2);
        return;
      }
    }
    const char c = source_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      const CodePoint point = decode_at(source_, pos_);
      std::string shown;
      append_utf8(shown, point.value);
      fail("unexpected character '" + shown + "'");
    }
    if (c == '(') brackets += ')';
    if (c == '[') brackets += ']';
    if (c == '{') brackets += '}';
    if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty()) fail(std::string("unexpected '") + c + "'");
      if (brackets.back() != c) {
        fail(std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
      }
      brackets.pop_back();
    }
    push(TokenType::kOperator, std::string(1, c));
    advance_to(pos_ + 1);
  }

  std::string source_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  return Lexer(source).run();
}

}  // namespace specrun::chat::jinja
