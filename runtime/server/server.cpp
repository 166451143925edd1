#include "runtime/server/server.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <httplib.h>

#include "runtime/server/chat_page.h"
#include "runtime/server/metrics.h"
#include "runtime/server/openai.h"

namespace specrun::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How long a response waits for the engine before it writes something (an SSE comment, or a space
// before a JSON body), so that a client that went away is noticed and its request cancelled.
constexpr auto kHeartbeat = std::chrono::milliseconds(250);

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status;
  response.set_content(dump(error.body()), "application/json");
}

ApiError server_error(int status, const std::string& message, const std::string& code = "") {
  return ApiError{status, status == 503 ? "service_unavailable_error" : "server_error", message, "",
                  code};
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

struct Server::State {
  ServerConfig config;
  EngineConfig defaults;
  httplib::Server http;
  int port = 0;
  Metrics metrics;
  Clock::time_point started = Clock::now();
  int64_t created = static_cast<int64_t>(std::time(nullptr));

  std::atomic<bool> ready{false};     // attach() was called: engine, template and name are set
  std::atomic<bool> draining{false};  // drain() was called: no new requests
  std::atomic<int64_t> in_flight{0};  // requests admitted and not yet answered
  std::unique_ptr<Engine> engine;     // set once, before `ready`
  std::optional<ChatTemplate> chat_template;
  std::string model_name;

  std::mutex random_mutex;  // guards `random`
  std::mt19937_64 random{std::random_device{}()};

  uint64_t draw() {
    std::lock_guard lock(random_mutex);
    return random();
  }
  std::string new_id(const char* prefix) {
    char digits[17];
    std::snprintf(digits, sizeof(digits), "%016llx", static_cast<unsigned long long>(draw()));
    return std::string(prefix) + digits;
  }

  void routes();
  // Reads the request's body, at most config.max_body_bytes of it whatever its framing
  // (Content-Length or chunked): false when there is more, or it cannot be read, with the error
  // sent and the connection closed after it. A body announced past the limit is refused at once,
  // unread.
  bool read_body(const httplib::Request& request, const httplib::ContentReader& content,
                 httplib::Response& response, std::string* body);
  void completion(const std::string& body, httplib::Response& response, Endpoint endpoint);
  // The 413's message, wherever the limit is met.
  std::string body_too_large() const {
    return "the request body is larger than the server's limit of " +
           std::to_string(config.max_body_bytes) + " bytes";
  }
  Request engine_request(const CompletionRequest& parsed);
};

namespace {

// The events of an exchange's engine requests, handed from the engine's thread (their callbacks)
// to the connection's. Shared with the callbacks, which may outlive the exchange.
struct EventQueue {
  std::mutex mutex;                             // guards `events`
  std::condition_variable ready;                // an event was queued
  std::deque<std::pair<size_t, Event>> events;  // (choice, event), as they came
};

// One choice of an exchange: one engine request and what its output became.
struct Choice {
  RequestHandle handle;     // its engine request
  StopMatcher matcher{{}};  // the request's stop strings over its text
  TextOrigins origins;      // which streamed text came from accepted drafts
  TokenAligner aligner;     // which tokens the released text is made of
  ChunkSpeculation unsent;  // the events' counts the next text chunk carries
  // tool_choice other than "none": the text past the stop strings read for tool calls (no value:
  // all content)
  std::optional<ToolCallStream> tool_calls;
  std::vector<IdentifiedCall> calls;  // the calls returned so far, in order
  std::string text;                   // the whole content, when not streaming (echo included)
  std::vector<ReportedToken> tokens;  // released tokens: not yet sent (streamed), or all
  double cumulative_logprob = 0.0;    // of the tokens released, for best_of
  int64_t completion_tokens = 0;      // up to the stop string, when one matched
  size_t text_bytes = 0;              // bytes of its text so far (echo included): token offsets
  bool first_chunk = true;            // a chat choice's stream opens with the assistant role
  bool done = false;                  // its request finished and its last chunk was written
  std::string finish;                 // its finish_reason, once done
  RequestStats stats;                 // its request's figures, once done
};

// One admitted request from submit to its last byte; used on its connection's thread only (but
// for `queue`).
struct Exchange {
  Server::State* server = nullptr;
  std::shared_ptr<EventQueue> queue = std::make_shared<EventQueue>();
  std::vector<Choice> choices;  // best_of of them (n unless best_of says more)
  size_t returned = 1;          // n: the choices the response has
  Endpoint endpoint = Endpoint::kCompletions;
  bool stream = false;
  bool include_usage = false;
  bool report_logprobs = false;     // the client asked for logprobs (best_of asks for itself too)
  std::string echo;                 // completions' echo: the prompt text each choice begins with
  int32_t prompt_first_token = -1;  // echo with logprobs: the prompt's first token (reported
                                    // without a log-probability, which nothing before it gives)
  bool started = false;             // the first call of provide() (echoes the prompt) is past
  ResponseHeader header;
  Clock::time_point arrived;
  std::optional<Clock::time_point> last_text;  // when text was last sent, for the latencies
  Clock::time_point last_write;                // when bytes were last written, for heartbeats
  bool finished = false;                       // the final bytes were written
  bool parallel_tool_calls = true;  // false: calls after a choice's first are not returned
};

bool write(httplib::DataSink& sink, const std::string& bytes) {
  return sink.write(bytes.data(), bytes.size());
}

bool write_event(httplib::DataSink& sink, const json& value) {
  return write(sink, "data: " + dump(value) + "\n\n");
}

// Something is sent: the latencies' clock.
void sent(Exchange& exchange) {
  const auto now = Clock::now();
  if (exchange.last_text) {
    exchange.server->metrics.inter_token_latency(seconds_between(*exchange.last_text, now));
  } else {
    exchange.server->metrics.time_to_first_token(seconds_between(exchange.arrived, now));
  }
  exchange.last_text = now;
}

TokenPiece token_piece(const Exchange& exchange, int32_t token) {
  return exchange.server->engine->token_piece(token);
}

// The logprobs of a choice's tokens released since its last chunk (null where none were asked),
// which the chunk takes.
json take_logprobs(Exchange& exchange, Choice& choice) {
  if (!exchange.report_logprobs) return nullptr;
  json logprobs = logprobs_json(exchange.endpoint, choice.tokens,
                                [&](int32_t token) { return token_piece(exchange, token); });
  choice.tokens.clear();
  return logprobs;
}

// Tokens the choice's stop matcher released: kept for its next chunk, or for the response.
void released_tokens(Choice& choice, std::vector<ReportedToken> tokens, size_t echo) {
  for (ReportedToken& token : tokens) {
    choice.cumulative_logprob += token.logprob.logprob;
    token.offset += echo;
    choice.tokens.push_back(std::move(token));
  }
}

// Content that became sendable: streamed as a chunk, or kept for the JSON body. `pieces` says
// which of it came from accepted drafts (null where tool-call parsing rearranged the text).
bool emit_content(Exchange& exchange, size_t index, httplib::DataSink& sink,
                  const std::string& text, const json& pieces) {
  if (text.empty()) return true;
  Choice& choice = exchange.choices[index];
  sent(exchange);
  choice.text_bytes += text.size();
  if (!exchange.stream) {
    choice.text += text;
    return true;
  }
  const bool first = choice.first_chunk;
  choice.first_chunk = false;
  exchange.last_write = Clock::now();  // (a JSON body's heartbeats go on: nothing is written)
  const json speculative = chunk_speculative_json(choice.unsent, pieces);
  choice.unsent = {};
  return write_event(
      sink, completion_chunk(exchange.endpoint, exchange.header, index, text, first, std::nullopt,
                             exchange.include_usage, speculative, take_logprobs(exchange, choice)));
}

// A tool call read from the output: streamed as its chunks, or kept for the JSON body.
bool emit_call(Exchange& exchange, size_t index, httplib::DataSink& sink, ToolCall call) {
  Choice& choice = exchange.choices[index];
  if (!exchange.parallel_tool_calls && !choice.calls.empty()) return true;
  sent(exchange);
  choice.calls.push_back({exchange.server->new_id("call_"), std::move(call)});
  if (!exchange.stream) return true;
  const bool first = choice.first_chunk;
  choice.first_chunk = false;
  exchange.last_write = Clock::now();
  for (const json& chunk :
       tool_call_chunks(exchange.header, index, choice.calls.back(), choice.calls.size() - 1, first,
                        exchange.include_usage)) {
    if (!write_event(sink, chunk)) return false;
  }
  return true;
}

// Text a choice's stop strings released: content, or read for tool calls first. `end`: the output
// ended, so nothing is held back any more.
bool emit(Exchange& exchange, size_t index, httplib::DataSink& sink, const std::string& text,
          bool end = false) {
  Choice& choice = exchange.choices[index];
  if (!choice.tool_calls) {
    return emit_content(exchange, index, sink, text,
                        exchange.stream ? choice.origins.released(text) : json());
  }
  if (exchange.stream) choice.origins.released(text);  // kept in step; not told per chunk
  std::vector<ToolCallPiece> pieces = choice.tool_calls->feed(text);
  if (end) {
    for (ToolCallPiece& piece : choice.tool_calls->finish()) pieces.push_back(std::move(piece));
  }
  for (ToolCallPiece& piece : pieces) {
    const bool written = piece.is_call ? emit_call(exchange, index, sink, std::move(piece.call))
                                       : emit_content(exchange, index, sink, piece.content, json());
    if (!written) return false;
  }
  return true;
}

// Every choice is done: the usage and the end of the stream, or the whole response.
bool finish_exchange(Exchange& exchange, httplib::DataSink& sink) {
  const Choice& lead = exchange.choices.front();
  exchange.server->metrics.request_finished(lead.finish);
  // The prompt once (every choice's is the same); the completion tokens of every choice made.
  int64_t completion_tokens = 0;
  for (const Choice& choice : exchange.choices) completion_tokens += choice.completion_tokens;
  const json usage =
      usage_json(lead.stats.prompt_tokens, completion_tokens, lead.stats.cached_prompt_tokens);
  exchange.finished = true;
  bool written = true;
  if (exchange.stream) {
    if (exchange.include_usage) {
      written = write_event(sink, usage_chunk(exchange.endpoint, exchange.header, usage));
    }
    written = written && write(sink, "data: [DONE]\n\n");
  } else {
    // best_of: the n choices whose tokens are likeliest together, in that order.
    std::vector<size_t> order(exchange.choices.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (exchange.returned < order.size()) {
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return exchange.choices[a].cumulative_logprob > exchange.choices[b].cumulative_logprob;
      });
      order.resize(exchange.returned);
    }
    std::vector<ChoiceOutput> outputs;
    for (const size_t i : order) {
      Choice& choice = exchange.choices[i];
      json logprobs = take_logprobs(exchange, choice);
      outputs.push_back({choice.text, choice.finish, choice.calls, std::move(logprobs)});
    }
    json response = completion_response(exchange.endpoint, exchange.header, outputs, usage);
    response["speculative"] = speculative_json(exchange.choices[order.front()].stats);
    written = write(sink, dump(response));
  }
  sink.done();
  return written;
}

// A choice's request ended: its last text and finish reason (streamed: its last chunk); an error
// ends the whole response.
bool finish_choice(Exchange& exchange, size_t index, httplib::DataSink& sink) {
  Choice& choice = exchange.choices[index];
  const bool stopped = choice.matcher.stopped();
  const std::string rest = choice.matcher.flush();
  const size_t echo = exchange.echo.size();
  released_tokens(choice, choice.aligner.released(rest.size()), echo);
  // Without a stop string every token is the output's, whatever its text.
  if (!stopped) released_tokens(choice, choice.aligner.rest(), echo);
  if (!emit(exchange, index, sink, rest, /*end=*/true)) return false;
  const Result result = choice.handle.wait();
  exchange.server->metrics.request_stats(result.stats);
  std::optional<std::string> reason = finish_reason(result.reason, stopped);
  // As vLLM: an output that called a tool ends for that reason.
  if (reason && !choice.calls.empty()) reason = "tool_calls";
  if (!reason) {
    exchange.finished = true;
    for (Choice& other : exchange.choices) other.handle.cancel();
    const bool shutdown = result.reason == FinishReason::kShutdown;
    exchange.server->metrics.request_finished(shutdown ? "shutdown" : to_string(result.reason));
    const ApiError error =
        server_error(shutdown ? 503 : 500, shutdown ? "the server is shutting down"
                                                    : "generation failed: " + result.error);
    const bool written = exchange.stream
                             ? write_event(sink, error.body()) && write(sink, "data: [DONE]\n\n")
                             : write(sink, dump(error.body()));
    sink.done();
    return written;
  }
  choice.done = true;
  choice.finish = *reason;
  choice.stats = result.stats;
  if (exchange.stream) {
    const bool first = choice.first_chunk;
    choice.first_chunk = false;
    if (!write_event(sink,
                     completion_chunk(exchange.endpoint, exchange.header, index, "", first, reason,
                                      exchange.include_usage, speculative_json(result.stats),
                                      take_logprobs(exchange, choice)))) {
      return false;
    }
  }
  for (const Choice& other : exchange.choices) {
    if (!other.done) return true;
  }
  return finish_exchange(exchange, sink);
}

// One event of a choice's request.
bool take_event(Exchange& exchange, size_t index, const Event& event, httplib::DataSink& sink) {
  Choice& choice = exchange.choices[index];
  if (!event.prompt_logprobs.empty() && exchange.report_logprobs) {
    // The echoed prompt's tokens come first among the choice's logprobs: the first token (which
    // follows nothing) without a log-probability, each placed in the echo by its bytes.
    std::vector<ReportedToken> prompt;
    const TokenPiece first = token_piece(exchange, exchange.prompt_first_token);
    prompt.push_back({TokenLogprob{exchange.prompt_first_token, NAN, {}}, 0});
    size_t offset = first.special ? 0 : first.bytes.size();
    for (const TokenLogprob& logprob : event.prompt_logprobs) {
      prompt.push_back({logprob, std::min(offset, exchange.echo.size())});
      const TokenPiece piece = token_piece(exchange, logprob.token);
      offset += piece.special ? 0 : piece.bytes.size();
    }
    choice.tokens.insert(choice.tokens.begin(), prompt.begin(), prompt.end());
  }
  if (!choice.matcher.stopped()) {
    const auto tokens = static_cast<int64_t>(event.tokens.size());
    choice.completion_tokens += tokens;
    choice.unsent.tokens += tokens;
    choice.unsent.drafted += event.drafted;
    choice.unsent.accepted_drafts += event.accepted_drafts;
    if (exchange.stream) choice.origins.fed(event.text, event.accepted_text);
    if (!event.logprobs.empty()) {
      // Each token's length in the text, which places it there (a special token has none).
      std::vector<size_t> lengths;
      for (const int32_t token : event.tokens) {
        const TokenPiece piece = token_piece(exchange, token);
        lengths.push_back(piece.special ? 0 : piece.bytes.size());
      }
      choice.aligner.fed(event.text, event.logprobs, lengths);
    }
    const std::string released = choice.matcher.feed(event.text);
    released_tokens(choice, choice.aligner.released(released.size()), exchange.echo.size());
    if (!emit(exchange, index, sink, released)) return false;
    // A stop string ends the completion: the engine stops at its next step.
    if (choice.matcher.stopped()) choice.handle.cancel();
  }
  if (event.finished) return finish_choice(exchange, index, sink);
  return true;
}

// Called by cpp-httplib on the connection's thread until the response is complete; returning false
// (a write failed: the client went away) ends the connection and the releaser cancels the requests.
bool provide(Exchange& exchange, httplib::DataSink& sink) {
  if (!exchange.started) {
    exchange.started = true;
    // echo: each choice begins with the prompt, streamed as its first chunk.
    for (size_t index = 0; index < exchange.choices.size(); ++index) {
      if (!emit_content(exchange, index, sink, exchange.echo, json())) return false;
    }
  }
  std::optional<std::pair<size_t, Event>> next;
  {
    std::unique_lock lock(exchange.queue->mutex);
    exchange.queue->ready.wait_for(lock, kHeartbeat,
                                   [&] { return !exchange.queue->events.empty(); });
    if (!exchange.queue->events.empty()) {
      next = std::move(exchange.queue->events.front());
      exchange.queue->events.pop_front();
    }
  }
  if (next) {
    if (!take_event(exchange, next->first, next->second, sink)) return false;
    if (exchange.finished) return true;
  }
  // Whatever holds the text back (the engine, a stop string's prefix, a JSON body kept whole), the
  // client hears something every kHeartbeat; the write fails once it has gone away.
  const auto now = Clock::now();
  if (now - exchange.last_write < kHeartbeat) return true;
  exchange.last_write = now;
  return write(sink, exchange.stream ? ": keep-alive\n\n" : " ");
}

}  // namespace

Request Server::State::engine_request(const CompletionRequest& parsed) {
  Request request;
  if (parsed.endpoint == Endpoint::kChat) {
    if (!chat_template) {
      throw ApiException(ApiError{400, "invalid_request_error",
                                  "the model '" + model_name +
                                      "' has no chat template: use /v1/completions, or start the "
                                      "server with --chat-template FILE",
                                  "messages", ""});
    }
    const std::string text = render_chat_prompt(*chat_template, parsed.chat);
    // The template writes the special tokens itself, as transformers' apply_chat_template.
    request.prompt_ids = engine->tokenize(text, parsed.add_special_tokens.value_or(false));
  } else if (!parsed.prompt_ids.empty()) {
    if (parsed.add_special_tokens) {
      throw ApiException(ApiError{400, "invalid_request_error",
                                  "'add_special_tokens' applies to a prompt given as text; token "
                                  "ids are the prompt as given",
                                  "add_special_tokens", ""});
    }
    request.prompt_ids = parsed.prompt_ids;
  } else {
    if (!engine->info().has_tokenizer) {
      throw ApiException(ApiError{400, "invalid_request_error",
                                  "the model has no tokenizer: give the prompt as token ids",
                                  "prompt", ""});
    }
    if (parsed.add_special_tokens.value_or(true)) {
      request.prompt = parsed.prompt;  // the engine adds the tokenizer's special tokens
    } else {
      request.prompt_ids = engine->tokenize(parsed.prompt, /*add_special_tokens=*/false);
    }
  }
  request.sampling = parsed.sampling;
  request.speculation = parsed.speculation;
  request.logit_bias = parsed.logit_bias;
  // best_of ranks its choices by their tokens' log-probabilities: it asks for them itself.
  request.logprobs =
      parsed.best_of > parsed.n ? std::max<int64_t>(parsed.logprobs, 0) : parsed.logprobs;
  // echo with logprobs reports the prompt's tokens too, the first without one (OpenAI's shape).
  if (parsed.echo && parsed.logprobs >= 0) request.prompt_logprobs = parsed.logprobs;
  if (request.logprobs >= 0 && !engine->info().has_tokenizer) {
    throw ApiException(ApiError{400, "invalid_request_error",
                                "'logprobs' shows tokens as text, and the model has no tokenizer",
                                "logprobs", ""});
  }
  request.constraint = parsed.constraint;
  if (parsed.tool_choice == ToolChoice::kRequired || parsed.tool_choice == ToolChoice::kFunction) {
    // The output is forced into calls that the template's format reads back.
    try {
      request.constraint = {
          ConstraintKind::kGbnf,
          tool_call_grammar(
              tool_call_format(chat_template->source()), parsed.chat.tools, parsed.tool_function,
              parsed.tool_choice == ToolChoice::kRequired && parsed.parallel_tool_calls)};
    } catch (const Error& error) {
      throw ApiException(ApiError{400, "invalid_request_error",
                                  std::string("'tool_choice': ") + error.what(), "tools", ""});
    }
  }
  return request;
}

bool Server::State::read_body(const httplib::Request& request,
                              const httplib::ContentReader& content, httplib::Response& response,
                              std::string* body) {
  const auto limit = static_cast<uint64_t>(config.max_body_bytes);
  bool over = request.has_header("Content-Length") &&
              request.get_header_value<uint64_t>("Content-Length") > limit;
  bool read = !over && content([&](const char* data, size_t length) {
    if (body->size() + length > limit) {
      over = true;
      return false;  // stop reading: the rest is never buffered
    }
    body->append(data, length);
    return true;
  });
  if (read) return true;
  // What is left of the body is not read: the connection cannot carry another request.
  response.set_header("Connection", "close");
  if (over) {
    send_error(response, ApiError{413, "invalid_request_error", body_too_large(), "", ""});
  } else {
    send_error(response, ApiError{400, "invalid_request_error",
                                  "the request body could not be read", "", ""});
  }
  return false;
}

void Server::State::completion(const std::string& body, httplib::Response& response,
                               Endpoint endpoint) {
  if (!ready) {
    response.set_header("Retry-After", "5");
    send_error(response, server_error(503, "the model is still loading"));
    return;
  }
  if (draining) {
    send_error(response, server_error(503, "the server is shutting down"));
    return;
  }
  // Admission: a bounded number of requests queued or running; past it, try again shortly.
  if (in_flight.fetch_add(1) >= config.max_requests) {
    in_flight.fetch_sub(1);
    metrics.request_finished("rejected");
    response.set_header("Retry-After", "1");
    send_error(response, ApiError{429, "rate_limit_error",
                                  "the server has " + std::to_string(config.max_requests) +
                                      " requests in flight, its limit: try again shortly",
                                  "", "too_many_requests"});
    return;
  }
  auto exchange = std::make_shared<Exchange>();
  try {
    const CompletionRequest parsed = parse_completion_request(body, endpoint, defaults, model_name);
    Request request = engine_request(parsed);
    if (request.prompt_logprobs >= 0) {
      exchange->prompt_first_token = request.prompt_ids.empty()
                                         ? engine->tokenize(request.prompt).front()
                                         : request.prompt_ids.front();
    }
    exchange->server = this;
    exchange->endpoint = endpoint;
    exchange->stream = parsed.stream;
    exchange->include_usage = parsed.include_usage;
    exchange->report_logprobs = parsed.logprobs >= 0;
    exchange->returned = static_cast<size_t>(parsed.n);
    if (parsed.echo) {
      exchange->echo =
          parsed.prompt_ids.empty() ? parsed.prompt : engine->detokenize(parsed.prompt_ids);
    }
    exchange->parallel_tool_calls =
        parsed.parallel_tool_calls && parsed.tool_choice != ToolChoice::kFunction;
    exchange->choices.resize(static_cast<size_t>(parsed.best_of));
    // Each choice is a request of its own: the same prompt (its KV blocks shared through the
    // prefix cache), choice i seeded seed + i where the request gives a seed, each drawing its
    // own otherwise, as OpenAI's API samples.
    const uint64_t seed = parsed.seeded ? parsed.sampling.seed : 0;
    for (size_t index = 0; index < exchange->choices.size(); ++index) {
      Choice& choice = exchange->choices[index];
      request.sampling->seed = parsed.seeded ? seed + index : draw();
      choice.matcher = StopMatcher(parsed.stop);
      if (endpoint == Endpoint::kChat && parsed.tool_choice != ToolChoice::kNone) {
        choice.tool_calls.emplace(tool_call_format(chat_template->source()));
      }
      try {
        choice.handle =
            engine->submit(request, [queue = exchange->queue, index](const Event& event) {
              {
                std::lock_guard lock(queue->mutex);
                queue->events.emplace_back(index, event);
              }
              queue->ready.notify_one();
            });
      } catch (const Error& error) {
        for (size_t earlier = 0; earlier < index; ++earlier) {
          exchange->choices[earlier].handle.cancel();
        }
        const std::string message = error.what();
        if (message.find("shut down") != std::string::npos) {
          throw ApiException(server_error(503, "the server is shutting down"));
        }
        const bool too_long = message.find("context limit") != std::string::npos;
        // The field the engine's check names, else the prompt's.
        std::string param = endpoint == Endpoint::kChat ? "messages" : "prompt";
        if (message.starts_with("logit_bias")) param = "logit_bias";
        if (message.starts_with("constraint") || message.starts_with("JSON schema") ||
            message.starts_with("the request's grammar")) {
          param = parsed.constraint_field.empty() ? "tool_choice" : parsed.constraint_field;
        }
        throw ApiException(ApiError{400, "invalid_request_error", message, param,
                                    too_long ? "context_length_exceeded" : ""});
      }
    }
    exchange->header = {new_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-"),
                        static_cast<int64_t>(std::time(nullptr)), model_name};
    exchange->arrived = Clock::now();
    exchange->last_write = exchange->arrived;
  } catch (const ApiException& error) {
    in_flight.fetch_sub(1);
    metrics.request_finished("rejected");
    send_error(response, error.error());
    return;
  } catch (const Error& error) {
    in_flight.fetch_sub(1);
    metrics.request_finished("rejected");
    send_error(response, ApiError{400, "invalid_request_error", error.what(), "", ""});
    return;
  }
  if (exchange->stream) response.set_header("Cache-Control", "no-cache");
  // Both kinds go out chunked, so that a heartbeat can notice a client that left. (The JSON body's
  // media type carries a charset so that it is not compressed, which would hold the heartbeats.)
  response.set_chunked_content_provider(
      exchange->stream ? "text/event-stream" : "application/json; charset=utf-8",
      [exchange](size_t, httplib::DataSink& sink) { return provide(*exchange, sink); },
      [this, exchange](bool) {
        if (!exchange->finished) {
          for (Choice& choice : exchange->choices) choice.handle.cancel();
          metrics.request_finished("cancelled");
        }
        in_flight.fetch_sub(1);
      });
}

void Server::State::routes() {
  // The completion routes read their bodies themselves, so that the limit holds while a body
  // streams in, however it is framed.
  for (const auto& route : {std::pair("/v1/completions", Endpoint::kCompletions),
                            std::pair("/v1/chat/completions", Endpoint::kChat)}) {
    const Endpoint endpoint = route.second;
    http.Post(route.first,
              [this, endpoint](const httplib::Request& request, httplib::Response& response,
                               const httplib::ContentReader& content) {
                std::string body;
                if (read_body(request, content, response, &body))
                  completion(body, response, endpoint);
              });
  }
  http.Get("/", [](const httplib::Request&, httplib::Response& response) {
    const std::string_view page = chat_page();
    // The page is self-contained: it may talk to this server and load nothing from elsewhere.
    response.set_header("Content-Security-Policy",
                        "default-src 'none'; script-src 'unsafe-inline'; "
                        "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                        "base-uri 'none'; form-action 'none'");
    response.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    json data = json::array();
    if (ready) {
      data.push_back(
          {{"id", model_name}, {"object", "model"}, {"created", created}, {"owned_by", "specrun"}});
    }
    response.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    const char* status = draining ? "draining" : ready ? "ok" : "loading";
    response.status = ready && !draining ? 200 : 503;
    response.set_content(dump({{"status", status}}), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    const EngineStats stats = ready ? engine->stats() : EngineStats{};
    response.set_content(metrics.scrape(stats), "text/plain; version=0.0.4");
  });
  // Every error without a body of its own (no route, a body too large, malformed HTTP) still
  // answers in OpenAI's shape.
  http.set_error_handler([this](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    ApiError error{response.status, "invalid_request_error", "", "", ""};
    if (response.status == 404) {
      error.type = "not_found_error";
      error.message = "no route for " + request.method + " " + request.path.substr(0, 256);
    } else if (response.status == 413) {
      error.message = body_too_large();
    } else {
      error.message =
          "the HTTP request could not be served (" + std::to_string(response.status) + ")";
    }
    send_error(response, error);
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr failure) {
        std::string message = "internal error";
        try {
          std::rethrow_exception(failure);
        } catch (const std::exception& error) {
          message += std::string(": ") + error.what();
        } catch (...) {
        }
        send_error(response, server_error(500, message));
      });
}

Server::Server(const ServerConfig& config, const EngineConfig& defaults)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = config;
  s.defaults = defaults;
  if (config.max_requests < 1) {
    throw Error("server: max_requests must be at least 1, got " +
                std::to_string(config.max_requests));
  }
  s.http.set_payload_max_length(static_cast<size_t>(config.max_body_bytes));
  // One request a connection, answered with "Connection: close" and closed at once. httplib
  // drops requests pipelined behind the first (it reads them into a buffer it then discards), and
  // keeps a connection it refused (garbage, an unknown method, HTTP/2's preface) open until its
  // keep-alive timeout: closing after each answer makes both explicit and prompt, as RFC 9112
  // 9.6 lets a server do. A connection costs a fraction of a millisecond on a request that
  // decodes for tens of them at least.
  s.http.set_keep_alive_max_count(1);
  // A worker per request in flight (a stream holds one for its life), and a few for the cheap
  // routes and for the refusals past the limit.
  const auto workers = static_cast<size_t>(config.max_requests) + 8;
  s.http.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  s.http.set_write_timeout(30, 0);
  // httplib's listening socket takes SO_REUSEPORT by default, with which a second server binds a
  // port another already listens on and the kernel splits the connections between them: a
  // replica started on a busy port (or beside an old one still draining) would silently share
  // its traffic. SO_REUSEADDR alone rebinds a port whose old connections linger in TIME_WAIT and
  // refuses one that another process listens on.
  s.http.set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.routes();
  s.port = config.port == 0 ? s.http.bind_to_any_port(config.host)
                            : (s.http.bind_to_port(config.host, config.port) ? config.port : -1);
  if (s.port < 0) {
    throw Error("server: cannot listen on " + config.host + ":" + std::to_string(config.port) +
                " (address in use, or not an address of this machine)");
  }
}

Server::~Server() {
  stop();
}

int Server::port() const {
  return state_->port;
}

void Server::listen() {
  state_->http.listen_after_bind();
}

void Server::attach(std::unique_ptr<Engine> engine, std::optional<ChatTemplate> chat_template,
                    const std::string& model_name) {
  State& s = *state_;
  s.engine = std::move(engine);
  s.chat_template = std::move(chat_template);
  s.model_name = model_name;
  s.ready = true;
}

void Server::drain(std::chrono::milliseconds grace) {
  State& s = *state_;
  s.draining = true;
  auto wait_for_idle = [&](Clock::time_point deadline) {
    while (s.in_flight > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  wait_for_idle(Clock::now() + grace);
  if (s.in_flight > 0 && s.engine) {
    // Past the deadline: what still runs finishes now, its clients told the server stopped.
    s.engine->shutdown();
    wait_for_idle(Clock::now() + std::chrono::seconds(10));
  }
  stop();
}

void Server::stop() {
  if (state_->http.is_running()) state_->http.stop();
}

std::string default_model_name(const std::string& target) {
  std::filesystem::path path(target);
  if (!path.has_filename()) path = path.parent_path();  // "dir/" names dir
  const std::string extension = path.extension().string();
  return extension == ".gguf" || extension == ".safetensors" ? path.stem().string()
                                                             : path.filename().string();
}

int serve(const EngineConfig& engine_config, const ServerConfig& config) {
  // Every thread started from here on inherits the blocked signals; this one takes them with
  // sigwait, so a signal never interrupts a handler or the engine.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);  // the loader's failure
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Server server(config, engine_config);
  std::fprintf(stderr,
               "specrun serve: listening on http://%s:%d (loading the models; a chat page at /)\n",
               config.host.c_str(), server.port());
  std::thread http([&] { server.listen(); });
  std::string load_error;
  std::thread loader([&] {
    try {
      std::unique_ptr<Engine> engine = Engine::create(engine_config);
      std::optional<ChatTemplate> chat_template =
          ChatTemplate::load(engine->info(), config.chat_template);
      const std::string name =
          config.model_name.empty() ? default_model_name(engine_config.target) : config.model_name;
      std::fprintf(
          stderr,
          "specrun serve: ready: model '%s'%s on %s, context %lld tokens, KV cache %lld "
          "tokens\n",
          name.c_str(), chat_template ? "" : " (no chat template: /v1/chat/completions refused)",
          engine->info().device.c_str(), static_cast<long long>(engine->info().context_limit),
          static_cast<long long>(engine->stats().kv_tokens_capacity));
      server.attach(std::move(engine), std::move(chat_template), name);
    } catch (const std::exception& error) {
      load_error = error.what();
      kill(getpid(), SIGUSR1);
    }
  });
  int received = 0;
  sigwait(&signals, &received);
  loader.join();
  if (load_error.empty()) {
    std::fprintf(stderr, "specrun serve: %s: draining (up to %.0f s), then exiting\n",
                 received == SIGINT ? "interrupted" : "terminated", config.shutdown_grace_seconds);
  }
  server.drain(
      std::chrono::milliseconds(static_cast<int64_t>(config.shutdown_grace_seconds * 1000.0)));
  http.join();
  if (!load_error.empty()) throw Error(load_error);
  return 0;
}

}  // namespace specrun::server
