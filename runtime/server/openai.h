// The OpenAI protocol of `specrun serve`: request bodies of /v1/completions and
// /v1/chat/completions checked and turned into the public API's settings, the response and chunk
// shapes, errors in OpenAI's shape, and the stop strings matched across token boundaries. Pure
// functions over JSON and text: the HTTP server (server.h) moves them over the wire.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/server/tool_calls.h"
#include "specrun/chat.hpp"
#include "specrun/specrun.hpp"

namespace specrun::server {

// An error in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, with its status.
struct ApiError {
  int status = 400;                            // HTTP status
  std::string type = "invalid_request_error";  // OpenAI's error type
  std::string message;                         // one line naming the field and value
  std::string param;                           // the offending field; "" for none
  std::string code;                            // a machine-readable code; "" for none

  nlohmann::json body() const;
};

// Thrown by the request parsers; carries the response to send.
class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError error) : error_(std::move(error)) {}
  const ApiError& error() const { return error_; }
  const char* what() const noexcept override { return error_.message.c_str(); }

 private:
  ApiError error_;
};

enum class Endpoint { kCompletions, kChat };

// What a chat request's prompt is made of: the arguments of the chat template's rendering, as
// vLLM hands an OpenAI request to transformers' apply_chat_template. Object members keep the
// order the client gave them (a template printing a tool or its tojson shows it).
struct ChatPrompt {
  // [{role, content, tool_calls, tool_call_id, name, ...}]: content flattened to a string, an
  // assistant's tool_calls with their function.arguments parsed from JSON text to objects.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // the request's tools as given; null for none
  nlohmann::ordered_json variables;  // chat_template_kwargs: extra template variables; null
  // Open the assistant's turn after the messages; false ends the prompt with the last message
  // closed, no turn opened.
  bool add_generation_prompt = true;
  // End the prompt inside the last message, for the model to continue it (vLLM's; it needs
  // add_generation_prompt false).
  bool continue_final_message = false;
};

// tool_choice: whether the output is read for tool calls. ("required" and a named function need
// the output constrained to a call, which is refused until grammar-constrained decoding exists.)
enum class ToolChoice {
  kNone,  // the tools are in the prompt, the output is all content
  kAuto,  // the output is parsed for calls in the template's format
};

// A request body, checked.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                // as the client named it
  std::string prompt;               // completions: the prompt text (BOS added when encoded)
  std::vector<int32_t> prompt_ids;  // completions: or the prompt as token ids
  ChatPrompt chat;                  // chat: what the template renders
  ToolChoice tool_choice = ToolChoice::kNone;  // chat: kAuto with tools unless told otherwise
  bool parallel_tool_calls = true;             // false: at most one call is returned (the first)
  // vLLM's add_special_tokens: the tokenizer's own special tokens (BOS) around the prompt text;
  // nullopt: the endpoint's default (completions yes, chat no: its template writes them).
  std::optional<bool> add_special_tokens;
  SamplingSettings sampling;        // the engine's defaults with the request's fields applied
  SpeculationSettings speculation;  // the same, from the "speculative" extension object
  bool seeded = false;              // the request gave a seed
  std::vector<std::string> stop;    // stop strings: never emitted, end the completion
  bool stream = false;              // server-sent events
  bool include_usage = false;       // stream_options.include_usage: a final usage chunk
};

// Limits of what a request may ask, independent of the model.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopLength = 1024;
inline constexpr int kMaxJsonDepth = 64;

// Parses `body` (JSON nested at most kMaxJsonDepth deep) as a request to `endpoint`: the fields
// OpenAI defines that specrun honours (model, prompt or messages, tools, tool_choice,
// parallel_tool_calls, max_tokens and max_completion_tokens, temperature, top_p, top_k, min_p,
// seed, stop, n = 1, stream, stream_options, user), vLLM's (ignore_eos, add_generation_prompt,
// continue_final_message, chat_template_kwargs, add_special_tokens) and the "speculative"
// extension object; fields that would change the output in ways specrun does not implement
// (penalties, logprobs, logit_bias, n > 1, tool_choice "required", vLLM's sampling extras, ...)
// are refused rather than ignored. `defaults` fill what the request leaves out; `served_model` is
// the only model name accepted (404 otherwise). Throws ApiException.
CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint,
                                           const EngineConfig& defaults,
                                           const std::string& served_model);

// The keys of a chat request that shape its prompt, which `specrun template` reads.
inline constexpr const char* kChatPromptKeys[] = {"messages", "tools", "add_generation_prompt",
                                                  "continue_final_message", "chat_template_kwargs"};

// `specrun template`'s input: a JSON list of messages, or an object of kChatPromptKeys as a chat
// request has them (any other key refused), read by the server's own rules. Throws ApiException.
ChatPrompt parse_chat_prompt(std::string_view body);

// The prompt text of `prompt` through `chat_template`, as the server renders a chat request:
// tools need a template whose tool-call format specrun reads (400 otherwise); what the template
// refuses is a 400 naming the messages. The one renderer of the server and `specrun template`.
// Throws ApiException.
std::string render_chat_prompt(const ChatTemplate& chat_template, const ChatPrompt& prompt);

// OpenAI's finish_reason for how a request ended ("stop", "length"), or nullopt when it ended
// without a result (cancelled, shut down, failed).
std::optional<std::string> finish_reason(FinishReason reason, bool stopped_by_string);

// Token counts of a finished request; cached prompt tokens as prompt_tokens_details.
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens,
                          int64_t cached_prompt_tokens);

// The non-streaming response and the streaming chunks, in OpenAI's shapes. `id` ("cmpl-..." or
// "chatcmpl-..."), `created` (Unix seconds) and `model` are the same in every chunk of a request.
struct ResponseHeader {
  std::string id;
  int64_t created = 0;
  std::string model;
};
// A tool call as the response gives it: its id ("call_..."), and the call.
struct IdentifiedCall {
  std::string id;  // the call's id, which the tool's answer names (tool_call_id)
  ToolCall call;   // the function and its arguments
};
// With `calls`, a chat message has them as "tool_calls" and "content" null where `text` is empty.
nlohmann::json completion_response(Endpoint endpoint, const ResponseHeader& header,
                                   const std::string& text, const std::string& finish,
                                   const nlohmann::json& usage,
                                   const std::vector<IdentifiedCall>& calls = {});
// A chunk carrying `text` (and, for chat, the assistant role in the first one); `finish` set on
// the last. With include_usage every chunk has "usage": null. A `speculative` object other than
// null is the chunk's extension of that name.
nlohmann::json completion_chunk(Endpoint endpoint, const ResponseHeader& header,
                                const std::string& text, bool first,
                                const std::optional<std::string>& finish, bool include_usage,
                                const nlohmann::json& speculative = nullptr);
// The chunks that stream one tool call, the call's `index` among the output's: the first with
// its id, type and name (and empty arguments; the role too where it opens the stream), the second
// with its arguments.
std::vector<nlohmann::json> tool_call_chunks(const ResponseHeader& header,
                                             const IdentifiedCall& call, size_t index, bool first,
                                             bool include_usage);
// The final chunk of a stream with include_usage: no choices, the usage.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                           const nlohmann::json& usage);

// The "speculative" extension object of a finished request, in the non-streamed response and in
// a stream's last chunk (the one with the finish reason): what speculation did for it.
nlohmann::json speculative_json(const RequestStats& stats);

// What the tokens behind a streamed chunk's text were: the engine's events since the previous
// chunk with text, summed (Event's fields of the same names).
struct ChunkSpeculation {
  int64_t tokens = 0;           // tokens committed
  int64_t drafted = 0;          // drafts the target verified in the steps that committed them
  int64_t accepted_drafts = 0;  // of `tokens`, drafts the target accepted
};
// The "speculative" extension object of a streamed chunk with text: {"tokens", "drafted",
// "accepted_drafts"} and "pieces", the chunk's text by origin (TextOrigins::released).
nlohmann::json chunk_speculative_json(const ChunkSpeculation& counts, const nlohmann::json& pieces);

// Which of the text a StopMatcher releases came from drafts the target accepted. The matcher
// releases what it was fed in order, so each byte it releases has the origin of the byte fed at
// the same place, whatever it held back in between.
class TextOrigins {
 public:
  // `text` was fed to the matcher; its first `accepted` bytes are accepted drafts' text
  // (Event::accepted_text).
  void fed(std::string_view text, size_t accepted);
  // The matcher released `text`: its pieces in order, each of one origin, as
  // [{"text": ..., "accepted_draft": true or false}].
  nlohmann::json released(std::string_view text);

 private:
  std::deque<std::pair<size_t, bool>> runs_;  // fed, not yet released: bytes, from a draft
};

// Matches stop strings in streamed text, across token boundaries: text that might be the start of
// a stop string is held back until it is known not to be; at the first occurrence the text before
// it is released and the rest (the stop string included) is dropped.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Takes the next piece of text; returns what may be sent now.
  std::string feed(std::string_view text);
  // At the end of the completion: whatever is still held back (never a whole stop string).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace specrun::server
