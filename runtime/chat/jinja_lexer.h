// Splits a chat template into tokens the way Jinja 2's lexer does under transformers' settings
// (trim_blocks, lstrip_blocks, no keep_trailing_newline): template text with the whitespace
// control applied, and the tokens inside {{ }} and {% %}. Comments and {% raw %} are resolved here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specrun::chat::jinja {

// A template that does not parse, or uses something outside the supported subset.
struct SyntaxError {
  std::string message;
  int line = 0;
};

enum class TokenType : uint8_t {
  kData,  // template text
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,  // text holds the decoded literal
  kInteger,
  kFloat,
  kOperator,  // text holds the operator: + - * / // % ** ~ == != < <= > >= = . : | , ; ( ) [ ] { }
  kEnd,
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string text;
  int line = 1;
  int64_t integer = 0;
  double number = 0;
};

// Throws SyntaxError. The last token is kEnd.
std::vector<Token> tokenize(std::string_view source);

}  // namespace specrun::chat::jinja
