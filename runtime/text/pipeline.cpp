#include "runtime/text/pipeline.h"

#include <algorithm>
#include <array>
#include <optional>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/text/regex.h"
#include "runtime/text/unicode.h"

namespace specrun::text {
namespace {

using nlohmann::json;

// ---- JSON access -----------------------------------------------------------------------------

std::string type_of(const json& object, const JsonContext& where) {
  if (!object.is_object()) where.fail("must be an object");
  const auto type = object.find("type");
  if (type == object.end() || !type->is_string()) where.fail("has no \"type\"");
  return type->get<std::string>();
}

// A non-negative integer, however the document was built (parsed JSON stores these unsigned,
// JSON built in code signed).
bool is_count(const json& value) {
  return value.is_number_integer() && value.get<int64_t>() >= 0;
}

const json* field(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

bool get_bool(const json& object, const char* key, bool fallback, const JsonContext& where) {
  const json* value = field(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) where.fail(std::string("'") + key + "' must be true or false");
  return value->get<bool>();
}

std::string get_string(const json& object, const char* key, const JsonContext& where,
                       std::optional<std::string> fallback = std::nullopt) {
  const json* value = field(object, key);
  if (value == nullptr) {
    if (fallback) return *fallback;
    where.fail(std::string("'") + key + "' is missing");
  }
  if (!value->is_string()) where.fail(std::string("'") + key + "' must be a string");
  std::string text = value->get<std::string>();
  if (!is_valid_utf8(text)) where.fail(std::string("'") + key + "' is not valid UTF-8");
  return text;
}

char32_t get_char(const json& object, const char* key, const JsonContext& where) {
  const std::string text = get_string(object, key, where);
  size_t i = 0;
  const char32_t c = text.empty() ? 0 : next_code_point(text, i);
  if (text.empty() || i != text.size()) {
    where.fail(std::string("'") + key + "' must be exactly one character");
  }
  return c;
}

uint64_t get_count(const json& object, const char* key, const JsonContext& where) {
  const json* value = field(object, key);
  if (value == nullptr) return 0;
  if (!is_count(*value)) where.fail(std::string("'") + key + "' must be a count");
  return value->get<uint64_t>();
}

const json& get_list(const json& object, const char* key, const JsonContext& where) {
  const json* value = field(object, key);
  if (value == nullptr || !value->is_array()) {
    where.fail(std::string("'") + key + "' is missing or not a list");
  }
  return *value;
}

// ---- Patterns and splitting ------------------------------------------------------------------

// A Split/Replace pattern: {"String": literal} or {"Regex": oniguruma pattern}.
class Pattern {
 public:
  Pattern(const json& object, const JsonContext& where) {
    const JsonContext at = where.at(".pattern");
    if (object.is_string()) {  // older files write the literal directly
      literal_ = object.get<std::string>();
      return;
    }
    if (!object.is_object() || object.size() != 1)
      at.fail("must be {\"String\": ...} or {\"Regex\": ...}");
    if (const json* s = field(object, "String"); s != nullptr && s->is_string()) {
      literal_ = s->get<std::string>();
    } else if (const json* r = field(object, "Regex"); r != nullptr && r->is_string()) {
      regex_ = std::make_unique<Regex>(r->get<std::string>(), at.source + ": " + at.path);
    } else {
      at.fail("must be {\"String\": ...} or {\"Regex\": ...}");
    }
  }

  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
    if (regex_) {
      regex_->find_all(text, matches);
      return;
    }
    if (literal_.empty()) return;  // the reference matches nothing with an empty literal
    size_t from = 0;
    while (true) {
      const size_t at = text.find(literal_, from);
      if (at == std::string_view::npos) return;
      matches.emplace_back(at, at + literal_.size());
      from = at + literal_.size();
    }
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const json& object, const JsonContext& where,
                        std::optional<Behavior> fallback = std::nullopt) {
  const json* value = field(object, "behavior");
  if (value == nullptr && fallback) return *fallback;
  const std::string name = value != nullptr && value->is_string() ? value->get<std::string>() : "";
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  where.fail(
      "'behavior' must be one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
      "Contiguous");
}

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// The reference's (offsets, is_match) cover of `size` bytes from sorted, non-overlapping matches.
void cover(size_t size, const std::vector<std::pair<size_t, size_t>>& matches,
           std::vector<Span>& spans) {
  spans.clear();
  if (size == 0) {
    spans.push_back({0, 0, false});
    return;
  }
  size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) spans.push_back({previous, begin, false});
    spans.push_back({begin, end, true});
    previous = end;
  }
  if (previous != size) spans.push_back({previous, size, false});
}

// Each character satisfying `predicate` is a match of its own.
template <typename Predicate>
void char_matches(std::string_view text, Predicate predicate,
                  std::vector<std::pair<size_t, size_t>>& matches) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    const char32_t c = next_code_point(text, i);
    if (predicate(c)) matches.emplace_back(start, i);
  }
}

// NormalizedString::split: groups the cover per `behavior` and emits the kept, non-empty pieces.
void split_spans(std::string_view text, std::vector<Span>& spans, Behavior behavior, bool invert,
                 bool at_origin, PieceSink emit) {
  if (invert) {
    for (Span& span : spans) span.is_match = !span.is_match;
  }
  std::vector<Span> pieces;  // is_match here means "remove"
  pieces.reserve(spans.size());
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& span : spans) pieces.push_back({span.begin, span.end, false});
      break;
    case Behavior::kRemoved:
      pieces = spans;
      break;
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match == previous_match && !pieces.empty()) {
          pieces.back().end = span.end;
        } else {
          pieces.push_back({span.begin, span.end, false});
        }
        previous_match = span.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !pieces.empty()) {
          pieces.back().end = span.end;
        } else {
          pieces.push_back({span.begin, span.end, false});
        }
        previous_match = span.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().begin = it->begin;
        } else {
          pieces.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
  }
  for (const Span& piece : pieces) {
    if (piece.is_match || piece.end == piece.begin) continue;
    emit(text.substr(piece.begin, piece.end - piece.begin), at_origin && piece.begin == 0);
  }
}

// ---- Normalizers -----------------------------------------------------------------------------

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = text::normalize(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = to_lower(text); }
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0;
    size_t end = text.size();
    if (right_) {
      while (end > 0 && is_whitespace(last_code_point(text, end))) {
        --end;
        while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
    }
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!is_whitespace(next_code_point(text, next))) break;
        begin = next;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

class StripAccentsNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t i = 0;
    while (i < text.size()) {
      const size_t start = i;
      if (!is_nonspacing_mark(next_code_point(text, i))) out.append(text, start, i - start);
    }
    text = std::move(out);
  }
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Replaces every match of the pattern in `text` with `content`.
std::string replace_all(const Pattern& pattern, std::string_view text, const std::string& content) {
  std::vector<std::pair<size_t, size_t>> matches;
  pattern.find_all(text, matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text.substr(previous, begin - previous));
    out += content;
    previous = end;
  }
  out.append(text.substr(previous));
  return out;
}

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const json& object, const JsonContext& where)
      : pattern_(object.at("pattern"), where), content_(get_string(object, "content", where)) {}
  void normalize(std::string& text) const override { text = replace_all(pattern_, text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

// ---- Pre-tokenizers --------------------------------------------------------------------------

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::string_view piece, bool at_origin, PieceSink emit) const override {
    split_from(0, piece, at_origin, emit);
  }

 private:
  void split_from(size_t step, std::string_view piece, bool at_origin, PieceSink emit) const {
    if (step == steps_.size()) {
      emit(piece, at_origin);
      return;
    }
    steps_[step]->split(piece, at_origin, [&](std::string_view sub, bool sub_at_origin) {
      split_from(step + 1, sub, sub_at_origin, emit);
    });
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(const json& object, const JsonContext& where)
      : pattern_(object.contains("pattern") ? object.at("pattern") : json(), where),
        behavior_(parse_behavior(object, where)),
        invert_(get_bool(object, "invert", false, where)) {}
  void split(std::string_view piece, bool at_origin, PieceSink emit) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    pattern_.find_all(piece, matches);
    std::vector<Span> spans;
    cover(piece.size(), matches, spans);
    split_spans(piece, spans, behavior_, invert_, at_origin, emit);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Splits on single characters that satisfy a predicate (Digits, Punctuation, WhitespaceSplit).
template <typename Predicate>
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  CharSplitPreTokenizer(Predicate predicate, Behavior behavior)
      : predicate_(predicate), behavior_(behavior) {}
  void split(std::string_view piece, bool at_origin, PieceSink emit) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    char_matches(piece, predicate_, matches);
    std::vector<Span> spans;
    cover(piece.size(), matches, spans);
    split_spans(piece, spans, behavior_, false, at_origin, emit);
  }

 private:
  Predicate predicate_;
  Behavior behavior_;
};

template <typename Predicate>
std::unique_ptr<PreTokenizer> char_split(Predicate predicate, Behavior behavior) {
  return std::make_unique<CharSplitPreTokenizer<Predicate>>(predicate, behavior);
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for U+0100 onward.
struct ByteLevelTables {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, 0x144> byte_of_char{};  // -1: not in the alphabet
  ByteLevelTables() {
    byte_of_char.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      char_of_byte[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    for (int b = 0; b < 256; ++b) {
      const char32_t c = char_of_byte[static_cast<size_t>(b)];
      append_utf8(utf8_of_byte[static_cast<size_t>(b)], c);
      byte_of_char[c] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(const json& object, const JsonContext& where)
      : add_prefix_space_(get_bool(object, "add_prefix_space", true, where)) {
    if (get_bool(object, "use_regex", true, where)) {
      regex_ = std::make_unique<Regex>(kGpt2Pattern, where.source + ": " + where.path);
    }
  }
  void split(std::string_view piece, bool at_origin, PieceSink emit) const override {
    std::string prefixed;
    if (add_prefix_space_ && piece.front() != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed += ' ';
      prefixed += piece;
      piece = prefixed;
    }
    if (!regex_) {
      emit_mapped(piece, at_origin, emit);
      return;
    }
    std::vector<std::pair<size_t, size_t>> matches;
    regex_->find_all(piece, matches);
    std::vector<Span> spans;
    cover(piece.size(), matches, spans);
    split_spans(
        piece, spans, Behavior::kIsolated, false, at_origin,
        [&](std::string_view sub, bool sub_at_origin) { emit_mapped(sub, sub_at_origin, emit); });
  }

 private:
  static void emit_mapped(std::string_view piece, bool at_origin, PieceSink emit) {
    const ByteLevelTables& tables = byte_level_tables();
    std::string mapped;
    mapped.reserve(piece.size() * 2);
    for (const char byte : piece) mapped += tables.utf8_of_byte[static_cast<uint8_t>(byte)];
    emit(mapped, at_origin);
  }
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

PrependScheme parse_prepend_scheme(const json& object, const JsonContext& where) {
  PrependScheme scheme = PrependScheme::kAlways;
  if (const json* value = field(object, "prepend_scheme")) {
    const std::string name = value->is_string() ? value->get<std::string>() : "";
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else {
      where.fail("'prepend_scheme' must be always, first or never");
    }
  }
  // The older spelling: add_prefix_space false means never (and contradicts any other scheme).
  if (const json* legacy = field(object, "add_prefix_space");
      legacy != nullptr && legacy->is_boolean() && !legacy->get<bool>()) {
    if (field(object, "prepend_scheme") != nullptr && scheme != PrependScheme::kNever) {
      where.fail("add_prefix_space does not match declared prepend_scheme");
    }
    scheme = PrependScheme::kNever;
  }
  return scheme;
}

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(const json& object, const JsonContext& where)
      : replacement_(get_char(object, "replacement", where)),
        scheme_(parse_prepend_scheme(object, where)),
        split_(get_bool(object, "split", true, where)) {
    append_utf8(replacement_utf8_, replacement_);
  }
  void split(std::string_view piece, bool at_origin, PieceSink emit) const override {
    std::string text;
    text.reserve(piece.size() + 8);
    for (const char c : piece) {
      if (c == ' ') {
        text += replacement_utf8_;
      } else {
        text += c;
      }
    }
    const bool starts_with_replacement =
        text.compare(0, replacement_utf8_.size(), replacement_utf8_) == 0;
    if (!starts_with_replacement &&
        (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_origin))) {
      text.insert(0, replacement_utf8_);
    }
    if (!split_) {
      emit(text, at_origin);
      return;
    }
    std::vector<std::pair<size_t, size_t>> matches;
    const char32_t replacement = replacement_;
    char_matches(
        text, [replacement](char32_t c) { return c == replacement; }, matches);
    std::vector<Span> spans;
    cover(text.size(), matches, spans);
    split_spans(text, spans, Behavior::kMergedWithNext, false, at_origin, emit);
  }

 private:
  char32_t replacement_;
  std::string replacement_utf8_;
  PrependScheme scheme_;
  bool split_;
};

// ---- Decoders --------------------------------------------------------------------------------

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, bool& incomplete) const override {
    for (const auto& step : steps_) step->decode_chain(tokens, incomplete);
  }
  void piece(std::string& token, bool& fused) const override {
    for (const auto& step : steps_) step->piece(token, fused);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool& incomplete) const override {
    const ByteLevelTables& tables = byte_level_tables();
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t start = bytes.size();
      size_t i = 0;
      bool all_mapped = true;
      while (i < token.size()) {
        const char32_t c = next_code_point(token, i);
        const int byte = c < tables.byte_of_char.size() ? tables.byte_of_char[c] : -1;
        if (byte < 0) {
          all_mapped = false;
          break;
        }
        bytes += static_cast<char>(byte);
      }
      // A token with any character outside the alphabet (an added token) is kept as it is.
      if (!all_mapped) {
        bytes.resize(start);
        bytes += token;
      }
    }
    incomplete = incomplete_utf8_suffix(bytes) > 0;
    tokens.assign(1, is_valid_utf8(bytes) ? std::move(bytes) : repair_utf8(bytes));
  }
  void piece(std::string& token, bool& /*fused*/) const override {
    const ByteLevelTables& tables = byte_level_tables();
    std::string bytes;
    size_t i = 0;
    while (i < token.size()) {
      const char32_t c = next_code_point(token, i);
      const int byte = c < tables.byte_of_char.size() ? tables.byte_of_char[c] : -1;
      if (byte < 0) return;  // an added token, kept as it is
      bytes += static_cast<char>(byte);
    }
    token = std::move(bytes);
  }
};

class ByteFallbackDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool& incomplete) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;  // bytes of consecutive <0xXX> tokens
    auto flush = [&](bool at_end) {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        if (at_end) incomplete = incomplete_utf8_suffix(pending) > 0;
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      int byte = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        byte = parse_hex(token[3], token[4]);
      }
      if (byte >= 0) {
        pending += static_cast<char>(byte);
      } else {
        flush(false);
        out.push_back(std::move(token));
      }
    }
    flush(true);
    tokens = std::move(out);
  }
  void piece(std::string& token, bool& /*fused*/) const override {
    if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
      const int byte = parse_hex(token[3], token[4]);
      if (byte >= 0) token.assign(1, static_cast<char>(byte));
    }
  }

 private:
  static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char high, char low) {
    const int h = hex_digit(high);
    const int l = hex_digit(low);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool& /*incomplete*/) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
  void piece(std::string& /*token*/, bool& fused) const override { fused = true; }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(const json& object, const JsonContext& where)
      : content_(get_char(object, "content", where)),
        start_(get_count(object, "start", where)),
        stop_(get_count(object, "stop", where)) {}
  void decode_chain(std::vector<std::string>& tokens, bool& /*incomplete*/) const override {
    for (std::string& token : tokens) strip(token);
  }
  void piece(std::string& token, bool& fused) const override {
    if (!fused) strip(token);
  }

 private:
  void strip(std::string& token) const {
    std::vector<size_t> starts;  // byte offset of each character, and the end
    size_t i = 0;
    while (i < token.size()) {
      starts.push_back(i);
      next_code_point(token, i);
    }
    const size_t chars = starts.size();
    starts.push_back(token.size());
    auto char_at = [&](size_t index) {
      size_t at = starts[index];
      return next_code_point(token, at);
    };
    size_t start_cut = 0;
    for (size_t k = 0; k < std::min<uint64_t>(start_, chars); ++k) {
      if (char_at(k) != content_) break;
      start_cut = k + 1;
    }
    size_t stop_cut = chars;
    for (size_t k = 0; k < std::min<uint64_t>(stop_, chars - start_cut); ++k) {
      const size_t index = chars - k - 1;
      if (char_at(index) != content_) break;
      stop_cut = index;
    }
    token = token.substr(starts[start_cut], starts[stop_cut] - starts[start_cut]);
  }

  char32_t content_;
  uint64_t start_;
  uint64_t stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const json& object, const JsonContext& where)
      : pattern_(object.at("pattern"), where), content_(get_string(object, "content", where)) {}
  void decode_chain(std::vector<std::string>& tokens, bool& /*incomplete*/) const override {
    for (std::string& token : tokens) token = replace_all(pattern_, token, content_);
  }
  void piece(std::string& token, bool& /*fused*/) const override {
    token = replace_all(pattern_, token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(const json& object, const JsonContext& where)
      : replacement_(get_char(object, "replacement", where)),
        scheme_(parse_prepend_scheme(object, where)) {}
  void decode_chain(std::vector<std::string>& tokens, bool& /*incomplete*/) const override {
    for (size_t t = 0; t < tokens.size(); ++t) {
      const std::string& token = tokens[t];
      std::string out;
      out.reserve(token.size());
      size_t i = 0;
      while (i < token.size()) {
        const size_t start = i;
        const char32_t c = next_code_point(token, i);
        if (c != replacement_) {
          out.append(token, start, i - start);
        } else if (t != 0 || scheme_ == PrependScheme::kNever) {
          // The reference drops every replacement character of the first token, not only
          // the leading one.
          out += ' ';
        }
      }
      tokens[t] = std::move(out);
    }
  }
  void piece(std::string& token, bool& /*fused*/) const override {
    std::string out;
    size_t i = 0;
    while (i < token.size()) {
      const size_t start = i;
      if (next_code_point(token, i) == replacement_) {
        out += ' ';
      } else {
        out.append(token, start, i - start);
      }
    }
    token = std::move(out);
  }

 private:
  char32_t replacement_;
  PrependScheme scheme_;
};

class BpeSuffixDecoder : public Decoder {
 public:
  BpeSuffixDecoder(const json& object, const JsonContext& where)
      : suffix_(get_string(object, "suffix", where, "</w>")) {}
  void decode_chain(std::vector<std::string>& tokens, bool& /*incomplete*/) const override {
    if (suffix_.empty()) return;
    for (size_t t = 0; t < tokens.size(); ++t) {
      std::string& token = tokens[t];
      const std::string replacement = t + 1 == tokens.size() ? "" : " ";
      std::string out;
      size_t from = 0;
      while (true) {
        const size_t at = token.find(suffix_, from);
        if (at == std::string::npos) break;
        out.append(token, from, at - from);
        out += replacement;
        from = at + suffix_.size();
      }
      out.append(token, from);
      token = std::move(out);
    }
  }
  void piece(std::string& token, bool& /*fused*/) const override {
    // Not the text's last token: the suffix stands for a space.
    if (suffix_.empty()) return;
    std::string out;
    size_t from = 0;
    for (size_t at = token.find(suffix_); at != std::string::npos; at = token.find(suffix_, from)) {
      out.append(token, from, at - from);
      out += ' ';
      from = at + suffix_.size();
    }
    out.append(token, from);
    token = std::move(out);
  }

 private:
  std::string suffix_;
};

// ---- Post-processors -------------------------------------------------------------------------

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& step : steps_) step->process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

// ByteLevel only trims offsets, which specrun does not report.
class NoOpProcessor : public PostProcessor {
 public:
  void process(std::vector<int32_t>& /*ids*/, bool /*add_special_tokens*/) const override {}
};

// TemplateProcessing (single sequence), and Bert/Roberta as fixed templates.
class TemplateProcessor : public PostProcessor {
 public:
  TemplateProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

std::unique_ptr<PostProcessor> parse_template(const json& object, const JsonContext& where) {
  const json& single = get_list(object, "single", where);
  const json* special = field(object, "special_tokens");
  if (special != nullptr && !special->is_object()) where.fail("'special_tokens' must be an object");
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const json& piece = single[i];
    const JsonContext at = where.at(".single[" + std::to_string(i) + "]");
    if (const json* sequence = piece.is_object() ? field(piece, "Sequence") : nullptr) {
      const json* id = sequence->is_object() ? field(*sequence, "id") : nullptr;
      if (id == nullptr || *id != "A")
        at.fail("a single-sequence template may only hold sequence A");
      if (seen_sequence) at.fail("sequence A appears twice");
      seen_sequence = true;
    } else if (const json* token = piece.is_object() ? field(piece, "SpecialToken") : nullptr) {
      const json* name = token->is_object() ? field(*token, "id") : nullptr;
      if (name == nullptr || !name->is_string()) at.fail("SpecialToken has no \"id\"");
      const std::string key = name->get<std::string>();
      const json* entry = special != nullptr ? field(*special, key.c_str()) : nullptr;
      if (entry == nullptr) at.fail("special token '" + key + "' is not in 'special_tokens'");
      const json* ids = entry->is_object() ? field(*entry, "ids") : nullptr;
      if (ids == nullptr || !ids->is_array()) at.fail("special token '" + key + "' has no 'ids'");
      for (const json& id : *ids) {
        if (!is_count(id) || id.get<uint64_t>() > INT32_MAX) {
          at.fail("special token '" + key + "' has an invalid id");
        }
        (seen_sequence ? after : before).push_back(static_cast<int32_t>(id.get<uint64_t>()));
      }
    } else {
      at.fail("must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) where.fail("'single' never places sequence A");
  return std::make_unique<TemplateProcessor>(std::move(before), std::move(after));
}

// Bert and Roberta write their tokens as ["<s>", 0].
int32_t pair_id(const json& object, const char* key, const JsonContext& where) {
  const json* value = field(object, key);
  if (value == nullptr || !value->is_array() || value->size() != 2 || !is_count((*value)[1])) {
    where.fail(std::string("'") + key + "' must be [token, id]");
  }
  return static_cast<int32_t>((*value)[1].get<uint64_t>());
}

}  // namespace

void JsonContext::fail(const std::string& what) const {
  throw Error(source + ": " + path + ": " + what);
}

JsonContext JsonContext::step(const std::string& child) const {
  if (depth >= kMaxSequenceDepth) {
    fail("Sequences nest deeper than " + std::to_string(kMaxSequenceDepth) + " levels, the limit");
  }
  return {source, path + child, depth + 1};
}

char32_t byte_level_char(uint8_t byte) {
  return byte_level_tables().char_of_byte[byte];
}

std::unique_ptr<Normalizer> parse_normalizer(const json& object, const JsonContext& where) {
  if (object.is_null()) return nullptr;
  const std::string type = type_of(object, where);
  const JsonContext at = where.at(" (" + type + ")");
  if (type == "Sequence") {
    const json& list = get_list(object, "normalizers", at);
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = parse_normalizer(list[i], where.step(".normalizers[" + std::to_string(i) + "]"));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(get_bool(object, "strip_left", true, at),
                                             get_bool(object, "strip_right", true, at));
  }
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(get_string(object, "prepend", at));
  if (type == "Replace") {
    if (field(object, "pattern") == nullptr) at.fail("'pattern' is missing");
    return std::make_unique<ReplaceNormalizer>(object, at);
  }
  where.fail("unsupported normalizer type '" + type +
             "' (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, "
             "Prepend, Replace)");
}

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const json& object, const JsonContext& where) {
  if (object.is_null()) return nullptr;
  const std::string type = type_of(object, where);
  const JsonContext at = where.at(" (" + type + ")");
  if (type == "Sequence") {
    const json& list = get_list(object, "pretokenizers", at);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step =
          parse_pre_tokenizer(list[i], where.step(".pretokenizers[" + std::to_string(i) + "]"));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(object, at);
  if (type == "Split") {
    if (field(object, "pattern") == nullptr) at.fail("'pattern' is missing");
    return std::make_unique<SplitPreTokenizer>(object, at);
  }
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(object, at);
  if (type == "Digits") {
    const bool individual = get_bool(object, "individual_digits", false, at);
    return char_split([](char32_t c) { return is_numeric(c); },
                      individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Punctuation") {
    return char_split([](char32_t c) { return is_punctuation(c); },
                      parse_behavior(object, at, Behavior::kIsolated));
  }
  if (type == "WhitespaceSplit") {
    return char_split([](char32_t c) { return is_whitespace(c); }, Behavior::kRemoved);
  }
  if (type == "CharDelimiterSplit") {
    const char32_t delimiter = get_char(object, "delimiter", at);
    return char_split([delimiter](char32_t c) { return c == delimiter; }, Behavior::kRemoved);
  }
  if (type == "Whitespace") {
    // The reference's \w+|[^\w\s]+ (Rust regex classes), keeping the matches.
    json split = {{"type", "Split"},
                  {"pattern",
                   {{"Regex",
                     "[\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}]+|"
                     "[^\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}\\s]+"}}},
                  {"behavior", "Removed"},
                  {"invert", true}};
    return std::make_unique<SplitPreTokenizer>(split, at);
  }
  where.fail("unsupported pre-tokenizer type '" + type +
             "' (supported: Sequence, ByteLevel, Split, Metaspace, Digits, Punctuation, "
             "Whitespace, WhitespaceSplit, CharDelimiterSplit)");
}

std::unique_ptr<Decoder> parse_decoder(const json& object, const JsonContext& where) {
  if (object.is_null()) return nullptr;
  const std::string type = type_of(object, where);
  const JsonContext at = where.at(" (" + type + ")");
  if (type == "Sequence") {
    const json& list = get_list(object, "decoders", at);
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = parse_decoder(list[i], where.step(".decoders[" + std::to_string(i) + "]"));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(object, at);
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(object, at);
  if (type == "BPEDecoder") return std::make_unique<BpeSuffixDecoder>(object, at);
  if (type == "Replace") {
    if (field(object, "pattern") == nullptr) at.fail("'pattern' is missing");
    return std::make_unique<ReplaceDecoder>(object, at);
  }
  where.fail("unsupported decoder type '" + type +
             "' (supported: Sequence, ByteLevel, ByteFallback, Fuse, Strip, Metaspace, Replace, "
             "BPEDecoder)");
}

std::unique_ptr<PostProcessor> parse_post_processor(const json& object, const JsonContext& where) {
  if (object.is_null()) return nullptr;
  const std::string type = type_of(object, where);
  const JsonContext at = where.at(" (" + type + ")");
  if (type == "Sequence") {
    const json& list = get_list(object, "processors", at);
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step =
          parse_post_processor(list[i], where.step(".processors[" + std::to_string(i) + "]"));
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (type == "TemplateProcessing") return parse_template(object, at);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<TemplateProcessor>(std::vector<int32_t>{pair_id(object, "cls", at)},
                                               std::vector<int32_t>{pair_id(object, "sep", at)});
  }
  where.fail("unsupported post-processor type '" + type +
             "' (supported: Sequence, ByteLevel, TemplateProcessing, BertProcessing, "
             "RobertaProcessing)");
}

}  // namespace specrun::text
