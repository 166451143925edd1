// Fuzzes the reader of `specrun serve`'s request bodies: the input is the body of a completions or
// a chat completions request (the first byte picks which); it is checked as the server checks it,
// and its stop strings then match against the body's own text split at every byte. A refusal is an
// OpenAI error (ApiException) or specrun::Error; anything else is a finding.
#include <string>

#include "runtime/server/openai.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto endpoint =
      data[0] % 2 == 0 ? specrun::server::Endpoint::kCompletions : specrun::server::Endpoint::kChat;
  const std::string_view body = specrun::fuzz::as_text(data + 1, size - 1);
  specrun::fuzz::expect_clean_refusal([&] {
    specrun::server::CompletionRequest request;
    try {
      request = specrun::server::parse_completion_request(body, endpoint, specrun::EngineConfig{},
                                                          "model");
    } catch (const specrun::server::ApiException& refusal) {
      if (refusal.error().message.empty()) throw std::logic_error("a refusal without a message");
      refusal.error().body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      return;
    }
    specrun::server::StopMatcher matcher(request.stop);
    std::string out;
    for (const char byte : body) out += matcher.feed(std::string_view(&byte, 1));
    out += matcher.flush();
    if (out.size() > body.size()) throw std::logic_error("the stop matcher invented text");
  });
  return 0;
}
