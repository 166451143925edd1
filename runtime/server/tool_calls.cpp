#include "runtime/server/tool_calls.h"

#include "specrun/specrun.hpp"

#include <optional>

#include <nlohmann/json.hpp>

namespace specrun::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kSpace = " \t\n\r\f\v";
// Deeper arguments than any function takes are not a call (and not parsed past this depth).
constexpr int kMaxDepth = 64;

bool is_space(std::string_view text) {
  return text.find_first_not_of(kSpace) == std::string_view::npos;
}

std::string_view trim(std::string_view text) {
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kSpace) - first + 1);
}

// `text` as one JSON value, or nullopt (malformed, or nested past kMaxDepth).
std::optional<Json> parse_json(std::string_view text) {
  bool too_deep = false;
  const Json::parser_callback_t bounded = [&too_deep](int depth, Json::parse_event_t, Json&) {
    if (depth > kMaxDepth) too_deep = true;
    return !too_deep;
  };
  Json value = Json::parse(text, bounded, /*allow_exceptions=*/false);
  if (too_deep || value.is_discarded()) return std::nullopt;
  return value;
}

// {"name": "...", "<arguments key>": {...}} as a call; nullopt for anything else.
std::optional<ToolCall> call_of(const Json& value, std::initializer_list<const char*> keys) {
  if (!value.is_object()) return std::nullopt;
  const auto name = value.find("name");
  if (name == value.end() || !name->is_string() || name->get<std::string>().empty()) {
    return std::nullopt;
  }
  for (const char* key : keys) {
    const auto arguments = value.find(key);
    if (arguments != value.end() && arguments->is_object()) {
      return ToolCall{name->get<std::string>(),
                      arguments->dump(-1, ' ', false, Json::error_handler_t::replace)};
    }
  }
  return std::nullopt;
}

// The JSON between <tool_call> and </tool_call> as a call.
std::optional<ToolCall> hermes_call(std::string_view body) {
  const std::optional<Json> value = parse_json(trim(body));
  return value ? call_of(*value, {"arguments"}) : std::nullopt;
}

// Where the JSON object opening at text[begin] ('{') ends (one past its '}'), braces counted
// outside strings; npos when it does not end.
size_t object_end(std::string_view text, size_t begin) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// After leading whitespace and <|python_tag|> (and whitespace after it): where Llama's calls
// would begin.
size_t llama_start(std::string_view text) {
  size_t at = text.find_first_not_of(kSpace);
  if (at == std::string_view::npos) return text.size();
  if (text.substr(at).starts_with(kPythonTag)) {
    at = text.find_first_not_of(kSpace, at + kPythonTag.size());
    if (at == std::string_view::npos) return text.size();
  }
  return at;
}

// The whole output as Llama's calls, or nullopt where it is anything else.
std::optional<std::vector<ToolCall>> llama_calls(std::string_view text) {
  size_t at = llama_start(text);
  std::vector<ToolCall> calls;
  while (true) {
    if (at >= text.size() || text[at] != '{') return std::nullopt;
    const size_t end = object_end(text, at);
    if (end == std::string_view::npos) return std::nullopt;
    const std::optional<Json> value = parse_json(text.substr(at, end - at));
    std::optional<ToolCall> call =
        value ? call_of(*value, {"parameters", "arguments"}) : std::nullopt;
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
    at = text.find_first_not_of(kSpace, end);
    if (at == std::string_view::npos) return calls;
    if (text[at] != ';') return std::nullopt;
    at = text.find_first_not_of(kSpace, at + 1);
    if (at == std::string_view::npos) return calls;  // a trailing ';'
  }
}

// The length of the longest end of `text` that begins `token` without being all of it.
size_t partial_suffix(std::string_view text, std::string_view token) {
  for (size_t length = std::min(token.size() - 1, text.size()); length > 0; --length) {
    if (text.substr(text.size() - length) == token.substr(0, length)) return length;
  }
  return 0;
}

}  // namespace

ToolCallFormat tool_call_format(std::string_view template_source) {
  if (template_source.find(kOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (template_source.find("<|start_header_id|>") != std::string_view::npos &&
      template_source.find("\"parameters\"") != std::string_view::npos) {
    return ToolCallFormat::kLlamaJson;
  }
  return ToolCallFormat::kNone;
}

const char* to_string(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlamaJson:
      return "llama3_json";
  }
  return "none";
}

ParsedOutput parse_tool_calls(ToolCallFormat format, std::string_view text) {
  ParsedOutput parsed;
  if (format == ToolCallFormat::kLlamaJson) {
    if (std::optional<std::vector<ToolCall>> calls = llama_calls(text)) {
      parsed.calls = std::move(*calls);
    } else {
      parsed.content = text;
    }
    return parsed;
  }
  if (format == ToolCallFormat::kNone) {
    parsed.content = text;
    return parsed;
  }
  // Hermes: the stretches of text outside the calls, one before each call and one after the last.
  std::vector<std::string> stretches(1);
  size_t at = 0;
  while (true) {
    const size_t open = text.find(kOpen, at);
    if (open == std::string_view::npos) {
      stretches.back() += text.substr(at);
      break;
    }
    stretches.back() += text.substr(at, open - at);
    const size_t body = open + kOpen.size();
    const size_t close = text.find(kClose, body);
    const size_t end = close == std::string_view::npos ? text.size() : close + kClose.size();
    const std::string_view inside =
        text.substr(body, (close == std::string_view::npos ? text.size() : close) - body);
    if (std::optional<ToolCall> call = hermes_call(inside)) {
      parsed.calls.push_back(std::move(*call));
      stretches.emplace_back();
    } else {
      stretches.back() += text.substr(open, end - open);  // not a call: content as written
    }
    at = end;
  }
  for (const std::string& stretch : stretches) {
    if (parsed.calls.empty() || !is_space(stretch)) parsed.content += stretch;
  }
  return parsed;
}

ToolCallStream::ToolCallStream(ToolCallFormat format)
    : format_(format),
      state_(format == ToolCallFormat::kHermes      ? State::kOutside
             : format == ToolCallFormat::kLlamaJson ? State::kUndecided
                                                    : State::kPassthrough) {}

void ToolCallStream::release(std::string text, std::vector<ToolCallPiece>& out) {
  if (text.empty()) return;
  if (!out.empty() && !out.back().is_call) {
    out.back().content += text;
  } else {
    out.push_back({false, std::move(text), {}});
  }
}

// Hermes: text outside the calls. A stretch that is only whitespace so far is held: it is dropped
// if a call follows it (or ends the output after one), released once the stretch has more.
void ToolCallStream::outside(std::string_view text, std::vector<ToolCallPiece>& out) {
  if (segment_has_text_) {
    release(std::string(text), out);
    return;
  }
  held_space_ += text;
  if (!is_space(held_space_)) {
    segment_has_text_ = true;
    release(std::move(held_space_), out);
    held_space_.clear();
  }
}

// Hermes: the text of a <tool_call> block, up to its end tag (`closed`) or the output's end.
void ToolCallStream::resolve(std::string_view body, bool closed, std::vector<ToolCallPiece>& out) {
  if (std::optional<ToolCall> call = hermes_call(body)) {
    held_space_.clear();  // whitespace only, bordering a call
    segment_has_text_ = false;
    called_ = true;
    out.push_back({true, "", std::move(*call)});
    return;
  }
  outside(std::string(kOpen) + std::string(body) + (closed ? std::string(kClose) : ""), out);
}

std::vector<ToolCallPiece> ToolCallStream::feed(std::string_view text) {
  std::vector<ToolCallPiece> out;
  buffer_ += text;
  while (true) {
    switch (state_) {
      case State::kPassthrough:
        release(std::move(buffer_), out);
        buffer_.clear();
        return out;
      case State::kHolding:
        return out;  // only the end says whether it was calls
      case State::kUndecided: {
        const size_t at = buffer_.find_first_not_of(kSpace);
        if (at == std::string::npos) return out;
        const std::string_view rest = std::string_view(buffer_).substr(at);
        if (rest.size() < kPythonTag.size() && kPythonTag.starts_with(rest)) return out;
        const size_t start = llama_start(buffer_);
        if (start == buffer_.size()) return out;  // the tag and whitespace so far
        state_ = buffer_[start] == '{' ? State::kHolding : State::kPassthrough;
        continue;
      }
      case State::kOutside: {
        const size_t open = buffer_.find(kOpen);
        if (open == std::string::npos) {
          const size_t keep = partial_suffix(buffer_, kOpen);
          outside(std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
          buffer_.erase(0, buffer_.size() - keep);
          return out;
        }
        outside(std::string_view(buffer_).substr(0, open), out);
        buffer_.erase(0, open + kOpen.size());
        state_ = State::kInside;
        continue;
      }
      case State::kInside: {
        const size_t close = buffer_.find(kClose);
        if (close == std::string::npos) return out;
        resolve(std::string_view(buffer_).substr(0, close), /*closed=*/true, out);
        buffer_.erase(0, close + kClose.size());
        state_ = State::kOutside;
        continue;
      }
    }
  }
}

std::vector<ToolCallPiece> ToolCallStream::finish() {
  std::vector<ToolCallPiece> out = feed("");
  switch (state_) {
    case State::kHolding:
    case State::kUndecided:
    case State::kPassthrough: {
      ParsedOutput parsed = parse_tool_calls(format_, buffer_);
      release(std::move(parsed.content), out);
      for (ToolCall& call : parsed.calls) out.push_back({true, "", std::move(call)});
      break;
    }
    case State::kInside:
      resolve(buffer_, /*closed=*/false, out);
      break;
    case State::kOutside:
      outside(buffer_, out);
      break;
  }
  buffer_.clear();
  // A stretch of whitespace left at the end borders the last call, if there was one.
  if (!called_) release(std::move(held_space_), out);
  held_space_.clear();
  return out;
}

std::string tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools,
                              const std::string& only, bool many) {
  using json = nlohmann::ordered_json;
  if (format == ToolCallFormat::kNone) throw Error("tool calls: the template has no call format");
  // One JSON Schema over every allowed call, so that the calls share one compiled document: an
  // anyOf of {"name": const, <arguments>: parameters}, both required, in the format's order.
  const char* arguments = format == ToolCallFormat::kHermes ? "arguments" : "parameters";
  json alternatives = json::array();
  for (const json& tool : tools) {
    const json& function = tool["function"];
    const std::string name = function["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    json parameters = function.contains("parameters") && function["parameters"].is_object() &&
                              !function["parameters"].empty()
                          ? function["parameters"]
                          : json{{"type", "object"}};
    alternatives.push_back(
        {{"type", "object"},
         {"properties", {{"name", {{"const", name}}}, {arguments, std::move(parameters)}}},
         {"required", json::array({"name", arguments})},
         {"additionalProperties", false}});
  }
  if (alternatives.empty()) throw Error("tool calls: no tool named '" + only + "'");
  const json schema =
      alternatives.size() == 1 ? alternatives[0] : json{{"anyOf", std::move(alternatives)}};
  std::string grammar;
  try {
    grammar = json_schema_gbnf(schema.dump(), "tool-call");
  } catch (const Error& error) {
    throw Error(std::string("tool calls: the tools' parameters do not compile: ") + error.what());
  }
  const std::string call = format == ToolCallFormat::kHermes
                               ? "\"<tool_call>\\n\" tool-call \"\\n</tool_call>\""
                               : "tool-call";
  const std::string separator = format == ToolCallFormat::kHermes ? "\"\\n\"" : "\"; \"";
  return "root ::= " + call + (many ? " (" + separator + " " + call + ")*" : "") + "\n" + grammar;
}

}  // namespace specrun::server
