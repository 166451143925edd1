#include <gtest/gtest.h>

#include <set>

#include "runtime/kv/kv_cache.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

class KvCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<kernels::cpu::CpuBackend> backend_ = testing::make_cpu_backend(1);
  KvCache cache_{*backend_, KvCacheLayout{2, 2, 4, /*block_size=*/4, /*num_blocks=*/5}};
};

TEST_F(KvCacheTest, AppendAllocatesWholeBlocks) {
  const SequenceId s = cache_.add_sequence();
  EXPECT_EQ(cache_.length(s), 0);
  cache_.append(s, 1);
  EXPECT_EQ(cache_.block_table(s).size(), 1u);
  cache_.append(s, 3);
  EXPECT_EQ(cache_.block_table(s).size(), 1u);
  cache_.append(s, 1);
  EXPECT_EQ(cache_.block_table(s).size(), 2u);
  EXPECT_EQ(cache_.length(s), 5);
  EXPECT_EQ(cache_.free_blocks(), 3);
}

TEST_F(KvCacheTest, SlotsFollowTheBlockTable) {
  const SequenceId a = cache_.add_sequence();
  const SequenceId b = cache_.add_sequence();
  cache_.append(a, 2);
  cache_.append(b, 5);
  cache_.append(a, 4);
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
  cache_.append(s, 13);  // 4 blocks
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
  cache_.append(a, 6);  // 2 blocks
  const std::vector<int32_t> table_before(cache_.block_table(a).begin(),
                                          cache_.block_table(a).end());
  // a needs 1 more block, b needs 3: 4 > 3 free.
  const std::pair<SequenceId, int64_t> growth[] = {{a, 4}, {b, 9}};
  EXPECT_THROW(cache_.append(growth), KvCacheFullError);
  EXPECT_EQ(cache_.length(a), 6);
  EXPECT_EQ(cache_.length(b), 0);
  EXPECT_EQ(cache_.free_blocks(), 3);
  EXPECT_EQ(std::vector<int32_t>(cache_.block_table(a).begin(), cache_.block_table(a).end()),
            table_before);
  try {
    cache_.append(b, 100);
  } catch (const KvCacheFullError& error) {
    EXPECT_NE(std::string(error.what()).find("KV cache full"), std::string::npos);
  }
  // What fits still fits.
  const std::pair<SequenceId, int64_t> fits[] = {{a, 4}, {b, 8}};
  cache_.append(fits);
  EXPECT_EQ(cache_.free_blocks(), 0);
}

TEST_F(KvCacheTest, OneAppendNamingASequenceTwiceIsRejected) {
  const SequenceId a = cache_.add_sequence();
  const std::pair<SequenceId, int64_t> twice[] = {{a, 4}, {a, 4}};
  EXPECT_THROW(cache_.append(twice), Error);
  EXPECT_EQ(cache_.length(a), 0);
  EXPECT_EQ(cache_.free_blocks(), 5);
}

TEST_F(KvCacheTest, RemovedSequencesReturnTheirBlocks) {
  const SequenceId a = cache_.add_sequence();
  cache_.append(a, 20);
  EXPECT_EQ(cache_.free_blocks(), 0);
  cache_.remove_sequence(a);
  EXPECT_FALSE(cache_.has_sequence(a));
  EXPECT_EQ(cache_.free_blocks(), 5);
  EXPECT_THROW(cache_.length(a), Error);
  const SequenceId b = cache_.add_sequence();
  EXPECT_NE(a, b);  // ids are never reused
  cache_.append(b, 20);
}

TEST_F(KvCacheTest, LayerPoolsAreDistinctAndInsideTheAllocation) {
  const int64_t pool = 5 * 4 * 2 * 4;
  EXPECT_EQ(cache_.values(0) - cache_.keys(0), pool);
  EXPECT_EQ(cache_.keys(1) - cache_.keys(0), 2 * pool);
  EXPECT_THROW(cache_.keys(2), Error);
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
