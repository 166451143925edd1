// The counter-based random numbers of sampling and verification: Philox4x32-10 against its
// published known answers, the stream's independence of purposes and positions, and Gumbel-max
// sampling with shared noise (exact against a full scan, distributed as p, coupled as the theory
// says).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "kernels/core/philox.h"
#include "kernels/core/random_stream.h"
#include "runtime/base/check.h"
#include "runtime/sampling/rng.h"
#include "tests/host_sampling.h"
#include "tests/verify_testing.h"

namespace specrun {
namespace {

TEST(Philox, MatchesTheKnownAnswers) {
  // Random123's kat_vectors for philox4x32_10: counter (4 words), key (2 words), output.
  struct Case {
    uint32_t counter[4];
    uint32_t key[2];
    uint32_t expected[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Case& c : cases) {
    const kernels::PhiloxWords out = kernels::philox4x32_10(
        c.counter[0], c.counter[1], c.counter[2], c.counter[3], c.key[0], c.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], c.expected[i]) << "word " << i;
  }
}

TEST(RandomStream, EveryPurposePositionAndSeedHasItsOwnNumbers) {
  std::set<double> seen;
  const Draw draws[] = {Draw::kToken, Draw::kAcceptance, Draw::kDraft, Draw::kNoise};
  for (const uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 32, ~uint64_t{0}}) {
    const RandomStream stream(seed);
    for (const int64_t position : {int64_t{0}, int64_t{1}, int64_t{1} << 32, int64_t{12345}}) {
      for (const Draw draw : draws) {
        const double u = stream.uniform(position, draw);
        EXPECT_GE(u, 0.0);
        EXPECT_LT(u, 1.0);
        EXPECT_TRUE(seen.insert(u).second) << "seed " << seed << " position " << position;
        // A pure function: asked again, the same number.
        EXPECT_EQ(RandomStream(seed).uniform(position, draw), u);
      }
    }
  }
}

TEST(RandomStream, UniformsAreUniform) {
  // 16 equal bins over 160,000 positions; 15 degrees of freedom, 0.999 quantile 37.70.
  const RandomStream stream(2024);
  std::vector<int64_t> bins(16, 0);
  const int64_t draws = 160000;
  for (int64_t i = 0; i < draws; ++i) {
    ++bins[static_cast<size_t>(stream.uniform(i, Draw::kToken) * 16.0)];
  }
  double statistic = 0.0;
  for (const int64_t count : bins) {
    const double e = static_cast<double>(draws) / 16.0;
    statistic += (static_cast<double>(count) - e) * (static_cast<double>(count) - e) / e;
  }
  EXPECT_LT(statistic, 37.70);
}

// Gumbel-max by scoring every token: argmax p / -log(u), no bound, ties to the lower id.
int32_t full_scan(std::span<const float> probs, const RandomStream& stream, int64_t position) {
  int32_t best = -1;
  double best_score = 0.0;
  for (size_t x = 0; x < probs.size(); ++x) {
    if (!(probs[x] > 0.0f)) continue;
    const kernels::PhiloxWords noise =
        stream.block(position, Draw::kNoise, static_cast<uint32_t>(x / 4));
    const double u = (static_cast<double>(noise.v[x % 4]) + 0.5) * 0x1.0p-32;
    const double score = static_cast<double>(probs[x]) / -std::log(u);
    if (best < 0 || score > best_score) {
      best = static_cast<int32_t>(x);
      best_score = score;
    }
  }
  return best;
}

TEST(SampleWithNoise, EqualsAFullScanOfEveryToken) {
  // The bound that skips logarithms must never change the winner: random distributions with
  // zeros, a peaked one, a flat one, a vocabulary that is not a multiple of four.
  Rng rng(11);
  for (const size_t vocab : {size_t{5}, size_t{1001}, size_t{49152}}) {
    for (int shape = 0; shape < 4; ++shape) {
      std::vector<float> probs(vocab);
      for (float& p : probs) {
        const double u = rng.uniform();
        p = shape == 0   ? static_cast<float>(u)
            : shape == 1 ? (u < 0.7 ? 0.0f : static_cast<float>(u))
            : shape == 2 ? static_cast<float>(std::exp(-30.0 * u))
                         : 1.0f;
      }
      for (int64_t position = 0; position < 200; ++position) {
        const RandomStream stream(static_cast<uint64_t>(shape) * 7 + vocab);
        ASSERT_EQ(sample_with_noise(probs, stream, position), full_scan(probs, stream, position))
            << "vocab " << vocab << " shape " << shape << " position " << position;
      }
    }
  }
}

TEST(SampleWithNoise, FollowsTheDistribution) {
  const std::vector<float> probs = {0.05f, 0.0f, 0.4f, 0.15f, 0.25f, 0.1f, 0.05f};
  const int64_t draws = 200000;
  std::map<int64_t, int64_t> counts;
  const RandomStream stream(31);
  for (int64_t i = 0; i < draws; ++i) ++counts[sample_with_noise(probs, stream, i)];
  std::map<int64_t, double> expected;
  for (size_t x = 0; x < probs.size(); ++x) expected[static_cast<int64_t>(x)] = probs[x];
  const auto check = testing::chi_square(counts, expected, draws);
  EXPECT_LT(check.statistic, check.critical()) << "df " << check.degrees;
  // Sharp enough to see a small bias: the same counts against a distribution moved by 0.01.
  std::map<int64_t, double> moved = expected;
  moved[2] -= 0.01;
  moved[3] += 0.01;
  const auto wrong = testing::chi_square(counts, moved, draws);
  EXPECT_GT(wrong.statistic, wrong.critical());
}

TEST(SampleWithNoise, SharedNoiseCouplesTwoDistributionsAsGumbelCouplingDoes) {
  // Two distributions drawn with the same noise agree with probability between the Gumbel
  // coupling's bound (1 - tv) / (1 + tv) and the best any coupling can do, 1 - tv.
  const std::vector<float> p = {0.10f, 0.20f, 0.30f, 0.40f};
  const std::vector<float> q = {0.50f, 0.30f, 0.15f, 0.05f};
  double tv = 0.0;
  for (size_t x = 0; x < p.size(); ++x) tv += 0.5 * std::fabs(p[x] - q[x]);
  const int64_t draws = 200000;
  int64_t agree = 0;
  const RandomStream stream(77);
  for (int64_t i = 0; i < draws; ++i) {
    agree += sample_with_noise(p, stream, i) == sample_with_noise(q, stream, i);
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(draws);
  EXPECT_GT(rate, (1.0 - tv) / (1.0 + tv));
  EXPECT_LT(rate, 1.0 - tv);
  // Identical distributions always agree; independent noise would not.
  for (int64_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(sample_with_noise(p, stream, i), sample_with_noise(p, stream, i));
  }
}

TEST(SampleWithNoise, NoMassIsAnError) {
  const std::vector<float> empty(8, 0.0f);
  EXPECT_THROW(sample_with_noise(empty, RandomStream(1), 0), Error);
  EXPECT_THROW(sample_from(empty, 0.5), Error);
}

}  // namespace
}  // namespace specrun
