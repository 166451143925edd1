// specbench --synthetic: the costs that decide speculative decoding, measured on synthetic models
// of published shapes (runtime/model/synthetic.h) on any backend: decode at batch 1 against the
// bandwidth floor, verification of 2..16 tokens against one decode step, prefill throughput, the
// draft's step, and speculative against target-only generation.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/model/model.h"

namespace specrun::tools {

struct DeviceBenchOptions {
  std::string device = "cuda";                // "cpu", "cuda" or "cuda:N"
  int threads = 0;                            // CPU threads (the CPU backend, host work)
  std::string target_shape = "llama-3.1-8b";  // synthetic target
  std::string draft_shape = "llama-3.2-1b";   // synthetic draft; "" measures the target alone
  int64_t context = 512;                      // tokens in the cache before each measured step
  int64_t prefill_tokens = 2048;              // prompt length of the prefill measurement
  int64_t max_verify_tokens = 16;             // verification measured for 2..this many tokens
  int64_t generate_tokens = 128;              // tokens per generation in the end-to-end comparison
  int repeats = 5;             // measured repetitions (after a warm-up) behind each median
  bool deterministic = false;  // batch-invariant kernels (runtime.deterministic)
  // The target's linear layers as 8-bit codes (the draft stays bf16); the bf16 target of the same
  // shape is measured first as the baseline where it fits the device's free memory and
  // max_verify_tokens >= 5 (the baseline's verification of 5 is compared).
  WeightQuantize quantize = WeightQuantize::kNone;
  int64_t kv_cache_tokens = 0;          // each model's KV capacity; 0: what the measurements need
  DType kv_cache_dtype = DType::kBF16;  // both models' KV caches: kBF16 or kF32
  std::string json_path;                // also write the results here; "" for none
};

// Prints the report to stdout; returns the process exit code. Throws Error on bad options or
// when the device cannot hold the models.
int run_device_bench(const DeviceBenchOptions& options);

}  // namespace specrun::tools
