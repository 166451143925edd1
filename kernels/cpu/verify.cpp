#include "kernels/cpu/verify.h"

#include <algorithm>
#include <span>
#include <vector>

#include "kernels/core/random_stream.h"
#include "kernels/cpu/sampling.h"

namespace specrun::kernels::cpu {
namespace {

float probability(std::span<const float> distribution, int32_t token) {
  return token >= 0 && static_cast<size_t>(token) < distribution.size()
             ? distribution[static_cast<size_t>(token)]
             : 0.0f;
}

// One row's inputs, as spans.
struct RowView {
  const VerifyParams& params;
  const VerifyRow& row;
  const float* p;
  const int32_t* p_status;
  const float* q;
  const int32_t* drafts;
  const int32_t* alternates;
  const int64_t* alternate_rows;

  // Row `index` of p; empty where it could not be processed, so no token is drawn from it.
  std::span<const float> p_row(int64_t index) const {
    if (p_status != nullptr && p_status[index] != static_cast<int32_t>(RowStatus::kOk)) return {};
    return {p + index * params.vocab, static_cast<size_t>(params.vocab)};
  }
  std::span<const float> p_at(int64_t i) const { return p_row(row.p_row + i); }
  std::span<const float> q_at(int64_t i) const {
    return {q + i * params.vocab_q, static_cast<size_t>(params.vocab_q)};
  }
  // The row of p scored after the alternate of draft i (from 0) that is `token`, and its entry;
  // {-1, -1} when `token` is none of them.
  std::pair<int64_t, int32_t> alternate(int64_t i, int32_t token) const {
    if (alternates == nullptr || token < 0) return {-1, -1};
    const int64_t width = params.alternates_width;
    for (int64_t k = 0; k < width; ++k) {
      const int64_t entry = i * width + k;
      if (alternates[entry] != token) continue;
      const int64_t scored = alternate_rows[entry];
      if (scored < 0 || scored >= params.p_rows) return {-1, -1};
      return {scored, static_cast<int32_t>(entry)};
    }
    return {-1, -1};
  }
};

// The rules write d_1..d_k and the new token into out and return k, or -1 when the row cannot be
// decided. `taken` receives the entry of an accepted alternate.

int32_t rejection(const RowView& v, int32_t* out) {
  const RandomStream stream(v.row.seed);
  const int64_t n = v.row.count;
  for (int64_t k = 0; k < n; ++k) {
    const int32_t draft = v.drafts[k];
    const std::span<const float> p = v.p_at(k);
    const int64_t position = v.row.position + k;
    const float p_draft = probability(p, draft);
    const float q_draft = v.q == nullptr ? 1.0f : probability(v.q_at(k), draft);
    // Accept with probability min(1, p/q), written without the division.
    if (stream.uniform(position, Draw::kAcceptance) * q_draft < p_draft) {
      out[k] = draft;
      continue;
    }
    // Recover from the residual max(0, p - q), renormalised by sample_from.
    std::vector<float> residual(p.size());
    double mass = 0.0;
    for (size_t x = 0; x < residual.size(); ++x) {
      const auto token = static_cast<int32_t>(x);
      const float q_x =
          v.q == nullptr ? (token == draft ? 1.0f : 0.0f) : probability(v.q_at(k), token);
      residual[x] = std::max(0.0f, p[x] - q_x);
      mass += residual[x];
    }
    // A rejection implies p(d) < q(d), hence mass somewhere else; rounding can still leave none,
    // and then p itself is the exact answer (p and q agree to rounding).
    const double uniform = stream.uniform(position, Draw::kToken);
    out[k] = mass > 0.0 ? sample_from(residual, uniform) : sample_from(p, uniform);
    return out[k] >= 0 ? static_cast<int32_t>(k) : -1;
  }
  // Every draft accepted: the bonus token.
  out[n] = sample_from(v.p_at(n), stream.uniform(v.row.position + n, Draw::kToken));
  return out[n] >= 0 ? static_cast<int32_t>(n) : -1;
}

// Greedy and shared noise: the target's own token at each position (`draw(p, i)` for position
// row.position + i), each draft accepted while it is that token; where the first it disagrees
// with is one of that position's alternates, the alternate is accepted too and the target's token
// after it is the new one.
template <typename DrawToken>
int32_t own_tokens(const RowView& v, int32_t* out, int32_t* taken, const DrawToken& draw) {
  const int64_t n = v.row.count;
  for (int64_t k = 0;; ++k) {
    const int32_t token = draw(v.p_at(k), k);
    out[k] = token;
    if (token < 0) return -1;
    if (k == n) return static_cast<int32_t>(k);
    if (v.drafts[k] == token) continue;
    const auto [scored, entry] = v.alternate(k, token);
    if (scored < 0) return static_cast<int32_t>(k);
    out[k + 1] = draw(v.p_row(scored), k + 1);
    if (out[k + 1] < 0) return -1;
    *taken = entry;
    return static_cast<int32_t>(k + 1);
  }
}

}  // namespace

void verify_row(const VerifyParams& params, const VerifyRow& row, const float* p,
                const int32_t* p_status, const float* q, const int32_t* drafts,
                const int32_t* alternates, const int64_t* alternate_rows, int32_t* tokens,
                int32_t* accepted, int32_t* alternate_taken) {
  std::fill(tokens, tokens + params.gamma + 1, -1);
  *accepted = -1;
  *alternate_taken = -1;
  if (row.count < 0 || row.count > params.gamma || row.p_row < 0 ||
      row.p_row + row.count >= params.p_rows) {
    return;
  }
  const RowView view{params, row, p, p_status, q, drafts, alternates, alternate_rows};
  int32_t taken = -1;
  int32_t k = -1;
  switch (row.rule) {
    case VerifyRule::kGreedy:
      k = own_tokens(view, tokens, &taken, [](std::span<const float> distribution, int64_t) {
        return argmax(distribution);
      });
      break;
    case VerifyRule::kSharedNoise: {
      const RandomStream stream(row.seed);
      k = own_tokens(view, tokens, &taken, [&](std::span<const float> distribution, int64_t i) {
        return sample_with_noise(distribution, stream, row.position + i);
      });
      break;
    }
    case VerifyRule::kRejection:
      k = rejection(view, tokens);
      break;
  }
  if (k < 0) {
    std::fill(tokens, tokens + params.gamma + 1, -1);
    return;
  }
  *accepted = k;
  *alternate_taken = taken;
}

}  // namespace specrun::kernels::cpu
