#include <gtest/gtest.h>

#include <set>

#include "runtime/kv/kv_cache.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

// `count` token ids from `first` on.
std::vector<int32_t> ids(int64_t count, int32_t first = 10) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first + static_cast<int32_t>(i);
  return tokens;
}

class KvCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(1);
  KvCache cache_{*backend_, KvCacheLayout{2, 2, 4, /*block_size=*/4, /*num_blocks=*/5}};
};

TEST_F(KvCacheTest, AppendAllocatesWholeBlocks) {
  const SequenceId s = cache_.add_sequence();
  EXPECT_EQ(cache_.length(s), 0);
  cache_.append(s, ids(1));
  EXPECT_EQ(cache_.block_table(s).size(), 1u);
  cache_.append(s, ids(3));
  EXPECT_EQ(cache_.block_table(s).size(), 1u);
  cache_.append(s, ids(1));
  EXPECT_EQ(cache_.block_table(s).size(), 2u);
  EXPECT_EQ(cache_.length(s), 5);
  EXPECT_EQ(cache_.free_blocks(), 3);
}

TEST_F(KvCacheTest, SlotsFollowTheBlockTable) {
  const SequenceId a = cache_.add_sequence();
  const SequenceId b = cache_.add_sequence();
  cache_.append(a, ids(2));
  cache_.append(b, ids(5));
  cache_.append(a, ids(4));
  std::set<int32_t> slots;
  for (const SequenceId s : {a, b}) {
    for (int64_t p = 0; p < cache_.length(s); ++p) {
      const int32_t slot = cache_.slot(s, p);
      EXPECT_EQ(slot, cache_.block_table(s)[p / 4] * 4 + p % 4);
      EXPECT_TRUE(slots.insert(slot).second) << "slot " << slot << " handed out twice";
    }
  }
  EXPECT_THROW(cache_.slot(a, cache_.length(a)), Error);
}

TEST_F(KvCacheTest, TruncateFreesBlocksPastTheNewLength) {
  const SequenceId s = cache_.add_sequence();
  cache_.append(s, ids(13));  // 4 blocks
  EXPECT_EQ(cache_.free_blocks(), 1);
  cache_.truncate(s, 9);  // 3 blocks
  EXPECT_EQ(cache_.free_blocks(), 2);
  EXPECT_EQ(cache_.length(s), 9);
  cache_.truncate(s, 8);  // exactly 2 blocks
  EXPECT_EQ(cache_.block_table(s).size(), 2u);
  cache_.truncate(s, 0);
  EXPECT_EQ(cache_.free_blocks(), 5);
  EXPECT_THROW(cache_.truncate(s, 1), Error);  // cannot grow by truncating
  EXPECT_THROW(cache_.truncate(s, -1), Error);
}

TEST_F(KvCacheTest, ExhaustionIsAllOrNothingAcrossSequences) {
  const SequenceId a = cache_.add_sequence();
  const SequenceId b = cache_.add_sequence();
  cache_.append(a, ids(6));  // 2 blocks
  const std::vector<int32_t> table_before(cache_.block_table(a).begin(),
                                          cache_.block_table(a).end());
  // a needs 1 more block, b needs 3: 4 > 3 free.
  const std::vector<int32_t> four = ids(4), nine = ids(9);
  const KvGrowth growth[] = {{a, four}, {b, nine}};
  EXPECT_THROW(cache_.append(growth), KvCacheFullError);
  EXPECT_EQ(cache_.length(a), 6);
  EXPECT_EQ(cache_.length(b), 0);
  EXPECT_EQ(cache_.free_blocks(), 3);
  EXPECT_EQ(std::vector<int32_t>(cache_.block_table(a).begin(), cache_.block_table(a).end()),
            table_before);
  try {
    cache_.append(b, ids(100));
  } catch (const KvCacheFullError& error) {
    EXPECT_NE(std::string(error.what()).find("KV cache full"), std::string::npos);
  }
  // What fits still fits.
  const std::vector<int32_t> eight = ids(8);
  const KvGrowth fits[] = {{a, four}, {b, eight}};
  cache_.append(fits);
  EXPECT_EQ(cache_.free_blocks(), 0);
}

TEST_F(KvCacheTest, OneAppendNamingASequenceTwiceIsRejected) {
  const SequenceId a = cache_.add_sequence();
  const std::vector<int32_t> four = ids(4);
  const KvGrowth twice[] = {{a, four}, {a, four}};
  EXPECT_THROW(cache_.append(twice), Error);
  EXPECT_EQ(cache_.length(a), 0);
  EXPECT_EQ(cache_.free_blocks(), 5);
}

TEST_F(KvCacheTest, RemovedSequencesReturnTheirBlocks) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(20));
  EXPECT_EQ(cache_.free_blocks(), 0);
  cache_.remove_sequence(a);
  EXPECT_FALSE(cache_.has_sequence(a));
  EXPECT_EQ(cache_.free_blocks(), 5);
  EXPECT_THROW(cache_.length(a), Error);
  const SequenceId b = cache_.add_sequence();
  EXPECT_NE(a, b);  // ids are never reused
  cache_.append(b, ids(20));
}

TEST_F(KvCacheTest, LayerPoolsAreDistinctAndInsideTheAllocation) {
  // 5 blocks of 4 slots of 2 heads of 4 channels, bf16 (the default) then f32.
  const auto byte_distance = [](void* to, void* from) {
    return static_cast<char*>(to) - static_cast<char*>(from);
  };
  const int64_t pool_bf16 = 5 * 4 * 2 * 4 * 2;
  EXPECT_EQ(byte_distance(cache_.values(0), cache_.keys(0)), pool_bf16);
  EXPECT_EQ(byte_distance(cache_.keys(1), cache_.keys(0)), 2 * pool_bf16);
  EXPECT_EQ(cache_.bytes_per_token(), 2u * 2 * 2 * 4 * 2);
  EXPECT_THROW(cache_.keys(2), Error);

  KvCache f32(*backend_, KvCacheLayout{2, 2, 4, 4, 5, DType::kF32});
  EXPECT_EQ(byte_distance(f32.values(0), f32.keys(0)), 2 * pool_bf16);
  EXPECT_EQ(byte_distance(f32.keys(1), f32.keys(0)), 4 * pool_bf16);
  EXPECT_EQ(f32.bytes_per_token(), 2u * 2 * 2 * 4 * 4);
}

TEST(KvCacheLayoutTest, ACacheDtypeOtherThanBf16OrF32IsOneError) {
  auto backend = testing::make_cpu_backend(1);
  testing::expect_error(
      [&] {
        KvCache(*backend, KvCacheLayout{1, 1, 4, 4, 4, DType::kF8E4M3});
      },
      {"KV cache", "F8_E4M3"});
}

// ---- prefix caching ----------------------------------------------------------------------------

std::vector<int32_t> table(const KvCache& cache, SequenceId sequence) {
  return {cache.block_table(sequence).begin(), cache.block_table(sequence).end()};
}

TEST_F(KvCacheTest, SealedFullBlocksAreReusedByASequenceWithTheSamePrefix) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(10));  // blocks: 4 + 4 full, 2 in the third
  cache_.seal(a, 10);
  EXPECT_EQ(cache_.cached_blocks(), 2);  // never the partial third block
  const SequenceId b = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(b, ids(10)), 8);
  EXPECT_EQ(cache_.length(b), 8);
  const std::vector<int32_t> shared = table(cache_, b);
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(shared[0], table(cache_, a)[0]);
  EXPECT_EQ(shared[1], table(cache_, a)[1]);
  EXPECT_EQ(cache_.free_blocks(), 2);  // a's three blocks, two of them shared with b
  // b's own tokens go to a block of its own: a shared block is never written.
  cache_.append(b, ids(2, 18));
  EXPECT_NE(table(cache_, b)[2], table(cache_, a)[2]);
  for (int64_t position = 8; position < 10; ++position) {
    EXPECT_EQ(cache_.slot(b, position) / 4, table(cache_, b)[2]);
  }
  // Removing a keeps b's shared blocks: b still holds them.
  cache_.remove_sequence(a);
  EXPECT_EQ(table(cache_, b)[0], shared[0]);
  EXPECT_EQ(cache_.free_blocks(), 5 - 3);
}

TEST_F(KvCacheTest, OnlyMatchingWholeBlocksAreReused) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(12));
  cache_.seal(a, 12);
  std::vector<int32_t> second_block_differs = ids(12);
  second_block_differs[5] = 99;
  std::vector<int32_t> first_token_differs = ids(12);
  first_token_differs[0] = 99;
  const std::pair<std::vector<int32_t>, int64_t> cases[] = {{ids(12), 12},
                                                            {ids(11), 8},
                                                            {ids(8), 8},
                                                            {ids(7), 4},
                                                            {ids(3), 0},
                                                            {second_block_differs, 4},
                                                            {first_token_differs, 0},
                                                            {ids(12, 11), 0}};
  for (const auto& [tokens, expected] : cases) {
    const SequenceId s = cache_.add_sequence();
    EXPECT_EQ(cache_.reuse_prefix(s, tokens), expected) << "prompt of " << tokens.size();
    cache_.remove_sequence(s);
  }
  // Only sealed positions are shared: sealing 7 of 12 caches one block, not two.
  cache_.remove_sequence(a);
  const SequenceId partial = cache_.add_sequence();
  cache_.append(partial, ids(12, 50));
  cache_.seal(partial, 7);
  const SequenceId probe = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(probe, ids(12, 50)), 4);
  // A sequence that already holds positions cannot take a prefix.
  EXPECT_THROW(cache_.reuse_prefix(probe, ids(12, 50)), Error);
}

TEST_F(KvCacheTest, ABlockIsReusedOnlyAfterTheSamePrefix) {
  // Blocks A B and C D cached; C B shares its second block's tokens with A B but not what comes
  // before it, so only C is reused (the same tokens after another prefix hold other keys and
  // values).
  const std::vector<int32_t> a = ids(4, 10), b = ids(4, 20), c = ids(4, 30), d = ids(4, 40);
  for (const auto& [first, second] : {std::pair{a, b}, std::pair{c, d}}) {
    const SequenceId s = cache_.add_sequence();
    cache_.append(s, first);
    cache_.append(s, second);
    cache_.seal(s, 8);
    cache_.remove_sequence(s);
  }
  std::vector<int32_t> c_then_b = c;
  c_then_b.insert(c_then_b.end(), b.begin(), b.end());
  const SequenceId probe = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(probe, c_then_b), 4);
}

TEST_F(KvCacheTest, ReleasedBlocksStayCachedUntilEvictedLeastRecentlyReleasedFirst) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(8));
  cache_.seal(a, 8);
  cache_.remove_sequence(a);           // releases its second block, then its first
  EXPECT_EQ(cache_.free_blocks(), 5);  // cached blocks no sequence holds can be taken
  EXPECT_EQ(cache_.cached_blocks(), 2);
  const SequenceId hit = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(hit, ids(8)), 8);
  cache_.remove_sequence(hit);
  // Three unused blocks, then the older of the two cached ones: the chain's tail.
  const SequenceId filler = cache_.add_sequence();
  cache_.append(filler, ids(16, 100));
  EXPECT_EQ(cache_.cached_blocks(), 1);
  const SequenceId after = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(after, ids(8)), 4);  // the head survived
  EXPECT_EQ(cache_.free_blocks(), 0);
  EXPECT_THROW(cache_.append(after, ids(4, 14)), KvCacheFullError);
  EXPECT_EQ(cache_.length(after), 4);
  cache_.remove_sequence(filler);
  cache_.append(after, ids(4, 14));
  EXPECT_EQ(cache_.free_blocks(), 3);
}

TEST_F(KvCacheTest, TruncationInsideASealedBlockIsRefused) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(10));
  cache_.seal(a, 8);
  EXPECT_NO_THROW(cache_.truncate(a, 9));  // past the sealed blocks
  testing::expect_error([&] { cache_.truncate(a, 6); }, {"sealed", "6"});
  EXPECT_EQ(cache_.length(a), 9);
  cache_.truncate(a, 4);  // a block boundary: the second block is released, still cached
  EXPECT_EQ(cache_.length(a), 4);
  EXPECT_EQ(cache_.cached_blocks(), 2);
  cache_.append(a, ids(4, 90));  // a new block, not the cached one
  cache_.seal(a, 8);
  const SequenceId b = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(b, ids(8)), 8);  // the original second block is still there
  EXPECT_NE(table(cache_, b)[1], table(cache_, a)[1]);
}

TEST_F(KvCacheTest, TokensLearnedAfterTheyWereFedKeyTheBlocksTheySeal) {
  // Positions fed from the backend's memory are appended with stand-ins, then told their ids:
  // the sealed block is keyed by the ids, not the stand-ins.
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(5));
  cache_.append(a, std::vector<int32_t>(3, 0));  // positions 5..7, ids not known yet
  cache_.rewrite_tokens(a, 5, std::vector<int32_t>{15, 16, 17});
  cache_.seal(a, 8);
  const SequenceId b = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(b, ids(9)), 8);
  // Sealed positions and positions past the sequence are refused, naming them.
  testing::expect_error([&] { cache_.rewrite_tokens(a, 7, std::vector<int32_t>{1}); },
                        {"rewrite", "position 7", "sealed to 8"});
  cache_.append(a, ids(2, 60));
  testing::expect_error(
      [&] {
        cache_.rewrite_tokens(a, 9, std::vector<int32_t>{1, 2});
      },
      {"rewrite 2 tokens", "length 10"});
}

TEST_F(KvCacheTest, AnAnnotationStaysWithItsCachedBlockUntilEvicted) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, ids(9));
  cache_.seal(a, 9);  // two sealed blocks
  EXPECT_EQ(cache_.sealed_blocks(a), 2);
  EXPECT_TRUE(cache_.annotation(a, 1).empty());
  cache_.annotate(a, 1, std::vector<float>{0.5f, 1.5f});
  cache_.annotate(a, 1, std::vector<float>{9.0f});  // the first stays
  EXPECT_EQ(std::vector<float>(cache_.annotation(a, 1).begin(), cache_.annotation(a, 1).end()),
            (std::vector<float>{0.5f, 1.5f}));
  EXPECT_TRUE(cache_.annotation(a, 0).empty());
  EXPECT_TRUE(cache_.annotation(a, 2).empty());  // not sealed
  testing::expect_error([&] { cache_.annotate(a, 2, std::vector<float>{1.0f}); },
                        {"annotate block 2", "2 sealed"});
  // Another sequence with the same prefix reads it, and annotates the cached block it shares.
  const SequenceId b = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(b, ids(9)), 8);
  EXPECT_EQ(cache_.annotation(b, 1).size(), 2u);
  cache_.annotate(b, 0, std::vector<float>{7.0f});
  EXPECT_EQ(cache_.annotation(a, 0).size(), 1u);
  // Released, then evicted by appends that need every block: the annotation goes with it.
  cache_.remove_sequence(a);
  cache_.remove_sequence(b);
  const SequenceId c = cache_.add_sequence();
  cache_.append(c, ids(20, 100));
  cache_.remove_sequence(c);
  const SequenceId d = cache_.add_sequence();
  EXPECT_EQ(cache_.reuse_prefix(d, ids(9)), 0);
  cache_.append(d, ids(9));
  cache_.seal(d, 9);
  EXPECT_TRUE(cache_.annotation(d, 0).empty());
  EXPECT_TRUE(cache_.annotation(d, 1).empty());
}

TEST_F(KvCacheTest, APrefixComputedTwiceIsCachedOnce) {
  const SequenceId a = cache_.add_sequence();
  const SequenceId b = cache_.add_sequence();
  cache_.append(a, ids(4));
  cache_.append(b, ids(4));
  cache_.seal(a, 4);
  cache_.seal(b, 4);
  EXPECT_EQ(cache_.cached_blocks(), 1);
  cache_.remove_sequence(b);  // b's copy was its own: unused again
  cache_.remove_sequence(a);
  EXPECT_EQ(cache_.free_blocks(), 5);
  EXPECT_EQ(cache_.cached_blocks(), 1);
}

TEST(KvCachePrefixTest, OffMeansNothingIsShared) {
  auto backend = testing::make_cpu_backend(1);
  KvCache cache(*backend, KvCacheLayout{1, 1, 4, 4, 4}, /*prefix_caching=*/false);
  const SequenceId a = cache.add_sequence();
  cache.append(a, ids(8));
  cache.seal(a, 8);
  EXPECT_EQ(cache.cached_blocks(), 0);
  const SequenceId b = cache.add_sequence();
  EXPECT_EQ(cache.reuse_prefix(b, ids(8)), 0);
  cache.remove_sequence(a);
  EXPECT_EQ(cache.free_blocks(), 4);
}

TEST(KvCacheLayoutTest, RejectsImpossibleLayouts) {
  auto backend = testing::make_cpu_backend(1);
  EXPECT_THROW(KvCache(*backend, KvCacheLayout{1, 1, 4, 0, 4}), Error);
  EXPECT_THROW(KvCache(*backend, KvCacheLayout{1, 1, 4, 16, 0}), Error);
  EXPECT_THROW(KvCache(*backend, KvCacheLayout{1, 1, 4, 1 << 20, 1 << 12}), Error);
}

TEST(KvCacheLayoutTest, ByteCountOverflowIsAnError) {
  // Layers x heads x head_dim whose byte count wraps 64 bits (2^62 + 64 heads of 4 wrap to 256
  // floats per slot) must be refused, never allocated at the wrapped size.
  auto backend = testing::make_cpu_backend(1);
  const int64_t huge = (int64_t{1} << 62) + 64;
  testing::expect_error(
      [&] {
        KvCache(*backend, KvCacheLayout{1, huge, 4, 16, 4});
      },
      {"KV cache", "overflow"});
  testing::expect_error(
      [&] {
        KvCache(*backend, KvCacheLayout{huge, 1, 1, 16, 4});
      },
      {"KV cache", "overflow"});
  testing::expect_error(
      [&] {
        KvCache(*backend, KvCacheLayout{1, 1 << 30, 1 << 30, 16, 4});
      },
      {"KV cache", "overflow"});
}

}  // namespace
}  // namespace specrun
