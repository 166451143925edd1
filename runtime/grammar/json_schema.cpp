#include "runtime/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/regex_grammar.h"
#include "runtime/text/unicode.h"
#include "specrun/error.hpp"

namespace specrun::grammar {

namespace {

using json = nlohmann::ordered_json;

// Keywords that constrain nothing: accepted and skipped.
const std::set<std::string> kAnnotations = {
    "title", "description", "default",    "examples",         "$schema",
    "$id",   "$comment",    "deprecated", "readOnly",         "writeOnly",
    "$defs", "definitions", "$anchor",    "contentMediaType", "contentEncoding"};

// Keywords compiled into the grammar.
const std::set<std::string> kSupported = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable"};

// Integers and numbers have at most this many digits before the point (and after it).
constexpr int kMaxDigits = 16;

// The grammar's shared rules: whitespace, strings, numbers, any value, formats.
std::string base_rules(const JsonSchemaOptions& options) {
  std::string ws = options.max_indent > 0 ? "ws ::= | \" \" | \"\\n\" [ \\t]{0," +
                                                std::to_string(options.max_indent) + "}\n"
                                          : "ws ::= \"\"\n";
  return ws + R"(json-char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" json-hex4)
json-hex4 ::= ([0-9a-cA-Ce-fE-F] [0-9a-fA-F] | [dD] [0-7]) [0-9a-fA-F] [0-9a-fA-F]
json-string ::= "\"" json-char* "\""
json-integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-member ::= json-string ws ":" ws json-value
json-object ::= "{" ws (json-member (ws "," ws json-member)* ws)? "}"
json-array ::= "[" ws (json-value (ws "," ws json-value)* ws)? "]"
json-hex ::= [0-9a-fA-F]
json-uuid ::= "\"" json-hex{8} "-" json-hex{4} "-" json-hex{4} "-" json-hex{4} "-" json-hex{12} "\""
json-date-body ::= [1-9] [0-9]{3} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]))
json-time-body ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
json-date ::= "\"" json-date-body "\""
json-time ::= "\"" json-time-body "\""
json-date-time ::= "\"" json-date-body "T" json-time-body "\""
)";
}

// Decimal digit strings of the integers in [low, high] (both >= 0, equal digit counts), no
// leading zeros but for 0 itself: the usual split into a common prefix, the first digit's middle
// range with free digits after it, and the two partial ends.
std::string same_length_range(const std::string& low, const std::string& high) {
  if (low == high) return gbnf_literal(low);
  const size_t n = low.size();
  if (n == 1) return "[" + low + "-" + high + "]";
  if (low[0] == high[0]) {
    return gbnf_literal(low.substr(0, 1)) + " (" +
           same_length_range(low.substr(1), high.substr(1)) + ")";
  }
  const std::string rest_low = low.substr(1);
  const std::string rest_high = high.substr(1);
  const std::string free = n - 1 == 1 ? " [0-9]" : " [0-9]{" + std::to_string(n - 1) + "}";
  std::vector<std::string> parts;
  char first = low[0];
  char last = high[0];
  if (rest_low == std::string(n - 1, '0')) {
    --first;  // low's first digit takes every continuation: part of the middle
  } else {
    parts.push_back(gbnf_literal(low.substr(0, 1)) + " (" +
                    same_length_range(rest_low, std::string(n - 1, '9')) + ")");
  }
  const bool high_full = rest_high == std::string(n - 1, '9');
  if (high_full) ++last;
  if (first + 1 <= last - 1) {
    parts.push_back("[" + std::string(1, static_cast<char>(first + 1)) + "-" +
                    std::string(1, static_cast<char>(last - 1)) + "]" + free);
  }
  if (!high_full) {
    parts.push_back(gbnf_literal(high.substr(0, 1)) + " (" +
                    same_length_range(std::string(n - 1, '0'), rest_high) + ")");
  }
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : " | ") + part;
  return out;
}

// The integers in [low, high] (0 <= low; no `high`: up to kMaxDigits digits) as digit strings.
std::string nonnegative_range(long long low, std::optional<long long> high) {
  std::vector<std::string> parts;
  const std::string low_text = std::to_string(low);
  const size_t top_length = high ? std::to_string(*high).size() : static_cast<size_t>(kMaxDigits);
  for (size_t length = low_text.size(); length <= top_length; ++length) {
    const std::string smallest = length == 1 ? "0" : "1" + std::string(length - 1, '0');
    const std::string largest(length, '9');
    const std::string from = length == low_text.size() ? low_text : smallest;
    std::string to = largest;
    if (high && length == top_length) to = std::to_string(*high);
    if (from.size() == to.size() && from > to) continue;
    parts.push_back("(" + same_length_range(from, to) + ")");
  }
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : " | ") + part;
  return out;
}

std::string pointer_text(const std::string& path) {
  return "#" + path;
}

std::string escape_pointer(const std::string& key) {
  std::string out;
  for (const char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& document, const JsonSchemaOptions& options)
      : document_(document), options_(options) {}

  std::string compile() {
    const std::string root = expression(document_, "");
    std::string out = options_.root_rule + " ::= " + root + "\n" + base_rules(options_);
    for (const std::string& rule : rules_) out += rule + "\n";
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw Error("JSON schema: " + pointer_text(path) + ": " + what);
  }

  std::string new_name(const std::string& hint) {
    std::string base;
    for (const char c : hint) {
      const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (word) {
        base += c;
      } else if (!base.empty() && base.back() != '-') {
        base += '-';
      }
      if (base.size() > 40) break;
    }
    while (!base.empty() && base.back() == '-') base.pop_back();
    base = "s-" + base;
    std::string name = base;
    for (int k = 2; !names_.insert(name).second; ++k) name = base + "-" + std::to_string(k);
    return name;
  }

  std::string define(const std::string& hint, const std::string& body) {
    const std::string name = new_name(hint);
    rules_.push_back(name + " ::= " + body);
    return name;
  }

  // A rule for the schema at `path`.
  std::string visit(const json& schema, const std::string& path) {
    return define(path, expression(schema, path));
  }

  static bool constrains(const std::string& key) { return kAnnotations.count(key) == 0; }

  void check_keywords(const json& schema, const std::string& path) {
    for (const auto& [key, value] : schema.items()) {
      if (kAnnotations.count(key) != 0 || kSupported.count(key) != 0) continue;
      fail(path + "/" + escape_pointer(key), "keyword '" + key + "' is not supported");
    }
  }

  std::string expression(const json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return "json-value";
      fail(path, "the schema false admits no value");
    }
    if (!schema.is_object()) fail(path, "a schema must be an object or a boolean");
    check_keywords(schema, path);
    bool nullable = false;
    if (schema.contains("nullable")) {
      if (!schema["nullable"].is_boolean()) fail(path + "/nullable", "must be a boolean");
      nullable = schema["nullable"].get<bool>();
    }
    const std::string body = core(schema, path);
    return nullable ? "(" + body + " | json-null)" : "(" + body + ")";
  }

  // The keywords present in `schema` that constrain, but `allowed` and nullable.
  static std::vector<std::string> others(const json& schema, std::set<std::string> allowed) {
    allowed.insert("nullable");
    std::vector<std::string> out;
    for (const auto& [key, value] : schema.items()) {
      if (constrains(key) && allowed.count(key) == 0) out.push_back(key);
    }
    return out;
  }

  std::string core(const json& schema, const std::string& path) {
    if (schema.contains("$ref")) {
      const auto extra = others(schema, {"$ref"});
      if (!extra.empty()) {
        fail(path + "/" + escape_pointer(extra[0]),
             "keyword '" + extra[0] + "' beside '$ref' is not supported");
      }
      return reference(schema["$ref"], path + "/$ref");
    }
    if (schema.contains("allOf")) return expression(merge_all_of(schema, path), path);
    for (const char* keyword : {"anyOf", "oneOf"}) {
      if (!schema.contains(keyword)) continue;
      const auto extra = others(schema, {keyword});
      if (!extra.empty()) {
        fail(path + "/" + escape_pointer(extra[0]),
             "keyword '" + extra[0] + "' beside '" + keyword + "' is not supported");
      }
      const json& branches = schema[keyword];
      if (!branches.is_array() || branches.empty()) {
        fail(path + "/" + keyword, "must be a non-empty array of schemas");
      }
      std::string out;
      for (size_t i = 0; i < branches.size(); ++i) {
        out += (i == 0 ? "" : " | ") +
               visit(branches[i], path + "/" + keyword + "/" + std::to_string(i));
      }
      return out;
    }
    const std::vector<std::string> types = type_list(schema, path);
    if (schema.contains("const")) {
      if (schema.contains("enum")) fail(path + "/enum", "'enum' beside 'const' is not supported");
      return literal(schema["const"], path + "/const");
    }
    if (schema.contains("enum")) {
      const json& values = schema["enum"];
      if (!values.is_array() || values.empty()) fail(path + "/enum", "must be a non-empty array");
      std::string out;
      for (size_t i = 0; i < values.size(); ++i) {
        if (schema.contains("type") && !has_type(values[i], types)) continue;
        out += (out.empty() ? "" : " | ") + literal(values[i], path + "/enum/" + std::to_string(i));
      }
      if (out.empty()) fail(path + "/enum", "no value of the enum has the schema's type");
      return out;
    }
    if (types.empty()) return "json-value";
    std::string out;
    for (const std::string& type : types) {
      out += (out.empty() ? "" : " | ") + type_expression(type, schema, path);
    }
    return out;
  }

  static bool has_type(const json& value, const std::vector<std::string>& types) {
    for (const std::string& type : types) {
      if ((type == "null" && value.is_null()) || (type == "boolean" && value.is_boolean()) ||
          (type == "string" && value.is_string()) || (type == "object" && value.is_object()) ||
          (type == "array" && value.is_array()) ||
          (type == "integer" &&
           (value.is_number_integer() ||
            (value.is_number_float() && std::floor(value.get<double>()) == value.get<double>()))) ||
          (type == "number" && value.is_number())) {
        return true;
      }
    }
    return false;
  }

  std::string literal(const json& value, const std::string& path) {
    try {
      return gbnf_literal(value.dump());
    } catch (const json::exception& error) {
      fail(path, std::string("cannot be written as JSON: ") + error.what());
    }
  }

  // The schema's types: "type" as given, else inferred from the keywords present.
  std::vector<std::string> type_list(const json& schema, const std::string& path) {
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& type = schema["type"];
      if (type.is_string()) {
        types.push_back(type.get<std::string>());
      } else if (type.is_array() && !type.empty()) {
        for (const json& item : type) {
          if (!item.is_string()) fail(path + "/type", "must be a type name or a list of them");
          types.push_back(item.get<std::string>());
        }
      } else {
        fail(path + "/type", "must be a type name or a non-empty list of them");
      }
      return types;
    }
    auto has_any = [&](std::initializer_list<const char*> keys) {
      return std::any_of(keys.begin(), keys.end(),
                         [&](const char* k) { return schema.contains(k); });
    };
    if (has_any({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (has_any({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
    if (has_any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
      types.push_back("number");
    }
    return types;
  }

  std::string type_expression(const std::string& type, const json& schema,
                              const std::string& path) {
    if (type == "null") return "json-null";
    if (type == "boolean") return "json-boolean";
    if (type == "string") return string_expression(schema, path);
    if (type == "integer") return integer_expression(schema, path);
    if (type == "number") {
      for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (schema.contains(key)) {
          fail(path + "/" + key,
               std::string("keyword '") + key + "' is supported on integers only, not on numbers");
        }
      }
      return "json-number";
    }
    if (type == "object") return object_expression(schema, path);
    if (type == "array") return array_expression(schema, path);
    fail(path + "/type", "unknown type '" + type + "'");
  }

  static std::optional<long long> count(const json& schema, const char* key,
                                        const std::string& path) {
    if (!schema.contains(key)) return std::nullopt;
    const json& value = schema[key];
    if (!value.is_number_integer() || value.get<long long>() < 0) {
      fail(path + "/" + key, std::string("'") + key + "' must be a non-negative integer");
    }
    if (value.get<long long>() > kMaxRepetition) {
      fail(path + "/" + key, std::string("'") + key + "' above " + std::to_string(kMaxRepetition) +
                                 " is not supported");
    }
    return value.get<long long>();
  }

  std::string string_expression(const json& schema, const std::string& path) {
    const auto min_length = count(schema, "minLength", path);
    const auto max_length = count(schema, "maxLength", path);
    if (min_length && max_length && *min_length > *max_length) {
      fail(path + "/minLength", "'minLength' above 'maxLength' admits no string");
    }
    const bool lengths = min_length || max_length;
    if (schema.contains("format")) {
      if (lengths || schema.contains("pattern")) {
        fail(path + "/format",
             "'format' with 'pattern', 'minLength' or 'maxLength' is not supported");
      }
      if (!schema["format"].is_string()) fail(path + "/format", "must be a string");
      const std::string format = schema["format"].get<std::string>();
      if (format == "date") return "json-date";
      if (format == "time") return "json-time";
      if (format == "date-time") return "json-date-time";
      if (format == "uuid") return "json-uuid";
      fail(path + "/format",
           "format '" + format + "' is not supported (date, time, date-time and uuid are)");
    }
    if (schema.contains("pattern")) {
      if (lengths) {
        fail(path + "/pattern", "'pattern' with 'minLength' or 'maxLength' is not supported");
      }
      if (!schema["pattern"].is_string()) fail(path + "/pattern", "must be a string");
      return "\"\\\"\" " +
             regex_to_gbnf(schema["pattern"].get<std::string>(), pointer_text(path + "/pattern"),
                           "json-char") +
             " \"\\\"\"";
    }
    if (!lengths) return "json-string";
    const long long low = min_length.value_or(0);
    std::string bounds = "{" + std::to_string(low) + ",";
    if (max_length) bounds += std::to_string(*max_length);
    return "\"\\\"\" json-char" + bounds + "} \"\\\"\"";
  }

  std::string integer_expression(const json& schema, const std::string& path) {
    std::optional<long long> low;
    std::optional<long long> high;
    const long long limit = 9999999999999999LL;  // kMaxDigits nines
    auto bound = [&](const char* key, bool lower, bool exclusive) {
      if (!schema.contains(key)) return;
      const json& value = schema[key];
      if (!value.is_number()) fail(path + "/" + key, std::string("'") + key + "' must be a number");
      const double x = value.get<double>();
      if (std::fabs(x) > static_cast<double>(limit)) {
        fail(path + "/" + key, std::string("'") + key + "' beyond 16 digits is not supported");
      }
      long long v =
          lower ? static_cast<long long>(std::ceil(x)) : static_cast<long long>(std::floor(x));
      if (exclusive && static_cast<double>(v) == x) v += lower ? 1 : -1;
      if (lower) {
        low = low ? std::max(*low, v) : v;
      } else {
        high = high ? std::min(*high, v) : v;
      }
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    if (!low && !high) return "json-integer";
    if (low && high && *low > *high) fail(path, "the integer bounds admit no value");
    std::vector<std::string> parts;
    // Negative part: "-" then magnitudes in [max(1, -high), -low].
    if (!low || *low < 0) {
      const long long magnitude_low = high && *high < 0 ? -*high : 1;
      std::optional<long long> magnitude_high;
      if (low) magnitude_high = -*low;
      parts.push_back("\"-\" (" + nonnegative_range(magnitude_low, magnitude_high) + ")");
    }
    if (!high || *high >= 0) {
      parts.push_back(nonnegative_range(low ? std::max<long long>(*low, 0) : 0, high));
    }
    std::string out;
    for (const std::string& part : parts)
      out += std::string(out.empty() ? "" : " | ") + "(" + part + ")";
    return define(path + "-integer", out);
  }

  std::string array_expression(const json& schema, const std::string& path) {
    const auto min_items = count(schema, "minItems", path);
    const auto max_items = count(schema, "maxItems", path);
    std::string item = "json-value";
    bool items_false = false;
    if (schema.contains("items")) {
      const json& items = schema["items"];
      if (items.is_array()) {
        fail(path + "/items",
             "'items' as an array (draft 4 tuples) is not supported: use 'prefixItems'");
      }
      if (items.is_boolean() && !items.get<bool>()) {
        items_false = true;
      } else {
        item = visit(items, path + "/items");
      }
    }
    if (schema.contains("prefixItems")) {
      const json& prefix = schema["prefixItems"];
      if (!prefix.is_array()) fail(path + "/prefixItems", "must be an array of schemas");
      if (min_items || max_items) {
        fail(path + "/prefixItems", "'prefixItems' with 'minItems' or 'maxItems' is not supported");
      }
      if (!prefix.empty()) {
        std::string out = "\"[\" ws";
        for (size_t i = 0; i < prefix.size(); ++i) {
          out += (i == 0 ? " " : " ws \",\" ws ") +
                 visit(prefix[i], path + "/prefixItems/" + std::to_string(i));
        }
        if (!items_false && schema.contains("items")) out += " (ws \",\" ws " + item + ")*";
        return out + " ws \"]\"";
      }
    }
    if (items_false) return "\"[\" ws \"]\"";
    const long long low = min_items.value_or(0);
    if (max_items && *max_items < low) fail(path + "/minItems", "'minItems' above 'maxItems'");
    if (max_items && *max_items == 0) return "\"[\" ws \"]\"";
    const std::string more = "(ws \",\" ws " + item + ")";
    std::string repeat;
    if (max_items) {
      const long long top = *max_items - 1;
      const long long bottom = std::max<long long>(low - 1, 0);
      repeat = top == 0
                   ? ""
                   : " " + more + "{" + std::to_string(bottom) + "," + std::to_string(top) + "}";
    } else {
      repeat = " " + more + "{" + std::to_string(std::max<long long>(low - 1, 0)) + ",}";
    }
    const std::string list = item + repeat;
    if (low == 0) return "\"[\" ws (" + list + " ws)? \"]\"";
    return "\"[\" ws " + list + " ws \"]\"";
  }

  // A key of another property: a JSON string without escapes that is none of `names`. Over the
  // trie of the names: at each node, close the key (unless the node spells a name), take a
  // character no name continues with (then anything), or follow a name's next character.
  std::string other_key(const std::vector<std::string>& names, const std::string& path) {
    struct Node {
      std::map<uint32_t, size_t> children;  // code point -> node
      bool is_name = false;                 // spells a whole name
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      size_t node = 0;
      bool plain = true;
      std::vector<uint32_t> code_points;
      for (size_t i = 0; i < name.size();) {
        const auto byte = static_cast<uint8_t>(name[i]);
        const int length = byte < 0x80 ? 1 : byte < 0xE0 ? 2 : byte < 0xF0 ? 3 : 4;
        uint32_t c = length == 1   ? byte
                     : length == 2 ? byte & 0x1F
                     : length == 3 ? byte & 0x0F
                                   : byte & 0x07;
        for (int k = 1; k < length && i + static_cast<size_t>(k) < name.size(); ++k) {
          c = (c << 6) | (static_cast<uint8_t>(name[i + k]) & 0x3F);
        }
        if (c < 0x20 || c == '"' || c == '\\') plain = false;
        code_points.push_back(c);
        i += static_cast<size_t>(length);
      }
      if (!plain) continue;  // unwritable without escapes: no plain key equals it
      for (const uint32_t c : code_points) {
        const auto found = trie[node].children.find(c);
        if (found != trie[node].children.end()) {
          node = found->second;
        } else {
          trie.push_back({});
          trie[node].children.emplace(c, trie.size() - 1);
          node = trie.size() - 1;
        }
      }
      trie[node].is_name = true;
    }
    const std::string rest = define(path + "-key-rest", "[^\"\\\\\\x00-\\x1f]* \"\\\"\"");
    std::vector<std::string> rule_of(trie.size());
    for (size_t k = 0; k < trie.size(); ++k) rule_of[k] = new_name(path + "-key");
    for (size_t k = trie.size(); k-- > 0;) {
      std::vector<CodePointRange> excluded = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
      std::string body;
      if (!trie[k].is_name) body = "\"\\\"\"";
      for (const auto& [c, child] : trie[k].children) {
        excluded.push_back({c, c});
        // Re-encoded: the literal writer takes UTF-8.
        std::string character;
        text::append_utf8(character, c);
        body += (body.empty() ? "" : " | ") + gbnf_literal(character) + " " + rule_of[child];
      }
      std::sort(excluded.begin(), excluded.end(),
                [](const CodePointRange& a, const CodePointRange& b) { return a.first < b.first; });
      body += (body.empty() ? "" : " | ") + gbnf_class(excluded, /*negated=*/true) + " " + rest;
      rules_.push_back(rule_of[k] + " ::= " + body);
    }
    return "\"\\\"\" " + rule_of[0];
  }

  std::string object_expression(const json& schema, const std::string& path) {
    std::vector<std::pair<std::string, json>> properties;
    if (schema.contains("properties")) {
      if (!schema["properties"].is_object()) fail(path + "/properties", "must be an object");
      for (const auto& [key, value] : schema["properties"].items())
        properties.emplace_back(key, value);
    }
    std::set<std::string> required;
    if (schema.contains("required")) {
      const json& list = schema["required"];
      if (!list.is_array()) fail(path + "/required", "must be an array of property names");
      for (const json& name : list) {
        if (!name.is_string()) fail(path + "/required", "must be an array of property names");
        required.insert(name.get<std::string>());
        const bool listed = std::any_of(properties.begin(), properties.end(), [&](const auto& p) {
          return p.first == name.get<std::string>();
        });
        if (!listed) properties.emplace_back(name.get<std::string>(), json(true));
      }
    }
    bool additional = options_.additional_properties_default;
    std::string additional_value = "json-value";
    if (schema.contains("additionalProperties")) {
      const json& value = schema["additionalProperties"];
      if (value.is_boolean()) {
        additional = value.get<bool>();
      } else {
        additional = true;
        additional_value = visit(value, path + "/additionalProperties");
      }
    }
    const std::string base = new_name(path + "-object");
    names_.insert(base);
    std::vector<std::string> names;
    for (const auto& [key, value] : properties) names.push_back(key);
    std::string extra_member;
    if (additional) {
      extra_member =
          define(path + "-other", other_key(names, path) + " ws \":\" ws " + additional_value);
    }
    const size_t n = properties.size();
    auto tail = [&](size_t i, bool after) {
      return base + "-" + std::to_string(i) + (after ? "-after" : "-first");
    };
    // The last tails: other properties, or nothing.
    if (additional) {
      rules_.push_back(tail(n, false) + " ::= (" + extra_member + " (ws \",\" ws " + extra_member +
                       ")*)?");
      rules_.push_back(tail(n, true) + " ::= (ws \",\" ws " + extra_member + ")*");
    } else {
      rules_.push_back(tail(n, false) + " ::= \"\"");
      rules_.push_back(tail(n, true) + " ::= \"\"");
    }
    for (size_t i = n; i-- > 0;) {
      const auto& [key, value] = properties[i];
      const std::string member = gbnf_literal(json(key).dump()) + " ws \":\" ws " +
                                 visit(value, path + "/properties/" + escape_pointer(key));
      for (const bool after : {false, true}) {
        std::string body = (after ? "ws \",\" ws " : "") + member + " " + tail(i + 1, true);
        if (required.count(key) == 0) body += " | " + tail(i + 1, after);
        rules_.push_back(tail(i, after) + " ::= " + body);
      }
    }
    return "\"{\" ws " + tail(0, false) + " ws \"}\"";
  }

  // The rule of the schema `ref` points at (inside this document), made once.
  std::string reference(const json& ref, const std::string& path) {
    if (!ref.is_string()) fail(path, "'$ref' must be a string");
    const std::string text = ref.get<std::string>();
    if (text.empty() || text[0] != '#') {
      fail(path, "'$ref' " + text + " leaves the document; only '#...' references are supported");
    }
    const auto known = ref_rules_.find(text);
    if (known != ref_rules_.end()) return known->second;
    const json* target = nullptr;
    try {
      const json::json_pointer pointer(text.substr(1));
      if (document_.contains(pointer)) target = &document_.at(pointer);
    } catch (const json::exception&) {
      target = nullptr;
    }
    if (target == nullptr) fail(path, "'$ref' " + text + " does not resolve in the document");
    const std::string name = new_name("ref" + text.substr(1));
    ref_rules_.emplace(text, name);
    const std::string body = expression(*target, text.substr(1));
    rules_.push_back(name + " ::= " + body);
    return name;
  }

  // `schema` with its allOf branches merged in: properties united (a property in two branches
  // must hold both), required united, types intersected, any other keyword equal or in one
  // branch only.
  json merge_all_of(const json& schema, const std::string& path) {
    const json& branches = schema["allOf"];
    if (!branches.is_array() || branches.empty()) {
      fail(path + "/allOf", "must be a non-empty array of schemas");
    }
    json merged = schema;
    merged.erase("allOf");
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string at = path + "/allOf/" + std::to_string(i);
      json branch = branches[i];
      std::string branch_path = at;
      for (int hops = 0; branch.is_object() && branch.contains("$ref"); ++hops) {
        if (hops > 32) fail(at, "'$ref' chain too long");
        if (!others(branch, {"$ref"}).empty()) break;
        const std::string text =
            branch["$ref"].is_string() ? branch["$ref"].get<std::string>() : "";
        if (text.empty() || text[0] != '#')
          fail(at + "/$ref", "only '#...' references are supported");
        const json::json_pointer pointer(text.substr(1));
        if (!document_.contains(pointer))
          fail(at + "/$ref", "'$ref' " + text + " does not resolve");
        branch = document_.at(pointer);
        branch_path = text.substr(1);
      }
      if (branch.is_boolean()) {
        if (branch.get<bool>()) continue;
        fail(at, "the schema false admits no value");
      }
      if (!branch.is_object()) fail(at, "a schema must be an object or a boolean");
      check_keywords(branch, branch_path);
      if (branch.contains("allOf")) branch = merge_all_of(branch, branch_path);
      for (const auto& [key, value] : branch.items()) {
        if (!constrains(key)) continue;
        if (key == "properties") {
          json& into = merged["properties"];
          if (into.is_null()) into = json::object();
          for (const auto& [name, property] : value.items()) {
            if (!into.contains(name)) {
              into[name] = property;
            } else if (into[name] != property) {
              into[name] = json{{"allOf", json::array({into[name], property})}};
            }
          }
        } else if (key == "required") {
          json& into = merged["required"];
          if (into.is_null()) into = json::array();
          for (const json& name : value) {
            if (std::find(into.begin(), into.end(), name) == into.end()) into.push_back(name);
          }
        } else if (key == "type" && merged.contains("type")) {
          const std::vector<std::string> ours = type_list(merged, path);
          const std::vector<std::string> theirs = type_list(branch, branch_path);
          json both = json::array();
          for (const std::string& type : ours) {
            if (std::find(theirs.begin(), theirs.end(), type) != theirs.end()) both.push_back(type);
          }
          if (both.empty()) fail(branch_path + "/type", "the allOf branches share no type");
          merged["type"] = both;
        } else if (!merged.contains(key)) {
          merged[key] = value;
        } else if (merged[key] != value) {
          fail(branch_path + "/" + escape_pointer(key),
               "keyword '" + key + "' differs between allOf branches (not supported)");
        }
      }
    }
    return merged;
  }

  const json& document_;                          // the whole schema, for $ref
  const JsonSchemaOptions& options_;              // whitespace, additionalProperties default
  std::vector<std::string> rules_;                // "name ::= body", in the order made
  std::set<std::string> names_;                   // rule names taken
  std::map<std::string, std::string> ref_rules_;  // "$ref" text -> its rule
};

}  // namespace

std::string json_schema_to_gbnf(const json& schema, const JsonSchemaOptions& options) {
  return SchemaCompiler(schema, options).compile();
}

std::shared_ptr<const Grammar> json_schema_grammar(const json& schema,
                                                   const JsonSchemaOptions& options) {
  return parse_gbnf(json_schema_to_gbnf(schema, options), "JSON schema grammar");
}

std::shared_ptr<const Grammar> json_schema_grammar(std::string_view schema_text,
                                                   const JsonSchemaOptions& options) {
  json schema;
  try {
    schema = json::parse(schema_text);
  } catch (const json::parse_error& error) {
    throw Error("JSON schema: not JSON: byte " + std::to_string(error.byte) + ": " +
                std::string(error.what()));
  }
  return json_schema_grammar(schema, options);
}

std::string any_json_gbnf(bool object_only, const JsonSchemaOptions& options) {
  return std::string("root ::= ") + (object_only ? "json-object" : "json-value") + "\n" +
         base_rules(options);
}

std::shared_ptr<const Grammar> any_json_grammar(bool object_only,
                                                const JsonSchemaOptions& options) {
  return parse_gbnf(any_json_gbnf(object_only, options), "JSON grammar");
}

}  // namespace specrun::grammar
