// Settings of a run, read from a TOML file (configs/default.toml documents every key) and then
// overridden by command-line flags.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "runtime/engine/generate.h"
#include "runtime/engine/speculative.h"

namespace specrun {

struct RunConfig {
  std::string target;  // [model] target: checkpoint; a relative path is resolved against the
                       // file's directory; "" when not given
  std::string draft;   // [model] draft: draft checkpoint, resolved the same way; "" for none
  SpeculativeOptions speculative;  // [speculative]: method, gamma, gamma_min, gamma_max,
                                   // controller, draft_p_min, lookup_min_ngram, lookup_max_ngram
  GenerationOptions generation;    // [sampling]: temperature, top_k, top_p, min_p, seed, max_tokens
  int threads = 0;                 // [runtime] threads: CPU threads, 0 for one per core
  int64_t kv_cache_tokens = 0;     // [runtime] kv_cache_tokens: capacity, 0 for the model's context
  int64_t kv_block_size = 16;      // [runtime] kv_block_size: tokens per KV-cache block
  std::string device = "cpu";      // [runtime] device: where the model runs: cpu, cuda, cuda:N
  int64_t max_batch = 64;          // [runtime] max_batch: sequences decoded together, at most
  bool deterministic = false;      // [runtime] deterministic: batch-invariant kernels (CUDA; the
                                   // CPU backend always is), so greedy speculative output equals
                                   // greedy target-only output bitwise
};

// Reads `path` over `defaults`: keys absent from the file keep their default. An unknown table or
// key, a value of the wrong type or out of range, or a TOML syntax error is an Error of the form
// "FILE:LINE: key 'sampling.top_p' must be in (0, 1], got 1.5".
RunConfig load_run_config(const std::filesystem::path& path, const RunConfig& defaults = {});

// Checks the ranges load_run_config checks, for settings that came from elsewhere (flags).
void validate_run_config(const RunConfig& config);

}  // namespace specrun
