// specrun-grammarbench: the cost of a grammar mask over a real vocabulary, per parse state. For
// each state (a JSON-schema document cut mid-object, mid-string, mid-number...; any JSON cut
// likewise) it times fill_mask three ways, single thread, median of --repeats:
//   cold:   a fresh matcher, whose automaton has no transitions yet (the first mask of a request);
//   walk:   the trie walk with the transitions it needs already made and no mask cache (what a
//           state never seen before costs once the automaton has warmed up);
//   cached: the state's mask kept from before (a string's body, whitespace: states that recur).
// Also the vocabulary's build, the grammar's compile and a matcher's copy. Prints one JSON object.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/engine/checkpoint_tokenizer.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/vocabulary.h"
#include "runtime/model/checkpoint.h"
#include "specrun/error.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using specrun::grammar::Matcher;

double microseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

// The schema the states cut: an object with a string, an integer range, an enum array, a nested
// object, a pattern and a date.
constexpr const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":64},
  "age":{"type":"integer","minimum":0,"maximum":150},
  "tags":{"type":"array","items":{"enum":["admin","user","guest"]},"maxItems":8},
  "address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
    "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["city"]},
  "email":{"type":"string","pattern":"^[a-z0-9.]+@[a-z]+\\.[a-z]{2,3}$"},
  "joined":{"type":"string","format":"date"}},
  "required":["name","age"]})";

struct State {
  const char* name;    // what the benchmark reports
  bool any_json;       // the any-JSON grammar rather than the schema's
  const char* prefix;  // the text generated so far
};

constexpr State kStates[] = {
    {"schema-start", false, ""},
    {"schema-mid-object", false, R"({"name": "Ada Lovelace", "age": 36,)"},
    {"schema-mid-string", false, R"({"name": "Ada Lov)"},
    {"schema-mid-number", false, R"({"name": "Ada", "age": 3)"},
    {"schema-nested-key", false, R"({"name": "Ada", "age": 36, "address": {"ci)"},
    {"schema-mid-pattern", false, R"({"name": "Ada", "age": 36, "email": "ada.l)"},
    {"any-json-mid-object", true, R"({"id": 7, "items": [1, 2, {"k": true}], )"},
    {"any-json-mid-string", true, R"({"id": 7, "text": "Once upon a ti)"},
};

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path;
  int repeats = 100;
  CLI::App app{"specrun-grammarbench: grammar mask cost per parse state"};
  app.add_option("--tokenizer", tokenizer_path,
                 "tokenizer.json, a checkpoint directory or a .gguf file")
      ->required();
  app.add_option("--repeats", repeats, "Timed runs per measurement; the median is reported")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    // A .gguf file's tokenizer is in its metadata; anything else is a tokenizer.json or a
    // checkpoint directory holding one.
    std::unique_ptr<specrun::text::Tokenizer> tokenizer;
    if (tokenizer_path.ends_with(".gguf")) {
      tokenizer = specrun::text::Tokenizer::from_json(
          specrun::read_tokenizer_document(tokenizer_path), tokenizer_path);
    } else if (tokenizer_path.ends_with(".json")) {
      tokenizer = specrun::text::Tokenizer::load(tokenizer_path);
    } else {
      tokenizer = specrun::load_tokenizer(specrun::resolve_checkpoint(tokenizer_path));
    }
    if (!tokenizer) throw specrun::Error(tokenizer_path + ": no tokenizer");
    std::vector<int32_t> eos;
    if (tokenizer->eos_id()) eos.push_back(*tokenizer->eos_id());
    auto start = Clock::now();
    const auto vocabulary = specrun::grammar::TokenVocabulary::from_tokenizer(*tokenizer, eos);
    const double vocabulary_ms = microseconds_since(start) / 1000;
    start = Clock::now();
    const auto schema = specrun::grammar::json_schema_grammar(std::string_view(kSchema));
    const double schema_compile_us = microseconds_since(start);
    const auto any_json = specrun::grammar::any_json_grammar(false);

    std::vector<uint32_t> bits(vocabulary->mask_words());
    nlohmann::ordered_json states = nlohmann::ordered_json::array();
    for (const State& state : kStates) {
      const auto& grammar = state.any_json ? any_json : schema;
      std::vector<double> cold;
      std::vector<double> walk;
      std::vector<double> cached;
      std::vector<double> copy;
      size_t allowed = 0;
      for (int r = 0; r < repeats; ++r) {
        Matcher fresh(grammar, vocabulary);
        if (!fresh.accept_bytes(state.prefix))
          throw specrun::Error("the grammar refuses its state");
        start = Clock::now();
        allowed = fresh.fill_mask(bits);
        cold.push_back(microseconds_since(start));
      }
      Matcher uncached(grammar, vocabulary, /*cache_masks=*/false);
      uncached.accept_bytes(state.prefix);
      uncached.fill_mask(bits);
      Matcher caching(grammar, vocabulary);
      caching.accept_bytes(state.prefix);
      caching.fill_mask(bits);
      for (int r = 0; r < repeats; ++r) {
        start = Clock::now();
        uncached.fill_mask(bits);
        walk.push_back(microseconds_since(start));
        start = Clock::now();
        caching.fill_mask(bits);
        cached.push_back(microseconds_since(start));
        start = Clock::now();
        const Matcher duplicate = caching;
        copy.push_back(microseconds_since(start));
        if (duplicate.accepted_steps() != caching.accepted_steps()) return 1;
      }
      states.push_back({{"state", state.name},
                        {"prefix", state.prefix},
                        {"allowed_tokens", allowed},
                        {"cold_us", median(cold)},
                        {"walk_us", median(walk)},
                        {"cached_us", median(cached)},
                        {"copy_us", median(copy)}});
    }
    const nlohmann::ordered_json report = {
        {"tokenizer", tokenizer_path},
        {"vocab_size", vocabulary->size()},
        {"trie_nodes", vocabulary->trie().size()},
        {"vocabulary_build_ms", vocabulary_ms},
        {"schema_compile_us", schema_compile_us},
        {"repeats", repeats},
        {"threads", 1},
        {"machine", {{"cpu", cpu_model()}, {"cores", std::thread::hardware_concurrency()}}},
        {"states", states}};
    std::cout << report.dump(2) << "\n";
  } catch (const specrun::Error& error) {
    std::fprintf(stderr, "specrun-grammarbench: %s\n", error.what());
    return 1;
  }
  return 0;
}
