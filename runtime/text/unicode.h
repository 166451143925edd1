// UTF-8 and Unicode helpers for the tokenizer: code point iteration, lossy repair of invalid
// UTF-8 (the same replacement rule as Rust's String::from_utf8_lossy and Python's
// bytes.decode(errors="replace")), the character classes the Hugging Face components test (Rust's
// char::is_whitespace, is_numeric, is_punctuation, regex \w) and normalization forms through
// utf8proc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace specrun::text {

// The byte length of the UTF-8 sequence led by `lead` (1 for a stray continuation byte, so that
// iteration over repaired text always advances).
inline size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the code point at `text[i]` and advances `i` past it. `text` must be valid UTF-8.
char32_t next_code_point(std::string_view text, size_t& i);

// The code point that ends just before byte `end` of valid UTF-8 `text` (end > 0).
char32_t last_code_point(std::string_view text, size_t end);

void append_utf8(std::string& out, char32_t code_point);

bool is_valid_utf8(std::string_view bytes);

// Replaces each maximal invalid subsequence with U+FFFD (Unicode's "substitution of maximal
// subparts", which Rust's from_utf8_lossy and the WHATWG decoder both follow).
std::string repair_utf8(std::string_view bytes);

// How many bytes at the end of `bytes` are the valid start of a UTF-8 sequence that is not yet
// complete (0 to 3): the bytes a streaming decoder must hold back until the next token.
size_t incomplete_utf8_suffix(std::string_view bytes);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(char32_t c);
// Rust's char::is_numeric: general categories Nd, Nl and No.
bool is_numeric(char32_t c);
// The tokenizers library's is_punc: ASCII punctuation or any P* general category.
bool is_punctuation(char32_t c);
// The Rust regex crate's Unicode \w: letters, marks, decimal digits, connector punctuation,
// letter numbers and the joiners.
bool is_word_char(char32_t c);
// A combining mark (general category Mn): what StripAccents removes after NFD.
bool is_nonspacing_mark(char32_t c);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// Normalizes valid UTF-8 `text` to `form`.
std::string normalize(std::string_view text, NormalForm form);

// Rust's str::to_lowercase applied character by character (as the Lowercase normalizer does):
// the full lowercase mapping, without the final-sigma context rule.
std::string to_lower(std::string_view text);

}  // namespace specrun::text
