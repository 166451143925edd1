#include "runtime/chat/jinja_builtins.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <initializer_list>
#include <limits>
#include <unordered_set>

#include "runtime/chat/jinja_parser.h"
#include "runtime/chat/jinja_unicode.h"

namespace specrun::chat::jinja {
namespace {

// ---- small helpers -----------------------------------------------------------------------------

bool is_integer(const Value& value) {
  return value.kind == Kind::kInt || value.kind == Kind::kBool;
}

int64_t integer_of(const Value& value) {
  return value.kind == Kind::kBool ? (value.boolean() ? 1 : 0) : value.integer();
}

double double_of(const Value& value) {
  return value.kind == Kind::kFloat ? value.number() : static_cast<double>(integer_of(value));
}

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string text_repr(std::string_view text) {
  std::string out;
  append_string_repr(out, text);
  return out;
}

// repr(value) for a message: its start when it is large.
std::string repr_of(const Value& value) {
  std::string out;
  try {
    Budget small(64);
    append_repr(out, value, small);
  } catch (const Failure&) {
    out += "...";
  }
  return out;
}

[[noreturn]] void throw_undefined(const Value& value) {
  throw Failure{value.undefined_message()};
}

void check_defined(const Value& value) {
  if (value.is_undefined()) throw_undefined(value);
}

// Binds positional and keyword arguments to the parameters `names` of `function`, as Python
// does; what is not passed stays empty.
std::vector<std::optional<Value>> bind(std::string_view function,
                                       std::initializer_list<std::string_view> names,
                                       const Arguments& arguments) {
  if (arguments.positional.size() > names.size()) {
    throw Failure{std::string(function) + "() takes at most " + std::to_string(names.size()) +
                  " argument(s) (" + std::to_string(arguments.positional.size()) + " given)"};
  }
  std::vector<std::optional<Value>> bound(names.size());
  for (size_t i = 0; i < arguments.positional.size(); ++i) bound[i] = arguments.positional[i];
  for (const auto& [key, value] : arguments.keywords) {
    const auto found = std::find(names.begin(), names.end(), key);
    if (found == names.end()) {
      throw Failure{std::string(function) + "() got an unexpected keyword argument '" + key + "'"};
    }
    auto& slot = bound[static_cast<size_t>(found - names.begin())];
    if (slot) {
      throw Failure{std::string(function) + "() got multiple values for argument '" + key + "'"};
    }
    slot = value;
  }
  return bound;
}

Value value_or(const std::optional<Value>& argument, Value fallback) {
  return argument ? *argument : std::move(fallback);
}

void no_keywords(std::string_view function, const Arguments& arguments) {
  if (!arguments.keywords.empty()) {
    throw Failure{std::string(function) + "() takes no keyword arguments"};
  }
}

void argument_count(std::string_view function, const Arguments& arguments, size_t minimum,
                    size_t maximum) {
  no_keywords(function, arguments);
  const size_t count = arguments.positional.size();
  if (count < minimum || count > maximum) {
    throw Failure{std::string(function) + "() takes " +
                  (minimum == maximum
                       ? "exactly " + std::to_string(minimum)
                       : "from " + std::to_string(minimum) + " to " + std::to_string(maximum)) +
                  " argument(s) (" + std::to_string(count) + " given)"};
  }
}

const std::string& string_argument(std::string_view function, const Value& value) {
  if (!value.is_string()) {
    throw Failure{std::string(function) + "() argument must be str, not " + type_name(value)};
  }
  return value.text();
}

int64_t integer_argument(std::string_view function, const Value& value) {
  if (!is_integer(value)) {
    throw Failure{"'" + type_name(value) + "' object cannot be interpreted as an integer (in " +
                  std::string(function) + "())"};
  }
  return integer_of(value);
}

// ---- text --------------------------------------------------------------------------------------

char ascii_upper(char c) {
  return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c;
}
char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}
bool ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Case mappings cover ASCII letters; other characters are left as they are.
std::string to_upper(std::string text) {
  for (char& c : text) c = ascii_upper(c);
  return text;
}
std::string to_lower(std::string text) {
  for (char& c : text) c = ascii_lower(c);
  return text;
}

std::string capitalize(const std::string& text) {
  std::string out = to_lower(text);
  if (!out.empty()) out[0] = ascii_upper(out[0]);
  return out;
}

// Python's str.title(): a letter after a letter is lowered, any other letter raised.
std::string python_title(const std::string& text) {
  std::string out = text;
  bool previous_letter = false;
  for (char& c : out) {
    if (ascii_letter(c)) {
      c = previous_letter ? ascii_lower(c) : ascii_upper(c);
      previous_letter = true;
    } else {
      previous_letter = false;
    }
  }
  return out;
}

// Jinja's title filter: words start after whitespace, '-', '(', '{', '[' or '<'.
std::string jinja_title(const std::string& text) {
  std::string out;
  bool word_start = true;
  for (size_t offset = 0; offset < text.size();) {
    const CodePoint point = decode_at(text, offset);
    const bool separator =
        is_space(point.value) ||
        (point.value < 0x80 &&
         std::string_view("-({[<").find(static_cast<char>(point.value)) != std::string_view::npos);
    if (point.size == 1 && point.value < 0x80) {
      const char c = static_cast<char>(point.value);
      out += word_start ? ascii_upper(c) : ascii_lower(c);
    } else {
      out.append(text, offset, point.size);
    }
    word_start = separator;
    offset += point.size;
  }
  return out;
}

std::string swapcase(std::string text) {
  for (char& c : text) c = c >= 'a' && c <= 'z' ? ascii_upper(c) : ascii_lower(c);
  return text;
}

std::vector<char32_t> code_points_of(std::string_view text) {
  std::vector<char32_t> points;
  for (size_t offset = 0; offset < text.size();) {
    const CodePoint point = decode_at(text, offset);
    points.push_back(point.value);
    offset += point.size;
  }
  return points;
}

// Python's strip(chars): removes characters in `chars` from the ends.
std::string strip_characters(const std::string& text, const std::string& chars, bool left,
                             bool right) {
  const std::vector<char32_t> set = code_points_of(chars);
  const auto in_set = [&](char32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  const std::vector<size_t> offsets = code_point_offsets(text);
  size_t begin = 0;
  size_t end = offsets.size() - 1;
  while (left && begin < end && in_set(decode_at(text, offsets[begin]).value)) ++begin;
  while (right && end > begin && in_set(decode_at(text, offsets[end - 1]).value)) --end;
  return text.substr(offsets[begin], offsets[end] - offsets[begin]);
}

std::string strip_with(std::string_view function, const std::string& text,
                       const std::optional<Value>& chars, bool left, bool right) {
  if (!chars || chars->is_none()) return std::string(strip_space(text, left, right));
  if (!chars->is_string()) {
    throw Failure{std::string(function) + " arg must be None or str"};
  }
  return strip_characters(text, chars->text(), left, right);
}

// The parts a split produced (each charged as it was cut) as a list of strings.
Value make_strings(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const std::string& part : parts) items.push_back(make_string(part));
  return make_list(std::move(items));
}

// Python's split() without a separator: runs of whitespace separate, ends are ignored.
std::vector<std::string> split_whitespace(const std::string& text, int64_t maxsplit,
                                          Budget& budget) {
  std::vector<std::string> parts;
  size_t i = 0;
  const auto space_at = [&](size_t at, size_t& size) {
    const CodePoint point = decode_at(text, at);
    size = point.size;
    return is_space(point.value);
  };
  size_t size = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    while (i < text.size() && space_at(i, size)) i += size;
    if (i >= text.size()) return parts;
    const size_t start = i;
    while (i < text.size() && !space_at(i, size)) i += size;
    budget.charge(kStringValueCost);
    parts.push_back(text.substr(start, i - start));
  }
  while (i < text.size() && space_at(i, size)) i += size;
  if (i < text.size()) parts.push_back(text.substr(i));
  return parts;
}

std::vector<std::string> rsplit_whitespace(const std::string& text, int64_t maxsplit,
                                           Budget& budget) {
  const std::vector<size_t> offsets = code_point_offsets(text);
  const auto space = [&](size_t index) { return is_space(decode_at(text, offsets[index]).value); };
  std::vector<std::string> parts;
  size_t end = offsets.size() - 1;  // code point index one past the part
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    while (end > 0 && space(end - 1)) --end;
    if (end == 0) break;
    size_t start = end;
    while (start > 0 && !space(start - 1)) --start;
    budget.charge(kStringValueCost);
    parts.push_back(text.substr(offsets[start], offsets[end] - offsets[start]));
    end = start;
  }
  if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
    while (end > 0 && space(end - 1)) --end;
    if (end > 0) parts.push_back(text.substr(0, offsets[end]));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> split_on(const std::string& text, const std::string& separator,
                                  int64_t maxsplit, Budget& budget) {
  if (separator.empty()) throw Failure{"empty separator"};
  std::vector<std::string> parts;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t found = text.find(separator, start);
    if (found == std::string::npos) break;
    budget.charge(kStringValueCost);
    parts.push_back(text.substr(start, found - start));
    start = found + separator.size();
  }
  parts.push_back(text.substr(start));
  return parts;
}

std::vector<std::string> rsplit_on(const std::string& text, const std::string& separator,
                                   int64_t maxsplit, Budget& budget) {
  if (separator.empty()) throw Failure{"empty separator"};
  std::vector<std::string> parts;
  size_t end = text.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < separator.size()) break;
    const size_t found = text.rfind(separator, end - separator.size());
    if (found == std::string::npos) break;
    budget.charge(kStringValueCost);
    parts.push_back(text.substr(found + separator.size(), end - found - separator.size()));
    end = found;
  }
  parts.push_back(text.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

// Python's str.splitlines(): \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028 and \u2029 end lines.
std::vector<std::string> split_lines(const std::string& text, bool keep_ends, Budget& budget) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t offset = 0; offset < text.size();) {
    const CodePoint point = decode_at(text, offset);
    const char32_t c = point.value;
    const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    size_t next = offset + point.size;
    if (!boundary) {
      offset = next;
      continue;
    }
    if (c == '\r' && next < text.size() && text[next] == '\n') ++next;
    budget.charge(kStringValueCost);
    lines.push_back(text.substr(start, (keep_ends ? next : offset) - start));
    start = offset = next;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

std::string replace_text(const std::string& text, const std::string& old_text,
                         const std::string& new_text, int64_t count, Budget& budget) {
  std::string out;
  int64_t done = 0;
  const auto room = [&] { return count < 0 || done < count; };
  if (old_text.empty()) {
    for (size_t offset = 0; offset <= text.size();) {
      if (room()) {
        out += new_text;
        ++done;
      }
      if (offset == text.size()) break;
      const size_t size = decode_at(text, offset).size;
      out.append(text, offset, size);
      offset += size;
      Budget::check_size(out.size());
    }
  } else {
    size_t start = 0;
    while (room()) {
      const size_t found = text.find(old_text, start);
      if (found == std::string::npos) break;
      out.append(text, start, found - start);
      out += new_text;
      Budget::check_size(out.size());
      start = found + old_text.size();
      ++done;
    }
    out.append(text, start);
  }
  budget.charge_bytes(out.size());
  Budget::check_size(out.size());
  return out;
}

// Python's slice bounds for a sequence of `length`: the indices a slice selects.
std::vector<int64_t> slice_indices(int64_t length, const Value& start_value,
                                   const Value& stop_value, const Value& step_value) {
  int64_t step = step_value.is_none() ? 1 : integer_of(step_value);
  if (step == 0) throw Failure{"slice step cannot be zero"};
  if (step == std::numeric_limits<int64_t>::min()) step = -std::numeric_limits<int64_t>::max();
  const auto adjust = [&](const Value& value, int64_t fallback) {
    if (value.is_none()) return fallback;
    int64_t index = integer_of(value);
    if (index < 0) {
      index = index < -length ? (step < 0 ? -1 : 0) : index + length;
    } else if (index >= length) {
      index = step < 0 ? length - 1 : length;
    }
    return index;
  };
  const int64_t start = adjust(start_value, step < 0 ? length - 1 : 0);
  const int64_t stop = adjust(stop_value, step < 0 ? -1 : length);
  std::vector<int64_t> indices;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) {
      indices.push_back(i);
      if (stop - i <= step) break;
    }
  } else {
    for (int64_t i = start; i > stop; i += step) {
      indices.push_back(i);
      if (i - stop <= -step) break;
    }
  }
  return indices;
}

// The code points of `text` from `start` to `end` (Python slice bounds, None for open), and the
// code-point index where that part begins.
std::pair<std::string, int64_t> text_range(const std::string& text, const Value& start,
                                           const Value& end) {
  const std::vector<size_t> offsets = code_point_offsets(text);
  const int64_t length = static_cast<int64_t>(offsets.size()) - 1;
  const auto adjust = [&](const Value& value, int64_t fallback) {
    if (value.is_none()) return fallback;
    int64_t index = integer_argument("slice", value);
    if (index < 0) index = std::max<int64_t>(0, index + length);
    return std::min(index, length);
  };
  const int64_t from = adjust(start, 0);
  const int64_t to = std::max(from, adjust(end, length));
  return {text.substr(offsets[static_cast<size_t>(from)],
                      offsets[static_cast<size_t>(to)] - offsets[static_cast<size_t>(from)]),
          from};
}

int64_t code_point_index(const std::string& text, size_t byte_offset) {
  return static_cast<int64_t>(count_code_points(std::string_view(text).substr(0, byte_offset)));
}

std::string repeat(const std::string& text, int64_t times, Budget& budget) {
  if (times <= 0 || text.empty()) return "";
  if (static_cast<uint64_t>(times) > kMaxStringBytes / text.size()) {
    Budget::check_size(static_cast<uint64_t>(times) > SIZE_MAX / text.size()
                           ? SIZE_MAX
                           : text.size() * static_cast<size_t>(times));
  }
  std::string out;
  out.reserve(text.size() * static_cast<size_t>(times));
  for (int64_t i = 0; i < times; ++i) out += text;
  budget.charge_bytes(out.size());
  return out;
}

std::string pad(const std::string& text, int64_t width, const std::string& fill, int64_t left) {
  const int64_t length = static_cast<int64_t>(count_code_points(text));
  if (width <= length) return text;
  if (width > static_cast<int64_t>(kMaxStringBytes)) Budget::check_size(static_cast<size_t>(width));
  Budget::check_size(static_cast<size_t>(width) * fill.size());
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += text;
  for (int64_t i = left + length; i < width; ++i) out += fill;
  return out;
}

// ---- numbers -----------------------------------------------------------------------------------

[[noreturn]] void overflow() {
  throw Failure{"integer overflow (beyond 64 bits)"};
}

int64_t checked_add(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) overflow();
  return result;
}
int64_t checked_sub(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_sub_overflow(a, b, &result)) overflow();
  return result;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) overflow();
  return result;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1) overflow();
  int64_t quotient = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --quotient;
  return quotient;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;
  const int64_t remainder = a % b;
  return remainder != 0 && ((remainder < 0) != (b < 0)) ? remainder + b : remainder;
}

// CPython's float divmod.
std::pair<double, double> float_divmod(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0.0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, y);
  }
  double floor_div_result = 0.0;
  if (div != 0.0) {
    floor_div_result = std::floor(div);
    if (div - floor_div_result > 0.5) floor_div_result += 1.0;
  } else {
    floor_div_result = std::copysign(0.0, x / y);
  }
  return {floor_div_result, mod};
}

// Python's float(text): optional whitespace and sign, digits with single underscores between
// them, an optional fraction and exponent; or inf, infinity, nan.
std::optional<double> parse_float(const std::string& raw) {
  const std::string text(strip_space(raw, true, true));
  std::string cleaned;
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) cleaned += text[i++];
  const std::string rest = to_lower(text.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    const double special = rest == "nan" ? std::numeric_limits<double>::quiet_NaN()
                                         : std::numeric_limits<double>::infinity();
    return cleaned == "-" ? -special : special;
  }
  const auto digits = [&](bool required) {
    const size_t begin = i;
    while (i < text.size()) {
      if (text[i] >= '0' && text[i] <= '9') {
        cleaned += text[i++];
      } else if (text[i] == '_' && i > begin && i + 1 < text.size() && text[i + 1] >= '0' &&
                 text[i + 1] <= '9' && text[i - 1] != '_') {
        ++i;
      } else {
        break;
      }
    }
    return !required || i > begin;
  };
  const size_t whole_start = i;
  digits(false);
  const bool whole = i > whole_start;
  bool fraction = false;
  if (i < text.size() && text[i] == '.') {
    cleaned += text[i++];
    const size_t fraction_start = i;
    digits(false);
    fraction = i > fraction_start;
  }
  if (!whole && !fraction) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    cleaned += text[i++];
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) cleaned += text[i++];
    if (!digits(true)) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  double value = 0;
  const char* begin = cleaned.data() + (cleaned[0] == '+' ? 1 : 0);
  const auto result = std::from_chars(begin, cleaned.data() + cleaned.size(), value);
  if (result.ec == std::errc::result_out_of_range) {
    const size_t e = cleaned.find_first_of("eE");
    const bool tiny = e != std::string::npos && cleaned.find('-', e) != std::string::npos;
    value = tiny ? 0.0 : std::numeric_limits<double>::infinity();
    if (cleaned[0] == '-') value = -value;
  } else if (result.ec != std::errc()) {
    return std::nullopt;
  }
  return value;
}

// Python's int(text, base) for bases 2 to 36 (with a 0b/0o/0x prefix matching the base).
std::optional<int64_t> parse_int(const std::string& raw, int64_t base) {
  const std::string text(strip_space(raw, true, true));
  size_t i = 0;
  bool negative = false;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) negative = text[i++] == '-';
  if (i + 1 < text.size() && text[i] == '0') {
    const char prefix = ascii_lower(text[i + 1]);
    if ((prefix == 'x' && base == 16) || (prefix == 'o' && base == 8) ||
        (prefix == 'b' && base == 2)) {
      i += 2;
      if (i < text.size() && text[i] == '_') ++i;
    }
  }
  const size_t begin = i;
  uint64_t value = 0;
  bool previous_underscore = false;
  for (; i < text.size(); ++i) {
    const char c = ascii_lower(text[i]);
    if (c == '_') {
      if (i == begin || previous_underscore) return std::nullopt;
      previous_underscore = true;
      continue;
    }
    previous_underscore = false;
    int digit = 99;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'z') digit = c - 'a' + 10;
    if (digit >= base) return std::nullopt;
    if (value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1 -
                 static_cast<uint64_t>(digit)) /
                    static_cast<uint64_t>(base)) {
      overflow();
    }
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit);
  }
  if (i == begin || previous_underscore) return std::nullopt;
  if (!negative && value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow();
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

int64_t float_to_int(double value) {
  if (std::isnan(value)) throw Failure{"cannot convert float NaN to integer"};
  if (std::isinf(value)) throw Failure{"cannot convert float infinity to integer"};
  const double truncated = std::trunc(value);
  if (truncated >= 9.223372036854775807e18 || truncated < -9.223372036854775808e18) overflow();
  return static_cast<int64_t>(truncated);
}

// Python's round(value, digits) on a float: the exact decimal value rounded half to even.
double round_float(double value, int64_t digits) {
  if (!std::isfinite(value) || digits > 320) return value;
  if (digits >= 0) {
    std::vector<char> buffer(static_cast<size_t>(digits) + 400);
    std::snprintf(buffer.data(), buffer.size(), "%.*f", static_cast<int>(digits), value);
    return std::strtod(buffer.data(), nullptr);
  }
  if (digits < -320) return std::copysign(0.0, value);
  const double scale = std::pow(10.0, static_cast<double>(-digits));
  const double rounded = std::nearbyint(value / scale) * scale;
  return rounded;
}

// ---- attribute access --------------------------------------------------------------------------

constexpr std::string_view kStringMethods[] = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill",
};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool is_dunder(const std::string& name) {
  return name.size() > 4 && name.rfind("__", 0) == 0 && name.compare(name.size() - 2, 2, "__") == 0;
}

Value unsafe(const Value& object, const std::string& name) {
  return make_undefined("access to attribute " + text_repr(name) + " of " +
                        text_repr(type_name(object)) + " object is unsafe.");
}

Value method(const Value& receiver, const std::string& name) {
  Function function;
  function.type = FunctionType::kMethod;
  function.name = name;
  function.receiver = receiver;
  return make_function(std::move(function));
}

// The attribute `name` of the object's Python type, when it has one (a method, or an attribute
// the sandbox hides); nullopt otherwise.
std::optional<Value> type_attribute(const Value& object, const std::string& name) {
  if (is_dunder(name) && object.kind != Kind::kNamespace && object.kind != Kind::kUndefined) {
    return unsafe(object, name);
  }
  switch (object.kind) {
    case Kind::kString:
      if (listed(kStringMethods, name)) return method(object, name);
      return std::nullopt;
    case Kind::kDict:
      if (one_of(name, {"get", "items", "keys", "values", "copy", "fromkeys"})) {
        return method(object, name);
      }
      if (one_of(name, {"clear", "pop", "popitem", "setdefault", "update"})) {
        return unsafe(object, name);
      }
      return std::nullopt;
    case Kind::kSequence: {
      const SequenceType type = object.sequence().type;
      if (type == SequenceType::kList) {
        if (one_of(name, {"copy", "count", "index"})) return method(object, name);
        if (one_of(name,
                   {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"})) {
          return unsafe(object, name);
        }
      }
      if ((type == SequenceType::kTuple || type == SequenceType::kRange) &&
          one_of(name, {"count", "index"})) {
        return method(object, name);
      }
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

Value loop_attribute(const Value& object, const std::string& name) {
  const LoopState& loop = object.loop();
  const auto length = static_cast<int64_t>(loop.items->items.size());
  const auto index0 = static_cast<int64_t>(loop.index0);
  if (name == "index") return make_int(index0 + 1);
  if (name == "index0") return make_int(index0);
  if (name == "revindex") return make_int(length - index0);
  if (name == "revindex0") return make_int(length - index0 - 1);
  if (name == "first") return make_bool(index0 == 0);
  if (name == "last") return make_bool(index0 == length - 1);
  if (name == "length") return make_int(length);
  if (name == "depth") return make_int(1);
  if (name == "depth0") return make_int(0);
  if (name == "previtem") {
    return index0 > 0 ? loop.items->items[static_cast<size_t>(index0 - 1)]
                      : make_undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return index0 + 1 < length ? loop.items->items[static_cast<size_t>(index0 + 1)]
                               : make_undefined("there is no next item");
  }
  if (name == "cycle" || name == "changed") return method(object, name);
  return make_undefined(missing_message(object, make_string(name)));
}

// ---- iteration helpers -------------------------------------------------------------------------

int64_t length_of(const Value& value, Budget& budget) {
  switch (value.kind) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      budget.charge_bytes(value.text().size());
      return static_cast<int64_t>(count_code_points(value.text()));
    case Kind::kSequence: {
      const Sequence& sequence = value.sequence();
      if (sequence.type == SequenceType::kGenerator ||
          sequence.type == SequenceType::kReverseIterator) {
        break;
      }
      return static_cast<int64_t>(sequence.items.size());
    }
    case Kind::kDict:
      return static_cast<int64_t>(value.dict().entries.size());
    case Kind::kLoop:
      return static_cast<int64_t>(value.loop().items->items.size());
    default:
      break;
  }
  throw Failure{"object of type '" + type_name(value) + "' has no len()"};
}

// Jinja's make_attrgetter: "a.b.0" looks up a, then b, then index 0, each with get_item.
struct AttributeGetter {
  std::vector<Value> parts;
  std::optional<Value> fallback;  // map(default=...): used for an undefined result

  Value operator()(Value item, Budget& budget) const {
    for (const Value& part : parts) {
      item = get_item(item, part, budget);
      if (fallback && item.is_undefined()) item = *fallback;
    }
    return item;
  }
};

AttributeGetter attribute_getter(const std::optional<Value>& attribute,
                                 std::optional<Value> fallback = std::nullopt) {
  AttributeGetter getter;
  getter.fallback = std::move(fallback);
  if (!attribute || attribute->is_none()) return getter;
  if (!attribute->is_string()) {
    getter.parts.push_back(*attribute);
    return getter;
  }
  Budget local;
  for (const std::string& part : split_on(attribute->text(), ".", -1, local)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
      const std::optional<int64_t> index = parse_int(part, 10);
      getter.parts.push_back(make_int(*index));
    } else {
      getter.parts.push_back(make_string(part));
    }
  }
  return getter;
}

Value ignore_case(const Value& value) {
  return value.is_string() ? make_string(to_lower(value.text())) : value;
}

Value make_generator(std::vector<Value> items) {
  return make_sequence(SequenceType::kGenerator, std::move(items));
}

// ---- filters -----------------------------------------------------------------------------------

Value filter_tojson(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound =
      bind("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}, arguments);
  JsonStyle style;
  style.ensure_ascii = bound[0] && truthy(*bound[0]);
  if (bound[1] && !bound[1]->is_none()) {
    if (bound[1]->is_string()) {
      style.indent = bound[1]->text();
    } else if (is_integer(*bound[1])) {
      const int64_t width = integer_of(*bound[1]);
      if (width > 1024) throw Failure{"tojson indent " + std::to_string(width) + " is too wide"};
      style.indent = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
    } else {
      throw Failure{"can't multiply sequence by non-int of type '" + type_name(*bound[1]) + "'"};
    }
    style.item_separator = ",";
  }
  if (bound[2] && !bound[2]->is_none()) {
    const Value& separators = *bound[2];
    if (separators.kind != Kind::kSequence || separators.sequence().items.size() != 2 ||
        !separators.sequence().items[0].is_string() ||
        !separators.sequence().items[1].is_string()) {
      throw Failure{"tojson separators must be a pair of strings"};
    }
    style.item_separator = separators.sequence().items[0].text();
    style.key_separator = separators.sequence().items[1].text();
  }
  style.sort_keys = bound[3] && truthy(*bound[3]);
  return make_string(to_json(value, style, budget));
}

Value filter_join(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound = bind("join", {"d", "attribute"}, arguments);
  const std::string separator = bound[0] ? to_str(*bound[0], budget) : std::string();
  const AttributeGetter getter = attribute_getter(bound[1]);
  std::string out;
  bool first = true;
  for (const Value& item : iterate(value, budget)) {
    if (!first) out += separator;
    first = false;
    append_str(out, getter(item, budget), budget);
    Budget::check_size(out.size());
  }
  return make_string(std::move(out));
}

Value filter_first(const Value& value, Budget& budget) {
  const Value empty = make_undefined("No first item, sequence was empty.");
  switch (value.kind) {
    case Kind::kUndefined:
      return empty;
    case Kind::kString:
      if (value.text().empty()) return empty;
      return make_string(value.text().substr(0, decode_at(value.text(), 0).size));
    case Kind::kSequence: {
      const Sequence& sequence = value.sequence();
      const bool iterator = sequence.type == SequenceType::kGenerator ||
                            sequence.type == SequenceType::kReverseIterator;
      const size_t at = iterator ? sequence.consumed : 0;
      if (at >= sequence.items.size()) return empty;
      if (iterator) ++sequence.consumed;
      return sequence.items[at];
    }
    case Kind::kDict:
      if (value.dict().entries.empty()) return empty;
      return value.dict().entries.front().first;
    default:
      break;
  }
  (void)iterate(value, budget);  // raises Python's "is not iterable"
  return empty;
}

Value filter_last(const Value& value, Budget& budget) {
  const Value empty = make_undefined("No last item, sequence was empty.");
  switch (value.kind) {
    case Kind::kUndefined:
      return empty;
    case Kind::kString: {
      budget.charge_bytes(value.text().size());
      const std::vector<size_t> offsets = code_point_offsets(value.text());
      if (offsets.size() < 2) return empty;
      const size_t start = offsets[offsets.size() - 2];
      return make_string(value.text().substr(start));
    }
    case Kind::kSequence: {
      const Sequence& sequence = value.sequence();
      if (sequence.type == SequenceType::kGenerator ||
          sequence.type == SequenceType::kReverseIterator) {
        break;
      }
      if (sequence.items.empty()) return empty;
      return sequence.items.back();
    }
    case Kind::kDict:
      if (value.dict().entries.empty()) return empty;
      return value.dict().entries.back().first;
    default:
      break;
  }
  throw Failure{"'" + type_name(value) + "' object is not reversible"};
}

Value filter_int(const Value& value, const Arguments& arguments) {
  const auto bound = bind("int", {"default", "base"}, arguments);
  const Value fallback = value_or(bound[0], make_int(0));
  const int64_t base = bound[1] ? integer_argument("int", *bound[1]) : 10;
  if (base < 2 || base > 36) throw Failure{"int() base must be >= 2 and <= 36, or 0"};
  switch (value.kind) {
    case Kind::kBool:
    case Kind::kInt:
      return make_int(integer_of(value));
    case Kind::kFloat:
      if (std::isnan(value.number())) return fallback;
      return make_int(float_to_int(value.number()));
    case Kind::kString: {
      if (const std::optional<int64_t> parsed = parse_int(value.text(), base)) {
        return make_int(*parsed);
      }
      const std::optional<double> number = parse_float(value.text());
      if (!number || std::isnan(*number)) return fallback;
      return make_int(float_to_int(*number));
    }
    default:
      return fallback;
  }
}

Value filter_float(const Value& value, const Arguments& arguments) {
  const auto bound = bind("float", {"default"}, arguments);
  const Value fallback = value_or(bound[0], make_float(0.0));
  if (value.is_number()) return make_float(double_of(value));
  if (value.is_string()) {
    const std::optional<double> number = parse_float(value.text());
    return number ? make_float(*number) : fallback;
  }
  return fallback;
}

Value filter_round(const Value& value, const Arguments& arguments) {
  const auto bound = bind("round", {"precision", "method"}, arguments);
  const int64_t precision = bound[0] ? integer_argument("round", *bound[0]) : 0;
  const std::string method_name = bound[1] && bound[1]->is_string() ? bound[1]->text() : "common";
  if (bound[1] && !bound[1]->is_string()) throw Failure{"method must be common, ceil or floor"};
  if (!one_of(method_name, {"common", "ceil", "floor"})) {
    throw Failure{"method must be common, ceil or floor"};
  }
  if (!value.is_number()) {
    check_defined(value);
    throw Failure{"type " + type_name(value) + " doesn't define __round__ method"};
  }
  if (method_name == "common") {
    if (is_integer(value)) {
      const int64_t number = integer_of(value);
      if (precision >= 0) return make_int(number);
      if (precision < -18) return make_int(0);
      int64_t scale = 1;
      for (int64_t i = 0; i < -precision; ++i) scale *= 10;
      const int64_t quotient = floor_div(number, scale);
      const int64_t remainder = number - quotient * scale;
      int64_t rounded = quotient;
      if (remainder * 2 > scale || (remainder * 2 == scale && (quotient % 2 != 0))) ++rounded;
      return make_int(checked_mul(rounded, scale));
    }
    return make_float(round_float(value.number(), precision));
  }
  if (precision < -308 || precision > 308) throw Failure{"round precision out of range"};
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = double_of(value) * scale;
  if (!std::isfinite(scaled)) throw Failure{"cannot convert float infinity to integer"};
  const double rounded = method_name == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return make_float(rounded / scale);
}

Value filter_indent(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound = bind("indent", {"width", "first", "blank"}, arguments);
  std::string indentation = "    ";
  if (bound[0]) {
    if (bound[0]->is_string()) {
      indentation = bound[0]->text();
    } else {
      const int64_t width = integer_argument("indent", *bound[0]);
      if (width > 1024) throw Failure{"indent width " + std::to_string(width) + " is too wide"};
      indentation = std::string(static_cast<size_t>(std::max<int64_t>(width, 0)), ' ');
    }
  }
  const bool first = bound[1] && truthy(*bound[1]);
  const bool blank = bound[2] && truthy(*bound[2]);
  const std::vector<std::string> lines = split_lines(to_str(value, budget) + "\n", false, budget);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += '\n';
    if ((i > 0 || first) && (blank || !lines[i].empty())) out += indentation;
    out += lines[i];
    Budget::check_size(out.size());
  }
  budget.charge_bytes(out.size());
  return make_string(std::move(out));
}

// map(attribute=...) or map('filter', args...).
Value filter_map(const Value& value, const Arguments& arguments, Budget& budget) {
  if (!truthy(value)) return make_generator({});
  std::vector<Value> items = iterate(value, budget);
  const bool by_attribute =
      arguments.positional.empty() &&
      std::any_of(arguments.keywords.begin(), arguments.keywords.end(),
                  [](const auto& keyword) { return keyword.first == "attribute"; });
  if (by_attribute) {
    const auto bound = bind("map", {"attribute", "default"}, arguments);
    const AttributeGetter getter = attribute_getter(bound[0], bound[1]);
    for (Value& item : items) item = getter(item, budget);
    return make_generator(std::move(items));
  }
  if (arguments.positional.empty()) throw Failure{"map requires a filter argument"};
  const Value& name = arguments.positional.front();
  if (!name.is_string()) throw Failure{"map's filter name must be a string"};
  if (!is_supported_filter(name.text())) {
    throw Failure{"unsupported filter " + text_repr(name.text())};
  }
  Arguments rest;
  rest.positional.assign(arguments.positional.begin() + 1, arguments.positional.end());
  rest.keywords = arguments.keywords;
  for (Value& item : items) item = apply_filter(name.text(), item, rest, budget);
  return make_generator(std::move(items));
}

// select/reject (by_attribute: selectattr/rejectattr).
Value filter_select(const Value& value, const Arguments& arguments, bool keep, bool by_attribute,
                    Budget& budget) {
  if (!truthy(value)) return make_generator({});
  size_t next = 0;
  AttributeGetter getter;
  if (by_attribute) {
    if (arguments.positional.empty()) throw Failure{"Missing parameter for attribute name"};
    getter = attribute_getter(arguments.positional[0]);
    next = 1;
  }
  std::optional<std::string> test;
  Arguments test_arguments;
  if (arguments.positional.size() > next) {
    const Value& name = arguments.positional[next];
    if (!name.is_string()) throw Failure{"the test name must be a string"};
    test = name.text();
    test_arguments.positional.assign(arguments.positional.begin() + static_cast<long>(next) + 1,
                                     arguments.positional.end());
    test_arguments.keywords = arguments.keywords;
  }
  std::vector<Value> kept;
  for (const Value& item : iterate(value, budget)) {
    const Value subject = getter(item, budget);
    const bool passed = test ? apply_test(*test, subject, test_arguments, budget) : truthy(subject);
    if (passed == keep) kept.push_back(item);
  }
  return make_generator(std::move(kept));
}

Value filter_unique(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound = bind("unique", {"case_sensitive", "attribute"}, arguments);
  const bool case_sensitive = bound[0] && truthy(*bound[0]);
  const AttributeGetter getter = attribute_getter(bound[1]);
  std::unordered_set<std::string> seen;
  std::vector<Value> kept;
  for (const Value& item : iterate(value, budget)) {
    Value key = getter(item, budget);
    if (!case_sensitive) key = ignore_case(key);
    const std::optional<std::string> hashed = hash_key(key);
    if (!hashed) throw Failure{"unhashable type: '" + type_name(key) + "'"};
    budget.charge_bytes(hashed->size());
    if (seen.insert(*hashed).second) kept.push_back(item);
  }
  return make_generator(std::move(kept));
}

void sort_values(std::vector<Value>& items, const std::vector<Value>& keys, bool reverse,
                 Budget& budget) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    budget.charge(1);
    return reverse ? less_than(keys[b], keys[a], budget) : less_than(keys[a], keys[b], budget);
  });
  std::vector<Value> sorted;
  sorted.reserve(items.size());
  for (const size_t index : order) sorted.push_back(items[index]);
  items = std::move(sorted);
}

Value filter_sort(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound = bind("sort", {"reverse", "case_sensitive", "attribute"}, arguments);
  const bool reverse = bound[0] && truthy(*bound[0]);
  const bool case_sensitive = bound[1] && truthy(*bound[1]);
  std::vector<AttributeGetter> getters;
  if (bound[2] && bound[2]->is_string()) {
    for (const std::string& part : split_on(bound[2]->text(), ",", -1, budget)) {
      getters.push_back(attribute_getter(make_string(part)));
    }
  } else {
    getters.push_back(attribute_getter(bound[2]));
  }
  std::vector<Value> items = iterate(value, budget);
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    std::vector<Value> parts;
    for (const AttributeGetter& getter : getters) {
      Value key = getter(item, budget);
      parts.push_back(case_sensitive ? key : ignore_case(key));
    }
    // A comma-separated attribute list sorts by the list of values, like Python's key returning
    // a list.
    keys.push_back(bound[2] && bound[2]->is_string() ? make_list(std::move(parts))
                                                     : std::move(parts.front()));
  }
  sort_values(items, keys, reverse, budget);
  return make_list(std::move(items));
}

Value filter_dictsort(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound = bind("dictsort", {"case_sensitive", "by", "reverse"}, arguments);
  const bool case_sensitive = bound[0] && truthy(*bound[0]);
  const std::string by = bound[1] && bound[1]->is_string() ? bound[1]->text() : "key";
  if ((bound[1] && !bound[1]->is_string()) || (by != "key" && by != "value")) {
    throw Failure{"You can only sort by either \"key\" or \"value\""};
  }
  const bool reverse = bound[2] && truthy(*bound[2]);
  check_defined(value);
  if (value.kind != Kind::kDict) {
    throw Failure{"'" + type_name(value) + "' object has no attribute 'items'"};
  }
  std::vector<Value> items;
  std::vector<Value> keys;
  for (const auto& [key, item] : value.dict().entries) {
    items.push_back(make_sequence(SequenceType::kTuple, {key, item}));
    const Value& sort_by = by == "key" ? key : item;
    keys.push_back(case_sensitive ? sort_by : ignore_case(sort_by));
  }
  budget.charge(items.size());
  sort_values(items, keys, reverse, budget);
  return make_list(std::move(items));
}

Value filter_reverse(const Value& value, Budget& budget) {
  if (value.is_string()) {
    const std::vector<size_t> offsets = code_point_offsets(value.text());
    std::string out;
    out.reserve(value.text().size());
    for (size_t i = offsets.size() - 1; i > 0; --i) {
      out.append(value.text(), offsets[i - 1], offsets[i] - offsets[i - 1]);
    }
    budget.charge_bytes(out.size());
    return make_string(std::move(out));
  }
  const bool reversible =
      value.kind == Kind::kDict || value.is_undefined() ||
      (value.kind == Kind::kSequence && value.sequence().type != SequenceType::kGenerator &&
       value.sequence().type != SequenceType::kReverseIterator);
  std::vector<Value> items = iterate(value, budget);
  std::reverse(items.begin(), items.end());
  if (reversible) return make_sequence(SequenceType::kReverseIterator, std::move(items));
  return make_list(std::move(items));
}

Value filter_sum(const Value& value, const Arguments& arguments, Budget& budget) {
  const auto bound = bind("sum", {"attribute", "start"}, arguments);
  const AttributeGetter getter = attribute_getter(bound[0]);
  Value total = value_or(bound[1], make_int(0));
  if (total.is_string()) throw Failure{"sum() can't sum strings [use ''.join(seq) instead]"};
  for (const Value& item : iterate(value, budget)) {
    total = binary_operation("+", total, getter(item, budget), budget);
  }
  return total;
}

Value filter_extreme(const Value& value, const Arguments& arguments, bool largest, Budget& budget) {
  const auto bound = bind(largest ? "max" : "min", {"case_sensitive", "attribute"}, arguments);
  const bool case_sensitive = bound[0] && truthy(*bound[0]);
  const AttributeGetter getter = attribute_getter(bound[1]);
  const std::vector<Value> items = iterate(value, budget);
  if (items.empty()) return make_undefined("No aggregated item, sequence was empty.");
  const auto key_of = [&](const Value& item) {
    Value key = getter(item, budget);
    return case_sensitive ? key : ignore_case(key);
  };
  size_t best = 0;
  Value best_key = key_of(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = key_of(items[i]);
    if (largest ? less_than(best_key, key, budget) : less_than(key, best_key, budget)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value filter_items(const Value& value) {
  if (value.is_undefined()) return make_generator({});
  if (value.kind != Kind::kDict) throw Failure{"Can only get item pairs from a mapping."};
  std::vector<Value> pairs;
  for (const auto& [key, item] : value.dict().entries) {
    pairs.push_back(make_sequence(SequenceType::kTuple, {key, item}));
  }
  return make_generator(std::move(pairs));
}

Value filter_abs(const Value& value) {
  switch (value.kind) {
    case Kind::kBool:
    case Kind::kInt: {
      const int64_t number = integer_of(value);
      if (number == std::numeric_limits<int64_t>::min()) overflow();
      return make_int(number < 0 ? -number : number);
    }
    case Kind::kFloat:
      return make_float(std::fabs(value.number()));
    case Kind::kUndefined:
      throw_undefined(value);
    default:
      throw Failure{"bad operand type for abs(): '" + type_name(value) + "'"};
  }
}

// ---- tests -------------------------------------------------------------------------------------

bool python_mod_is(const Value& value, const Value& divisor, int64_t expected) {
  check_defined(value);
  check_defined(divisor);
  if (!value.is_number() || !divisor.is_number()) {
    throw Failure{"unsupported operand type(s) for %: '" + type_name(value) + "' and '" +
                  type_name(divisor) + "'"};
  }
  Budget budget;
  return equals(binary_operation("%", value, divisor, budget), make_int(expected), budget);
}

bool is_identical(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return a.boolean() == b.boolean();
    case Kind::kInt:
      return a.integer() == b.integer() && a.integer() >= -5 && a.integer() <= 256;
    case Kind::kString:
      return std::get<std::shared_ptr<const std::string>>(a.data) ==
             std::get<std::shared_ptr<const std::string>>(b.data);
    case Kind::kSequence:
      return a.sequence_ptr() == b.sequence_ptr();
    case Kind::kDict:
      return &a.dict() == &b.dict();
    case Kind::kNamespace:
      return a.namespace_ptr() == b.namespace_ptr();
    case Kind::kLoop:
      return &a.loop() == &b.loop();
    case Kind::kFunction:
      return a.function_ptr() == b.function_ptr();
    default:
      return false;
  }
}

bool text_is_cased(const std::string& text, bool lower) {
  bool cased = false;
  for (const char c : text) {
    if (c >= 'a' && c <= 'z') {
      if (!lower) return false;
      cased = true;
    } else if (c >= 'A' && c <= 'Z') {
      if (lower) return false;
      cased = true;
    }
  }
  return cased;
}

// ---- methods -----------------------------------------------------------------------------------

Value string_method(const Value& receiver, const std::string& name, const Arguments& arguments,
                    Budget& budget) {
  const std::string& text = receiver.text();
  budget.charge_bytes(text.size());
  const auto& positional = arguments.positional;
  if (one_of(name, {"strip", "lstrip", "rstrip"})) {
    argument_count(name, arguments, 0, 1);
    const std::optional<Value> chars =
        positional.empty() ? std::nullopt : std::optional<Value>(positional[0]);
    return make_string(strip_with(name, text, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto bound = bind(name, {"sep", "maxsplit"}, arguments);
    const int64_t maxsplit = bound[1] ? integer_argument(name, *bound[1]) : -1;
    const bool reverse = name == "rsplit";
    if (!bound[0] || bound[0]->is_none()) {
      return make_strings(reverse ? rsplit_whitespace(text, maxsplit, budget)
                                  : split_whitespace(text, maxsplit, budget));
    }
    const std::string& separator = string_argument(name, *bound[0]);
    return make_strings(reverse ? rsplit_on(text, separator, maxsplit, budget)
                                : split_on(text, separator, maxsplit, budget));
  }
  if (name == "splitlines") {
    const auto bound = bind(name, {"keepends"}, arguments);
    return make_strings(split_lines(text, bound[0] && truthy(*bound[0]), budget));
  }
  if (name == "startswith" || name == "endswith") {
    argument_count(name, arguments, 1, 3);
    const Value none = make_none();
    const std::string part = text_range(text, positional.size() > 1 ? positional[1] : none,
                                        positional.size() > 2 ? positional[2] : none)
                                 .first;
    std::vector<Value> candidates;
    if (positional[0].kind == Kind::kSequence &&
        positional[0].sequence().type == SequenceType::kTuple) {
      candidates = positional[0].sequence().items;
    } else if (positional[0].is_string()) {
      candidates.push_back(positional[0]);
    } else {
      throw Failure{name + " first arg must be str or a tuple of str, not " +
                    type_name(positional[0])};
    }
    for (const Value& candidate : candidates) {
      const std::string& affix = string_argument(name, candidate);
      if (affix.size() > part.size()) continue;
      const size_t at = name == "startswith" ? 0 : part.size() - affix.size();
      if (part.compare(at, affix.size(), affix) == 0) return make_bool(true);
    }
    return make_bool(false);
  }
  if (name == "replace") {
    argument_count(name, arguments, 2, 3);
    const int64_t count = positional.size() > 2 ? integer_argument(name, positional[2]) : -1;
    return make_string(replace_text(text, string_argument(name, positional[0]),
                                    string_argument(name, positional[1]), count, budget));
  }
  if (name == "upper") {
    argument_count(name, arguments, 0, 0);
    return make_string(to_upper(text));
  }
  if (name == "lower" || name == "casefold") {
    argument_count(name, arguments, 0, 0);
    return make_string(to_lower(text));
  }
  if (name == "title") {
    argument_count(name, arguments, 0, 0);
    return make_string(python_title(text));
  }
  if (name == "capitalize") {
    argument_count(name, arguments, 0, 0);
    return make_string(capitalize(text));
  }
  if (name == "swapcase") {
    argument_count(name, arguments, 0, 0);
    return make_string(swapcase(text));
  }
  if (one_of(name, {"find", "rfind", "index", "rindex", "count"})) {
    argument_count(name, arguments, 1, 3);
    const std::string& needle = string_argument(name, positional[0]);
    const Value none = make_none();
    const Value& start = positional.size() > 1 ? positional[1] : none;
    const Value& end = positional.size() > 2 ? positional[2] : none;
    const int64_t length = static_cast<int64_t>(count_code_points(text));
    const auto [part, offset] = text_range(text, start, end);
    if (name == "count") {
      if (needle.empty()) {
        const bool start_past = !start.is_none() && integer_of(start) > length;
        return make_int(start_past ? 0 : static_cast<int64_t>(count_code_points(part)) + 1);
      }
      int64_t count = 0;
      for (size_t at = part.find(needle); at != std::string::npos;
           at = part.find(needle, at + needle.size())) {
        ++count;
      }
      return make_int(count);
    }
    const bool reverse = name[0] == 'r';
    size_t found = reverse ? part.rfind(needle) : part.find(needle);
    if (!start.is_none() && integer_of(start) > length) found = std::string::npos;
    if (found == std::string::npos) {
      if (name == "index" || name == "rindex") throw Failure{"substring not found"};
      return make_int(-1);
    }
    return make_int(offset + code_point_index(part, found));
  }
  if (name == "join") {
    argument_count(name, arguments, 1, 1);
    std::string out;
    size_t index = 0;
    for (const Value& item : iterate(positional[0], budget)) {
      if (!item.is_string()) {
        throw Failure{"sequence item " + std::to_string(index) + ": expected str instance, " +
                      type_name(item) + " found"};
      }
      if (index++ > 0) out += text;
      out += item.text();
      Budget::check_size(out.size());
    }
    budget.charge_bytes(out.size());
    return make_string(std::move(out));
  }
  if (one_of(name, {"isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "islower",
                    "isupper", "isascii"})) {
    argument_count(name, arguments, 0, 0);
    if (name == "isascii") {
      return make_bool(std::all_of(text.begin(), text.end(),
                                   [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
    }
    if (name == "isspace") return make_bool(all_space(text));
    if (name == "islower" || name == "isupper") {
      return make_bool(text_is_cased(text, name == "islower"));
    }
    if (text.empty()) return make_bool(false);
    const bool digits = name == "isdigit" || name == "isdecimal" || name == "isnumeric";
    return make_bool(std::all_of(text.begin(), text.end(), [&](char c) {
      const bool digit = c >= '0' && c <= '9';
      if (digits) return digit;
      return ascii_letter(c) || (name == "isalnum" && digit);
    }));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    argument_count(name, arguments, 1, 1);
    const std::string& affix = string_argument(name, positional[0]);
    if (name == "removeprefix" && text.rfind(affix, 0) == 0) {
      return make_string(text.substr(affix.size()));
    }
    if (name == "removesuffix" && !affix.empty() && text.size() >= affix.size() &&
        text.compare(text.size() - affix.size(), affix.size(), affix) == 0) {
      return make_string(text.substr(0, text.size() - affix.size()));
    }
    return receiver;
  }
  if (name == "partition" || name == "rpartition") {
    argument_count(name, arguments, 1, 1);
    const std::string& separator = string_argument(name, positional[0]);
    if (separator.empty()) throw Failure{"empty separator"};
    const size_t at = name == "partition" ? text.find(separator) : text.rfind(separator);
    std::vector<Value> parts;
    if (at == std::string::npos) {
      parts = name == "partition" ? std::vector<Value>{receiver, make_string(""), make_string("")}
                                  : std::vector<Value>{make_string(""), make_string(""), receiver};
    } else {
      parts = {make_string(text.substr(0, at)), make_string(separator),
               make_string(text.substr(at + separator.size()))};
    }
    return make_sequence(SequenceType::kTuple, std::move(parts));
  }
  if (one_of(name, {"center", "ljust", "rjust"})) {
    argument_count(name, arguments, 1, 2);
    const int64_t width = integer_argument(name, positional[0]);
    std::string fill = " ";
    if (positional.size() > 1) {
      fill = string_argument(name, positional[1]);
      if (count_code_points(fill) != 1) {
        throw Failure{"The fill character must be exactly one character long"};
      }
    }
    const int64_t length = static_cast<int64_t>(count_code_points(text));
    const int64_t margin = width - length;
    int64_t left = 0;
    if (name == "rjust") left = std::max<int64_t>(margin, 0);
    if (name == "center" && margin > 0) left = margin / 2 + (margin & width & 1);
    return make_string(pad(text, width, fill, left));
  }
  if (name == "zfill") {
    argument_count(name, arguments, 1, 1);
    const int64_t width = integer_argument(name, positional[0]);
    const int64_t length = static_cast<int64_t>(count_code_points(text));
    if (width <= length) return receiver;
    if (width > static_cast<int64_t>(kMaxStringBytes))
      Budget::check_size(static_cast<size_t>(width));
    const size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
    return make_string(text.substr(0, sign) +
                       std::string(static_cast<size_t>(width - length), '0') + text.substr(sign));
  }
  throw Failure{"unsupported method " + text_repr(name) + " of str"};
}

Value dict_method(const Value& receiver, const std::string& name, const Arguments& arguments,
                  Budget& budget) {
  const Dict& dict = receiver.dict();
  budget.charge(dict.entries.size());
  if (name == "get") {
    argument_count(name, arguments, 1, 2);
    const Value* found = dict.find(arguments.positional[0], budget);
    if (found) return *found;
    return arguments.positional.size() > 1 ? arguments.positional[1] : make_none();
  }
  if (name == "items" || name == "keys" || name == "values") {
    argument_count(name, arguments, 0, 0);
    std::vector<Value> items;
    items.reserve(dict.entries.size());
    for (const auto& [key, item] : dict.entries) {
      if (name == "keys") {
        items.push_back(key);
      } else if (name == "values") {
        items.push_back(item);
      } else {
        items.push_back(make_sequence(SequenceType::kTuple, {key, item}));
      }
    }
    const SequenceType type = name == "items"  ? SequenceType::kDictItems
                              : name == "keys" ? SequenceType::kDictKeys
                                               : SequenceType::kDictValues;
    auto sequence = std::make_shared<Sequence>();
    sequence->type = type;
    sequence->depth = dict.depth + 1;
    sequence->items = std::move(items);
    return Value{Kind::kSequence, std::shared_ptr<const Sequence>(std::move(sequence))};
  }
  if (name == "copy") {
    argument_count(name, arguments, 0, 0);
    return receiver;
  }
  throw Failure{"unsupported method " + text_repr(name) + " of dict"};
}

Value sequence_method(const Value& receiver, const std::string& name, const Arguments& arguments,
                      Budget& budget) {
  const std::vector<Value>& items = receiver.sequence().items;
  budget.charge(items.size());
  if (name == "copy") {
    argument_count(name, arguments, 0, 0);
    return make_list(items);
  }
  if (name == "count") {
    argument_count(name, arguments, 1, 1);
    return make_int(std::count_if(items.begin(), items.end(), [&](const Value& item) {
      return equals(item, arguments.positional[0], budget);
    }));
  }
  if (name == "index") {
    argument_count(name, arguments, 1, 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (equals(items[i], arguments.positional[0], budget)) {
        return make_int(static_cast<int64_t>(i));
      }
    }
    throw Failure{repr_of(arguments.positional[0]) + " is not in " + type_name(receiver)};
  }
  throw Failure{"unsupported method " + text_repr(name) + " of " + type_name(receiver)};
}

Value loop_method(const Value& receiver, const std::string& name, const Arguments& arguments,
                  Budget& budget) {
  LoopState& loop = receiver.loop();
  no_keywords(name, arguments);
  if (name == "cycle") {
    if (arguments.positional.empty()) throw Failure{"no items for cycling given"};
    return arguments.positional[loop.index0 % arguments.positional.size()];
  }
  if (loop.last_changed && loop.last_changed->size() == arguments.positional.size() &&
      std::equal(arguments.positional.begin(), arguments.positional.end(),
                 loop.last_changed->begin(),
                 [&budget](const Value& a, const Value& b) { return equals(a, b, budget); })) {
    return make_bool(false);
  }
  loop.last_changed = arguments.positional;
  return make_bool(true);
}

Value call_range(const Arguments& arguments, Budget& budget) {
  argument_count("range", arguments, 1, 3);
  const auto& positional = arguments.positional;
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (positional.size() == 1) {
    stop = integer_argument("range", positional[0]);
  } else {
    start = integer_argument("range", positional[0]);
    stop = integer_argument("range", positional[1]);
    if (positional.size() == 3) step = integer_argument("range", positional[2]);
  }
  if (step == 0) throw Failure{"range() arg 3 must not be zero"};
  // In unsigned arithmetic: the bounds may lie further apart than int64_t holds.
  uint64_t length = 0;
  if (step > 0 && stop > start) {
    const uint64_t span = static_cast<uint64_t>(stop) - static_cast<uint64_t>(start);
    length = (span - 1) / static_cast<uint64_t>(step) + 1;
  } else if (step < 0 && stop < start) {
    const uint64_t span = static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    length = (span - 1) / (0 - static_cast<uint64_t>(step)) + 1;
  }
  if (length > static_cast<uint64_t>(kMaxRange)) {
    throw Failure{"Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                  std::to_string(kMaxRange) + ")."};
  }
  budget.charge(length);
  auto sequence = std::make_shared<Sequence>();
  sequence->type = SequenceType::kRange;
  sequence->range_args = {start, stop, step};
  for (uint64_t i = 0; i < length; ++i) {
    const uint64_t item = static_cast<uint64_t>(start) + i * static_cast<uint64_t>(step);
    sequence->items.push_back(make_int(static_cast<int64_t>(item)));
  }
  return Value{Kind::kSequence, std::shared_ptr<const Sequence>(std::move(sequence))};
}

// dict(...) and namespace(...): keyword arguments over an optional mapping or sequence of
// pairs.
Dict collect_mapping(std::string_view function, const Arguments& arguments, Budget& budget) {
  if (arguments.positional.size() > 1) {
    throw Failure{std::string(function) + " expected at most 1 argument, got " +
                  std::to_string(arguments.positional.size())};
  }
  Dict dict;
  if (!arguments.positional.empty()) {
    const Value& source = arguments.positional[0];
    if (source.kind == Kind::kDict) {
      for (const auto& [key, item] : source.dict().entries) dict.set(key, item, budget);
    } else {
      size_t index = 0;
      for (const Value& pair : iterate(source, budget)) {
        std::vector<Value> parts = iterate(pair, budget);
        if (parts.size() != 2) {
          throw Failure{"dictionary update sequence element #" + std::to_string(index) +
                        " has length " + std::to_string(parts.size()) + "; 2 is required"};
        }
        dict.set(parts[0], parts[1], budget);
        ++index;
      }
    }
  }
  for (const auto& [key, item] : arguments.keywords) dict.set(make_string(key), item, budget);
  budget.charge(dict.entries.size());
  return dict;
}

void check_namespace_name(const Value& key) {
  if (key.is_string() && !key.text().empty() && key.text()[0] == '_') {
    throw Failure{
        "Chat templates cannot store underscore-prefixed attributes on a namespace, "
        "but got " +
        text_repr(key.text()) + ". Please rename the attribute."};
  }
}

std::string strftime_now(const Arguments& arguments) {
  argument_count("strftime_now", arguments, 1, 1);
  const std::string& format = string_argument("strftime_now", arguments.positional[0]);
  if (format.size() > 1024) throw Failure{"strftime_now format is too long"};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::vector<char> buffer(256 + format.size() * 64);
  const size_t written = std::strftime(buffer.data(), buffer.size(), format.c_str(), &local);
  return std::string(buffer.data(), written);
}

}  // namespace

// ---- public ------------------------------------------------------------------------------------

Value get_attribute(const Value& object, const std::string& name) {
  check_defined(object);
  // Attribute names are identifiers of the template, or keys get_item has charged for.
  Budget local;
  switch (object.kind) {
    case Kind::kNamespace: {
      const Value* found = object.attributes().find(make_string(name), local);
      if (found) return *found;
      break;
    }
    case Kind::kLoop:
      return loop_attribute(object, name);
    case Kind::kDict: {
      if (std::optional<Value> attribute = type_attribute(object, name)) return *attribute;
      const Value* found = object.dict().find(make_string(name), local);
      if (found) return *found;
      break;
    }
    default:
      if (std::optional<Value> attribute = type_attribute(object, name)) return *attribute;
  }
  return make_undefined(missing_message(object, make_string(name)));
}

Value get_item(const Value& object, const Value& key, Budget& budget) {
  check_defined(object);
  budget.charge(1);
  if (key.is_string()) budget.charge_bytes(key.text().size());
  switch (object.kind) {
    case Kind::kDict: {
      if (hash_key(key)) {
        const Value* found = object.dict().find(key, budget);
        if (found) return *found;
      }
      break;
    }
    case Kind::kSequence: {
      const Sequence& sequence = object.sequence();
      const bool indexable = sequence.type == SequenceType::kList ||
                             sequence.type == SequenceType::kTuple ||
                             sequence.type == SequenceType::kRange;
      if (indexable && is_integer(key)) {
        const auto size = static_cast<int64_t>(sequence.items.size());
        int64_t index = integer_of(key);
        if (index < 0) index += size;
        if (index >= 0 && index < size) return sequence.items[static_cast<size_t>(index)];
        return make_undefined(missing_message(object, key));
      }
      break;
    }
    case Kind::kString: {
      if (is_integer(key)) {
        const std::string& text = object.text();
        budget.charge_bytes(text.size());
        int64_t index = integer_of(key);
        if (index < 0) index += static_cast<int64_t>(count_code_points(text));
        for (size_t offset = 0; index >= 0 && offset < text.size(); --index) {
          const size_t size = decode_at(text, offset).size;
          if (index == 0) return make_string(text.substr(offset, size));
          offset += size;
        }
        return make_undefined(missing_message(object, key));
      }
      break;
    }
    case Kind::kNamespace:
    case Kind::kLoop:
      if (key.is_string()) return get_attribute(object, key.text());
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (std::optional<Value> attribute = type_attribute(object, key.text())) return *attribute;
  }
  return make_undefined(missing_message(object, key));
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step,
                Budget& budget) {
  check_defined(object);
  for (const Value* bound : {&start, &stop, &step}) {
    if (!bound->is_none() && !is_integer(*bound)) {
      return make_undefined(type_name(object) +
                            " object has no element slice (slice indices must be integers or "
                            "None)");
    }
  }
  if (object.is_string()) {
    budget.charge_bytes(object.text().size());
    const std::vector<size_t> offsets = code_point_offsets(object.text());
    const auto indices = slice_indices(static_cast<int64_t>(offsets.size()) - 1, start, stop, step);
    std::string out;
    for (const int64_t index : indices) {
      const auto at = static_cast<size_t>(index);
      out.append(object.text(), offsets[at], offsets[at + 1] - offsets[at]);
    }
    budget.charge_bytes(out.size());
    return make_string(std::move(out));
  }
  if (object.kind == Kind::kSequence) {
    const Sequence& sequence = object.sequence();
    if (sequence.type == SequenceType::kList || sequence.type == SequenceType::kTuple ||
        sequence.type == SequenceType::kRange) {
      const auto indices =
          slice_indices(static_cast<int64_t>(sequence.items.size()), start, stop, step);
      std::vector<Value> items;
      items.reserve(indices.size());
      for (const int64_t index : indices)
        items.push_back(sequence.items[static_cast<size_t>(index)]);
      budget.charge(items.size());
      return make_sequence(
          sequence.type == SequenceType::kTuple ? SequenceType::kTuple : SequenceType::kList,
          std::move(items));
    }
  }
  return make_undefined(type_name(object) + " object has no element slice");
}

Value binary_operation(std::string_view op, const Value& left, const Value& right, Budget& budget) {
  check_defined(left);
  check_defined(right);
  const std::string operands = "'" + type_name(left) + "' and '" + type_name(right) + "'";
  const auto unsupported = [&]() -> Failure {
    return Failure{"unsupported operand type(s) for " + std::string(op) + ": " + operands};
  };
  const bool numbers = left.is_number() && right.is_number();
  const bool integers = is_integer(left) && is_integer(right);
  if (op == "+") {
    if (integers) return make_int(checked_add(integer_of(left), integer_of(right)));
    if (numbers) return make_float(double_of(left) + double_of(right));
    if (left.is_string() && right.is_string()) {
      Budget::check_size(left.text().size() + right.text().size());
      budget.charge_bytes(left.text().size() + right.text().size());
      return make_string(left.text() + right.text());
    }
    if (left.kind == Kind::kSequence && right.kind == Kind::kSequence &&
        left.sequence().type == right.sequence().type &&
        (left.sequence().type == SequenceType::kList ||
         left.sequence().type == SequenceType::kTuple)) {
      std::vector<Value> items = left.sequence().items;
      items.insert(items.end(), right.sequence().items.begin(), right.sequence().items.end());
      budget.charge(items.size());
      return make_sequence(left.sequence().type, std::move(items));
    }
    const bool concatenable = left.is_string() || (left.kind == Kind::kSequence &&
                                                   (left.sequence().type == SequenceType::kList ||
                                                    left.sequence().type == SequenceType::kTuple));
    if (concatenable) {
      throw Failure{"can only concatenate " + type_name(left) + " (not \"" + type_name(right) +
                    "\") to " + type_name(left)};
    }
    throw unsupported();
  }
  if (op == "-") {
    if (integers) return make_int(checked_sub(integer_of(left), integer_of(right)));
    if (numbers) return make_float(double_of(left) - double_of(right));
    throw unsupported();
  }
  if (op == "*") {
    if (integers) return make_int(checked_mul(integer_of(left), integer_of(right)));
    if (numbers) return make_float(double_of(left) * double_of(right));
    const Value& sequence = left.is_number() ? right : left;
    const Value& times = left.is_number() ? left : right;
    const bool repeatable =
        sequence.is_string() ||
        (sequence.kind == Kind::kSequence && (sequence.sequence().type == SequenceType::kList ||
                                              sequence.sequence().type == SequenceType::kTuple));
    if (repeatable && !is_integer(times) && times.is_number()) {
      throw Failure{"can't multiply sequence by non-int of type '" + type_name(times) + "'"};
    }
    if (repeatable && is_integer(times)) {
      const int64_t count = integer_of(times);
      if (sequence.is_string()) return make_string(repeat(sequence.text(), count, budget));
      const std::vector<Value>& items = sequence.sequence().items;
      std::vector<Value> repeated;
      if (count > 0 && !items.empty()) {
        if (static_cast<uint64_t>(count) > kMaxSteps / items.size()) budget.charge(kMaxSteps);
        budget.charge(items.size() * static_cast<uint64_t>(count));
        for (int64_t i = 0; i < count; ++i)
          repeated.insert(repeated.end(), items.begin(), items.end());
      }
      return make_sequence(sequence.sequence().type, std::move(repeated));
    }
    throw unsupported();
  }
  if (op == "/") {
    if (!numbers) throw unsupported();
    if (double_of(right) == 0.0) {
      throw Failure{left.kind == Kind::kFloat || right.kind == Kind::kFloat
                        ? "float division by zero"
                        : "division by zero"};
    }
    return make_float(double_of(left) / double_of(right));
  }
  if (op == "//" || op == "%") {
    if (left.is_string() && op == "%") {
      throw Failure{"printf-style string formatting (str % value) is not supported"};
    }
    if (!numbers) throw unsupported();
    if (integers) {
      if (integer_of(right) == 0) {
        throw Failure{op == "//" ? "integer division or modulo by zero" : "integer modulo by zero"};
      }
      return make_int(op == "//" ? floor_div(integer_of(left), integer_of(right))
                                 : floor_mod(integer_of(left), integer_of(right)));
    }
    if (double_of(right) == 0.0) {
      throw Failure{op == "//" ? "float floor division by zero" : "float modulo"};
    }
    const auto [quotient, remainder] = float_divmod(double_of(left), double_of(right));
    return make_float(op == "//" ? quotient : remainder);
  }
  if (op == "**") {
    if (!numbers) throw Failure{"unsupported operand type(s) for ** or pow(): " + operands};
    if (integers && integer_of(right) >= 0) {
      int64_t base = integer_of(left);
      int64_t exponent = integer_of(right);
      int64_t result = 1;
      while (exponent > 0) {
        if (exponent & 1) result = checked_mul(result, base);
        exponent >>= 1;
        if (exponent > 0) base = checked_mul(base, base);
      }
      return make_int(result);
    }
    const double base = double_of(left);
    const double exponent = double_of(right);
    if (base == 0.0 && exponent < 0) throw Failure{"0.0 cannot be raised to a negative power"};
    if (base < 0 && std::isfinite(exponent) && exponent != std::floor(exponent)) {
      throw Failure{
          "a negative number raised to a fractional power is complex, which templates "
          "cannot use"};
    }
    const double result = std::pow(base, exponent);
    if (std::isinf(result) && std::isfinite(base) && std::isfinite(exponent)) {
      throw Failure{"(34, 'Numerical result out of range')"};
    }
    return make_float(result);
  }
  throw Failure{"unknown operator " + std::string(op)};
}

Value unary_operation(std::string_view op, const Value& operand) {
  check_defined(operand);
  if (is_integer(operand)) {
    const int64_t number = integer_of(operand);
    if (op == "+") return make_int(number);
    if (number == std::numeric_limits<int64_t>::min()) overflow();
    return make_int(-number);
  }
  if (operand.kind == Kind::kFloat) {
    return make_float(op == "+" ? operand.number() : -operand.number());
  }
  throw Failure{"bad operand type for unary " + std::string(op) + ": '" + type_name(operand) + "'"};
}

namespace {

bool contains(const Value& container, const Value& item, Budget& budget) {
  switch (container.kind) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        throw Failure{"'in <string>' requires string as left operand, not " + type_name(item)};
      }
      budget.charge_bytes(container.text().size());
      return container.text().find(item.text()) != std::string::npos;
    case Kind::kSequence: {
      const Sequence& sequence = container.sequence();
      const bool iterator = sequence.type == SequenceType::kGenerator ||
                            sequence.type == SequenceType::kReverseIterator;
      for (size_t i = iterator ? sequence.consumed : 0; i < sequence.items.size(); ++i) {
        budget.charge(1);
        if (equals(sequence.items[i], item, budget)) {
          if (iterator) sequence.consumed = i + 1;
          return true;
        }
      }
      if (iterator) sequence.consumed = sequence.items.size();
      return false;
    }
    case Kind::kDict:
      return container.dict().find(item, budget) != nullptr;
    default:
      throw Failure{"argument of type '" + type_name(container) + "' is not iterable"};
  }
}

}  // namespace

bool compare(std::string_view op, const Value& left, const Value& right, Budget& budget) {
  if (op == "==") return equals(left, right, budget);
  if (op == "!=") return !equals(left, right, budget);
  if (op == "in") return contains(right, left, budget);
  if (op == "notin") return !contains(right, left, budget);
  return compare_order(left, right, op, budget);
}

Value apply_filter(const std::string& name, const Value& operand, const Arguments& arguments,
                   Budget& budget) {
  budget.charge(1);
  const auto no_arguments = [&] {
    if (!arguments.positional.empty() || !arguments.keywords.empty()) {
      throw Failure{"the filter " + text_repr(name) + " takes no arguments"};
    }
  };
  if (name == "trim") {
    const auto bound = bind("trim", {"chars"}, arguments);
    return make_string(strip_with("strip", to_str(operand, budget), bound[0], true, true));
  }
  if (name == "length" || name == "count") {
    no_arguments();
    return make_int(length_of(operand, budget));
  }
  if (name == "tojson") return filter_tojson(operand, arguments, budget);
  if (name == "upper") {
    no_arguments();
    return make_string(to_upper(to_str(operand, budget)));
  }
  if (name == "lower") {
    no_arguments();
    return make_string(to_lower(to_str(operand, budget)));
  }
  if (name == "capitalize") {
    no_arguments();
    return make_string(capitalize(to_str(operand, budget)));
  }
  if (name == "title") {
    no_arguments();
    return make_string(jinja_title(to_str(operand, budget)));
  }
  if (name == "default" || name == "d") {
    const auto bound = bind(name, {"default_value", "boolean"}, arguments);
    const bool boolean = bound[1] && truthy(*bound[1]);
    if (operand.is_undefined() || (boolean && !truthy(operand))) {
      return value_or(bound[0], make_string(""));
    }
    return operand;
  }
  if (name == "first") {
    no_arguments();
    return filter_first(operand, budget);
  }
  if (name == "last") {
    no_arguments();
    return filter_last(operand, budget);
  }
  if (name == "join") return filter_join(operand, arguments, budget);
  if (name == "replace") {
    const auto bound = bind("replace", {"old", "new", "count"}, arguments);
    if (!bound[0] || !bound[1]) throw Failure{"replace() needs the old and the new text"};
    const int64_t count =
        bound[2] && !bound[2]->is_none() ? integer_argument("replace", *bound[2]) : -1;
    return make_string(replace_text(to_str(operand, budget), to_str(*bound[0], budget),
                                    to_str(*bound[1], budget), count, budget));
  }
  if (name == "list") {
    no_arguments();
    return make_list(iterate(operand, budget));
  }
  if (name == "items") {
    no_arguments();
    return filter_items(operand);
  }
  if (name == "string") {
    no_arguments();
    return make_string(to_str(operand, budget));
  }
  if (name == "int") return filter_int(operand, arguments);
  if (name == "float") return filter_float(operand, arguments);
  if (name == "abs") {
    no_arguments();
    return filter_abs(operand);
  }
  if (name == "round") return filter_round(operand, arguments);
  if (name == "indent") return filter_indent(operand, arguments, budget);
  if (name == "map") return filter_map(operand, arguments, budget);
  if (name == "select") return filter_select(operand, arguments, true, false, budget);
  if (name == "reject") return filter_select(operand, arguments, false, false, budget);
  if (name == "selectattr") return filter_select(operand, arguments, true, true, budget);
  if (name == "rejectattr") return filter_select(operand, arguments, false, true, budget);
  if (name == "unique") return filter_unique(operand, arguments, budget);
  if (name == "sort") return filter_sort(operand, arguments, budget);
  if (name == "dictsort") return filter_dictsort(operand, arguments, budget);
  if (name == "reverse") {
    no_arguments();
    return filter_reverse(operand, budget);
  }
  if (name == "sum") return filter_sum(operand, arguments, budget);
  if (name == "min") return filter_extreme(operand, arguments, false, budget);
  if (name == "max") return filter_extreme(operand, arguments, true, budget);
  throw Failure{"unsupported filter " + text_repr(name)};
}

bool apply_test(const std::string& name, const Value& operand, const Arguments& arguments,
                Budget& budget) {
  budget.charge(1);
  const auto argument = [&](const char* parameter) -> const Value& {
    no_keywords(name, arguments);
    if (arguments.positional.size() != 1) {
      throw Failure{"the test " + text_repr(name) + " takes one argument (" + parameter + ")"};
    }
    return arguments.positional[0];
  };
  const auto none = [&] {
    if (!arguments.positional.empty() || !arguments.keywords.empty()) {
      throw Failure{"the test " + text_repr(name) + " takes no arguments"};
    }
  };
  if (name == "defined") {
    none();
    return !operand.is_undefined();
  }
  if (name == "undefined") {
    none();
    return operand.is_undefined();
  }
  if (name == "none") {
    none();
    return operand.is_none();
  }
  if (name == "boolean") {
    none();
    return operand.kind == Kind::kBool;
  }
  if (name == "true") {
    none();
    return operand.kind == Kind::kBool && operand.boolean();
  }
  if (name == "false") {
    none();
    return operand.kind == Kind::kBool && !operand.boolean();
  }
  if (name == "integer") {
    none();
    return operand.kind == Kind::kInt;
  }
  if (name == "float") {
    none();
    return operand.kind == Kind::kFloat;
  }
  if (name == "number") {
    none();
    return operand.is_number();
  }
  if (name == "string") {
    none();
    return operand.is_string();
  }
  if (name == "mapping") {
    none();
    return operand.kind == Kind::kDict;
  }
  if (name == "iterable") {
    none();
    return operand.is_undefined() || operand.is_string() || operand.kind == Kind::kSequence ||
           operand.kind == Kind::kDict || operand.kind == Kind::kLoop;
  }
  if (name == "sequence") {
    none();
    if (operand.kind == Kind::kSequence) {
      const SequenceType type = operand.sequence().type;
      return type == SequenceType::kList || type == SequenceType::kTuple ||
             type == SequenceType::kRange;
    }
    return operand.is_undefined() || operand.is_string() || operand.kind == Kind::kDict;
  }
  if (name == "callable") {
    none();
    return operand.kind == Kind::kFunction || operand.is_undefined() || operand.kind == Kind::kLoop;
  }
  if (name == "odd") {
    none();
    return python_mod_is(operand, make_int(2), 1);
  }
  if (name == "even") {
    none();
    return python_mod_is(operand, make_int(2), 0);
  }
  if (name == "divisibleby") return python_mod_is(operand, argument("num"), 0);
  if (name == "lower" || name == "upper") {
    none();
    return text_is_cased(to_str(operand, budget), name == "lower");
  }
  if (name == "eq" || name == "equalto" || name == "==") {
    return compare("==", operand, argument("other"), budget);
  }
  if (name == "ne" || name == "!=") return compare("!=", operand, argument("other"), budget);
  if (name == "lt" || name == "lessthan" || name == "<") {
    return compare("<", operand, argument("other"), budget);
  }
  if (name == "le" || name == "<=") return compare("<=", operand, argument("other"), budget);
  if (name == "gt" || name == "greaterthan" || name == ">") {
    return compare(">", operand, argument("other"), budget);
  }
  if (name == "ge" || name == ">=") return compare(">=", operand, argument("other"), budget);
  if (name == "in") return compare("in", operand, argument("seq"), budget);
  if (name == "sameas") return is_identical(operand, argument("other"));
  throw Failure{"unsupported test " + text_repr(name)};
}

Value call_function(const Function& function, const Arguments& arguments, Budget& budget) {
  budget.charge(1);
  switch (function.type) {
    case FunctionType::kRange:
      return call_range(arguments, budget);
    case FunctionType::kDict:
      return make_dict(collect_mapping("dict", arguments, budget));
    case FunctionType::kNamespace: {
      Dict attributes = collect_mapping("namespace", arguments, budget);
      for (const auto& [key, item] : attributes.entries) {
        check_namespace_name(key);
        if (!is_plain_data(item)) {
          throw Failure{
              "a namespace attribute may hold only data (None, booleans, numbers, "
              "strings, and lists and dicts of them)"};
        }
      }
      return make_namespace(std::move(attributes));
    }
    case FunctionType::kRaiseException: {
      argument_count("raise_exception", arguments, 1, 1);
      throw Failure{to_str(arguments.positional[0], budget)};
    }
    case FunctionType::kStrftimeNow:
      return make_string(strftime_now(arguments));
    case FunctionType::kMethod: {
      const Value& receiver = function.receiver;
      switch (receiver.kind) {
        case Kind::kString:
          return string_method(receiver, function.name, arguments, budget);
        case Kind::kDict:
          return dict_method(receiver, function.name, arguments, budget);
        case Kind::kSequence:
          return sequence_method(receiver, function.name, arguments, budget);
        case Kind::kLoop:
          return loop_method(receiver, function.name, arguments, budget);
        default:
          break;
      }
      throw Failure{"unsupported method " + text_repr(function.name)};
    }
    case FunctionType::kMacro:
      break;
  }
  throw Failure{"cannot call " + function.name + " here"};
}

std::optional<Value> global_function(const std::string& name) {
  if (!one_of(name, {"range", "namespace", "dict", "raise_exception", "strftime_now"})) {
    return std::nullopt;
  }
  Function function;
  function.name = name;
  if (name == "range") {
    function.type = FunctionType::kRange;
  } else if (name == "namespace") {
    function.type = FunctionType::kNamespace;
  } else if (name == "dict") {
    function.type = FunctionType::kDict;
  } else if (name == "raise_exception") {
    function.type = FunctionType::kRaiseException;
  } else {
    function.type = FunctionType::kStrftimeNow;
  }
  return make_function(std::move(function));
}

}  // namespace specrun::chat::jinja
