// downstream TARGET: a greedy request of 8 tokens through the C++ API, printed as token ids, and
// an Error thrown by the library caught here (an exception crossing the shared library).
#include <cstdio>

#include <specrun/specrun.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: downstream TARGET\n");
    return 2;
  }
  try {
    specrun::Engine::create({.target = std::string(argv[1]) + "/missing"});
    std::fprintf(stderr, "downstream: a missing checkpoint was accepted\n");
    return 1;
  } catch (const specrun::Error& error) {
    std::printf("error: %s\n", error.what());
  }
  const auto engine = specrun::Engine::create({.target = argv[1], .threads = 1});
  specrun::Request request;
  request.prompt_ids = {1, 17, 200};
  request.sampling = specrun::SamplingSettings{.temperature = 0.0f, .max_tokens = 8};
  const specrun::Result result = engine->submit(request).wait();
  std::printf("%s:", specrun::to_string(result.reason));
  for (const int32_t token : result.tokens) std::printf(" %d", token);
  std::printf("\n");
  return 0;
}
