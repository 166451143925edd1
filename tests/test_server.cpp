// `specrun serve` over loopback HTTP: completions and chat completions, streamed and not (the
// stream adds up to the response; greedy output equals the CLI's), stop strings, every error path
// in OpenAI's shape with its status, admission (429), a client that leaves (its request is
// cancelled), draining, metrics, and the real binary stopped by SIGINT.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <httplib.h>

#include "runtime/server/chat_page.h"
#include "runtime/server/server.h"
#include "tests/test_support.h"

namespace specrun::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A prompt-follows-the-role chat format, written in the Jinja subset real templates use.
// It teaches Hermes's <tool_call> format (in a comment: the format is read from the text), and
// shows how many tools it got and a `flag` variable when given.
constexpr const char* kChatTemplate =
    "{# calls: <tool_call>{...}</tool_call> #}{% if tools %}<tools>{{ tools | length }}"
    "</tools>{% endif %}{% if flag is defined %}[{{ flag }}]{% endif %}"
    "{{ bos_token }}{% for message in messages %}<{{ message['role'] }}>"
    "{{ message['content'] | trim }}\n{% endfor %}{% if add_generation_prompt %}<assistant>"
    "{% endif %}";

struct Reply {
  int status = 0;
  std::string body;
  httplib::Headers headers;
  json parsed() const { return json::parse(body); }
};

// The server-sent events of a stream body, up to "data: [DONE]" (which must end it).
std::vector<json> events(const std::string& body) {
  std::vector<json> parsed;
  size_t at = 0;
  bool done = false;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    EXPECT_FALSE(done) << "an event after [DONE]";
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    parsed.push_back(json::parse(data));
  }
  EXPECT_TRUE(done) << "the stream did not end with [DONE]: " << body.substr(0, 300);
  return parsed;
}

// The text of a streamed completion or chat completion.
std::string streamed_text(const std::vector<json>& chunks) {
  std::string text;
  for (const json& chunk : chunks) {
    if (chunk["choices"].empty()) continue;
    const json& choice = chunk["choices"][0];
    if (choice.contains("text")) text += choice["text"].get<std::string>();
    if (choice.contains("delta") && choice["delta"].contains("content")) {
      text += choice["delta"]["content"].get<std::string>();
    }
  }
  return text;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Wide enough that 4000 tokens take seconds: time for a client to leave mid-request.
    fixtures::GeneratorOptions options;
    options.vocab_size = 256;
    options.hidden_size = 256;
    options.intermediate_size = 512;
    options.num_layers = 4;
    options.num_heads = 8;
    options.num_kv_heads = 4;
    options.max_position_embeddings = 4096;
    options.shallow_layers = 1;
    options.deep_layer_scale = 0.3f;
    options.bos_token_id = 1;
    options.eos_token_id = 2;
    fixtures::write_random_checkpoint(options, dir_ / "target");
    fixtures::write_truncated_checkpoint(dir_ / "target", 1, dir_ / "draft");
    for (const char* model : {"target", "draft"}) {
      testing::write_file(dir_ / model / "tokenizer.json", testing::byte_tokenizer_json());
    }
    testing::write_file(dir_ / "chat.jinja", kChatTemplate);
  }

  void TearDown() override { stop(); }

  EngineConfig engine_config() const {
    EngineConfig config;
    config.target = (dir_ / "target").string();
    config.draft = (dir_ / "draft").string();
    config.threads = 2;
    config.kv_cache_tokens = 8192;
    // Random weights end early at EOS often; most tests want their full length.
    config.sampling.stop_at_eos = false;
    return config;
  }

  // Starts a server on a free port; `with_template` false: the checkpoint's (none).
  void start(ServerConfig config = {}, bool attach_engine = true, bool with_template = false) {
    config.port = 0;
    const EngineConfig engine = engine_config();
    server_ = std::make_unique<Server>(config, engine);
    listener_ = std::thread([this] { server_->listen(); });
    if (attach_engine) {
      auto loaded = Engine::create(engine);
      const std::optional<ChatTemplate> chat_template =
          ChatTemplate::load(loaded->info(), with_template ? (dir_ / "chat.jinja").string() : "");
      server_->attach(std::move(loaded), chat_template, "tiny");
    }
    for (int i = 0; i < 500 && !client().Get("/health"); ++i) std::this_thread::sleep_for(10ms);
  }

  void stop() {
    if (!server_) return;
    server_->stop();
    if (listener_.joinable()) listener_.join();
    server_.reset();
  }

  httplib::Client client() const {
    httplib::Client http("127.0.0.1", server_->port());
    http.set_read_timeout(120, 0);
    return http;
  }

  Reply get(const std::string& path) const {
    auto result = client().Get(path);
    if (!result) return {-1, "", {}};
    return {result->status, result->body, result->headers};
  }

  // A POST; `on_data` sees the body as it arrives and may return false to hang up.
  Reply post(const std::string& path, const std::string& body,
             std::function<bool(const std::string&)> on_data = {}) const {
    httplib::Client http = client();
    httplib::Request request;
    request.method = "POST";
    request.path = path;
    request.body = body;
    request.set_header("Content-Type", "application/json");
    Reply reply;
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      reply.body.append(data, size);
      return !on_data || on_data(reply.body);
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    if (!http.send(request, response, error)) {
      reply.status = -1;
      return reply;
    }
    reply.status = response.status;
    reply.headers = response.headers;
    return reply;
  }

  // The counter or gauge `name` (with its labels, as exposed) in /metrics; -1 when absent.
  double metric(const std::string& name) const {
    const std::string text = get("/metrics").body;
    const size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + name.size() + 2));
  }

  testing::TempDir dir_;
  std::unique_ptr<Server> server_;
  std::thread listener_;
};

TEST_F(ServerTest, CompletionsStreamedAddUpToTheResponseAndGreedyEqualsTheCli) {
  start();
  const std::string prompt = "def fib(n):";
  const Reply greedy = post(
      "/v1/completions",
      json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}.dump());
  ASSERT_EQ(greedy.status, 200) << greedy.body;
  const json response = greedy.parsed();
  EXPECT_EQ(response["object"], "text_completion");
  EXPECT_EQ(response["model"], "tiny");
  EXPECT_EQ(response["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(response["usage"]["completion_tokens"], 24);
  EXPECT_EQ(response["usage"]["prompt_tokens"], 1 + static_cast<int>(prompt.size()));
  EXPECT_EQ(response["usage"]["total_tokens"], 25 + static_cast<int>(prompt.size()));
  // What speculation did for the request.
  const json& speculation = response["speculative"];
  EXPECT_GT(speculation["steps"].get<int64_t>(), 0);
  EXPECT_LE(speculation["accepted"].get<int64_t>(), speculation["drafted"].get<int64_t>());
  EXPECT_LE(speculation["looked_up"].get<int64_t>(), speculation["drafted"].get<int64_t>());
  EXPECT_LE(speculation["looked_up_accepted"].get<int64_t>(),
            speculation["looked_up"].get<int64_t>());
  // The command line on the same checkpoint and prompt.
  const testing::CommandResult cli = testing::run_command(
      "'" + testing::tool_path("specrun").string() + "' --target '" + (dir_ / "target").string() +
      "' --draft '" + (dir_ / "draft").string() + "' --prompt '" + prompt +
      "' --temperature 0 --max-tokens 24 --ignore-eos --quiet");
  ASSERT_EQ(cli.exit_code, 0) << cli.stderr_text;
  EXPECT_EQ(response["choices"][0]["text"].get<std::string>() + "\n", cli.stdout_text);

  // Sampled with a seed: the stream's pieces add up to the response, with and without speculation.
  for (const bool speculative : {true, false}) {
    json body = {{"model", "tiny"},    {"prompt", prompt}, {"max_tokens", 40},
                 {"temperature", 0.9}, {"seed", 11},       {"speculative", speculative}};
    const Reply whole = post("/v1/completions", body.dump());
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const Reply pieces = post("/v1/completions", body.dump());
    ASSERT_EQ(pieces.status, 200);
    EXPECT_NE(pieces.headers.find("Content-Type")->second.find("text/event-stream"),
              std::string::npos);
    const std::vector<json> chunks = events(pieces.body);
    ASSERT_GE(chunks.size(), 3u);
    EXPECT_EQ(streamed_text(chunks), whole.parsed()["choices"][0]["text"]);
    for (const json& chunk : chunks) {
      EXPECT_EQ(chunk["id"], chunks.front()["id"]);
      EXPECT_TRUE(chunk.contains("usage"));
    }
    EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "length");
    EXPECT_TRUE(chunks.back()["choices"].empty());
    EXPECT_EQ(chunks.back()["usage"], whole.parsed()["usage"]);
  }
}

// Each streamed chunk with text says how the tokens since the previous one were made, its pieces
// (adding up to its text) say which text came from accepted drafts, even where a stop string held
// text back, and the last chunk carries the request's figures as the non-streamed response does.
TEST_F(ServerTest, StreamedChunksSayWhatSpeculationDid) {
  start();
  const json whole = post("/v1/completions",
                          json{{"model", "tiny"}, {"prompt", "x = "}, {"max_tokens", 40}}.dump())
                         .parsed();
  for (const json& extra : {json::object(), json{{"stop", {"a", "zz"}}}, json{{"seed", 3}},
                            json{{"speculative", false}}}) {
    SCOPED_TRACE(extra.dump());
    json body = {{"model", "tiny"},    {"prompt", "x = "},
                 {"max_tokens", 40},   {"stream", true},
                 {"temperature", 0.9}, {"stream_options", {{"include_usage", true}}}};
    body.update(extra);
    const std::vector<json> chunks = events(post("/v1/completions", body.dump()).body);
    ASSERT_GE(chunks.size(), 2u);
    int64_t tokens = 0, drafted = 0, accepted = 0, from_drafts = 0;
    for (size_t i = 0; i + 2 < chunks.size(); ++i) {
      const json& speculative = chunks[i]["speculative"];
      std::string pieces;
      for (const json& piece : speculative["pieces"]) {
        EXPECT_FALSE(piece["text"].get<std::string>().empty());
        pieces += piece["text"].get<std::string>();
        from_drafts += piece["accepted_draft"].get<bool>() ? 1 : 0;
      }
      EXPECT_EQ(pieces, chunks[i]["choices"][0]["text"]);
      EXPECT_LE(speculative["accepted_drafts"].get<int64_t>(),
                speculative["tokens"].get<int64_t>());
      tokens += speculative["tokens"].get<int64_t>();
      drafted += speculative["drafted"].get<int64_t>();
      accepted += speculative["accepted_drafts"].get<int64_t>();
    }
    const json& last = chunks[chunks.size() - 2];
    ASSERT_FALSE(last["choices"][0]["finish_reason"].is_null());
    const json& totals = last["speculative"];
    for (const auto& field : whole["speculative"].items())
      EXPECT_TRUE(totals.contains(field.key()));
    // Tokens whose text never reached a chunk (held back, then cut by a stop string) count in the
    // totals alone.
    EXPECT_LE(tokens, chunks.back()["usage"]["completion_tokens"].get<int64_t>());
    EXPECT_LE(drafted, totals["drafted"].get<int64_t>());
    EXPECT_LE(accepted, totals["accepted"].get<int64_t>());
    if (extra.contains("speculative")) {
      EXPECT_EQ(totals["drafted"], 0);
      EXPECT_EQ(from_drafts, 0);
    }
  }
}

// GET / is the chat page, whole and self-contained: it names no other site, and the browser is
// told to load nothing from anywhere else.
TEST_F(ServerTest, ServesTheChatPageAtTheRoot) {
  start();
  const Reply page = get("/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.headers.find("Content-Type")->second, "text/html; charset=utf-8");
  EXPECT_EQ(page.body, chat_page());
  EXPECT_EQ(page.body.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(page.body.find("<textarea"), std::string::npos);
  EXPECT_NE(page.body.find("/v1/chat/completions"), std::string::npos);
  EXPECT_EQ(page.body.find("://"), std::string::npos);
  const std::string policy = page.headers.find("Content-Security-Policy")->second;
  EXPECT_EQ(policy.rfind("default-src 'none';", 0), 0u) << policy;
  EXPECT_NE(policy.find("connect-src 'self'"), std::string::npos) << policy;
}

TEST_F(ServerTest, ChatCompletionsThroughTheTemplate) {
  start({}, true, /*with_template=*/true);
  const json messages = {{{"role", "system"}, {"content", "  Be brief.  "}},
                         {{"role", "user"}, {"content", "Hi \xc3\xa9t\xc3\xa9"}}};
  json body = {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 16}, {"seed", 3}};
  const Reply whole = post("/v1/chat/completions", body.dump());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json response = whole.parsed();
  EXPECT_EQ(response["object"], "chat.completion");
  EXPECT_EQ(response["choices"][0]["message"]["role"], "assistant");
  // <s> (BOS through bos_token, one id), then the rendered text byte by byte.
  const std::string rendered = "<system>Be brief.\n<user>Hi \xc3\xa9t\xc3\xa9\n<assistant>";
  EXPECT_EQ(response["usage"]["prompt_tokens"], 1 + static_cast<int>(rendered.size()));
  body["stream"] = true;
  const std::vector<json> chunks = events(post("/v1/chat/completions", body.dump()).body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.front()["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(streamed_text(chunks), response["choices"][0]["message"]["content"]);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(chunks.back().contains("usage"));  // not asked for
}

TEST_F(ServerTest, StopStringsEndTheCompletionAcrossTokens) {
  start();
  json body = {{"model", "tiny"}, {"prompt", "x = "}, {"max_tokens", 60}, {"temperature", 0}};
  const std::string free_run = post("/v1/completions", body.dump()).parsed()["choices"][0]["text"];
  ASSERT_GE(free_run.size(), 20u);
  // A stop string of several tokens (one per byte here) from the middle of the free run.
  const std::string stop = free_run.substr(10, 3);
  const std::string expected = free_run.substr(0, free_run.find(stop));
  body["stop"] = {stop, "\x01never"};
  const json stopped = post("/v1/completions", body.dump()).parsed();
  EXPECT_EQ(stopped["choices"][0]["text"], expected);
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(stopped["usage"]["completion_tokens"].get<int>(), 60);
  body["stream"] = true;
  const std::vector<json> chunks = events(post("/v1/completions", body.dump()).body);
  EXPECT_EQ(streamed_text(chunks), expected);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "stop");
}

TEST_F(ServerTest, ErrorsInOpenAisShapeWithTheirStatus) {
  ServerConfig config;
  config.max_body_bytes = 4096;
  start(config);
  auto expect_error = [&](const Reply& reply, int status, const std::string& fragment) {
    SCOPED_TRACE(reply.body.substr(0, 300));
    EXPECT_EQ(reply.status, status);
    const json body = json::parse(reply.body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error"));
    EXPECT_NE(body["error"]["message"].get<std::string>().find(fragment), std::string::npos);
    EXPECT_TRUE(body["error"]["type"].is_string());
  };
  expect_error(post("/v1/completions", "{not json"), 400, "not valid JSON");
  expect_error(post("/v1/completions", R"({"model": "tiny", "prompt": 5})"), 400, "'prompt'");
  expect_error(post("/v1/completions", R"({"model": "big", "prompt": "x"})"), 404, "'big'");
  expect_error(post("/v1/completions", R"({"model": "tiny", "prompt": "x", "top_p": 7})"), 400,
               "top_p");
  expect_error(post("/v1/completions", R"({"model": "tiny", "prompt": "x", "n": 17})"), 400, "'n'");
  std::vector<int> ids(2000, 65);
  expect_error(post("/v1/completions", json{{"model", "tiny"}, {"prompt", ids}}.dump()), 413,
               "4096 bytes");
  EXPECT_EQ(metric("specrun_requests_total{outcome=\"rejected\"}"), 5);
  stop();
  start();
  ids.assign(5000, 65);  // past the 4096-token context
  const Reply long_prompt =
      post("/v1/completions", json{{"model", "tiny"}, {"prompt", ids}}.dump());
  expect_error(long_prompt, 400, "context limit");
  EXPECT_EQ(long_prompt.parsed()["error"]["code"], "context_length_exceeded");
  expect_error(post("/v1/chat/completions",
                    R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})"),
               400, "no chat template");
  expect_error(get("/v1/nothing"), 404, "no route");
  EXPECT_EQ(metric("specrun_requests_total{outcome=\"rejected\"}"), 2);
}

// What a raw connection gets back for `head` (request line and headers, ending in a blank line)
// followed by `pieces`, each sent as it is, until the server closes the connection or 8 s pass;
// and how long the answer's first bytes took.
struct RawReply {
  std::string text;             // everything the server sent
  bool closed = false;          // the server closed the connection
  double first_seconds = 0.0;   // from the head's sending to the answer's first bytes
  double closed_seconds = 0.0;  // from the head's sending to the server's close
};
RawReply raw_exchange(int port, const std::string& head, const std::vector<std::string>& pieces) {
  const int socket_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  RawReply reply;
  if (::connect(socket_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(socket_fd);
    return reply;
  }
  const timeval timeout{8, 0};
  ::setsockopt(socket_fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const auto start = std::chrono::steady_clock::now();
  // A server that stops reading may reset the connection under the later pieces: not an error.
  ::send(socket_fd, head.data(), head.size(), MSG_NOSIGNAL);
  for (const std::string& piece : pieces)
    ::send(socket_fd, piece.data(), piece.size(), MSG_NOSIGNAL);
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::recv(socket_fd, buffer, sizeof(buffer), 0);
    if (got == 0) {
      reply.closed = true;
      reply.closed_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (got <= 0) break;
    if (reply.text.empty()) {
      reply.first_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    reply.text.append(buffer, static_cast<size_t>(got));
  }
  ::close(socket_fd);
  return reply;
}

// A second server on a port another one listens on is refused at once, naming the port, rather
// than sharing its connections (which httplib's default SO_REUSEPORT would have it do).
TEST_F(ServerTest, APortAnotherServerListensOnIsRefused) {
  start();
  ServerConfig config;
  config.port = server_->port();
  testing::expect_error([&] { Server second(config, engine_config()); },
                        {"cannot listen on 127.0.0.1:" + std::to_string(config.port)});
  // The first still answers.
  const httplib::Result health = client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(ServerTest, ABodyPastTheLimitIsRefusedWhateverItsFramingAndNeverBuffered) {
  ServerConfig config;
  config.max_body_bytes = 4096;
  start(config);
  // A valid request, padded with whitespace to 16 times the limit, sent in chunks of the limit.
  std::string body = R"({"model": "tiny", "prompt": "x", "max_tokens": 1)";
  body += std::string(16 * 4096, ' ') + "}";
  const auto chunked = [](const std::string& text, size_t piece) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size(); at += piece) {
      const std::string part = text.substr(at, piece);
      std::ostringstream framed;
      framed << std::hex << part.size() << "\r\n" << part << "\r\n";
      pieces.push_back(framed.str());
    }
    pieces.push_back("0\r\n\r\n");
    return pieces;
  };
  const std::string chunked_head =
      "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  const RawReply over = raw_exchange(server_->port(), chunked_head, chunked(body, 4096));
  EXPECT_EQ(over.text.rfind("HTTP/1.1 413", 0), 0u) << over.text.substr(0, 300);
  EXPECT_NE(over.text.find("4096 bytes"), std::string::npos) << over.text.substr(0, 300);
  EXPECT_TRUE(over.closed);
  // Announced past the limit: refused at once, before any of it arrives, and the connection closed.
  const RawReply announced = raw_exchange(
      server_->port(),
      "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
      "Content-Length: 10000000\r\n\r\n",
      {});
  EXPECT_EQ(announced.text.rfind("HTTP/1.1 413", 0), 0u) << announced.text.substr(0, 300);
  EXPECT_TRUE(announced.closed);
  EXPECT_LT(announced.first_seconds, 2.0);
  EXPECT_LT(announced.closed_seconds, 2.0);
  // Within the limit, chunked is as good as a length.
  const RawReply within =
      raw_exchange(server_->port(), chunked_head,
                   chunked(R"({"model": "tiny", "prompt": "x", "max_tokens": 1})", 7));
  EXPECT_EQ(within.text.rfind("HTTP/1.1 200", 0), 0u) << within.text.substr(0, 300);
}

// One request a connection: requests pipelined behind the first are never dropped silently (the
// first is answered with "Connection: close" and the connection closes at once, so the client
// knows the rest were not read), and a refused request's connection closes at once too (not at
// the keep-alive timeout, 5 s).
TEST_F(ServerTest, EachConnectionCarriesOneRequestAndClosesAtOnceAfterItsAnswer) {
  start({});
  const std::string health = "GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";
  const RawReply pipelined = raw_exchange(server_->port(), health + health + health, {});
  size_t answers = 0;
  for (size_t at = pipelined.text.find("HTTP/1.1 "); at != std::string::npos;
       at = pipelined.text.find("HTTP/1.1 ", at + 1)) {
    answers += 1;
  }
  EXPECT_EQ(answers, 1u) << pipelined.text;
  EXPECT_EQ(pipelined.text.rfind("HTTP/1.1 200", 0), 0u) << pipelined.text;
  EXPECT_NE(pipelined.text.find("Connection: close"), std::string::npos) << pipelined.text;
  EXPECT_TRUE(pipelined.closed);
  EXPECT_LT(pipelined.closed_seconds, 2.0);
  for (const std::string& refused :
       {std::string("\x16\x03\x01 garbage\r\n\r\n"), std::string("BREW /pot HTTP/1.1\r\n\r\n"),
        std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), std::string("GET /health\r\n\r\n")}) {
    const RawReply reply = raw_exchange(server_->port(), refused, {});
    EXPECT_TRUE(reply.closed) << refused;
    EXPECT_LT(reply.closed_seconds, 2.0) << refused << ": " << reply.text;
  }
}

// add_generation_prompt false renders the conversation without opening the assistant's turn (the
// model continues the last message): the prompt is the template's text less "<assistant>".
TEST_F(ServerTest, AddGenerationPromptFalseLeavesTheAssistantsTurnUnopened) {
  start({}, true, /*with_template=*/true);
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  const auto prompt_tokens = [&](const std::string& extra) {
    const Reply reply = post("/v1/chat/completions",
                             R"({"model": "tiny", "max_tokens": 1, )" + messages + extra + "}");
    EXPECT_EQ(reply.status, 200) << reply.body;
    return reply.parsed()["usage"]["prompt_tokens"].get<int64_t>();
  };
  const int64_t opened = prompt_tokens("");
  EXPECT_EQ(prompt_tokens(R"(, "add_generation_prompt": true)"), opened);
  // The byte tokenizer spends one token a byte: "<assistant>" is 11.
  EXPECT_EQ(prompt_tokens(R"(, "add_generation_prompt": false)"), opened - 11);
}

// tools and chat_template_kwargs reach the template; continue_final_message ends the prompt inside
// the last message; with tools the output is read for calls ("auto"), streamed and not alike.
TEST_F(ServerTest, ToolsAndTemplateVariablesReachThePrompt) {
  start({}, true, /*with_template=*/true);
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}])";
  const auto reply = [&](const std::string& extra) {
    return post("/v1/chat/completions",
                R"({"model": "tiny", "max_tokens": 8, "seed": 1, )" + messages + extra + "}");
  };
  const auto prompt_tokens = [&](const std::string& extra) {
    const Reply answer = reply(extra);
    EXPECT_EQ(answer.status, 200) << answer.body;
    return answer.parsed()["usage"]["prompt_tokens"].get<int64_t>();
  };
  const int64_t plain = prompt_tokens("");
  // The byte tokenizer spends one token a byte.
  EXPECT_EQ(prompt_tokens(", " + tools), plain + 16);  // "<tools>1</tools>"
  EXPECT_EQ(prompt_tokens(R"(, "chat_template_kwargs": {"flag": "xy"})"), plain + 4);  // "[xy]"
  // "<assistant>" unopened, and the last message's text not closed ("\n" dropped).
  EXPECT_EQ(prompt_tokens(R"(, "add_generation_prompt": false, "continue_final_message": true)"),
            plain - 12);

  const Reply whole = reply(", " + tools);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json message = whole.parsed()["choices"][0]["message"];
  const Reply streamed = reply(", " + tools + R"(, "stream": true)");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const std::vector<json> chunks = events(streamed.body);
  // Random weights write no call: the text is content, the same either way.
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(streamed_text(chunks), message["content"]);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"],
            whole.parsed()["choices"][0]["finish_reason"]);
}

// The tokens of each choice of a response or a stream, by choice index: what their logprobs say.
std::map<int64_t, json> streamed_logprobs(const std::vector<json>& chunks) {
  std::map<int64_t, json> by_choice;
  for (const json& chunk : chunks) {
    for (const json& choice : chunk["choices"]) {
      const json& logprobs = choice["logprobs"];
      if (logprobs.is_null()) continue;
      json& into = by_choice[choice["index"].get<int64_t>()];
      if (logprobs.contains("content")) {
        if (into.is_null()) into = {{"content", json::array()}};
        for (const json& entry : logprobs["content"]) into["content"].push_back(entry);
      } else {
        if (into.is_null())
          into = {{"tokens", json::array()},
                  {"token_logprobs", json::array()},
                  {"top_logprobs", json::array()},
                  {"text_offset", json::array()}};
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          for (const json& entry : logprobs[key]) into[key].push_back(entry);
        }
      }
    }
  }
  return by_choice;
}

// The text of each choice of a stream, by index.
std::map<int64_t, std::string> streamed_texts(const std::vector<json>& chunks) {
  std::map<int64_t, std::string> texts;
  for (const json& chunk : chunks) {
    for (const json& choice : chunk["choices"]) {
      std::string& text = texts[choice["index"].get<int64_t>()];
      if (choice.contains("text")) text += choice["text"].get<std::string>();
      if (choice.contains("delta") && choice["delta"].contains("content") &&
          choice["delta"]["content"].is_string()) {
        text += choice["delta"]["content"].get<std::string>();
      }
    }
  }
  return texts;
}

// Logprobs: one entry per generated token, in each endpoint's shape, the same streamed or not and
// with or without speculation (the target's own, after penalties and bias, before temperature);
// held back by a stop string they stay with their text, and those the stop cut are not reported.
TEST_F(ServerTest, LogprobsInEachShapeTheSameStreamedAndWithoutSpeculation) {
  start({}, true, /*with_template=*/true);
  // ASCII only (no special token, no byte past 0x7f), so that each token is one byte of the text.
  json ascii = json::object();
  for (int id = 0; id < 256; ++id) {
    if (id < 3 || id >= 0x80 + 3) ascii[std::to_string(id)] = -100;
  }
  const auto completions = [&](json extra) {
    json body = {{"model", "tiny"},
                 {"prompt", "def fib(n):"},
                 {"max_tokens", 30},
                 {"temperature", 0.8},
                 {"seed", 4},
                 {"logprobs", 3},
                 {"frequency_penalty", 0.5},
                 {"logit_bias", ascii}};
    body.update(extra);
    return post("/v1/completions", body.dump());
  };
  const Reply whole = completions(json::object());
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json choice = whole.parsed()["choices"][0];
  const json& logprobs = choice["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 30u);
  std::string joined;
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_EQ(logprobs["text_offset"][i], joined.size());
    joined += logprobs["tokens"][i].get<std::string>();
    const double value = logprobs["token_logprobs"][i].get<double>();
    EXPECT_LE(value, 0.0);
    const json& top = logprobs["top_logprobs"][i];
    EXPECT_LE(top.size(), 3u);
    double best = -1e30;
    for (const auto& entry : top.items()) best = std::max(best, entry.value().get<double>());
    EXPECT_LE(value, best + 1e-6);
  }
  EXPECT_EQ(joined, choice["text"]);

  json streamed_body = {{"stream", true}};
  const std::vector<json> chunks = events(completions(streamed_body).body);
  EXPECT_EQ(streamed_logprobs(chunks)[0], logprobs);
  EXPECT_EQ(completions({{"speculative", false}}).parsed()["choices"][0]["logprobs"], logprobs);

  // Chat: {"content": [{token, logprob, bytes, top_logprobs}]}.
  json chat = {{"model", "tiny"},    {"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"max_tokens", 12},   {"temperature", 0},
               {"logprobs", true},   {"top_logprobs", 2},
               {"logit_bias", ascii}};
  const json answer = post("/v1/chat/completions", chat.dump()).parsed();
  const json& content = answer["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 12u);
  for (const json& entry : content) {
    EXPECT_EQ(entry["bytes"].size(), 1u);  // one byte a token
    ASSERT_EQ(entry["top_logprobs"].size(), 2u);
    // Greedy: the token is the likeliest.
    EXPECT_EQ(entry["top_logprobs"][0]["bytes"], entry["bytes"]);
    EXPECT_EQ(entry["top_logprobs"][0]["logprob"], entry["logprob"]);
  }
  chat["stream"] = true;
  EXPECT_EQ(streamed_logprobs(events(post("/v1/chat/completions", chat.dump()).body))[0],
            answer["choices"][0]["logprobs"]);
  chat["speculative"] = false;
  EXPECT_EQ(streamed_logprobs(events(post("/v1/chat/completions", chat.dump()).body))[0],
            answer["choices"][0]["logprobs"]);

  // A stop string: the tokens before it, each with its text; none of the stop's.
  const std::string text = choice["text"].get<std::string>();
  const std::string stop = text.substr(10, 2);
  const size_t cut = text.find(stop);
  for (const bool stream : {false, true}) {
    const Reply stopped = completions({{"stop", stop}, {"stream", stream}});
    const json reported = stream ? streamed_logprobs(events(stopped.body))[0]
                                 : stopped.parsed()["choices"][0]["logprobs"];
    ASSERT_EQ(reported["tokens"].size(), cut) << stopped.body.substr(0, 400);
    for (size_t i = 0; i < cut; ++i) EXPECT_EQ(reported["tokens"][i], logprobs["tokens"][i]);
  }
}

// logit_bias makes a token certain; the penalties are accepted and change greedy output.
TEST_F(ServerTest, LogitBiasAndPenalties) {
  start();
  json body = {{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 8}, {"temperature", 0}};
  const std::string plain = post("/v1/completions", body.dump()).parsed()["choices"][0]["text"];
  body["logit_bias"] = {{std::to_string('Z' + 3), 100}};  // the byte tokenizer's "Z"
  const Reply biased = post("/v1/completions", body.dump());
  ASSERT_EQ(biased.status, 200) << biased.body;
  EXPECT_EQ(biased.parsed()["choices"][0]["text"], "ZZZZZZZZ");
  body["temperature"] = 0.8;
  body["seed"] = 4;
  EXPECT_EQ(post("/v1/completions", body.dump()).parsed()["choices"][0]["text"], "ZZZZZZZZ");
  body["prompt"] = "def fib(n):";
  body["logprobs"] = 3;
  EXPECT_EQ(post("/v1/completions", body.dump()).parsed()["choices"][0]["text"], "ZZZZZZZZ");
  body.erase("logprobs");
  body["temperature"] = 0;
  body["logit_bias"] = {{"99999", 1}};
  const Reply outside = post("/v1/completions", body.dump());
  EXPECT_EQ(outside.status, 400);
  EXPECT_EQ(outside.parsed()["error"]["param"], "logit_bias");
  body.erase("logit_bias");
  body["presence_penalty"] = 2;
  body["repetition_penalty"] = 1.5;
  const Reply penalised = post("/v1/completions", body.dump());
  ASSERT_EQ(penalised.status, 200) << penalised.body;
  EXPECT_EQ(penalised.parsed()["usage"]["completion_tokens"], 8);
}

// n choices, each its own request (choice i seeded seed + i): reproducible, streamed by index,
// usage summed over the choices with the prompt counted once; best_of returns the likeliest of
// its choices; echo begins each with the prompt.
TEST_F(ServerTest, SeveralChoicesBestOfAndEcho) {
  start();
  json body = {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 16}, {"temperature", 1.0},
               {"seed", 21},      {"n", 3},          {"logprobs", 0}};
  const json first = post("/v1/completions", body.dump()).parsed();
  ASSERT_EQ(first["choices"].size(), 3u) << first.dump();
  EXPECT_EQ(post("/v1/completions", body.dump()).parsed()["choices"], first["choices"]);
  EXPECT_EQ(first["usage"]["completion_tokens"], 48);
  EXPECT_EQ(first["usage"]["prompt_tokens"], 4);
  std::set<std::string> distinct;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(first["choices"][i]["index"], i);
    distinct.insert(first["choices"][i]["text"].get<std::string>());
  }
  EXPECT_EQ(distinct.size(), 3u);
  // Choice i is the request seeded 21 + i alone.
  json single = body;
  single["n"] = 1;
  single["seed"] = 22;
  EXPECT_EQ(post("/v1/completions", single.dump()).parsed()["choices"][0]["text"],
            first["choices"][1]["text"]);
  json streamed = body;
  streamed["stream"] = true;
  const std::vector<json> chunks = events(post("/v1/completions", streamed.dump()).body);
  const std::map<int64_t, std::string> texts = streamed_texts(chunks);
  ASSERT_EQ(texts.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(texts.at(i), first["choices"][i]["text"]);

  // best_of 3, n 1: the choice whose tokens are likeliest together.
  size_t best = 0;
  double best_sum = -1e30;
  for (size_t i = 0; i < 3; ++i) {
    double sum = 0;
    for (const json& value : first["choices"][i]["logprobs"]["token_logprobs"]) {
      sum += value.get<double>();
    }
    if (sum > best_sum) best_sum = sum, best = i;
  }
  json best_of = body;
  best_of.erase("logprobs");
  best_of["n"] = 1;
  best_of["best_of"] = 3;
  const json picked = post("/v1/completions", best_of.dump()).parsed();
  ASSERT_EQ(picked["choices"].size(), 1u) << picked.dump();
  EXPECT_EQ(picked["choices"][0]["text"], first["choices"][best]["text"]);
  EXPECT_TRUE(picked["choices"][0]["logprobs"].is_null());  // not asked for
  EXPECT_EQ(picked["usage"]["completion_tokens"], 48);      // every choice made counts

  // echo: the prompt first, whole and streamed.
  json echo = {
      {"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 5}, {"seed", 3}, {"echo", true}};
  const std::string echoed = post("/v1/completions", echo.dump()).parsed()["choices"][0]["text"];
  EXPECT_EQ(echoed.substr(0, 3), "abc");
  EXPECT_GT(echoed.size(), 3u);
  echo["stream"] = true;
  const std::vector<json> echo_chunks = events(post("/v1/completions", echo.dump()).body);
  EXPECT_EQ(echo_chunks.front()["choices"][0]["text"], "abc");
  EXPECT_EQ(streamed_text(echo_chunks), echoed);
  // echo with logprobs: the prompt's tokens first (BOS and "abc", the first without a
  // log-probability, as OpenAI writes it), then the completion's; streamed alike.
  echo["logprobs"] = 1;
  echo["stream"] = false;
  const json with_logprobs = post("/v1/completions", echo.dump()).parsed();
  const json logprobs = with_logprobs["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["tokens"].size(), 9u) << with_logprobs.dump();
  EXPECT_EQ(logprobs["tokens"][1], "a");
  EXPECT_EQ(logprobs["tokens"][3], "c");
  EXPECT_TRUE(logprobs["token_logprobs"][0].is_null());
  EXPECT_TRUE(logprobs["top_logprobs"][0].is_null());
  for (size_t i = 1; i < 9; ++i) {
    EXPECT_LE(logprobs["token_logprobs"][i].get<double>(), 0.0) << i;
    EXPECT_EQ(logprobs["top_logprobs"][i].size(), 1u) << i;
  }
  EXPECT_EQ(logprobs["text_offset"], json::parse("[0, 0, 1, 2, 3, 4, 5, 6, 7]"))
      << "offsets in the echoed text (byte tokens)";
  EXPECT_EQ(with_logprobs["choices"][0]["text"], echoed);
  echo["stream"] = true;
  json streamed_tokens = json::array(), streamed_values = json::array();
  for (const json& chunk : events(post("/v1/completions", echo.dump()).body)) {
    if (chunk["choices"].empty() || chunk["choices"][0]["logprobs"].is_null()) continue;
    for (const json& token : chunk["choices"][0]["logprobs"]["tokens"]) {
      streamed_tokens.push_back(token);
    }
    for (const json& value : chunk["choices"][0]["logprobs"]["token_logprobs"]) {
      streamed_values.push_back(value);
    }
  }
  EXPECT_EQ(streamed_tokens, logprobs["tokens"]);
  EXPECT_EQ(streamed_values, logprobs["token_logprobs"]);
}

// Structured output on random weights: response_format's JSON schema (its members in order) and
// the grammar field hold whatever the model would say.
TEST_F(ServerTest, ResponseFormatAndGrammarConstrainTheOutput) {
  start({}, true, /*with_template=*/true);
  const nlohmann::ordered_json schema =
      nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "pet": {"enum": ["cat", "dog"]}}, "required": ["name", "age", "pet"]})");
  for (const int seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    // Ordered, so that the schema goes out in its order.
    nlohmann::ordered_json body = {
        {"model", "tiny"},
        {"messages", {{{"role", "user"}, {"content", "Who?"}}}},
        {"max_tokens", 300},
        {"seed", seed},
        {"ignore_eos", false},
        {"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}}}};
    const json answer = post("/v1/chat/completions", body.dump()).parsed();
    ASSERT_EQ(answer["choices"][0]["finish_reason"], "stop") << answer.dump();
    const std::string content = answer["choices"][0]["message"]["content"];
    const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(content);
    std::vector<std::string> keys;
    for (const auto& item : parsed.items()) keys.push_back(item.key());
    EXPECT_EQ(keys, (std::vector<std::string>{"name", "age", "pet"})) << content;
    const std::string name = parsed["name"];
    // maxLength counts characters: UTF-8 bytes other than continuation bytes.
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (c & 0xC0) != 0x80; }),
              8);
    EXPECT_TRUE(parsed["age"].is_number_integer());
    EXPECT_GE(parsed["age"].get<int64_t>(), 0);
    EXPECT_LE(parsed["age"].get<int64_t>(), 150);
    EXPECT_TRUE(parsed["pet"] == "cat" || parsed["pet"] == "dog");
  }
  json object = {{"model", "tiny"},     {"prompt", "x"},
                 {"max_tokens", 400},   {"seed", 5},
                 {"ignore_eos", false}, {"response_format", {{"type", "json_object"}}}};
  const json answer = post("/v1/completions", object.dump()).parsed();
  if (answer["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(answer["choices"][0]["text"].get<std::string>()).is_object());
  }
  const json grammar = {{"model", "tiny"},    {"prompt", "x"},
                        {"max_tokens", 10},   {"ignore_eos", false},
                        {"temperature", 1.0}, {"grammar", "root ::= (\"yes\" | \"no\") \"!\""}};
  for (const int seed : {1, 2, 3, 4}) {
    json body = grammar;
    body["seed"] = seed;
    const std::string text = post("/v1/completions", body.dump()).parsed()["choices"][0]["text"];
    EXPECT_TRUE(text == "yes!" || text == "no!") << text;
  }
  json bad = grammar;
  bad["grammar"] = "root ::= undefined-rule";
  const Reply refused = post("/v1/completions", bad.dump());
  EXPECT_EQ(refused.status, 400);
  EXPECT_EQ(refused.parsed()["error"]["param"], "grammar");
}

// tool_choice "required" and a named function on random weights: the output is calls the
// template's parser reads, each call's arguments valid against its function's parameters.
TEST_F(ServerTest, ToolChoiceRequiredAndNamedForceValidCalls) {
  start({}, true, /*with_template=*/true);
  const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
       "properties": {"city": {"type": "string", "maxLength": 10},
                      "days": {"type": "integer", "minimum": 1, "maximum": 14}},
       "required": ["city", "days"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
       "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}])");
  // maxLength counts characters: UTF-8 bytes other than continuation bytes.
  const auto characters = [](const std::string& text) {
    return std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; });
  };
  const auto valid = [&](const json& call) {
    const json arguments = json::parse(call["function"]["arguments"].get<std::string>());
    if (call["function"]["name"] == "get_weather") {
      return arguments.size() == 2 && arguments["city"].is_string() &&
             characters(arguments["city"].get<std::string>()) <= 10 &&
             arguments["days"].is_number_integer() && arguments["days"] >= 1 &&
             arguments["days"] <= 14;
    }
    return call["function"]["name"] == "get_time" && arguments.size() == 1 &&
           (arguments["zone"] == "UTC" || arguments["zone"] == "CET");
  };
  for (const json& choice :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "get_time"}}}}}) {
    for (const bool parallel : {false, true}) {
      for (const bool stream : {false, true}) {
        SCOPED_TRACE(choice.dump() + (parallel ? " parallel" : "") + (stream ? " stream" : ""));
        const json body = {{"model", "tiny"},
                           {"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
                           {"tools", tools},
                           {"tool_choice", choice},
                           {"parallel_tool_calls", parallel},
                           {"max_tokens", 2000},
                           {"seed", 7},
                           {"ignore_eos", false},
                           {"stream", stream}};
        const Reply reply = post("/v1/chat/completions", body.dump());
        ASSERT_EQ(reply.status, 200) << reply.body;
        json calls = json::array();
        std::string finish;
        if (stream) {
          for (const json& chunk : events(reply.body)) {
            for (const json& entry : chunk["choices"]) {
              if (!entry["finish_reason"].is_null()) finish = entry["finish_reason"];
              for (const json& delta : entry["delta"].value("tool_calls", json::array())) {
                if (delta.contains("id")) calls.push_back(delta);
                if (delta["function"].contains("arguments")) {
                  calls.back()["function"]["arguments"] =
                      calls.back()["function"]["arguments"].get<std::string>() +
                      delta["function"]["arguments"].get<std::string>();
                }
              }
            }
          }
        } else {
          const json message = reply.parsed()["choices"][0];
          finish = message["finish_reason"];
          calls = message["message"].value("tool_calls", json::array());
          EXPECT_TRUE(message["message"]["content"].is_null()) << message.dump();
        }
        EXPECT_EQ(finish, "tool_calls") << reply.body.substr(0, 600);
        ASSERT_FALSE(calls.empty()) << reply.body.substr(0, 600);
        if (!parallel || choice.is_object()) {
          EXPECT_EQ(calls.size(), 1u);
        }
        for (const json& call : calls) {
          EXPECT_TRUE(valid(call)) << call.dump();
          if (choice.is_object()) {
            EXPECT_EQ(call["function"]["name"], "get_time");
          }
        }
      }
    }
  }
}

TEST_F(ServerTest, ToolsForATemplateWithoutACallFormatAreRefused) {
  testing::write_file(dir_ / "plain.jinja",
                      "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools | length }}");
  ServerConfig config;
  start(config, /*attach_engine=*/false);
  auto loaded = Engine::create(engine_config());
  server_->attach(std::move(loaded),
                  ChatTemplate::load(EngineInfo{}, (dir_ / "plain.jinja").string()), "tiny");
  const Reply refused =
      post("/v1/chat/completions",
           R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type":
          "function", "function": {"name": "f"}}]})");
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_EQ(refused.parsed()["error"]["param"], "tools");
  EXPECT_NE(refused.body.find("tool-call format"), std::string::npos) << refused.body;
}

TEST_F(ServerTest, WhileLoadingHealthSaysSoAndRequestsAreAskedToRetry) {
  start({}, /*attach_engine=*/false);
  const Reply health = get("/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.parsed()["status"], "loading");
  const Reply refused = post("/v1/completions", R"({"model": "tiny", "prompt": "x"})");
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.headers.find("Retry-After"), refused.headers.end());
  EXPECT_TRUE(get("/v1/models").parsed()["data"].empty());
  server_->attach(Engine::create(engine_config()), std::nullopt, "tiny");
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/v1/models").parsed()["data"][0]["id"], "tiny");
}

TEST_F(ServerTest, PastTheRequestLimitClientsAreToldToRetry) {
  ServerConfig config;
  config.max_requests = 1;
  start(config);
  // A long stream holds the one place while another request arrives.
  std::atomic<bool> streaming{false};
  std::atomic<bool> release{false};
  std::thread holder([&] {
    post("/v1/completions",
         R"({"model": "tiny", "prompt": "x", "max_tokens": 4000, "stream": true})",
         [&](const std::string&) {
           streaming = true;
           return !release.load();
         });
  });
  while (!streaming) std::this_thread::sleep_for(5ms);
  const Reply refused = post("/v1/completions", R"({"model": "tiny", "prompt": "y"})");
  release = true;
  holder.join();
  EXPECT_EQ(refused.status, 429);
  EXPECT_EQ(refused.headers.find("Retry-After")->second, "1");
  EXPECT_EQ(refused.parsed()["error"]["type"], "rate_limit_error");
}

TEST_F(ServerTest, AClientThatLeavesCancelsItsRequestAndFreesItsBlocks) {
  start();
  for (const bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    const double before = metric("specrun_requests_total{outcome=\"cancelled\"}");
    const json body = {
        {"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 4000}, {"stream", stream}};
    if (stream) {
      int pieces = 0;
      post("/v1/completions", body.dump(), [&](const std::string&) { return ++pieces < 3; });
    } else {
      // A raw connection that sends the request and hangs up before the answer.
      const int socket_fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(server_->port()));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::connect(socket_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
      const std::string text = body.dump();
      const std::string request =
          "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
          "Content-Type: application/json\r\nContent-Length: " +
          std::to_string(text.size()) + "\r\n\r\n" + text;
      ASSERT_EQ(::send(socket_fd, request.data(), request.size(), 0),
                static_cast<ssize_t>(request.size()));
      std::this_thread::sleep_for(300ms);
      ::close(socket_fd);
    }
    // The request stops within a heartbeat or so; its KV blocks go back.
    for (int i = 0; i < 1000; ++i) {
      if (metric("specrun_requests_total{outcome=\"cancelled\"}") > std::max(before, 0.0) &&
          metric("specrun_kv_cache_tokens_used") == 0) {
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(metric("specrun_requests_total{outcome=\"cancelled\"}"), std::max(before, 0.0) + 1);
    EXPECT_EQ(metric("specrun_kv_cache_tokens_used"), 0);
    EXPECT_EQ(metric("specrun_requests_running"), 0);
  }
}

TEST_F(ServerTest, DrainingLetsRequestsFinishWithinTheGraceThenStopsTheRest) {
  start();
  // Within the grace: the stream finishes whole.
  std::string finished;
  std::atomic<bool> started{false};
  std::thread within([&] {
    finished = post("/v1/completions",
                    R"({"model": "tiny", "prompt": "x", "max_tokens": 200, "stream": true})",
                    [&](const std::string&) {
                      started = true;
                      return true;
                    })
                   .body;
  });
  while (!started) std::this_thread::sleep_for(2ms);
  std::thread drainer([&] { server_->drain(60s); });
  within.join();
  drainer.join();
  listener_.join();
  const std::vector<json> chunks = events(finished);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "length");

  // Past the grace: the stream ends with an error event.
  server_.reset();
  start();
  std::string cut;
  started = false;
  std::thread past([&] {
    cut = post("/v1/completions",
               R"({"model": "tiny", "prompt": "x", "max_tokens": 4000, "stream": true})",
               [&](const std::string&) {
                 started = true;
                 return true;
               })
              .body;
  });
  while (!started) std::this_thread::sleep_for(2ms);
  std::thread short_drain([&] { server_->drain(100ms); });
  std::this_thread::sleep_for(20ms);
  const Reply during = get("/health");
  past.join();
  short_drain.join();
  EXPECT_EQ(during.status, 503);
  EXPECT_EQ(during.parsed()["status"], "draining");
  const std::vector<json> cut_chunks = events(cut);
  ASSERT_FALSE(cut_chunks.empty());
  EXPECT_NE(cut_chunks.back()["error"]["message"].get<std::string>().find("shutting down"),
            std::string::npos);
}

TEST_F(ServerTest, MetricsInPrometheusTextFormat) {
  start();
  for (int i = 0; i < 3; ++i) {
    post("/v1/completions", R"({"model": "tiny", "prompt": "abc", "max_tokens": 8})");
  }
  const Reply scrape = get("/metrics");
  EXPECT_EQ(scrape.status, 200);
  for (const char* name :
       {"# TYPE specrun_requests_total counter",
        "# TYPE specrun_time_to_first_token_seconds histogram",
        "# TYPE specrun_inter_token_latency_seconds histogram", "specrun_requests_waiting",
        "specrun_kv_cache_tokens_used", "specrun_acceptance_rate", "specrun_mean_accepted_length",
        "specrun_gamma_mean", "specrun_draft_seconds_total", "specrun_target_seconds_total",
        "specrun_speculative_steps_total", "specrun_prefix_cache_hit_rate"}) {
    EXPECT_NE(scrape.body.find(name), std::string::npos) << name;
  }
  // Every step waits for the device at least once, for its verdict, and reads it back.
  EXPECT_GT(metric("specrun_device_waits_total"), 0);
  EXPECT_GT(metric("specrun_device_to_host_bytes_total"), 0);
  EXPECT_EQ(metric("specrun_requests_total{outcome=\"length\"}"), 3);
  EXPECT_EQ(metric("specrun_generation_tokens_total"), 24);
  EXPECT_EQ(metric("specrun_prompt_tokens_total"), 12);
  EXPECT_EQ(metric("specrun_time_to_first_token_seconds_count"), 3);
  // Acceptance by draft position: every step with drafts has a first one.
  const double drafted_first = metric("specrun_drafts_per_position_total{position=\"1\"}");
  const double accepted_first =
      metric("specrun_accepted_drafts_per_position_total{position=\"1\"}");
  EXPECT_GT(drafted_first, 0);
  EXPECT_GE(accepted_first, 0);
  EXPECT_LE(accepted_first, drafted_first);
  // A second scrape adds nothing where nothing ran.
  get("/metrics");
  EXPECT_EQ(metric("specrun_drafts_per_position_total{position=\"1\"}"), drafted_first);
}

TEST_F(ServerTest, TheOfficialOpenAiClientWorksWithIt) {
  const std::string python = testing::venv_python_with("openai");
  if (python.empty()) {
    GTEST_SKIP() << "the openai package is not installed (tools/setup-python.sh server)";
  }
  start({}, true, /*with_template=*/true);
  const testing::CommandResult check = testing::run_command(
      "'" + python + "' '" + testing::source_path("tests/server/openai_client_check.py").string() +
      "' http://127.0.0.1:" + std::to_string(server_->port()) + "/v1 tiny");
  ASSERT_EQ(check.exit_code, 0) << check.stdout_text << check.stderr_text;
  const testing::CommandResult cli = testing::run_command(
      "'" + testing::tool_path("specrun").string() + "' --target '" + (dir_ / "target").string() +
      "' --prompt 'def fib(n):' --temperature 0 --max-tokens 24 --ignore-eos --quiet");
  ASSERT_EQ(cli.exit_code, 0) << cli.stderr_text;
  EXPECT_EQ(json::parse(check.stdout_text)["greedy"].get<std::string>() + "\n", cli.stdout_text);
}

TEST(ServeCommand, TheBinaryServesAndExitsZeroOnSigint) {
  testing::TempDir dir;
  fixtures::GeneratorOptions options;
  options.vocab_size = 256;
  options.max_position_embeddings = 1024;
  fixtures::write_random_checkpoint(options, dir / "model");
  testing::write_file(dir / "model" / "tokenizer.json", testing::byte_tokenizer_json());
  // A free port: one the system picks for a socket that is then closed.
  int port = 0;
  {
    const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    socklen_t length = sizeof(address);
    ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port = ntohs(address.sin_port);
    ::close(probe);
  }
  ASSERT_GT(port, 0);
  const std::string binary = testing::tool_path("specrun").string();
  const std::string target = (dir / "model").string();
  const std::string port_text = std::to_string(port);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(binary.c_str(), binary.c_str(), "serve", "--target", target.c_str(), "--port",
          port_text.c_str(), "--threads", "1", "--ignore-eos", "--model-name", "m",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  httplib::Client http("127.0.0.1", port);
  bool ready = false;
  for (int i = 0; i < 3000 && !ready; ++i) {
    auto health = http.Get("/health");
    ready = health && health->status == 200;
    if (!ready) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(ready) << "the server never became ready";
  // A request in flight when SIGINT arrives still completes.
  std::string body;
  std::atomic<bool> started{false};
  std::thread client([&] {
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.body = R"({"model": "m", "prompt": "x", "max_tokens": 300, "stream": true})";
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      body.append(data, size);
      started = true;
      return true;
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    httplib::Client(("127.0.0.1"), port).send(request, response, error);
  });
  while (!started) std::this_thread::sleep_for(2ms);
  kill(child, SIGINT);
  client.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(events(body).back()["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(http.Get("/health"));  // no longer listening
}

}  // namespace
}  // namespace specrun::server
