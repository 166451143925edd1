// The code-point view of UTF-8 text that chat templates need to behave like Python's str: indexing,
// slicing and length count code points, strip() and split() know Unicode whitespace, repr() knows
// which characters are printable.
//
// Text that is not valid UTF-8 still round-trips: each byte that does not begin a valid sequence is
// one code point of its own, U+DC80..U+DCFF (Python's "surrogateescape"), written back as the byte.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace specrun::chat::jinja {

struct CodePoint {
  char32_t value = 0;
  size_t size = 0;  // bytes it takes in the text
};

// The code point that starts at `offset` (< text.size()).
CodePoint decode_at(std::string_view text, size_t offset);

// Appends `value` as UTF-8 (an escaped byte U+DC80..U+DCFF as that byte).
void append_utf8(std::string& out, char32_t value);

// The byte offset of every code point, then text.size(): code point i is [offsets[i],
// offsets[i+1]).
std::vector<size_t> code_point_offsets(std::string_view text);

size_t count_code_points(std::string_view text);

// str.isspace() of Python 3.11 for one character.
bool is_space(char32_t value);

// str.isprintable() of Python 3.11 (Unicode 14.0) for one character.
bool is_printable(char32_t value);

// The whole text is whitespace (and not empty), as Python's str.isspace().
bool all_space(std::string_view text);

// Python's str.strip()/lstrip()/rstrip() without arguments: Unicode whitespace removed.
std::string_view strip_space(std::string_view text, bool left, bool right);

}  // namespace specrun::chat::jinja
