// `specrun serve`: an OpenAI-compatible HTTP server over one engine, through cpp-httplib.
//
// Endpoints: POST /v1/completions and /v1/chat/completions (JSON or server-sent events),
// GET /v1/models, GET /health (200 once the models are loaded, 503 while loading or draining),
// GET /metrics (Prometheus text format), and GET /, a chat page (chat_page.html) that streams
// answers from /v1/chat/completions and colours them by what speculation did. Every request is
// independent: replicas scale out behind any HTTP load balancer that routes on /health.
//
// It uses the public API (specrun/specrun.hpp) and nothing below it, as any embedder would.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "specrun/chat.hpp"
#include "specrun/specrun.hpp"

namespace specrun::server {

class Server {
 public:
  // Binds config.host:config.port (Error naming them when it cannot); until attach(), /health
  // answers 503 "loading" and requests 503 with Retry-After. `defaults` are the engine's settings:
  // what requests leave out.
  Server(const ServerConfig& config, const EngineConfig& defaults);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;  // the bound port (config.port, or the one the system picked for 0)
  // Serves on the calling thread until stop() or drain() ends it.
  void listen();
  // The models are loaded: from now on requests are served. `model_name` is the id requests must
  // name; without a chat template, chat completions are refused with a 400 that says so.
  void attach(std::unique_ptr<Engine> engine, std::optional<ChatTemplate> chat_template,
              const std::string& model_name);
  // Refuses new requests (503), lets those in flight finish within `grace`, stops the rest (the
  // engine shuts down: streams end with an error event), and stops listening.
  void drain(std::chrono::milliseconds grace);
  // Stops listening at once.
  void stop();

  struct State;  // the listener, the engine, the counters (server.cpp)

 private:
  std::unique_ptr<State> state_;
};

// The model id a server names its model by when the settings give none: the target checkpoint's
// file or directory name, without a .gguf or .safetensors extension.
std::string default_model_name(const std::string& target);

// `specrun serve`: binds, loads the models while /health says so, serves until SIGINT or SIGTERM,
// then drains (in-flight requests get config.shutdown_grace_seconds) and returns 0. Throws Error
// when it cannot bind or load. Announces the address, then readiness, in one line each on stderr.
int serve(const EngineConfig& engine, const ServerConfig& config);

}  // namespace specrun::server
