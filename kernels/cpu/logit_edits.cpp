#include "kernels/cpu/logit_edits.h"

#include <limits>

namespace specrun::kernels::cpu {

void edit_logits(std::span<const LogitEdit> edits, std::span<const uint32_t> mask,
                 std::span<float> logits) {
  const auto vocab = static_cast<int64_t>(logits.size());
  for (const LogitEdit& edit : edits) {
    if (edit.token < 0 || edit.token >= vocab) continue;
    float& x = logits[static_cast<size_t>(edit.token)];
    const float scaled = x > 0.0f ? x / edit.repetition : x * edit.repetition;
    x = scaled + edit.add;
  }
  if (mask.empty()) return;
  for (int64_t t = 0; t < vocab; ++t) {
    if (((mask[static_cast<size_t>(t / 32)] >> (t % 32)) & 1u) == 0) {
      logits[static_cast<size_t>(t)] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace specrun::kernels::cpu
