#include "runtime/engine/generate.h"

#include <algorithm>
#include <chrono>

#include "kernels/core/check.h"

namespace specrun {

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::kEndOfSequence:
      return "eos";
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kContextLimit:
      return "context_limit";
    case StopReason::kStopped:
      return "stopped";
  }
  return "unknown";
}

namespace {

// Frees the sequence however generation ends.
class SequenceGuard {
 public:
  explicit SequenceGuard(KvCache& cache) : cache_(cache), id_(cache.add_sequence()) {}
  ~SequenceGuard() { cache_.remove_sequence(id_); }
  SequenceGuard(const SequenceGuard&) = delete;
  SequenceGuard& operator=(const SequenceGuard&) = delete;
  SequenceId id() const { return id_; }

 private:
  KvCache& cache_;
  SequenceId id_;
};

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

void validate_request(const Model& model, std::span<const int32_t> prompt, int64_t max_tokens) {
  if (prompt.empty()) throw Error("the prompt is empty: give at least one token");
  if (max_tokens < 0) throw Error("max_tokens must be >= 0, got " + std::to_string(max_tokens));
  for (const int32_t token : prompt) {
    if (token < 0 || token >= model.config().vocab_size) {
      throw Error("prompt token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                  std::to_string(model.config().vocab_size) + ")");
    }
  }
  if (static_cast<int64_t>(prompt.size()) > model.context_limit()) {
    throw Error("the prompt has " + std::to_string(prompt.size()) +
                " tokens, more than the context limit of " + std::to_string(model.context_limit()));
  }
}

GenerationResult generate(Model& model, std::span<const int32_t> prompt,
                          const GenerationOptions& options, const TokenCallback& on_token) {
  validate_request(model, prompt, options.max_tokens);
  const int64_t context_limit = model.context_limit();
  Sampler sampler(options.sampling);
  const std::vector<int32_t>& eos = model.config().eos_token_ids;

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (options.max_tokens == 0) return result;

  SequenceGuard sequence(model.kv_cache());
  Logits logits;
  const auto prefill_start = std::chrono::steady_clock::now();
  const SequenceInput prefill[] = {{sequence.id(), prompt, false}};
  model.forward(prefill, &logits);
  int32_t token = sampler.sample(logits.last(0));
  result.prefill_ms = milliseconds_since(prefill_start);

  const auto decode_start = std::chrono::steady_clock::now();
  for (;;) {
    if (options.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      result.stop_reason = StopReason::kEndOfSequence;
      break;
    }
    result.tokens.push_back(token);
    if (on_token && !on_token(token)) {
      result.stop_reason = StopReason::kStopped;
      break;
    }
    if (static_cast<int64_t>(result.tokens.size()) >= options.max_tokens) {
      result.stop_reason = StopReason::kMaxTokens;
      break;
    }
    // Feeding the token needs one more position in the context and the cache.
    if (model.kv_cache().length(sequence.id()) + 1 > context_limit) {
      result.stop_reason = StopReason::kContextLimit;
      break;
    }
    const int32_t fed[] = {token};
    const SequenceInput step[] = {{sequence.id(), fed, false}};
    try {
      model.forward(step, &logits);
    } catch (const KvCacheFullError&) {
      // Other sequences hold the rest of a shared cache.
      result.stop_reason = StopReason::kContextLimit;
      break;
    }
    token = sampler.sample(logits.last(0));
  }
  result.decode_ms = milliseconds_since(decode_start);
  return result;
}

}  // namespace specrun
