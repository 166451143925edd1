// Fuzzes `specrun serve`'s HTTP front as a client's connection: the input is the raw bytes a
// client writes on one connection (request lines, headers, sized or chunked bodies, requests
// pipelined behind one another, garbage), sent to a server running in this process with a tiny
// random model behind it. The server must answer or close within the time limit, and stay up: a
// /health on a new connection answers after every input. A hang or a dead server is a finding.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "runtime/server/server.h"
#include "specrun/specrun.hpp"
#include "tests/fuzz/fuzz_support.h"
#include "tools/fixtures/checkpoint_generator.h"

namespace {

// Writes `bytes` on a new connection to `port` and reads until the server closes or `seconds`
// pass. Returns what the server sent; `closed` says whether it closed. The writing side stays
// open (the HTTP library drops a request whose client half-closed): a request left unfinished
// closes at the server's read timeout, 5 s.
std::string exchange(int port, std::string_view bytes, double seconds, bool* closed) {
  *closed = false;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    ::close(fd);
    return reply;
  }
  const timeval timeout{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);  // a refusal may reset the rest
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  char buffer[4096];
  while (std::chrono::steady_clock::now() < end) {
    const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
    if (got == 0) {
      *closed = true;
      break;
    }
    if (got > 0) reply.append(buffer, static_cast<size_t>(got));
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      *closed = true;  // reset: the server ended the connection
      break;
    }
  }
  ::close(fd);
  return reply;
}

// The server, started on first use with a tiny random model (token ids only: no tokenizer) and
// kept for the process's life, as libFuzzer runs every input in one process.
class FuzzServer {
 public:
  FuzzServer() {
    const std::filesystem::path model = specrun::fuzz::scratch_directory() / "model";
    specrun::fixtures::GeneratorOptions options;
    options.num_layers = 1;
    specrun::fixtures::write_random_checkpoint(options, model);
    specrun::EngineConfig engine;
    engine.target = model.string();
    engine.threads = 1;
    engine.kv_cache_tokens = 1024;
    engine.sampling.max_tokens = 4;
    specrun::ServerConfig config;
    config.port = 0;
    config.max_body_bytes = 64 * 1024;
    server_ = std::make_unique<specrun::server::Server>(config, engine);
    listener_ = std::thread([this] { server_->listen(); });
    server_->attach(specrun::Engine::create(engine), std::nullopt, "tiny");
    for (int i = 0; i < 500 && !healthy(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~FuzzServer() {
    server_->stop();
    listener_.join();
  }
  int port() const { return server_->port(); }
  bool healthy() const {
    bool closed = false;
    const std::string reply =
        exchange(port(), "GET /health HTTP/1.1\r\nHost: fuzz\r\n\r\n", 5.0, &closed);
    return reply.rfind("HTTP/1.1 200", 0) == 0;
  }

 private:
  std::unique_ptr<specrun::server::Server> server_;
  std::thread listener_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FuzzServer server;
  bool closed = false;
  // A request decodes 4 tokens of a tiny model: an answer takes milliseconds, a refusal less, an
  // unfinished request the read timeout (5 s).
  exchange(server.port(), specrun::fuzz::as_text(data, size), 10.0, &closed);
  if (!closed) {
    std::fprintf(stderr, "the server did not close the connection within 10 s\n");
    std::abort();
  }
  if (!server.healthy()) {
    std::fprintf(stderr, "the server stopped answering /health after this input\n");
    std::abort();
  }
  return 0;
}
