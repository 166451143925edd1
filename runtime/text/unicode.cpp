#include "runtime/text/unicode.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "runtime/base/check.h"

namespace specrun::text {
namespace {

// The bounds of the second byte of a sequence led by `lead` (Unicode table 3-7); the later
// continuation bytes are always 80..BF. Returns the sequence length, 0 for a byte that cannot
// lead one.
int sequence_rule(unsigned char lead, unsigned char& low, unsigned char& high) {
  low = 0x80;
  high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
    return 4;
  }
  return 0;
}

// Length of the valid sequence at bytes[i], or the negated count of bytes that form its maximal
// invalid subpart (at least 1).
int scan_sequence(std::string_view bytes, size_t i) {
  const auto lead = static_cast<unsigned char>(bytes[i]);
  if (lead < 0x80) return 1;
  unsigned char low = 0;
  unsigned char high = 0;
  const int length = sequence_rule(lead, low, high);
  if (length == 0) return -1;
  for (int k = 1; k < length; ++k) {
    if (i + k >= bytes.size()) return -k;
    const auto byte = static_cast<unsigned char>(bytes[i + k]);
    if (byte < low || byte > high) return -k;
    low = 0x80;
    high = 0xBF;
  }
  return length;
}

utf8proc_category_t category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

}  // namespace

char32_t next_code_point(std::string_view text, size_t& i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  if (lead < 0x80) {
    ++i;
    return lead;
  }
  const size_t length = utf8_length(lead);
  char32_t c = 0;
  if (length == 2) {
    c = lead & 0x1F;
  } else if (length == 3) {
    c = lead & 0x0F;
  } else if (length == 4) {
    c = lead & 0x07;
  } else {
    ++i;
    return lead;
  }
  for (size_t k = 1; k < length && i + k < text.size(); ++k) {
    c = (c << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  }
  i += length;
  return c;
}

char32_t last_code_point(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

bool is_valid_utf8(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    // Runs of ASCII are the common case: skip them eight bytes at a time.
    while (i + 8 <= bytes.size()) {
      uint64_t word = 0;
      for (int k = 0; k < 8; ++k) word |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i + k]));
      if (word & 0x80) break;
      i += 8;
    }
    if (i >= bytes.size()) break;
    const int length = scan_sequence(bytes, i);
    if (length < 0) return false;
    i += static_cast<size_t>(length);
  }
  return true;
}

std::string repair_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t i = 0;
  while (i < bytes.size()) {
    const int length = scan_sequence(bytes, i);
    if (length > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(length)));
      i += static_cast<size_t>(length);
    } else {
      out += "\xEF\xBF\xBD";
      i += static_cast<size_t>(-length);
    }
  }
  return out;
}

size_t incomplete_utf8_suffix(std::string_view bytes) {
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t start = n - back;
    const auto lead = static_cast<unsigned char>(bytes[start]);
    if ((lead & 0xC0) == 0x80) continue;  // a continuation byte: the lead is further back
    unsigned char low = 0;
    unsigned char high = 0;
    const int length = sequence_rule(lead, low, high);
    if (length <= static_cast<int>(back)) return 0;  // complete, or not a lead at all
    for (size_t k = 1; k < back; ++k) {
      const auto byte = static_cast<unsigned char>(bytes[start + k]);
      if (byte < low || byte > high) return 0;
      low = 0x80;
      high = 0xBF;
    }
    return back;
  }
  return 0;
}

bool is_whitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const utf8proc_category_t cat = category(c);
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
  }
  const utf8proc_category_t cat = category(c);
  return cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;
  const utf8proc_category_t cat = category(c);
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME) ||
         cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC;
}

bool is_nonspacing_mark(char32_t c) {
  return c >= 0x300 && category(c) == UTF8PROC_CATEGORY_MN;
}

std::string normalize(std::string_view text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  // ASCII characters are invariant, never reorder with combining marks (combining class 0) and
  // never compose with what precedes them; only what follows one can attach to it. So the text
  // is normalized run by run: each run of non-ASCII characters together with the ASCII character
  // just before it, the rest copied as it is.
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  while (i < text.size()) {
    size_t run = i;
    while (run < text.size() && static_cast<unsigned char>(text[run]) < 0x80) ++run;
    if (run == text.size()) {
      out.append(text.substr(i));
      break;
    }
    const size_t start = run > i ? run - 1 : run;  // keep the base a mark may attach to
    out.append(text.substr(i, start - i));
    size_t end = run;
    while (end < text.size() && static_cast<unsigned char>(text[end]) >= 0x80) ++end;
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + start),
                     static_cast<utf8proc_ssize_t>(end - start), &result,
                     static_cast<utf8proc_option_t>(options));
    SPECRUN_CHECK(length >= 0) << "utf8proc_map: " << utf8proc_errmsg(length);
    const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
    out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
    i = end;
  }
  return out;
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const char32_t c = next_code_point(text, i);
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {
      // The one unconditional multi-character lowercase mapping: I with dot above -> i + U+0307.
      out += "i\xCC\x87";
    } else {
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

}  // namespace specrun::text
