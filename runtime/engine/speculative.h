// The speculative step loop for one sequence: propose (draft), score (target), verify, commit and
// roll back both caches, adapt gamma. Gamma 0 is plain decoding through the same loop.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "draft/proposer.h"
#include "runtime/engine/generate.h"
#include "runtime/model/model.h"
#include "verify/batch_gamma.h"
#include "verify/gamma_controller.h"
#include "verify/verifier.h"

namespace specrun {

enum class SpeculativeMethod {
  kDraftModel,    // a small model proposes
  kPromptLookup,  // n-gram matches against the text so far propose
  kNone,          // plain decoding
};

// "draft", "prompt_lookup", "none"; throws Error otherwise.
SpeculativeMethod parse_method(const std::string& name);
const char* method_name(SpeculativeMethod method);

struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::kDraftModel;  // who proposes
  GammaLimits gamma;                                          // initial, min and max gamma
  ControllerKind controller = ControllerKind::kGoodput;       // how gamma adapts
  float draft_p_min = 0.0f;      // stop drafting below this draft confidence; 0 never stops
  int64_t lookup_min_ngram = 1;  // prompt lookup: shortest suffix matched
  int64_t lookup_max_ngram = 3;  // prompt lookup: longest suffix matched
};

// Throws Error naming the setting when the options are inconsistent.
void validate_speculative(const SpeculativeOptions& options);

// What a run measured; the CLI's stats and --stats-json come from it.
struct SpeculativeStats {
  int64_t tokens_generated = 0;                // tokens emitted (EOS excluded)
  double total_ms = 0.0;                       // from the call to the last token
  double ttft_ms = 0.0;                        // time to the first token
  std::vector<double> token_ms;                // each token's arrival, from the start
  int64_t steps = 0;                           // target forwards after the prefill
  int64_t drafted = 0;                         // drafts verified
  int64_t accepted = 0;                        // drafts accepted
  int64_t rejections = 0;                      // steps that rejected a draft (accepted < drafted)
  int64_t committed_in_steps = 0;              // tokens committed by the steps (accepted + 1 each)
  std::map<int64_t, int64_t> gamma_histogram;  // drafts per step -> steps
  double draft_ms = 0.0;                       // time proposing
  double target_ms = 0.0;  // time in the target (prefill, scoring, verification)

  // Adds one step: `drafted` drafts verified, `accepted` of them taken, and its two costs.
  void record_step(int64_t drafted, int64_t accepted, double step_draft_ms, double step_target_ms);

  double acceptance_rate() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  // Tokens committed per target step: accepted drafts plus the recovered or bonus token.
  double mean_accepted_length() const {
    return steps ? double(committed_in_steps) / double(steps) : 0.0;
  }
  double tokens_per_second() const {
    return total_ms > 0 ? 1e3 * double(tokens_generated) / total_ms : 0.0;
  }
  // Inter-token latency over consecutive arrivals: {mean, p50, p99}; zeros below two tokens.
  struct Latency {
    double mean = 0, p50 = 0, p99 = 0;
  };
  Latency inter_token_latency() const;
};

// A request's draft generator is seeded with its seed xor this, so that it is independent of the
// verifier's stream (seeded with the seed itself).
inline constexpr uint64_t kDraftSeedSalt = 0x5bd1e9955bd1e995ull;

class SpeculativeGenerator {
 public:
  // `draft` is required for kDraftModel and ignored otherwise. `verifier` replaces the default
  // (greedy at temperature 0, rejection sampling otherwise); tests pass a broken one to show the
  // distribution checks catch it. Both models and the verifier must outlive the generator.
  SpeculativeGenerator(Model& target, Model* draft, const GenerationOptions& generation,
                       const SpeculativeOptions& speculative, const Verifier* verifier = nullptr);
  ~SpeculativeGenerator();

  // Generates on fresh sequences of both caches, freed on return. Throws Error for an empty
  // prompt, a prompt that does not fit, or a prompt token outside the vocabulary.
  GenerationResult generate(std::span<const int32_t> prompt, const TokenCallback& on_token = {},
                            SpeculativeStats* stats = nullptr);

 private:
  Model& target_;
  Model* draft_;
  GenerationOptions generation_;
  SpeculativeOptions speculative_;
  std::unique_ptr<Proposer> proposer_;
  // Persist across generate() calls: acceptance and costs are properties of the model pair and
  // the machine, learnt once rather than per request. One of them: the goodput controller (for a
  // batch of one) or a per-sequence one.
  std::unique_ptr<BatchGoodputController> goodput_;
  std::unique_ptr<GammaController> controller_;
  std::unique_ptr<Verifier> default_verifier_;
  const Verifier* verifier_;
};

}  // namespace specrun
