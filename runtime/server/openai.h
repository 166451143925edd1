// The OpenAI protocol of `specrun serve`: request bodies of /v1/completions and
// /v1/chat/completions checked and turned into the public API's settings, the response and chunk
// shapes, errors in OpenAI's shape, and the stop strings matched across token boundaries. Pure
// functions over JSON and text: the HTTP server (server.h) moves them over the wire.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
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

// tool_choice: whether the output is read for tool calls, and whether it must be one.
enum class ToolChoice {
  kNone,      // the tools are in the prompt, the output is all content
  kAuto,      // the output is parsed for calls in the template's format
  kRequired,  // the output is constrained to one or more calls (one without parallel_tool_calls)
  kFunction,  // the output is constrained to exactly one call of CompletionRequest::tool_function
};

// A request body, checked.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                // as the client named it
  std::string prompt;               // completions: the prompt text (BOS added when encoded)
  std::vector<int32_t> prompt_ids;  // completions: or the prompt as token ids
  ChatPrompt chat;                  // chat: what the template renders
  ToolChoice tool_choice = ToolChoice::kNone;  // chat: kAuto with tools unless told otherwise
  std::string tool_function;                   // kFunction: the function it names
  bool parallel_tool_calls = true;             // false: at most one call is returned (the first)
  // vLLM's add_special_tokens: the tokenizer's own special tokens (BOS) around the prompt text;
  // nullopt: the endpoint's default (completions yes, chat no: its template writes them).
  std::optional<bool> add_special_tokens;
  SamplingSettings sampling;            // the engine's defaults with the request's fields applied
  SpeculationSettings speculation;      // the same, from the "speculative" extension object
  bool seeded = false;                  // the request gave a seed
  std::map<int32_t, float> logit_bias;  // logit_bias: token id -> bias in [-100, 100]
  // Log-probabilities to return: -1 none, else this many top tokens beside each token (chat's
  // top_logprobs under "logprobs": true, completions' logprobs).
  int64_t logprobs = -1;
  int64_t n = 1;        // choices returned
  int64_t best_of = 1;  // completions: choices generated, the n likeliest returned (>= n)
  bool echo = false;    // completions: each choice's text begins with the prompt's
  // Structured output: response_format (json_object, json_schema), the "grammar" extension (GBNF)
  // or vLLM's guided_json; kNone for free text (and for tool_choice's, built by the server).
  OutputConstraint constraint;
  std::string constraint_field;   // the field that set `constraint`, which its errors name
  std::vector<std::string> stop;  // stop strings: never emitted, end the completion
  bool stream = false;            // server-sent events
  bool include_usage = false;     // stream_options.include_usage: a final usage chunk
};

// Limits of what a request may ask, independent of the model.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopLength = 1024;
inline constexpr int kMaxJsonDepth = 64;
// n and best_of at most: each choice is an engine request of its own.
inline constexpr int64_t kMaxChoices = 16;

// Parses `body` (JSON nested at most kMaxJsonDepth deep) as a request to `endpoint`: the fields
// OpenAI defines that specrun honours (model, prompt or messages, tools, tool_choice,
// parallel_tool_calls, max_tokens and max_completion_tokens, temperature, top_p, top_k, min_p,
// frequency_penalty, presence_penalty, logit_bias, logprobs, top_logprobs, seed, stop, n,
// best_of, echo, response_format, stream, stream_options, user), vLLM's (repetition_penalty,
// ignore_eos, add_generation_prompt, continue_final_message, chat_template_kwargs,
// add_special_tokens, guided_json), llama-server's "grammar" and the "speculative" extension
// object; fields that would change the output in ways specrun does not implement (echo with
// logprobs, vLLM's other sampling extras, ...) are refused rather than ignored. A schema or
// grammar is compiled here (check_constraint): one that does not compile is a 400 naming its
// field. `defaults` fill what the request leaves out; `served_model` is
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
// What a token's log-probability entry shows of it (Engine::token_piece).
using TokenPieces = std::function<TokenPiece(int32_t)>;

// A generated token as the response reports it: its log-probabilities and where its text begins
// in the choice's text (echoed prompt included), counted in the tokens' bytes (TokenPiece): the
// text's own bytes where it is valid UTF-8, whatever events carried it.
struct ReportedToken {
  TokenLogprob logprob;  // the token, its log-probability and the top ones beside it
  size_t offset = 0;     // byte offset of its text in the choice's text
};

// A choice's "logprobs" for `tokens`: chat's {"content": [{"token", "logprob", "bytes",
// "top_logprobs": [...]}]}, completions' {"tokens", "token_logprobs", "top_logprobs": [{piece:
// logprob}], "text_offset"}. A token's text is its bytes (invalid UTF-8 replaced when written).
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<ReportedToken>& tokens,
                             const TokenPieces& pieces);

// One choice of a non-streamed response.
struct ChoiceOutput {
  std::string text{};                   // the content (completions: echoed prompt included)
  std::string finish{};                 // its finish_reason
  std::vector<IdentifiedCall> calls{};  // chat: its tool calls ("content" null where text is "")
  nlohmann::json logprobs = nullptr;    // logprobs_json, or null where none were asked
};
// The response: each choice with its index, in order.
nlohmann::json completion_response(Endpoint endpoint, const ResponseHeader& header,
                                   const std::vector<ChoiceOutput>& choices,
                                   const nlohmann::json& usage);
// A chunk of choice `index` carrying `text` (and, for chat, the assistant role in the choice's
// first one) and `logprobs` (its tokens'; null for none); `finish` set on the choice's last. With
// include_usage every chunk has "usage": null. A `speculative` object other than null is the
// chunk's extension of that name.
nlohmann::json completion_chunk(Endpoint endpoint, const ResponseHeader& header, size_t index,
                                const std::string& text, bool first,
                                const std::optional<std::string>& finish, bool include_usage,
                                const nlohmann::json& speculative = nullptr,
                                const nlohmann::json& logprobs = nullptr);
// The chunks that stream one tool call of choice `index`, the call's `call_index` among the
// choice's: the first with its id, type and name (and empty arguments; the role too where it
// opens the choice's stream), the second with its arguments.
std::vector<nlohmann::json> tool_call_chunks(const ResponseHeader& header, size_t index,
                                             const IdentifiedCall& call, size_t call_index,
                                             bool first, bool include_usage);
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

// Which tokens the text a StopMatcher releases is made of, so that log-probabilities go out with
// their text: a token is released once the released text covers its bytes, and one whose bytes a
// stop string cut (or that came after it) never is. Tokens are placed by their bytes' lengths
// (TokenPiece; a special token has none in the text), and each event's last token ends no earlier
// than the event's text, which also holds the ends of characters earlier tokens began (where
// decoding replaced invalid UTF-8, which tokens a stop string cut is as near as that allows).
class TokenAligner {
 public:
  // An event's `text` was fed to the matcher, made by `tokens`, whose text lengths are `lengths`.
  void fed(std::string_view text, const std::vector<TokenLogprob>& tokens,
           const std::vector<size_t>& lengths);
  // The matcher released `bytes` more bytes: the tokens that are now wholly released, in order,
  // each with its offset in the released text.
  std::vector<ReportedToken> released(size_t bytes);
  // The output ended without a stop string: every token left (flush released the rest).
  std::vector<ReportedToken> rest();

 private:
  struct Placed {
    TokenLogprob logprob;  // the token
    size_t begin = 0;      // where it lies in the fed text: [begin, end)
    size_t end = 0;
    size_t offset = 0;  // the bytes of the tokens before it: its reported offset
  };
  std::deque<Placed> pending_;  // fed, not yet released
  size_t fed_ = 0;              // bytes of text fed
  size_t placed_ = 0;           // where the next token's bytes begin
  size_t released_ = 0;         // bytes of text released
  size_t offset_ = 0;           // bytes of the tokens fed
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
