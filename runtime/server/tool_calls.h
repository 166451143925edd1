// Tool calls in a model's output: the text a chat model writes to call a function, in the format
// its chat template teaches it, read back into OpenAI's tool_calls. Two formats: Hermes's (Qwen's,
// and every template that shows <tool_call>) and Llama 3.1's and 3.2's JSON. A whole output is
// parsed by parse_tool_calls; a stream by ToolCallStream, which releases text as soon as it cannot
// belong to a call and gives each call once it is complete, so that the two agree at every split.
// Text that looks like a call but does not parse (malformed JSON, a missing name) stays content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace specrun::server {

// How a model writes its tool calls.
enum class ToolCallFormat {
  kNone,       // the template shows no format specrun reads
  kHermes,     // <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of them, text
               // around them content (Qwen 2.5 and 3, Hermes); the last one may lack its end tag
  kLlamaJson,  // the whole output {"name": ..., "parameters": {...}} (or "arguments"), optionally
               // after <|python_tag|>, several separated by ';' (Llama 3.1, 3.2)
};

// The format a chat template's text teaches: <tool_call> Hermes's; Llama 3's headers with a
// "parameters" object Llama's JSON; anything else kNone.
ToolCallFormat tool_call_format(std::string_view template_source);
const char* to_string(ToolCallFormat format);

// One call: OpenAI's function {name, arguments}.
struct ToolCall {
  std::string name;       // the function called
  std::string arguments;  // its arguments, a JSON object as text
  bool operator==(const ToolCall&) const = default;
};

// What a model wrote: its text outside the calls, and the calls in order.
struct ParsedOutput {
  std::string content;          // the text outside the calls (see parse_tool_calls)
  std::vector<ToolCall> calls;  // empty: the output called nothing
  bool operator==(const ParsedOutput&) const = default;
};

// The calls in `text`, a whole output. Hermes: each <tool_call>...</tool_call> whose JSON is an
// object with a string "name" and an object "arguments" is a call; the rest is content, except
// that where there are calls, a stretch between, before or after them that is only whitespace is
// dropped. Llama: the output (after whitespace and <|python_tag|>) is calls separated by ';' and
// nothing else, or it is all content. kNone: all content.
ParsedOutput parse_tool_calls(ToolCallFormat format, std::string_view text);

// tool_choice "required" and a named function: the GBNF grammar whose sentences are exactly calls
// in `format` that parse_tool_calls reads, each call's arguments valid against its function's
// `parameters` (JSON Schema; none, or an empty schema: an object without members). Hermes: blocks
// "<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>" separated by "\n"; Llama:
// {"name": ..., "parameters": {...}} objects separated by "; ", without <|python_tag|> (a special
// token, which the output's text drops). `tools` is the request's, checked (checked_tools);
// `only` restricts the calls to that function ("" any of them); `many`: one or more calls, else
// exactly one. Throws specrun::Error (a function's parameters that do not compile, naming it).
std::string tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools,
                              const std::string& only, bool many);

// One piece of a streamed output, in order: content text, or a complete call.
struct ToolCallPiece {
  bool is_call = false;  // a call, rather than content
  std::string content;   // the content text (is_call false)
  ToolCall call;         // the call (is_call true)
};

// parse_tool_calls over a stream: feed() takes each piece of text as it comes and returns what
// can be given now; finish() the rest. Text that may begin a call is held until it is known to be
// one (then given as the call, once complete) or not (then released as content); the pieces'
// content and calls, concatenated, equal parse_tool_calls on the whole text.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format);
  std::vector<ToolCallPiece> feed(std::string_view text);
  std::vector<ToolCallPiece> finish();

 private:
  void outside(std::string_view text, std::vector<ToolCallPiece>& out);
  void resolve(std::string_view body, bool closed, std::vector<ToolCallPiece>& out);
  void release(std::string text, std::vector<ToolCallPiece>& out);

  enum class State {
    kOutside,      // Hermes: between calls
    kInside,       // Hermes: after <tool_call>, waiting for </tool_call>
    kUndecided,    // Llama: not yet known whether the output is calls
    kHolding,      // Llama: it may be calls, which only the end tells
    kPassthrough,  // Llama: it is not (kNone: never is); everything is content
  };
  ToolCallFormat format_;
  State state_;
  std::string buffer_;             // text fed and not yet given or released
  std::string held_space_;         // Hermes: whitespace that may border a call (then dropped)
  bool segment_has_text_ = false;  // Hermes: the stretch since the last call has non-whitespace
  bool called_ = false;            // Hermes: a call was given
};

}  // namespace specrun::server
