#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/exp.h"

namespace specrun::kernels::cpu {

namespace {

// What one pass over a row of logits finds.
struct LogitScan {
  float max = -INFINITY;  // the largest logit (meaningless when corrupt)
  bool corrupt = false;   // some logit is NaN or +infinity
};

// Sixteen independent lanes, so that the loop vectorises (one running maximum is a chain of
// dependent comparisons the compiler may not reorder); `v > top ? v : top` is the vector max.
// Inlined into the x86-64-v3 and baseline copies below; x86-64-v4 has its own in intrinsics. One
// is chosen at run time, like exponentiate's: a row of logits is scanned at least once for every
// token scored.
[[gnu::always_inline]] inline LogitScan scan_row(std::span<const float> logits) {
  constexpr size_t kLanes = 16;
  std::array<float, kLanes> top;
  top.fill(-INFINITY);
  std::array<int32_t, kLanes> bad{};
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = logits[i + j];
      bad[j] |= v < INFINITY ? 0 : 1;  // NaN fails every comparison
      top[j] = v > top[j] ? v : top[j];
    }
  }
  for (; i < n; ++i) {
    const float v = logits[i];
    bad[0] |= v < INFINITY ? 0 : 1;
    top[0] = v > top[0] ? v : top[0];
  }
  LogitScan scan;
  for (size_t j = 0; j < kLanes; ++j) {
    scan.corrupt = scan.corrupt || bad[j] != 0;
    scan.max = std::max(scan.max, top[j]);
  }
  return scan;
}

#if defined(__x86_64__)
// scan_row in AVX-512 registers, which GCC 12 does not make of the loop above (it keeps the lanes
// in scalars). vmaxps(v, top) is `v > top ? v : top`, NaN included; the lanes' maximum is the
// same whatever order they are taken in.
__attribute__((target("arch=x86-64-v4"))) LogitScan scan_x86_64_v4(std::span<const float> logits) {
  const __m512 infinity = _mm512_set1_ps(INFINITY);
  __m512 top = _mm512_set1_ps(-INFINITY);
  __mmask16 finite = 0xffff;  // lanes where every value so far was below +infinity
  const size_t n = logits.size();
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 valid = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1u);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, logits.data() + i);
    finite &= _mm512_cmp_ps_mask(v, infinity, _CMP_LT_OQ);
    top = _mm512_mask_max_ps(top, valid, v, top);
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, top);
  LogitScan scan{lanes[0], finite != 0xffff};
  for (const float lane : lanes) scan.max = std::max(scan.max, lane);
  return scan;
}

__attribute__((target("arch=x86-64-v3"))) LogitScan scan_x86_64_v3(std::span<const float> logits) {
  return scan_row(logits);
}
#endif

LogitScan scan_baseline(std::span<const float> logits) {
  return scan_row(logits);
}

LogitScan scan_logits(std::span<const float> logits) {
  using Copy = LogitScan (*)(std::span<const float>);
  static const Copy copy = []() -> Copy {
#if defined(__x86_64__)
    if (has_x86_64_v4()) return scan_x86_64_v4;
    if (has_x86_64_v3()) return scan_x86_64_v3;
#endif
    return scan_baseline;
  }();
  return copy(logits);
}

// The first index holding `value`.
size_t first_of(std::span<const float> values, float value) {
  return static_cast<size_t>(std::find(values.begin(), values.end(), value) - values.begin());
}

// weights[i] = exp((logits[i] - max_logit) * inverse_temperature), and their total: the softmax
// of a row before normalisation, most of the time processing a row takes. One copy per instruction
// set, chosen at run time (they give the same bits: exp_nonpositive's arithmetic is exact IEEE
// operations and fused multiply-adds, and the total is eight partial sums in a fixed order).
// Inlined into each copy below, so that it is compiled for that copy's instruction set.
template <typename Weight>
[[gnu::always_inline]] inline double exponentiate_row(std::span<const float> logits,
                                                      float max_logit, double inverse_temperature,
                                                      Weight* weights) {
  constexpr size_t kLanes = 8;
  std::array<double, kLanes> partial{};
  const size_t n = logits.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const double weight =
          exp_nonpositive((static_cast<double>(logits[i + j]) - max_logit) * inverse_temperature);
      weights[i + j] = static_cast<Weight>(weight);
      partial[j] += weight;
    }
  }
  for (; i < n; ++i) {
    const double weight =
        exp_nonpositive((static_cast<double>(logits[i]) - max_logit) * inverse_temperature);
    weights[i] = static_cast<Weight>(weight);
    partial[i % kLanes] += weight;
  }
  double total = 0.0;
  for (const double sum : partial) total += sum;
  return total;
}

#if defined(__x86_64__)
template <typename Weight>
__attribute__((target("arch=x86-64-v4"))) double exponentiate_x86_64_v4(
    std::span<const float> logits, float max_logit, double inverse_temperature, Weight* weights) {
  return exponentiate_row(logits, max_logit, inverse_temperature, weights);
}

template <typename Weight>
__attribute__((target("arch=x86-64-v3"))) double exponentiate_x86_64_v3(
    std::span<const float> logits, float max_logit, double inverse_temperature, Weight* weights) {
  return exponentiate_row(logits, max_logit, inverse_temperature, weights);
}
#endif

template <typename Weight>
double exponentiate_baseline(std::span<const float> logits, float max_logit,
                             double inverse_temperature, Weight* weights) {
  return exponentiate_row(logits, max_logit, inverse_temperature, weights);
}

// The copy this CPU runs best, chosen once. (Not target_clones: its resolvers run while the
// program is being relocated, before ThreadSanitizer's runtime is up, and crash it.)
template <typename Weight>
double exponentiate(std::span<const float> logits, float max_logit, double inverse_temperature,
                    Weight* weights) {
  using Copy = double (*)(std::span<const float>, float, double, Weight*);
  static const Copy copy = []() -> Copy {
#if defined(__x86_64__)
    if (has_x86_64_v4()) return exponentiate_x86_64_v4<Weight>;
    if (has_x86_64_v3()) return exponentiate_x86_64_v3<Weight>;
#endif
    return exponentiate_baseline<Weight>;
  }();
  return copy(logits, max_logit, inverse_temperature, weights);
}

// Weights below a floor rank after every weight at or above it, so the tokens at or above a floor
// (ties included) are a prefix of the full ranking: the filters can rank that prefix alone when it
// holds all they keep. The floors tried, relative to the top weight (1): the first leaves a few
// dozen to a few thousand of tens of thousands of tokens; the last, every token.
constexpr double kCandidateFloors[] = {0x1.0p-16, 0x1.0p-40, 0.0};

}  // namespace

RowStatus top_probability(std::span<const float> logits, std::span<float> scratch,
                          double* probability) {
  if (scratch.size() != logits.size() || logits.empty()) return RowStatus::kBadSettings;
  const LogitScan scan = scan_logits(logits);
  if (scan.corrupt) return RowStatus::kCorruptLogits;
  if (scan.max == -INFINITY) return RowStatus::kAllBanned;
  // The top weight is exp(0) = 1.
  *probability = 1.0 / exponentiate(logits, scan.max, 1.0, scratch.data());
  return RowStatus::kOk;
}

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) return -1;
  // The maximum, then its first index: two passes that vectorise, where one pass keeping the best
  // index does not.
  const LogitScan scan = scan_logits(logits);
  const size_t best = first_of(logits, scan.max);
  if (!scan.corrupt && best < logits.size()) return static_cast<int32_t>(best);
  size_t first_best = 0;  // NaN among the values: the plain loop's answer
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[first_best]) first_best = i;
  }
  return static_cast<int32_t>(first_best);
}

bool valid_settings(const LogitsSettings& params) {
  return std::isfinite(params.temperature) && params.temperature >= 0.0f && params.top_k >= 0 &&
         params.top_p > 0.0f && params.top_p <= 1.0f && params.min_p >= 0.0f &&
         params.min_p <= 1.0f;
}

RowStatus process_logits(const LogitsSettings& params, std::span<const float> logits,
                         std::span<float> probs) {
  if (probs.size() != logits.size() || logits.empty()) return RowStatus::kBadSettings;
  const size_t vocab = logits.size();
  // NaN or +infinity means the forward pass went wrong: never sample from it. -infinity bans a
  // token, but not every token. One pass (it vectorises) checks and finds the maximum.
  const LogitScan scan = scan_logits(logits);
  const float max_logit = scan.max;
  const RowStatus status = !valid_settings(params)  ? RowStatus::kBadSettings
                           : scan.corrupt           ? RowStatus::kCorruptLogits
                           : max_logit == -INFINITY ? RowStatus::kAllBanned
                                                    : RowStatus::kOk;
  if (status != RowStatus::kOk) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    return status;
  }
  if (params.temperature == 0.0f) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[first_of(logits, max_logit)] = 1.0f;
    return RowStatus::kOk;
  }
  const double inverse_temperature = 1.0 / static_cast<double>(params.temperature);
  if (params.top_k == 0 && params.top_p >= 1.0f && params.min_p == 0.0f) {
    // No filter: a plain softmax, written straight into probs (the common case, once per drafted
    // and verified token, so no vocabulary-sized scratch is allocated).
    const double total = exponentiate(logits, max_logit, inverse_temperature, probs.data());
    const float scale = static_cast<float>(1.0 / total);
    for (float& p : probs) p *= scale;
    return RowStatus::kOk;
  }
  // Softmax of logits / temperature in double: the filters compare and accumulate these masses.
  // The top weight is exp(0) = 1, the maximum's. (Vocabulary-sized scratch, every element written
  // before it is read: not zeroed first.)
  const std::unique_ptr<double[]> weights = std::make_unique_for_overwrite<double[]>(vocab);
  const double total = exponentiate(logits, max_logit, inverse_temperature, weights.get());
  // Ranked by weight, ties by lower id.
  const auto ranks_before = [&](int32_t a, int32_t b) {
    return weights[static_cast<size_t>(a)] != weights[static_cast<size_t>(b)]
               ? weights[static_cast<size_t>(a)] > weights[static_cast<size_t>(b)]
               : a < b;
  };
  const bool top_k_cuts = params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab;
  const bool top_p_cuts = params.top_p < 1.0f;
  // The min-p threshold: min_p times the top kept weight, which is always the maximum's.
  const double min_weight = static_cast<double>(params.min_p);

  // Candidates in id order (a prefix of the ranking, see kCandidateFloors), and the last-ranked
  // token top-k and top-p keep of them (-1: they cut nothing).
  std::vector<int32_t> candidates;
  std::vector<int32_t> order;
  const std::unique_ptr<int32_t[]> passing = std::make_unique_for_overwrite<int32_t[]>(vocab);
  int32_t last_kept = -1;
  for (const double floor : kCandidateFloors) {
    // Min-p alone keeps exactly the tokens at or above its threshold.
    const double cut = !top_k_cuts && !top_p_cuts ? min_weight : floor;
    size_t count = 0;
    for (size_t i = 0; i < vocab; ++i) {  // branch-free: the comparison is unpredictable
      passing[count] = static_cast<int32_t>(i);
      count += weights[i] >= cut ? 1 : 0;
    }
    candidates.assign(passing.get(), passing.get() + count);
    if (!top_k_cuts && !top_p_cuts) break;
    const bool last_floor = cut == 0.0;
    size_t kept = count;
    order = candidates;
    double kept_total = total;  // what top-p's p is a fraction of: every weight, or top-k's
    if (top_k_cuts) {
      kept = static_cast<size_t>(params.top_k);
      if (count < kept && !last_floor) continue;
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept) - 1,
                       order.end(), ranks_before);
      last_kept = order[kept - 1];
      kept_total = 0.0;  // in id order
      for (const int32_t token : candidates) {
        if (token == last_kept || ranks_before(token, last_kept)) {
          kept_total += weights[static_cast<size_t>(token)];
        }
      }
    } else if (!last_floor) {
      double mass = 0.0;
      for (const int32_t token : candidates) mass += weights[static_cast<size_t>(token)];
      if (mass < static_cast<double>(params.top_p) * total) continue;  // the nucleus reaches lower
    }
    if (top_p_cuts) {
      const double target = static_cast<double>(params.top_p) * kept_total;
      // Only the nucleus needs ranking, and it is usually a few dozen tokens: rank the best
      // `ranked` candidates exactly (a selection, then a sort of those alone), growing them
      // fourfold until their mass reaches the target. The prefix is the full order's.
      size_t ranked = std::min<size_t>(kept, 64);
      double cumulative = 0.0;
      size_t nucleus = 0;
      for (;;) {
        if (ranked < kept) {
          std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(ranked) - 1,
                           order.begin() + static_cast<std::ptrdiff_t>(kept), ranks_before);
        }
        std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(ranked), ranks_before);
        cumulative = 0.0;
        nucleus = 0;
        while (nucleus < ranked && cumulative < target) {
          cumulative += weights[static_cast<size_t>(order[nucleus])];
          ++nucleus;
        }
        if (cumulative >= target || ranked == kept) break;
        ranked = std::min(kept, ranked * 4);
      }
      // Rounding can leave the candidates' mass, summed in rank order, a hair short of what their
      // sum in id order promised: then the nucleus reaches below this floor after all.
      if (cumulative < target && !top_k_cuts && !last_floor) continue;
      last_kept = order[std::max<size_t>(nucleus, 1) - 1];
    }
    break;
  }

  // The kept tokens: candidates ranked no later than last_kept, at or above the min-p threshold;
  // renormalised by their total in id order.
  const auto keeps = [&](int32_t token) {
    return (last_kept < 0 || token == last_kept || ranks_before(token, last_kept)) &&
           weights[static_cast<size_t>(token)] >= min_weight;
  };
  double kept_mass = 0.0;
  for (const int32_t token : candidates) {
    if (keeps(token)) kept_mass += weights[static_cast<size_t>(token)];
  }
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (const int32_t token : candidates) {
    if (keeps(token)) {
      probs[static_cast<size_t>(token)] =
          static_cast<float>(weights[static_cast<size_t>(token)] / kept_mass);
    }
  }
  return RowStatus::kOk;
}

int32_t sample_from(std::span<const float> probs, double uniform) {
  double total = 0.0;
  for (const float p : probs) total += p;
  if (!(total > 0.0)) return -1;
  const double target = uniform * total;
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cumulative += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (target < cumulative) return last_nonzero;
  }
  return last_nonzero;  // rounding left the target at the very end
}

namespace {

// The most tokens best_with_noise and highest rank.
constexpr size_t kMostRanked = 16;

// Keeps the best `tokens.size()` (score, token) pairs offered, best first; ties to the lower
// token, which is offered first.
class BestTokens {
 public:
  // Ranks as many as `tokens` holds, at most kMostRanked (the rest stay -1).
  explicit BestTokens(std::span<int32_t> tokens)
      : tokens_(tokens.first(std::min(tokens.size(), kMostRanked))) {
    std::fill(tokens.begin(), tokens.end(), -1);
  }
  bool full() const { return kept_ == tokens_.size(); }
  // The score a new token must beat once full.
  double threshold() const { return full() ? scores_[kept_ - 1] : -INFINITY; }
  void offer(double score, int32_t token) {
    if (full() && !(score > scores_[kept_ - 1])) return;
    size_t at = std::min(kept_, tokens_.size() - 1);
    while (at > 0 && score > scores_[at - 1]) {
      scores_[at] = scores_[at - 1];
      tokens_[at] = tokens_[at - 1];
      --at;
    }
    scores_[at] = score;
    tokens_[at] = token;
    kept_ = std::min(kept_ + 1, tokens_.size());
  }

 private:
  std::span<int32_t> tokens_;
  std::array<double, kMostRanked> scores_{};
  size_t kept_ = 0;
};

}  // namespace

int32_t sample_with_noise(std::span<const float> probs, const RandomStream& stream,
                          int64_t position, std::span<const int32_t> tokens) {
  int32_t best = -1;
  best_with_noise(probs, stream, position, std::span<int32_t>(&best, 1), tokens);
  return best;
}

void best_with_noise(std::span<const float> probs, const RandomStream& stream, int64_t position,
                     std::span<int32_t> out, std::span<const int32_t> tokens) {
  if (out.empty()) return;
  BestTokens best(out);
  if (!tokens.empty() && tokens.size() != probs.size()) return;  // no entry names its token
  // -log u >= 1 - u on (0, 1], so p / (1 - u) bounds a token's score p / -log(u) from above: a
  // token whose bound stays below the score it must beat cannot enter, and its logarithm is
  // skipped (the test is written as p * margin < threshold * (1 - u), without a division). The
  // margin covers the rounding of the logarithm, the products and the division (a few units in
  // 2^-52), so the ranking is exactly the one scoring every token would find. A token of
  // probability zero never enters.
  constexpr double kBoundMargin = 1.0 + 0x1.0p-40;
  const auto enter = [&](double p, uint32_t noise_word, int32_t token) {
    const double u = (static_cast<double>(noise_word) + 0.5) * 0x1.0p-32;  // in (0, 1)
    if (best.full() && !(p * kBoundMargin >= best.threshold() * (1.0 - u))) return;
    best.offer(p / -std::log(u), token);
  };
  if (!tokens.empty()) {
    // Part of the vocabulary: each token's noise is the full row's, its block drawn once for the
    // entries in it, and the tokens are offered in the full row's order (ids increase).
    int64_t drawn_block = -1;
    PhiloxWords noise{};
    for (size_t i = 0; i < probs.size(); ++i) {
      const double p = probs[i];
      if (!(p > 0.0)) continue;
      const auto token = static_cast<uint32_t>(tokens[i]);
      if (static_cast<int64_t>(token / 4) != drawn_block) {
        drawn_block = token / 4;
        noise = stream.block(position, Draw::kNoise, token / 4);
      }
      enter(p, noise.v[token % 4], tokens[i]);
    }
    return;
  }
  const size_t vocab = probs.size();
  // A block of tokens a filter removed cannot enter: its noise (a pure function of the position
  // and the block) is not drawn. Top-p leaves a few dozen of tens of thousands, so the tokens are
  // first checked for mass sixteen at a time (a loop that vectorises), four blocks of four.
  constexpr size_t kChecked = 16;
  for (size_t checked = 0; checked < vocab; checked += kChecked) {
    const size_t checked_end = std::min(vocab, checked + kChecked);
    int any_mass = 0;
    for (size_t x = checked; x < checked_end; ++x) any_mass |= probs[x] > 0.0f ? 1 : 0;
    if (any_mass == 0) continue;
    for (size_t first = checked; first < checked_end; first += 4) {
      const size_t end = std::min(vocab, first + 4);
      bool block_mass = false;
      for (size_t x = first; x < end; ++x) block_mass = block_mass || probs[x] > 0.0f;
      if (!block_mass) continue;
      const PhiloxWords noise =
          stream.block(position, Draw::kNoise, static_cast<uint32_t>(first / 4));
      for (size_t x = first; x < end; ++x) {
        const double p = probs[x];
        if (p > 0.0) enter(p, noise.v[x - first], static_cast<int32_t>(x));
      }
    }
  }
}

void highest(std::span<const float> values, std::span<int32_t> out) {
  if (out.empty()) return;
  BestTokens best(out);
  for (size_t x = 0; x < values.size(); ++x) {
    if (values[x] > -INFINITY && (!best.full() || values[x] > best.threshold())) {
      best.offer(values[x], static_cast<int32_t>(x));
    }
  }
}

void sample_row(const SampleRow& row, std::span<const float> logits,
                std::span<const int32_t> tokens, std::span<float> q, SampledRow* out) {
  *out = SampledRow{};
  out->token = -1;
  std::fill(std::begin(out->ranked), std::end(out->ranked), -1);
  const bool known_rule = row.rule == SampleRule::kArgmax || row.rule == SampleRule::kInverseCdf ||
                          row.rule == SampleRule::kSharedNoise;
  if (!known_rule || row.ranked < 0 || row.ranked > kMaxRanked ||
      (!tokens.empty() && tokens.size() != logits.size()) || q.size() != logits.size()) {
    std::fill(q.begin(), q.end(), 0.0f);
    out->status = static_cast<int32_t>(RowStatus::kBadSettings);
    return;
  }
  // The confidence first, with q as the scratch its weights pass through.
  float max_logit = 0.0f;
  if (row.weigh != 0) {
    const RowStatus status = top_probability(logits, q, &out->top_probability);
    if (status != RowStatus::kOk) {
      std::fill(q.begin(), q.end(), 0.0f);
      out->status = static_cast<int32_t>(status);
      out->top_probability = 0.0;
      return;
    }
    max_logit = scan_logits(logits).max;
  }
  const RowStatus status = process_logits(row.settings, logits, q);
  out->status = static_cast<int32_t>(status);
  if (status != RowStatus::kOk) {
    out->top_probability = 0.0;
    return;
  }
  const auto token_of = [&](int32_t entry) {
    return entry < 0 || tokens.empty() ? entry : tokens[static_cast<size_t>(entry)];
  };
  const RandomStream stream(row.seed);
  const std::span<int32_t> ranked(out->ranked, static_cast<size_t>(row.ranked));
  switch (row.rule) {
    case SampleRule::kArgmax:
      out->token = token_of(argmax(logits));
      highest(logits, ranked);
      for (int32_t& entry : ranked) entry = token_of(entry);
      break;
    case SampleRule::kInverseCdf:
      out->token = token_of(sample_from(q, stream.uniform(row.position, row.draw)));
      highest(q, ranked);
      for (int32_t& entry : ranked) entry = token_of(entry);
      break;
    case SampleRule::kSharedNoise:
      out->token = sample_with_noise(q, stream, row.position, tokens);
      best_with_noise(q, stream, row.position, ranked, tokens);
      break;
  }
  if (row.weigh == 0) return;
  // A token's weight as top_probability computed it: exp(logit - max) rounded to f32.
  const auto weight_of = [&](int32_t token) {
    int64_t entry = token;
    if (!tokens.empty()) {
      const auto it = std::lower_bound(tokens.begin(), tokens.end(), token);
      entry = it != tokens.end() && *it == token ? it - tokens.begin() : -1;
    }
    if (entry < 0 || entry >= static_cast<int64_t>(logits.size())) return 0.0f;
    return static_cast<float>(
        exp_nonpositive(static_cast<double>(logits[static_cast<size_t>(entry)]) - max_logit));
  };
  out->token_weight = weight_of(out->token);
  out->probe_weight = row.probe >= 0 ? weight_of(row.probe) : 0.0f;
  for (int32_t i = 0; i < row.ranked; ++i) {
    if (out->ranked[i] >= 0) out->ranked_weight[i] = weight_of(out->ranked[i]);
  }
}

}  // namespace specrun::kernels::cpu
