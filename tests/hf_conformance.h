// specrun's logits against Hugging Face transformers (tests/reference/hf_reference.py, float32 on
// the CPU), shared by the CPU suite (test_hf_conformance) and the CUDA one
// (gpu/test_cuda_hf_conformance): the reference's cases, reading its output, and one comparison of
// a loaded model with it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "runtime/model/model.h"
#include "tests/test_support.h"

namespace specrun::testing {

// The models hf_reference.py builds (its CASES): eight configurations, each in bf16 and f32.
std::vector<std::string> hf_case_names();

// One case's reference: prompts, the greedy continuation of each, and the logits after every
// token of prompt + continuation.
struct HfReference {
  struct Prompt {
    std::vector<int32_t> tokens;
    std::vector<int32_t> continuation;
    int64_t row_offset = 0;  // the prompt's first row in `logits`
  };
  int64_t vocab_size = 0;
  std::string versions;  // "torch X, transformers Y"
  std::vector<Prompt> prompts;
  std::vector<float> logits;  // [rows, vocab_size]

  // The logits after token `position` of prompt + continuation.
  std::span<const float> row(const Prompt& prompt, int64_t position) const;
};

// Finds the case's model and reference: under ctest, the directory the hf_reference_models
// fixture filled (SPECRUN_HF_REFERENCE_DIR); run directly, the script is run for this case alone
// into `scratch`. Returns the directory holding NAME/ (the model), NAME.json and NAME.bin, or an
// empty path with `skip_reason` set when transformers is not installed.
std::filesystem::path hf_reference_dir(const std::string& name, const TempDir& scratch,
                                       std::string* skip_reason);

HfReference load_hf_reference(const std::filesystem::path& directory, const std::string& name);

// Worst errors and greedy agreement of one model against one reference. A logit passes when
// |specrun - reference| <= tolerance * (the largest |reference logit| of its row): a logit's
// rounding error comes from sums of products over the hidden state, whose size is that of the
// row's logits, not of the one logit (which may be near zero).
struct HfComparison {
  int64_t rows = 0;
  double max_reference = 0.0;  // the largest |logit|
  double max_error = 0.0;      // the largest |specrun - reference|
  double mean_error = 0.0;     // mean |specrun - reference| over every logit
  double worst_ratio = 0.0;    // the largest error / bound: 1 is the limit
  int64_t violations = 0;
  std::string first_violation;
  // Greedy: at each of the continuation's steps, specrun's argmax on the same prefix against the
  // reference's token. A different choice is a near tie (allowed) when the reference's margin
  // between the two tokens is within twice the bound (both logits may move by the bound toward
  // each other), a failure otherwise.
  int64_t greedy_steps = 0;
  int64_t greedy_agreed = 0;
  std::vector<std::string> near_ties;
  int64_t greedy_failures = 0;
  std::string first_greedy_failure;
};

// Runs every prompt of `reference` through `model` (one batched prefill, then one batched decode
// step per continuation token, feeding the reference's tokens) and compares every row. The
// sequences are removed from the model's cache afterwards.
HfComparison compare_with_hf(Model& model, const HfReference& reference, double tolerance);

// One line for the log: the case, the worst errors and the greedy agreement.
std::string describe(const std::string& name, const HfComparison& c, double tolerance);

}  // namespace specrun::testing
