#include "runtime/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "runtime/chat/jinja_unicode.h"

namespace specrun::chat::jinja {
namespace {

// Recursive walks over values stop here: deeper than any value the limits let a template build.
constexpr int kMaxWalkDepth = 4 * kMaxValueDepth;

void check_walk_depth(int depth) {
  if (depth > kMaxWalkDepth) {
    throw Failure{"a value nests deeper than " + std::to_string(kMaxWalkDepth)};
  }
}

const char* sequence_type_name(SequenceType type) {
  switch (type) {
    case SequenceType::kList:
      return "list";
    case SequenceType::kTuple:
      return "tuple";
    case SequenceType::kGenerator:
      return "generator";
    case SequenceType::kReverseIterator:
      return "list_reverseiterator";
    case SequenceType::kDictItems:
      return "dict_items";
    case SequenceType::kDictKeys:
      return "dict_keys";
    case SequenceType::kDictValues:
      return "dict_values";
    case SequenceType::kRange:
      return "range";
  }
  return "list";
}

bool is_iterator(const Sequence& sequence) {
  return sequence.type == SequenceType::kGenerator ||
         sequence.type == SequenceType::kReverseIterator;
}

// Exact comparison of an integer with a double, as Python compares int and float.
int compare_numbers(const Value& left, const Value& right) {
  const auto as_long_double = [](const Value& value) -> long double {
    switch (value.kind) {
      case Kind::kBool:
        return value.boolean() ? 1 : 0;
      case Kind::kInt:
        return static_cast<long double>(value.integer());
      default:
        return value.number();
    }
  };
  const long double a = as_long_double(left);
  const long double b = as_long_double(right);
  if (a < b) return -1;
  if (a > b) return 1;
  if (a == b) return 0;
  return 2;  // NaN: unordered
}

int64_t int_value(const Value& value) {
  return value.kind == Kind::kBool ? (value.boolean() ? 1 : 0) : value.integer();
}

void append_json_string(std::string& out, std::string_view text, bool ensure_ascii) {
  out += '"';
  char buffer[16];
  for (size_t offset = 0; offset < text.size();) {
    const CodePoint point = decode_at(text, offset);
    const char32_t c = point.value;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(buffer, sizeof(buffer), "\\u%04x\\u%04x",
                          static_cast<unsigned>(0xD800 | (v >> 10)),
                          static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
          } else {
            std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(c));
          }
          out += buffer;
        } else {
          out.append(text.substr(offset, point.size));
        }
    }
    offset += point.size;
  }
  out += '"';
}

std::string json_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return float_repr(value);
}

void append_json(std::string& out, const Value& value, const JsonStyle& style, Budget& budget,
                 int level) {
  check_walk_depth(level);
  budget.charge(1);
  Budget::check_size(out.size());
  const auto newline = [&](int at) {
    if (!style.indent) return;
    out += '\n';
    for (int i = 0; i < at; ++i) out += *style.indent;
  };
  switch (value.kind) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += value.boolean() ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(value.integer());
      return;
    case Kind::kFloat:
      out += json_float(value.number());
      return;
    case Kind::kString:
      budget.charge_bytes(value.text().size());
      append_json_string(out, value.text(), style.ensure_ascii);
      return;
    case Kind::kSequence: {
      const Sequence& sequence = value.sequence();
      if (sequence.type != SequenceType::kList && sequence.type != SequenceType::kTuple) break;
      if (sequence.items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < sequence.items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(level + 1);
        append_json(out, sequence.items[i], style, budget, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::kDict: {
      const Dict& dict = value.dict();
      if (dict.entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& entry : dict.entries) entries.push_back(&entry);
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [&budget](const auto* a, const auto* b) {
          return less_than(a->first, b->first, budget);
        });
      }
      out += '{';
      bool first = true;
      for (const auto* entry : entries) {
        if (!first) out += style.item_separator;
        first = false;
        newline(level + 1);
        const Value& key = entry->first;
        switch (key.kind) {
          case Kind::kString:
            append_json_string(out, key.text(), style.ensure_ascii);
            break;
          case Kind::kNone:
            out += "\"null\"";
            break;
          case Kind::kBool:
            out += key.boolean() ? "\"true\"" : "\"false\"";
            break;
          case Kind::kInt:
            out += '"' + std::to_string(key.integer()) + '"';
            break;
          case Kind::kFloat:
            out += '"' + json_float(key.number()) + '"';
            break;
          default:
            throw Failure{"keys must be str, int, float, bool or None, not " + type_name(key)};
        }
        out += style.key_separator;
        append_json(out, entry->second, style, budget, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      break;
  }
  throw Failure{"Object of type " + type_name(value) + " is not JSON serializable"};
}

void append_sequence_items(std::string& out, const std::vector<Value>& items, Budget& budget) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    append_repr(out, items[i], budget);
  }
}

void append_dict_items(std::string& out, const Dict& dict, Budget& budget) {
  out += '{';
  bool first = true;
  for (const auto& [key, item] : dict.entries) {
    if (!first) out += ", ";
    first = false;
    append_repr(out, key, budget);
    out += ": ";
    append_repr(out, item, budget);
  }
  out += '}';
}

}  // namespace

void Budget::throw_exhausted() const {
  throw Failure{"rendering exceeded the limit of " + std::to_string(limit_) + " evaluation steps"};
}

void Budget::throw_too_large(size_t bytes) {
  throw Failure{"a string of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                std::to_string(kMaxStringBytes) + " bytes"};
}

const Value* Dict::find(const Value& key, Budget& budget) const {
  const std::optional<std::string> hashed = hash_key(key);
  if (!hashed) throw Failure{"unhashable type: '" + type_name(key) + "'"};
  budget.charge_bytes(hashed->size());
  const auto found = positions.find(*hashed);
  return found == positions.end() ? nullptr : &entries[found->second].second;
}

void Dict::set(const Value& key, Value value, Budget& budget) {
  const std::optional<std::string> hashed = hash_key(key);
  if (!hashed) throw Failure{"unhashable type: '" + type_name(key) + "'"};
  budget.charge_bytes(hashed->size());
  depth = std::max(depth, 1 + depth_of(value));
  plain = plain && is_plain_data(value);
  const auto [found, inserted] = positions.emplace(*hashed, entries.size());
  if (inserted) {
    entries.emplace_back(key, std::move(value));
  } else {
    entries[found->second].second = std::move(value);
  }
}

Value make_undefined(std::string message) {
  return Value{Kind::kUndefined, std::make_shared<const std::string>(std::move(message))};
}
Value make_none() {
  return Value{Kind::kNone, std::monostate{}};
}
Value make_bool(bool value) {
  return Value{Kind::kBool, value};
}
Value make_int(int64_t value) {
  return Value{Kind::kInt, value};
}
Value make_float(double value) {
  return Value{Kind::kFloat, value};
}
Value make_string(std::string text) {
  Budget::check_size(text.size());
  return Value{Kind::kString, std::make_shared<const std::string>(std::move(text))};
}

Value make_sequence(SequenceType type, std::vector<Value> items) {
  auto sequence = std::make_shared<Sequence>();
  sequence->type = type;
  for (const Value& item : items) {
    sequence->depth = std::max(sequence->depth, 1 + depth_of(item));
    sequence->plain = sequence->plain && is_plain_data(item);
  }
  if (sequence->depth > kMaxValueDepth) {
    throw Failure{"a value would nest deeper than " + std::to_string(kMaxValueDepth)};
  }
  sequence->items = std::move(items);
  return Value{Kind::kSequence, std::shared_ptr<const Sequence>(std::move(sequence))};
}

Value make_list(std::vector<Value> items) {
  return make_sequence(SequenceType::kList, std::move(items));
}

Value make_dict(Dict dict) {
  if (dict.depth > kMaxValueDepth) {
    throw Failure{"a value would nest deeper than " + std::to_string(kMaxValueDepth)};
  }
  return Value{Kind::kDict, std::make_shared<const Dict>(std::move(dict))};
}

Value make_namespace(Dict attributes) {
  return Value{Kind::kNamespace, std::make_shared<Dict>(std::move(attributes))};
}

Value make_function(Function function) {
  return Value{Kind::kFunction, std::make_shared<const Function>(std::move(function))};
}

bool is_plain_data(const Value& value) {
  switch (value.kind) {
    case Kind::kSequence:
      return value.sequence().plain;
    case Kind::kDict:
      return value.dict().plain;
    case Kind::kNamespace:
    case Kind::kLoop:
    case Kind::kFunction:
      return false;
    default:
      return true;
  }
}

int depth_of(const Value& value) {
  switch (value.kind) {
    case Kind::kSequence:
      return value.sequence().depth;
    case Kind::kDict:
      return value.dict().depth;
    case Kind::kNamespace:
      return 1;
    default:
      return 0;
  }
}

std::string type_name(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kSequence:
      return sequence_type_name(value.sequence().type);
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "TemplateNamespace";
    case Kind::kLoop:
      return "LoopContext";
    case Kind::kFunction:
      switch (value.function().type) {
        case FunctionType::kMacro:
          return "Macro";
        case FunctionType::kMethod:
          return "builtin_function_or_method";
        case FunctionType::kNamespace:
          return "type";
        case FunctionType::kDict:
          return "TemplateDict";
        default:
          return "function";
      }
  }
  return "object";
}

std::string missing_message(const Value& object, const Value& name) {
  std::string owner;
  switch (object.kind) {
    case Kind::kNone:
      owner = "None";
      break;
    case Kind::kNamespace:
      owner = "transformers.utils.chat_template_utils.TemplateNamespace object";
      break;
    case Kind::kLoop:
      owner = "jinja2.runtime.LoopContext object";
      break;
    case Kind::kFunction:
      owner = object.function().type == FunctionType::kMacro ? "jinja2.runtime.Macro object"
                                                             : type_name(object) + " object";
      break;
    default:
      owner = type_name(object) + " object";
  }
  std::string message;
  if (name.is_string()) {
    append_string_repr(message, owner);
    message += " has no attribute ";
  } else {
    message = owner + " has no element ";
  }
  // A name made of data can be large: the message shows its start.
  try {
    Budget small(64);
    append_repr(message, name, small);
  } catch (const Failure&) {
    message += "...";
  }
  return message;
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return value.boolean();
    case Kind::kInt:
      return value.integer() != 0;
    case Kind::kFloat:
      return value.number() != 0.0;
    case Kind::kString:
      return !value.text().empty();
    case Kind::kSequence:
      return is_iterator(value.sequence()) || !value.sequence().items.empty();
    case Kind::kDict:
      return !value.dict().entries.empty();
    case Kind::kLoop:
      return value.loop().items && !value.loop().items->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return true;
}

std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest digits that read back as `value`, then Python's layout of them: positional for
  // decimal exponents -4 <= e < 16, else scientific with a two-digit exponent at least.
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string_view text(buffer, static_cast<size_t>(result.ptr - buffer));
  const size_t e = text.find('e');
  std::string_view mantissa = text.substr(0, e);
  const int exponent = std::stoi(std::string(text.substr(e + 1)));
  std::string out;
  if (!mantissa.empty() && mantissa[0] == '-') {
    out += '-';
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (const char c : mantissa) {
    if (c != '.') digits += c;
  }
  const int point = exponent + 1;  // digits before the decimal point
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(point)) + "." +
             digits.substr(static_cast<size_t>(point));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof(exponent_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  out += exponent_text;
  return out;
}

void append_string_repr(std::string& out, std::string_view text) {
  const bool has_single = text.find('\'') != std::string_view::npos;
  const bool has_double = text.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  char buffer[16];
  for (size_t offset = 0; offset < text.size();) {
    const CodePoint point = decode_at(text, offset);
    const char32_t c = point.value;
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (is_printable(c)) {
      out.append(text.substr(offset, point.size));
    } else {
      if (c <= 0xFF) {
        std::snprintf(buffer, sizeof(buffer), "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buffer, sizeof(buffer), "\\U%08x", static_cast<unsigned>(c));
      }
      out += buffer;
    }
    offset += point.size;
  }
  out += quote;
}

void append_str(std::string& out, const Value& value, Budget& budget) {
  if (value.is_undefined()) return;
  if (value.is_string()) {
    budget.charge_bytes(value.text().size());
    out += value.text();
    Budget::check_size(out.size());
    return;
  }
  append_repr(out, value, budget);
}

std::string to_str(const Value& value, Budget& budget) {
  if (value.is_string()) {
    budget.charge_bytes(value.text().size());
    return value.text();
  }
  std::string out;
  append_str(out, value, budget);
  return out;
}

void append_repr(std::string& out, const Value& value, Budget& budget) {
  budget.charge(1);
  Budget::check_size(out.size());
  switch (value.kind) {
    case Kind::kUndefined:
      out += "Undefined";
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += value.boolean() ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(value.integer());
      return;
    case Kind::kFloat:
      out += float_repr(value.number());
      return;
    case Kind::kString:
      budget.charge_bytes(value.text().size());
      append_string_repr(out, value.text());
      return;
    case Kind::kSequence: {
      const Sequence& sequence = value.sequence();
      switch (sequence.type) {
        case SequenceType::kList:
          out += '[';
          append_sequence_items(out, sequence.items, budget);
          out += ']';
          return;
        case SequenceType::kTuple:
          out += '(';
          append_sequence_items(out, sequence.items, budget);
          if (sequence.items.size() == 1) out += ',';
          out += ')';
          return;
        case SequenceType::kDictItems:
        case SequenceType::kDictKeys:
        case SequenceType::kDictValues:
          out += sequence_type_name(sequence.type);
          out += "([";
          append_sequence_items(out, sequence.items, budget);
          out += "])";
          return;
        case SequenceType::kRange:
          out += "range(" + std::to_string(sequence.range_args[0]) + ", " +
                 std::to_string(sequence.range_args[1]);
          if (sequence.range_args[2] != 1) out += ", " + std::to_string(sequence.range_args[2]);
          out += ')';
          return;
        case SequenceType::kGenerator:
        case SequenceType::kReverseIterator:
          throw Failure{std::string("cannot print a ") + sequence_type_name(sequence.type) +
                        " (Python prints its memory address); convert it with |list first"};
      }
      return;
    }
    case Kind::kDict:
      append_dict_items(out, value.dict(), budget);
      return;
    case Kind::kNamespace:
      out += "<Namespace ";
      append_dict_items(out, value.attributes(), budget);
      out += '>';
      return;
    case Kind::kLoop: {
      const LoopState& loop = value.loop();
      out += "<LoopContext " + std::to_string(loop.index0 + 1) + "/" +
             std::to_string(loop.items ? loop.items->items.size() : 0) + ">";
      return;
    }
    case Kind::kFunction:
      if (value.function().type == FunctionType::kMacro) {
        out += "<Macro ";
        append_string_repr(out, value.function().name);
        out += '>';
        return;
      }
      throw Failure{"cannot print a function (Python prints its memory address)"};
  }
}

namespace {

bool equals_at(const Value& left, const Value& right, Budget& budget, int depth);

bool sequences_equal(const std::vector<Value>& left, const std::vector<Value>& right,
                     Budget& budget, int depth) {
  if (left.size() != right.size()) return false;
  for (size_t i = 0; i < left.size(); ++i) {
    if (!equals_at(left[i], right[i], budget, depth + 1)) return false;
  }
  return true;
}

// dict_keys and dict_items compare as sets.
bool same_members(const std::vector<Value>& left, const std::vector<Value>& right, Budget& budget,
                  int depth) {
  if (left.size() != right.size()) return false;
  for (const Value& item : left) {
    bool found = false;
    for (const Value& other : right) {
      if (equals_at(item, other, budget, depth + 1)) {
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

bool equals_at(const Value& left, const Value& right, Budget& budget, int depth) {
  check_walk_depth(depth);
  budget.charge(1);
  if (left.is_number() && right.is_number()) return compare_numbers(left, right) == 0;
  if (left.kind != right.kind) return false;
  switch (left.kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      if (left.text().size() != right.text().size()) return false;
      budget.charge_bytes(left.text().size());
      return left.text() == right.text();
    case Kind::kSequence: {
      const Sequence& a = left.sequence();
      const Sequence& b = right.sequence();
      if (left.sequence_ptr() == right.sequence_ptr()) return true;
      if (a.type != b.type || is_iterator(a) || a.type == SequenceType::kDictValues) return false;
      if (a.type == SequenceType::kDictKeys || a.type == SequenceType::kDictItems) {
        return same_members(a.items, b.items, budget, depth);
      }
      return sequences_equal(a.items, b.items, budget, depth);
    }
    case Kind::kDict: {
      const Dict& a = left.dict();
      const Dict& b = right.dict();
      if (a.entries.size() != b.entries.size()) return false;
      for (const auto& [key, item] : a.entries) {
        const Value* other = b.find(key, budget);
        if (other == nullptr || !equals_at(item, *other, budget, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return left.namespace_ptr() == right.namespace_ptr();
    case Kind::kLoop:
      return &left.loop() == &right.loop();
    case Kind::kFunction:
      return left.function_ptr() == right.function_ptr();
    default:
      return false;
  }
}

}  // namespace

bool equals(const Value& left, const Value& right, Budget& budget) {
  return equals_at(left, right, budget, 0);
}

bool compare_order(const Value& left, const Value& right, std::string_view op, Budget& budget) {
  budget.charge(1);
  if (left.is_undefined()) throw Failure{left.undefined_message()};
  if (right.is_undefined()) throw Failure{right.undefined_message()};
  const auto apply = [op](int order) {
    if (order == 2) return false;  // NaN
    if (op == "<") return order < 0;
    if (op == "<=") return order <= 0;
    if (op == ">") return order > 0;
    return order >= 0;
  };
  if (left.is_number() && right.is_number()) return apply(compare_numbers(left, right));
  if (left.is_string() && right.is_string()) {
    budget.charge_bytes(std::min(left.text().size(), right.text().size()));
    const int order = left.text().compare(right.text());
    return apply(order < 0 ? -1 : order > 0 ? 1 : 0);
  }
  if (left.kind == Kind::kSequence && right.kind == Kind::kSequence) {
    const Sequence& a = left.sequence();
    const Sequence& b = right.sequence();
    if (a.type == b.type && (a.type == SequenceType::kList || a.type == SequenceType::kTuple)) {
      const size_t common = std::min(a.items.size(), b.items.size());
      for (size_t i = 0; i < common; ++i) {
        if (!equals(a.items[i], b.items[i], budget)) {
          return compare_order(a.items[i], b.items[i], op, budget);
        }
      }
      return apply(a.items.size() < b.items.size() ? -1 : a.items.size() > b.items.size() ? 1 : 0);
    }
  }
  throw Failure{"'" + std::string(op) + "' not supported between instances of '" + type_name(left) +
                "' and '" + type_name(right) + "'"};
}

bool less_than(const Value& left, const Value& right, Budget& budget) {
  return compare_order(left, right, "<", budget);
}

std::optional<std::string> hash_key(const Value& value) {
  switch (value.kind) {
    case Kind::kNone:
      return std::string("n");
    case Kind::kBool:
    case Kind::kInt:
      return "i" + std::to_string(int_value(value));
    case Kind::kFloat: {
      const double number = value.number();
      if (std::isfinite(number) && number == std::floor(number) && std::abs(number) < 9.2e18) {
        return "i" + std::to_string(static_cast<int64_t>(number));
      }
      return "f" + float_repr(number);
    }
    case Kind::kString:
      return "s" + value.text();
    case Kind::kSequence: {
      if (value.sequence().type != SequenceType::kTuple) return std::nullopt;
      std::string key = "t" + std::to_string(value.sequence().items.size());
      for (const Value& item : value.sequence().items) {
        const std::optional<std::string> inner = hash_key(item);
        if (!inner) return std::nullopt;
        key += ":" + std::to_string(inner->size()) + ":" + *inner;
      }
      return key;
    }
    default:
      return std::nullopt;
  }
}

std::string to_json(const Value& value, const JsonStyle& style, Budget& budget) {
  std::string out;
  append_json(out, value, style, budget, 0);
  Budget::check_size(out.size());
  return out;
}

namespace {

template <typename Json>
Value from_json_at(const Json& json, int depth) {
  if (depth > kMaxValueDepth) {
    throw Failure{"the context nests deeper than " + std::to_string(kMaxValueDepth)};
  }
  switch (json.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
      return make_none();
    case Json::value_t::boolean:
      return make_bool(json.template get<bool>());
    case Json::value_t::number_integer:
      return make_int(json.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t number = json.template get<uint64_t>();
      if (number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw Failure{"the context holds the integer " + std::to_string(number) +
                      ", beyond 64 bits"};
      }
      return make_int(static_cast<int64_t>(number));
    }
    case Json::value_t::number_float:
      return make_float(json.template get<double>());
    case Json::value_t::string:
      return make_string(json.template get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json_at(item, depth + 1));
      return make_list(std::move(items));
    }
    case Json::value_t::object: {
      Dict dict;
      Budget unlimited(std::numeric_limits<uint64_t>::max());
      for (const auto& [key, item] : json.items()) {
        dict.set(make_string(key), from_json_at(item, depth + 1), unlimited);
      }
      return make_dict(std::move(dict));
    }
    case Json::value_t::binary:
      break;
  }
  throw Failure{"the context holds binary data, which templates cannot read"};
}

}  // namespace

Value from_json(const nlohmann::ordered_json& json) {
  return from_json_at(json, 1);
}

std::vector<Value> iterate(const Value& value, Budget& budget) {
  switch (value.kind) {
    case Kind::kUndefined:
      return {};
    case Kind::kString: {
      const std::string& text = value.text();
      budget.charge(kStringValueCost * count_code_points(text));
      std::vector<Value> characters;
      for (size_t offset = 0; offset < text.size();) {
        const size_t size = decode_at(text, offset).size;
        characters.push_back(make_string(text.substr(offset, size)));
        offset += size;
      }
      return characters;
    }
    case Kind::kSequence: {
      const Sequence& sequence = value.sequence();
      budget.charge(sequence.items.size());
      if (is_iterator(sequence)) {
        const size_t from = std::min(sequence.consumed, sequence.items.size());
        sequence.consumed = sequence.items.size();
        return {sequence.items.begin() + static_cast<std::ptrdiff_t>(from), sequence.items.end()};
      }
      return sequence.items;
    }
    case Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(value.dict().entries.size());
      for (const auto& entry : value.dict().entries) keys.push_back(entry.first);
      budget.charge(keys.size());
      return keys;
    }
    default:
      break;
  }
  throw Failure{"'" + type_name(value) + "' object is not iterable"};
}

}  // namespace specrun::chat::jinja
