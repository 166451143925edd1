// Logits processing keeps exactly the right tokens, and sampling follows the processed
// distribution (checked by a chi-square test against the exact probabilities).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/exp.h"
#include "kernels/cpu/sampling.h"
#include "runtime/base/check.h"
#include "tests/host_sampling.h"

namespace specrun {
namespace {

using kernels::cpu::exp_nonpositive;

// Logits whose softmax is exactly proportional to `probabilities`.
std::vector<float> logits_of(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (const double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::set<int32_t> support(const std::vector<float>& probs) {
  std::set<int32_t> kept;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] > 0.0f) kept.insert(static_cast<int32_t>(i));
  }
  return kept;
}

std::vector<float> process(const SamplingParams& params, const std::vector<float>& logits) {
  std::vector<float> probs(logits.size());
  process_logits(params, logits, probs);
  double total = 0.0;
  for (const float p : probs) total += p;
  EXPECT_NEAR(total, 1.0, 1e-6);
  return probs;
}

// Token ids shuffled so that rank order differs from id order.
const std::vector<double> kProbabilities = {0.10, 0.02, 0.50, 0.15, 0.03, 0.20};
// Rank order by probability: 2 (0.50), 5 (0.20), 3 (0.15), 0 (0.10), 4 (0.03), 1 (0.02).

TEST(Sampler, PlainSoftmaxWithoutFilters) {
  const std::vector<float> probs = process({}, logits_of(kProbabilities));
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(probs[i], kProbabilities[i], 1e-6);
}

TEST(Sampler, TopProbabilityIsTheLargestOfTheUnprocessedSoftmax) {
  std::vector<float> scratch(kProbabilities.size());
  EXPECT_NEAR(top_probability(logits_of(kProbabilities), scratch), 0.50, 1e-6);
  // Against a long-double softmax over a wide row with banned tokens; the scratch holds weights.
  std::mt19937 random(3);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  std::vector<float> logits(50000);
  for (float& logit : logits) logit = uniform(random);
  logits[7] = -INFINITY;
  logits[123] = 12.5f;
  long double total = 0.0L;
  for (const float logit : logits) total += std::exp(static_cast<long double>(logit) - 12.5L);
  scratch.resize(logits.size());
  EXPECT_NEAR(top_probability(logits, scratch), static_cast<double>(1.0L / total), 1e-12);
  EXPECT_EQ(scratch[123], 1.0f);
  EXPECT_EQ(scratch[7], 0.0f);
  logits[9] = NAN;
  EXPECT_THROW(top_probability(logits, scratch), Error);
}

TEST(Sampler, TopKKeepsExactlyTheKMostProbable) {
  const auto logits = logits_of(kProbabilities);
  for (int64_t k = 1; k <= 6; ++k) {
    SamplingParams params;
    params.top_k = k;
    const std::vector<float> probs = process(params, logits);
    const std::vector<int32_t> ranked = {2, 5, 3, 0, 4, 1};
    EXPECT_EQ(support(probs), std::set<int32_t>(ranked.begin(), ranked.begin() + k)) << "k " << k;
  }
  SamplingParams large;
  large.top_k = 1000;  // beyond the vocabulary: no filtering
  EXPECT_EQ(support(process(large, logits)).size(), 6u);
}

TEST(Sampler, TopKBreaksTiesByLowerId) {
  SamplingParams params;
  params.top_k = 2;
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 3.0f};
  EXPECT_EQ(support(process(params, logits)), (std::set<int32_t>{1, 2}));
}

TEST(Sampler, TopPKeepsTheFewestTokensReachingP) {
  const auto logits = logits_of(kProbabilities);
  const struct {
    float top_p;
    std::set<int32_t> kept;
  } cases[] = {{0.45f, {2}},
               {0.55f, {2, 5}},
               {0.69f, {2, 5}},
               {0.71f, {2, 5, 3}},
               {0.84f, {2, 5, 3}},
               {0.86f, {2, 5, 3, 0}},
               {0.96f, {2, 5, 3, 0, 4}},
               {0.99f, {2, 5, 3, 0, 4, 1}},
               {1.0f, {0, 1, 2, 3, 4, 5}}};
  for (const auto& c : cases) {
    SamplingParams params;
    params.top_p = c.top_p;
    const std::vector<float> probs = process(params, logits);
    EXPECT_EQ(support(probs), c.kept) << "top_p " << c.top_p;
    // Kept tokens keep their relative odds.
    double kept_mass = 0.0;
    for (const int32_t t : c.kept) kept_mass += kProbabilities[t];
    for (const int32_t t : c.kept) EXPECT_NEAR(probs[t], kProbabilities[t] / kept_mass, 1e-6);
  }
}

// process_logits ranks only as many candidates as the nucleus needs (64, then four times as
// many while their mass falls short): nuclei of every size, with and without top-k and with ties,
// must be the fewest tokens reaching p in the full order (probability, then lower id), as a sort
// of the whole vocabulary finds them.
TEST(Sampler, TopPOfLargeNucleiMatchesAFullSort) {
  std::mt19937 random(7);
  for (const size_t vocab : {50u, 1000u, 49152u}) {
    for (const float spread : {0.0f, 0.5f, 3.0f, 12.0f}) {
      std::normal_distribution<float> normal(0.0f, spread);
      std::vector<float> logits(vocab);
      // Rounded to a coarse grid so that many logits tie.
      for (float& logit : logits) logit = std::round(normal(random) * 4.0f) / 4.0f;
      for (const int32_t top_k : {0, 300}) {
        for (const float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
          SamplingParams params;
          params.temperature = 0.7f;
          params.top_k = top_k;
          params.top_p = top_p;
          const std::vector<float> probs = process(params, logits);
          // The reference: every token ranked.
          std::vector<double> weights(vocab);
          const float top = *std::max_element(logits.begin(), logits.end());
          for (size_t i = 0; i < vocab; ++i) {
            weights[i] = std::exp((static_cast<double>(logits[i]) - top) / 0.7);
          }
          std::vector<int32_t> order(vocab);
          std::iota(order.begin(), order.end(), 0);
          std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return weights[a] != weights[b] ? weights[a] > weights[b] : a < b;
          });
          const size_t candidates =
              top_k > 0 ? std::min<size_t>(vocab, static_cast<size_t>(top_k)) : vocab;
          double total = 0.0;
          for (size_t i = 0; i < candidates; ++i) total += weights[order[i]];
          double cumulative = 0.0;
          std::set<int32_t> expected;
          for (size_t i = 0; i < candidates && cumulative < top_p * total; ++i) {
            cumulative += weights[order[i]];
            expected.insert(order[i]);
          }
          EXPECT_EQ(support(probs), expected) << "vocab " << vocab << ", spread " << spread
                                              << ", top_k " << top_k << ", top_p " << top_p;
        }
      }
    }
  }
}

// process_logits ranks only the candidates above a floor (a prefix of the ranking), lowering the
// floor while they hold less than the filters keep: every combination of top-k, top-p and min-p,
// on rows flat, peaked, tied and so spread that most weights underflow, must keep the tokens and
// the probabilities a full sort of the vocabulary finds. The reference computes the same weights
// (exp_nonpositive, whose accuracy ExpNonpositiveIsWithinAnUlpOfTheLibrarys pins down) and sums
// kept masses in id order, as process_logits does.
TEST(Sampler, EveryFilterCombinationMatchesAFullSort) {
  std::mt19937 random(11);
  int64_t checked = 0;
  for (const size_t vocab : {7u, 1000u, 49152u}) {
    for (const float spread : {0.0f, 1.0f, 4.0f, 40.0f}) {
      std::normal_distribution<float> normal(0.0f, spread);
      std::vector<float> logits(vocab);
      for (float& logit : logits) logit = std::round(normal(random) * 4.0f) / 4.0f;
      logits[vocab / 2] = -INFINITY;  // a banned token
      for (const float temperature : {0.05f, 0.7f, 1.5f}) {
        for (const int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{40}, int64_t{5000}}) {
          for (const float top_p : {0.3f, 0.9f, 0.9999f, 1.0f}) {
            for (const float min_p : {0.0f, 0.001f, 0.2f}) {
              SamplingParams params;
              params.temperature = temperature;
              params.top_k = top_k;
              params.top_p = top_p;
              params.min_p = min_p;
              const std::vector<float> probs = process(params, logits);
              // The reference: every token ranked (weight, then lower id).
              const float top = *std::max_element(logits.begin(), logits.end());
              std::vector<double> weights(vocab);
              for (size_t i = 0; i < vocab; ++i) {
                weights[i] = exp_nonpositive((static_cast<double>(logits[i]) - top) *
                                             (1.0 / static_cast<double>(temperature)));
              }
              std::vector<int32_t> order(vocab);
              std::iota(order.begin(), order.end(), 0);
              std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
                return weights[a] != weights[b] ? weights[a] > weights[b] : a < b;
              });
              size_t kept = top_k > 0 ? std::min<size_t>(vocab, static_cast<size_t>(top_k)) : vocab;
              const auto id_order_total = [&](size_t count) {
                std::vector<int32_t> ids(order.begin(), order.begin() + count);
                std::sort(ids.begin(), ids.end());
                double total = 0.0;
                for (const int32_t id : ids) total += weights[id];
                return total;
              };
              if (top_p < 1.0f) {
                const double target = static_cast<double>(top_p) * id_order_total(kept);
                double cumulative = 0.0;
                size_t nucleus = 0;
                while (nucleus < kept && cumulative < target)
                  cumulative += weights[order[nucleus++]];
                kept = std::max<size_t>(nucleus, 1);
              }
              std::vector<int32_t> survivors;
              for (size_t i = 0; i < kept; ++i) {
                if (weights[order[i]] >= static_cast<double>(min_p)) survivors.push_back(order[i]);
              }
              std::sort(survivors.begin(), survivors.end());
              double total = 0.0;
              for (const int32_t id : survivors) total += weights[id];
              const std::string where = "vocab " + std::to_string(vocab) + ", spread " +
                                        std::to_string(spread) + ", temperature " +
                                        std::to_string(temperature) + ", top_k " +
                                        std::to_string(top_k) + ", top_p " + std::to_string(top_p) +
                                        ", min_p " + std::to_string(min_p);
              // Dropped tokens are exactly 0. Kept ones are within float rounding of the quotient
              // (and, without filters, of the weight and 1 / total apiece): a few units in 2^-24,
              // subnormal probabilities to their own spacing.
              std::vector<bool> survives(vocab, false);
              for (const int32_t id : survivors) survives[id] = true;
              for (size_t id = 0; id < vocab; ++id) {
                if (!survives[id]) {
                  ASSERT_EQ(probs[id], 0.0f) << where << ": token " << id << " dropped";
                  continue;
                }
                const double expected_p = weights[id] / total;
                ASSERT_NEAR(probs[id], expected_p, 3e-7 * expected_p + 1e-44)
                    << where << ": token " << id;
              }
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 4 * 3 * 4 * 4 * 3);
}

// exp_nonpositive, the weights' exponential: within 2 ulps of the library's (which is within one
// of the exact value) over the whole range that has non-zero results, subnormals included; 1 at 0;
// 0 at -infinity and below the smallest subnormal.
TEST(Sampler, ExpNonpositiveIsWithinAnUlpOfTheLibrarys) {
  const auto ulps_apart = [](double a, double b) {
    return std::abs(std::bit_cast<int64_t>(a) - std::bit_cast<int64_t>(b));
  };
  std::mt19937_64 random(5);
  std::uniform_real_distribution<double> wide(-750.0, 0.0), near_zero(-2.0, 0.0);
  int64_t worst = 0;
  for (int i = 0; i < 2000000; ++i) {
    const double x = i % 2 == 0 ? wide(random) : near_zero(random);
    worst = std::max(worst, ulps_apart(exp_nonpositive(x), std::exp(x)));
  }
  EXPECT_LE(worst, 2);
  for (const double x : {-0x1.0p-60, -1e-300, -0.5 * std::log(2.0), -std::log(2.0), -708.39, -708.4,
                         -745.0, -745.1}) {
    EXPECT_LE(ulps_apart(exp_nonpositive(x), std::exp(x)), 2) << x;
  }
  EXPECT_EQ(exp_nonpositive(0.0), 1.0);
  EXPECT_EQ(exp_nonpositive(-0.0), 1.0);
  EXPECT_EQ(exp_nonpositive(-746.0), 0.0);
  EXPECT_EQ(exp_nonpositive(-1e6), 0.0);
  EXPECT_EQ(exp_nonpositive(-INFINITY), 0.0);
}

// exp_nonpositive as the sampler's copies for x86-64-v4 and x86-64-v3 compile it (vectorised, with
// hardware fused multiply-adds), against this file's baseline build (std::fma in software or
// hardware, one rounding either way): the same bits, so a seed samples alike on every machine.
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void exp_row_v4(const std::vector<double>& x,
                                                          std::vector<double>& out) {
  for (size_t i = 0; i < x.size(); ++i) out[i] = exp_nonpositive(x[i]);
}
__attribute__((target("arch=x86-64-v3"))) void exp_row_v3(const std::vector<double>& x,
                                                          std::vector<double>& out) {
  for (size_t i = 0; i < x.size(); ++i) out[i] = exp_nonpositive(x[i]);
}

TEST(Sampler, ExpNonpositiveGivesTheSameBitsOnEveryInstructionSet) {
  std::mt19937_64 random(9);
  std::uniform_real_distribution<double> wide(-760.0, 0.0), near_zero(-3.0, 0.0);
  std::vector<double> x(100000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 2 == 0 ? wide(random) : near_zero(random);
  x[0] = 0.0;
  x[1] = -INFINITY;
  std::vector<double> baseline(x.size()), copy(x.size());
  for (size_t i = 0; i < x.size(); ++i) baseline[i] = exp_nonpositive(x[i]);
  const bool v3 = kernels::cpu::has_x86_64_v3();
  const bool v4 = kernels::cpu::has_x86_64_v4();
  if (!v3) GTEST_SKIP() << "this CPU has neither x86-64-v3 nor v4";
  exp_row_v3(x, copy);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(copy[i], baseline[i]) << "v3, x = " << x[i];
  if (!v4) return;
  exp_row_v4(x, copy);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(copy[i], baseline[i]) << "v4, x = " << x[i];
}

#endif  // __x86_64__

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTop) {
  const auto logits = logits_of(kProbabilities);
  const struct {
    float min_p;
    std::set<int32_t> kept;
  } cases[] = {{0.39f, {2, 5}},
               {0.41f, {2}},
               {0.25f, {2, 5, 3}},
               {0.19f, {2, 5, 3, 0}},
               {0.05f, {2, 5, 3, 0, 4}},
               {0.0f, {0, 1, 2, 3, 4, 5}},
               {1.0f, {2}}};
  for (const auto& c : cases) {
    SamplingParams params;
    params.min_p = c.min_p;
    EXPECT_EQ(support(process(params, logits)), c.kept) << "min_p " << c.min_p;
  }
}

TEST(Sampler, FiltersApplyInOrderTopKThenTopPThenMinP) {
  SamplingParams params;
  params.top_k = 3;     // {2, 5, 3}: renormalised 0.588, 0.235, 0.176
  params.top_p = 0.8f;  // 0.588 < 0.8 <= 0.823: {2, 5}
  params.min_p = 0.3f;  // 0.235 / 0.588 = 0.4 >= 0.3: both stay
  EXPECT_EQ(support(process(params, logits_of(kProbabilities))), (std::set<int32_t>{2, 5}));
  params.min_p = 0.5f;  // 0.4 < 0.5: only 2
  EXPECT_EQ(support(process(params, logits_of(kProbabilities))), (std::set<int32_t>{2}));
}

TEST(Sampler, TemperatureScalesLogits) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  SamplingParams params;
  params.temperature = 0.5f;
  const std::vector<float> probs = process(params, logits);
  const double z = 1.0 + std::exp(2.0) + std::exp(4.0);
  EXPECT_NEAR(probs[0], 1.0 / z, 1e-6);
  EXPECT_NEAR(probs[1], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(probs[2], std::exp(4.0) / z, 1e-6);
}

TEST(Sampler, TemperatureZeroIsArgmaxWithLowestIdOnTies) {
  SamplingParams params;
  params.temperature = 0.0f;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  const std::vector<float> probs = process(params, logits);
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f}));
  Sampler sampler(params);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(sampler.sample(logits), 1);
  EXPECT_EQ(argmax(logits), 1);
}

TEST(Sampler, ASeedReproducesAndAnotherSeedDiffers) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 1.7));
  auto draw = [&](uint64_t seed) {
    SamplingParams params;
    params.seed = seed;
    Sampler sampler(params);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 200; ++i) tokens.push_back(sampler.sample(logits));
    return tokens;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

// Pearson's chi-square statistic of observed counts against expected probabilities.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& expected,
                  int64_t draws) {
  double statistic = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability zero but was drawn";
      continue;
    }
    const double e = expected[i] * static_cast<double>(draws);
    statistic += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
  }
  return statistic;
}

TEST(Sampler, SamplesFollowTheProcessedDistribution) {
  // With a fixed seed the test is deterministic; the threshold is the 0.999 quantile of the
  // chi-square distribution, so a correct sampler passes for all but 1 in 1000 seeds, while a
  // bias of one percentage point on any token fails at this sample size. Both ways of drawing:
  // inverse CDF with each position's uniform, and Gumbel-max with each position's noise.
  const int64_t draws = 200000;
  const auto logits = logits_of(kProbabilities);
  for (const bool shared_noise : {false, true}) {
    SCOPED_TRACE(shared_noise ? "shared noise" : "inverse CDF");
    SamplingParams params;
    params.seed = 1234;
    params.top_k = 5;  // drops token 1
    params.shared_noise = shared_noise;
    Sampler sampler(params);
    std::vector<int64_t> counts(kProbabilities.size(), 0);
    for (int64_t i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.sample(logits))];
    std::vector<double> expected(kProbabilities.size());
    for (size_t i = 0; i < expected.size(); ++i)
      expected[i] = i == 1 ? 0.0 : kProbabilities[i] / 0.98;
    // 4 degrees of freedom (5 possible tokens); chi-square 0.999 quantile: 18.47.
    EXPECT_LT(chi_square(counts, expected, draws), 18.47);
  }
}

TEST(Sampler, TheNthSampleIsDrawnWithPositionNsNumbers) {
  // A sampler's draws are a function of (seed, position): the n-th sample of a fresh sampler is
  // the token draw_token picks for position n, whatever was sampled before.
  const auto logits = logits_of(kProbabilities);
  for (const bool shared_noise : {false, true}) {
    SamplingParams params;
    params.seed = 99;
    params.shared_noise = shared_noise;
    std::vector<float> probs(logits.size());
    process_logits(params, logits, probs);
    Sampler sampler(params);
    const RandomStream stream(99);
    for (int64_t n = 0; n < 50; ++n) {
      EXPECT_EQ(sampler.sample(logits), draw_token(params, probs, stream, n, Draw::kToken))
          << "position " << n;
    }
  }
}

TEST(Sampler, SampleFromUnnormalisedWeights) {
  const std::vector<float> weights = {0.0f, 3.0f, 0.0f, 1.0f};
  std::vector<int64_t> counts(4, 0);
  const int64_t draws = 100000;
  const RandomStream stream(5);
  for (int64_t i = 0; i < draws; ++i) {
    ++counts[static_cast<size_t>(sample_from(weights, stream.uniform(i, Draw::kToken)))];
  }
  // 1 degree of freedom; 0.999 quantile 10.83.
  EXPECT_LT(chi_square(counts, {0.0, 0.75, 0.0, 0.25}, draws), 10.83);
  std::vector<int64_t> noise_counts(4, 0);
  for (int64_t i = 0; i < draws; ++i) {
    ++noise_counts[static_cast<size_t>(sample_with_noise(weights, stream, i))];
  }
  EXPECT_LT(chi_square(noise_counts, {0.0, 0.75, 0.0, 0.25}, draws), 10.83);
}

TEST(Sampler, BestWithNoiseRanksTheSharedNoiseDrawsWinnersInTurn) {
  // Against every token's score p / -log u scored in full: the draw's winner first, then the
  // tokens that would win with the ones before removed; none of probability zero.
  const RandomStream stream(11);
  std::vector<float> probs(37);
  for (size_t x = 0; x < probs.size(); ++x) probs[x] = x % 5 == 0 ? 0.0f : 1.0f + float(x % 7);
  for (int64_t position = 0; position < 200; ++position) {
    std::vector<std::pair<double, int32_t>> scored;
    for (size_t x = 0; x < probs.size(); ++x) {
      if (probs[x] == 0.0f) continue;
      const kernels::PhiloxWords noise =
          stream.block(position, Draw::kNoise, static_cast<uint32_t>(x / 4));
      const double u = (static_cast<double>(noise.v[x % 4]) + 0.5) * 0x1.0p-32;
      scored.push_back({-(probs[x] / -std::log(u)), static_cast<int32_t>(x)});
    }
    std::sort(scored.begin(), scored.end());
    std::vector<int32_t> best(4);
    best_with_noise(probs, stream, position, best);
    ASSERT_EQ(best[0], sample_with_noise(probs, stream, position)) << "position " << position;
    for (size_t k = 0; k < best.size(); ++k) ASSERT_EQ(best[k], scored[k].second) << k;
  }
  // Fewer tokens with mass than asked for: -1 past them.
  std::vector<int32_t> best(3);
  best_with_noise(std::vector<float>{0.0f, 0.4f, 0.0f, 0.6f}, stream, 0, best);
  EXPECT_EQ(best[2], -1);
  EXPECT_TRUE((best[0] == 1 && best[1] == 3) || (best[0] == 3 && best[1] == 1));
}

TEST(Sampler, DrawsOverPartOfTheVocabularyAreTheFullRowsDraws) {
  // A reduced head's row: probabilities for some tokens alone (their ids given), every other
  // token's zero. Each draw names the token the full row's draw names, with the full row's noise.
  std::mt19937 random(17);
  std::uniform_real_distribution<float> mass(0.0f, 1.0f);
  const RandomStream stream(23);
  int64_t different_entries = 0;  // draws whose entry index is not the token: the map is used
  for (int trial = 0; trial < 200; ++trial) {
    const size_t vocab = 40 + static_cast<size_t>(trial % 50);
    std::vector<int32_t> tokens;  // strictly increasing, about half the vocabulary
    for (size_t x = 0; x < vocab; ++x) {
      if (mass(random) < 0.5f) tokens.push_back(static_cast<int32_t>(x));
    }
    if (tokens.empty()) tokens.push_back(static_cast<int32_t>(vocab - 1));
    std::vector<float> part(tokens.size());
    std::vector<float> full(vocab, 0.0f);
    for (size_t i = 0; i < tokens.size(); ++i) {
      // Some of the scored tokens have no mass either (a filter dropped them).
      part[i] = mass(random) < 0.3f ? 0.0f : mass(random);
      full[static_cast<size_t>(tokens[i])] = part[i];
    }
    if (std::all_of(part.begin(), part.end(), [](float p) { return p == 0.0f; })) {
      part.back() = 1.0f;
      full[static_cast<size_t>(tokens.back())] = 1.0f;
    }
    const int64_t position = trial * 7;
    SCOPED_TRACE("trial " + std::to_string(trial));
    SamplingParams params;
    params.temperature = 1.0f;
    for (const bool shared_noise : {false, true}) {
      params.shared_noise = shared_noise;
      const int32_t token = draw_token(params, part, stream, position, Draw::kDraft, tokens);
      ASSERT_EQ(token, draw_token(params, full, stream, position, Draw::kDraft));
      const auto entry = std::find(tokens.begin(), tokens.end(), token) - tokens.begin();
      different_entries += token != static_cast<int32_t>(entry) ? 1 : 0;
    }
    ASSERT_EQ(sample_with_noise(part, stream, position, tokens),
              sample_with_noise(full, stream, position));
    std::vector<int32_t> from_part(6), from_full(6);
    best_with_noise(part, stream, position, from_part, tokens);
    best_with_noise(full, stream, position, from_full);
    ASSERT_EQ(from_part, from_full);
  }
  EXPECT_GT(different_entries, 100);
  // Ids that do not match the probabilities are a caller's error, not a draw.
  const std::vector<int32_t> too_few = {0, 2};
  EXPECT_ANY_THROW(sample_with_noise(std::vector<float>{0.5f, 0.2f, 0.3f}, stream, 0, too_few));
}

TEST(Sampler, HighestRanksValuesWithTiesToTheLowerIdAndSkipsBannedTokens) {
  const float banned = -std::numeric_limits<float>::infinity();
  const std::vector<float> values = {0.5f, 2.0f, banned, 2.0f, -1.0f, 3.0f};
  std::vector<int32_t> top(4);
  highest(values, top);
  EXPECT_EQ(top, (std::vector<int32_t>{5, 1, 3, 0}));
  std::vector<int32_t> all(7);
  highest(values, all);
  EXPECT_EQ(all, (std::vector<int32_t>{5, 1, 3, 0, 4, -1, -1}));
}

TEST(Sampler, BannedTokensAndCorruptLogits) {
  // -inf bans a token; NaN or +inf means the forward pass went wrong and must not be sampled.
  SamplingParams params;
  const std::vector<float> banned = {0.0f, -INFINITY, 0.0f};
  EXPECT_EQ(support(process(params, banned)), (std::set<int32_t>{0, 2}));
  std::vector<float> probs(3);
  for (const float bad : {std::nanf(""), INFINITY}) {
    const std::vector<float> logits = {0.0f, bad, 1.0f};
    EXPECT_THROW(process_logits(params, logits, probs), Error);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    EXPECT_THROW(process_logits(greedy, logits, probs), Error);
  }
  const std::vector<float> all_banned(3, -INFINITY);
  EXPECT_THROW(process_logits(params, all_banned, probs), Error);
}

// A row's scan runs 16 lanes at a time and a masked tail: the maximum and a corrupt value are
// found at every position of a row that is not a multiple of 16 long, beside -infinity.
TEST(Sampler, FindsTheMaximumAndCorruptValuesAtEveryPosition) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (const size_t size : {size_t{1}, size_t{15}, size_t{16}, size_t{37}}) {
    std::vector<float> probs(size);
    for (size_t at = 0; at < size; ++at) {
      std::vector<float> logits(size, -3.0f);
      if (size > 1) logits[(at + 1) % size] = -INFINITY;
      logits[at] = 2.5f;
      EXPECT_EQ(argmax(logits), static_cast<int32_t>(at)) << size << " " << at;
      process_logits(greedy, logits, probs);
      EXPECT_EQ(probs[at], 1.0f) << size << " " << at;
      EXPECT_NEAR(top_probability(logits, probs),
                  1.0 / (1.0 + (size - 1 - (size > 1)) * std::exp(-5.5)), 1e-6);
      for (const float bad : {std::nanf(""), INFINITY}) {
        logits[at] = bad;
        EXPECT_THROW(process_logits(greedy, logits, probs), Error) << size << " " << at;
        logits[at] = 2.5f;
      }
    }
  }
}

TEST(Sampler, RejectsOutOfRangeParameters) {
  auto expect_rejected = [](SamplingParams params, const std::string& name) {
    try {
      validate_sampling(params);
      ADD_FAILURE() << name << " accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
    }
  };
  SamplingParams p;
  p.temperature = -0.1f;
  expect_rejected(p, "temperature");
  p = {};
  p.temperature = std::nanf("");
  expect_rejected(p, "temperature");
  p = {};
  p.top_k = -1;
  expect_rejected(p, "top_k");
  p = {};
  p.top_p = 0.0f;
  expect_rejected(p, "top_p");
  p = {};
  p.top_p = 1.01f;
  expect_rejected(p, "top_p");
  p = {};
  p.min_p = -0.5f;
  expect_rejected(p, "min_p");
  p = {};
  p.min_p = 1.5f;
  expect_rejected(p, "min_p");
  EXPECT_THROW({ Sampler sampler(p); }, Error);
}

// Backend::sample's reference row (kernels/cpu/sampling.h's sample_row) is the row functions
// the host drafting called one by one: the drawn token, the ranking and the weights are theirs,
// and a reduced head's compact row gives the full row's answers in token ids.
kernels::SampleRow sample_row_of(const SamplingParams& params, uint64_t seed, int64_t position,
                                 int32_t ranked, int32_t probe) {
  kernels::SampleRow row{};
  row.settings = logits_settings(params);
  row.seed = seed;
  row.position = position;
  row.rule = params.temperature == 0.0f ? kernels::SampleRule::kArgmax
             : params.shared_noise      ? kernels::SampleRule::kSharedNoise
                                        : kernels::SampleRule::kInverseCdf;
  row.draw = Draw::kDraft;
  row.ranked = ranked;
  row.probe = probe;
  row.weigh = 1;
  return row;
}

TEST(SampleRow, IsTheRowFunctionsOneByOne) {
  std::mt19937 engine(11);
  std::uniform_real_distribution<float> spread(-6.0f, 6.0f);
  const size_t vocab = 301;
  for (int trial = 0; trial < 60; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::vector<float> logits(vocab);
    for (float& logit : logits) logit = spread(engine);
    logits[17] = -std::numeric_limits<float>::infinity();  // a banned token
    SamplingParams params;
    params.temperature = trial % 3 == 0 ? 0.0f : 0.9f;
    params.top_k = trial % 4 == 1 ? 40 : 0;
    params.top_p = trial % 5 == 2 ? 0.8f : 1.0f;
    params.shared_noise = trial % 2 == 1;
    const uint64_t seed = 500 + static_cast<uint64_t>(trial);
    const int64_t position = trial % 7;
    const int32_t probe = static_cast<int32_t>(engine() % vocab);
    const kernels::SampleRow row = sample_row_of(params, seed, position, 6, probe);
    std::vector<float> q(vocab);
    kernels::SampledRow out{};
    kernels::cpu::sample_row(row, logits, {}, q, &out);
    ASSERT_EQ(out.status, 0);

    EXPECT_EQ(q, process(params, logits));
    const RandomStream stream(seed);
    const int32_t token = params.temperature == 0.0f
                              ? argmax(logits)
                              : draw_token(params, q, stream, position, Draw::kDraft);
    EXPECT_EQ(out.token, token);
    std::vector<int32_t> ranked(6);
    if (params.temperature == 0.0f) {
      highest(logits, ranked);
    } else if (params.shared_noise) {
      best_with_noise(q, stream, position, ranked);
    } else {
      highest(q, ranked);
    }
    EXPECT_EQ(std::vector<int32_t>(out.ranked, out.ranked + 6), ranked);
    for (int k = 6; k < kernels::kMaxRanked; ++k) EXPECT_EQ(out.ranked[k], -1);
    std::vector<float> weights(vocab);
    EXPECT_EQ(out.top_probability, top_probability(logits, weights));
    EXPECT_EQ(out.token_weight, weights[static_cast<size_t>(out.token)]);
    EXPECT_EQ(out.probe_weight, weights[static_cast<size_t>(probe)]);
    for (int k = 0; k < 6; ++k) {
      if (out.ranked[k] >= 0) {
        EXPECT_EQ(out.ranked_weight[k], weights[static_cast<size_t>(out.ranked[k])]);
      }
    }
  }
}

TEST(SampleRow, AReducedHeadsRowGivesTheFullRowsAnswers) {
  std::mt19937 engine(12);
  std::uniform_real_distribution<float> spread(-5.0f, 5.0f);
  const size_t vocab = 240;
  std::vector<int32_t> map;  // every third token
  for (int32_t t = 1; t < static_cast<int32_t>(vocab); t += 3) map.push_back(t);
  for (int trial = 0; trial < 45; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::vector<float> compact(map.size());
    for (float& logit : compact) logit = spread(engine);
    std::vector<float> full(vocab, -std::numeric_limits<float>::infinity());
    for (size_t i = 0; i < map.size(); ++i) full[static_cast<size_t>(map[i])] = compact[i];
    SamplingParams params;
    params.temperature = trial % 3 == 0 ? 0.0f : 1.1f;
    params.min_p = trial % 4 == 3 ? 0.02f : 0.0f;
    params.shared_noise = trial % 2 == 0;
    // The probe: a scored token, or one the head does not score (weight 0).
    const int32_t probe = trial % 2 == 0 ? map[static_cast<size_t>(trial) % map.size()] : 0;
    const kernels::SampleRow row =
        sample_row_of(params, 900 + static_cast<uint64_t>(trial), trial, 5, probe);
    std::vector<float> q_compact(map.size()), q_full(vocab);
    kernels::SampledRow from_compact{}, from_full{};
    kernels::cpu::sample_row(row, compact, map, q_compact, &from_compact);
    kernels::cpu::sample_row(row, full, {}, q_full, &from_full);
    ASSERT_EQ(from_compact.status, 0);
    EXPECT_EQ(from_compact.token, from_full.token);
    EXPECT_EQ(std::vector<int32_t>(from_compact.ranked, from_compact.ranked + 5),
              std::vector<int32_t>(from_full.ranked, from_full.ranked + 5));
    EXPECT_FLOAT_EQ(from_compact.token_weight, from_full.token_weight);
    EXPECT_FLOAT_EQ(from_compact.probe_weight, from_full.probe_weight);
    EXPECT_DOUBLE_EQ(from_compact.top_probability, from_full.top_probability);
    for (size_t i = 0; i < map.size(); ++i) {
      EXPECT_FLOAT_EQ(q_compact[i], q_full[static_cast<size_t>(map[i])]);
    }
  }
}

TEST(SampleRow, AFailedRowReportsWhyAndDrawsNothing) {
  const std::vector<float> logits = {0.5f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
  kernels::SampleRow row = sample_row_of(SamplingParams{}, 1, 0, 2, -1);
  std::vector<float> q(3, 9.0f);
  kernels::SampledRow out{};
  kernels::cpu::sample_row(row, logits, {}, q, &out);
  EXPECT_EQ(out.status, static_cast<int32_t>(kernels::RowStatus::kCorruptLogits));
  EXPECT_EQ(out.token, -1);
  EXPECT_EQ(out.ranked[0], -1);
  EXPECT_EQ(q, std::vector<float>(3, 0.0f));
  const std::vector<float> finite = {0.5f, 0.1f, 1.0f};
  row.rule = static_cast<kernels::SampleRule>(9);
  kernels::cpu::sample_row(row, finite, {}, q, &out);
  EXPECT_EQ(out.status, static_cast<int32_t>(kernels::RowStatus::kBadSettings));
  EXPECT_EQ(out.token, -1);
  row = sample_row_of(SamplingParams{}, 1, 0, static_cast<int32_t>(kernels::kMaxRanked) + 1, -1);
  kernels::cpu::sample_row(row, finite, {}, q, &out);
  EXPECT_EQ(out.status, static_cast<int32_t>(kernels::RowStatus::kBadSettings));
}

TEST(SampleRow, TheOpRefusesAShapeItCannotTake) {
  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(1));
  std::vector<float> logits(8, 0.0f), q(8);
  const kernels::SampleRow row = sample_row_of(SamplingParams{}, 1, 0, 0, -1);
  kernels::SampledRow out{};
  // Token ids past the row need a token map naming them; a row needs an entry.
  for (const kernels::SampleParams params :
       {kernels::SampleParams{1, 8, 9}, kernels::SampleParams{1, 0, 0},
        kernels::SampleParams{-1, 8, 8}}) {
    const Status status = cpu.sample(params, &row, logits.data(), nullptr, q.data(), &out, nullptr);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(status.to_string().find("sample:"), std::string::npos) << status.to_string();
  }
  // A map may name ids past the row: entry 3, the argmax, is token 6.
  const std::vector<int32_t> map = {0, 2, 4, 6, 8, 10, 12, 14};
  logits[3] = 1.0f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const kernels::SampleRow argmax_row = sample_row_of(greedy, 1, 0, 0, -1);
  int32_t drawn = -7;
  EXPECT_TRUE(cpu.sample({1, 8, 15}, &argmax_row, logits.data(), map.data(), q.data(), &out, &drawn)
                  .is_ok());
  EXPECT_EQ(out.token, 6);
  EXPECT_EQ(drawn, 6);
}

TEST(SampleRow, TheOpWritesEachTokenAgainForTheNextForwardAndZeroForAFailedRow) {
  // `drawn` is what a model's next forward reads on the backend: contiguous, and a valid id even
  // where the row failed (its status says so), so that no forward indexes past the embeddings.
  kernels::cpu::CpuBackend cpu(std::make_shared<kernels::cpu::ThreadPool>(2));
  const int64_t width = 8;
  std::vector<float> logits(3 * width, 0.0f), q(3 * width);
  logits[0 * width + 5] = 2.0f;
  logits[1 * width + 0] = std::numeric_limits<float>::quiet_NaN();
  logits[2 * width + 3] = 2.0f;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<kernels::SampleRow> rows(3, sample_row_of(greedy, 1, 0, 0, -1));
  std::vector<kernels::SampledRow> out(3);
  std::vector<int32_t> drawn(3, -7);
  ASSERT_TRUE(cpu.sample({3, width, width}, rows.data(), logits.data(), nullptr, q.data(),
                         out.data(), drawn.data())
                  .is_ok());
  EXPECT_EQ(out[0].token, 5);
  EXPECT_EQ(out[1].token, -1);
  EXPECT_NE(out[1].status, static_cast<int32_t>(kernels::RowStatus::kOk));
  EXPECT_EQ(out[2].token, 3);
  EXPECT_EQ(drawn, (std::vector<int32_t>{5, 0, 3}));
}

}  // namespace
}  // namespace specrun
