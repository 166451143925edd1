// The one way specrun parses JSON it reads from files (config.json, safetensors headers and
// indexes, tokenizer.json): bounded nesting, linear time, and errors that quote values only in
// short excerpts. Header-only so that the tokenizer library, which sits below the runtime, uses
// it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "specrun/error.hpp"

namespace specrun {

// No file specrun reads nests deeper than a handful of levels (a tokenizer.json's Sequence of
// normalizers is the deepest, at about six). The bound keeps every recursive walk over a parsed
// document (copies, comparisons, dump) far from the end of the stack.
inline constexpr int kMaxJsonDepth = 64;

// Called with each key of the top-level object as it is read, and the object as built so far
// (without that key's value): lets a caller refuse duplicate keys (nlohmann would silently keep
// the last) or too many entries before the rest is parsed. It throws to refuse.
using JsonTopLevelKeyHook =
    std::function<void(const std::string& key, const nlohmann::json& object)>;

// At most `limit` bytes of `text` for an error message, marked when cut: a message stays one
// readable line however long the value a file holds.
inline std::string excerpt(std::string_view text, size_t limit = 64) {
  return text.size() <= limit ? std::string(text) : std::string(text.substr(0, limit)) + "...";
}

namespace detail {

// Forwards to nlohmann's DOM builder, counting depth and showing the top-level keys to a hook.
// nlohmann's own parser callback cannot be used: after every nested object it rescans the parent
// for discarded values, which makes a header of n tensors cost O(n^2).
class BoundedJsonSax {
 public:
  using json = nlohmann::json;
  BoundedJsonSax(json& result, const std::string& source, const JsonTopLevelKeyHook& on_key)
      : builder_(result, /*allow_exceptions=*/true),
        result_(result),
        source_(source),
        on_key_(on_key) {}

  bool null() { return builder_.null(); }
  bool boolean(bool value) { return builder_.boolean(value); }
  bool number_integer(json::number_integer_t value) { return builder_.number_integer(value); }
  bool number_unsigned(json::number_unsigned_t value) { return builder_.number_unsigned(value); }
  bool number_float(json::number_float_t value, const json::string_t& text) {
    return builder_.number_float(value, text);
  }
  bool string(json::string_t& value) { return builder_.string(value); }
  bool binary(json::binary_t& value) { return builder_.binary(value); }
  bool start_object(std::size_t size) {
    enter();
    return builder_.start_object(size);
  }
  bool end_object() {
    --depth_;
    return builder_.end_object();
  }
  bool start_array(std::size_t size) {
    enter();
    return builder_.start_array(size);
  }
  bool end_array() {
    --depth_;
    return builder_.end_array();
  }
  bool key(json::string_t& name) {
    if (depth_ == 1 && on_key_ && result_.is_object()) on_key_(name, result_);
    return builder_.key(name);
  }
  template <typename Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& error) {
    return builder_.parse_error(position, token, error);
  }

 private:
  void enter() {
    if (++depth_ > kMaxJsonDepth) {
      throw Error(source_ + ": JSON nests deeper than " + std::to_string(kMaxJsonDepth) +
                  " levels, the limit");
    }
  }

  nlohmann::detail::json_sax_dom_parser<json> builder_;
  json& result_;
  const std::string& source_;
  const JsonTopLevelKeyHook& on_key_;
  int depth_ = 0;
};

}  // namespace detail

// Parses `text`; `source` names it in errors ("model/config.json", "model.safetensors: header"):
// "<source>: not valid JSON: ...", "<source>: JSON nests deeper than 64 levels, the limit".
inline nlohmann::json parse_json(std::string_view text, const std::string& source,
                                 const JsonTopLevelKeyHook& on_top_level_key = {}) {
  nlohmann::json result;
  detail::BoundedJsonSax sax(result, source, on_top_level_key);
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const nlohmann::json::exception& error) {
    throw Error(source + ": not valid JSON: " + error.what());
  }
  return result;
}

// A value for an error message: its JSON text, cut to a short excerpt. Invalid UTF-8 in a string is
// replaced rather than thrown over: the message is about the value.
inline std::string json_excerpt(const nlohmann::json& value, size_t limit = 64) {
  return excerpt(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), limit);
}

}  // namespace specrun
