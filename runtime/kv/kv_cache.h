// The paged KV cache of one model instance: a pool of fixed-size blocks in backend memory and a
// block table per sequence. Appending and truncating only move bookkeeping; the forward pass
// writes and reads the blocks.
//
// Prefix caching: once a sequence's tokens up to some length are final (seal()), each full block
// among them is identified by a key chained from its tokens and its prefix's key, and a new
// sequence whose tokens start the same way takes those blocks into its table (reuse_prefix())
// instead of computing them again. Blocks are reference-counted. Only full blocks are shared, and
// a sequence only ever writes past its length, so a shared block is never written; truncation
// below a sealed length must fall on a block boundary. A cached block that no sequence holds keeps
// its contents until its space is needed, and is then evicted least recently released first. Each
// model has its own cache, so the draft's and the target's blocks never mix.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "runtime/base/check.h"

namespace specrun {

struct KvCacheLayout {
  int64_t num_layers;    // one K and one V pool per layer
  int64_t num_kv_heads;  // heads stored per token
  int64_t head_dim;      // channels per head
  int64_t block_size;    // tokens per block
  int64_t num_blocks;    // blocks in the pool
  // Storage of keys and values (kernels::is_kv_cache_dtype): bf16 halves the memory and the bytes
  // attention reads; f32 keeps them exact (the reference comparisons).
  DType dtype = DType::kBF16;
};

using SequenceId = int64_t;

// One sequence's part of an append.
struct KvGrowth {
  SequenceId sequence;              // a sequence of the cache
  std::span<const int32_t> tokens;  // the token ids taking positions [length, length + n)
};

// Thrown when the pool cannot hold a requested growth; nothing was changed.
class KvCacheFullError : public Error {
 public:
  using Error::Error;
};

class KvCache {
 public:
  // Allocates the pool on the backend; throws Error when the layout is impossible or memory is
  // short. `prefix_caching` false: seal() registers nothing and reuse_prefix() finds nothing.
  KvCache(kernels::Backend& backend, const KvCacheLayout& layout, bool prefix_caching = true);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheLayout& layout() const { return layout_; }
  bool prefix_caching() const { return prefix_caching_; }
  int64_t capacity_tokens() const { return layout_.num_blocks * layout_.block_size; }
  // Blocks an append may take: the unused ones and the cached ones no sequence holds.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  // Blocks holding a reusable prefix, held by a sequence or not.
  int64_t cached_blocks() const { return static_cast<int64_t>(table_.size()); }
  // Positions reuse_prefix() has taken from the cache since the cache was made.
  int64_t reused_positions() const { return reused_positions_; }
  // Blocks needed to hold `tokens` positions.
  int64_t blocks_for(int64_t tokens) const {
    return (tokens + layout_.block_size - 1) / layout_.block_size;
  }

  SequenceId add_sequence();
  // Releases the sequence's blocks (cached ones stay cached until evicted).
  void remove_sequence(SequenceId sequence);
  bool has_sequence(SequenceId sequence) const { return sequences_.count(sequence) != 0; }
  int64_t num_sequences() const { return static_cast<int64_t>(sequences_.size()); }
  // Positions held.
  int64_t length(SequenceId sequence) const { return get(sequence).length; }

  // For an empty sequence about to take `tokens`: takes every cached full block that `tokens`
  // starts with into its table, as if those positions had been appended and computed, and
  // returns how many positions that is (a multiple of the block size, 0 when nothing matched).
  int64_t reuse_prefix(SequenceId sequence, std::span<const int32_t> tokens);
  // Grows each sequence by its tokens, allocating blocks (evicting cached ones no sequence holds,
  // least recently released first, when no block is unused). All or nothing: if the pool cannot
  // hold every growth, throws KvCacheFullError and changes nothing.
  void append(std::span<const KvGrowth> growth);
  void append(SequenceId sequence, std::span<const int32_t> tokens);
  // Positions [0, length) of the sequence hold final tokens (its committed text): the full blocks
  // among them become reusable by other sequences.
  void seal(SequenceId sequence, int64_t length);
  // Keeps the first `length` positions and releases the blocks past them (the speculative
  // rollback). Below the sealed length, `length` must be a multiple of the block size.
  void truncate(SequenceId sequence, int64_t length);

  // Copies position `from`'s keys and values (every layer) and token over position `to` of the
  // same sequence: an accepted branch of a token tree, scored past the chain in the cache, moved
  // to the position its depth gives it. Both below length(); `to` past the sealed positions.
  void copy_position(SequenceId sequence, int64_t from, int64_t to);
  // Sealed leading blocks of the sequence (its first sealed_blocks() x block_size positions).
  int64_t sealed_blocks(SequenceId sequence) const {
    return static_cast<int64_t>(get(sequence).sealed.size());
  }
  // Values the cached block holding the sequence's sealed block `index` keeps beside its keys
  // and values while it stays cached, for whoever reuses it: a feature-reading draft's engine
  // keeps there the target's feature at the block's last position, which the draft reads beside
  // the first token it computes past a reused prefix. The first annotation of a block stays.
  void annotate(SequenceId sequence, int64_t index, std::span<const float> values);
  // What annotate() left beside the sequence's sealed block `index`; empty when nothing.
  std::span<const float> annotation(SequenceId sequence, int64_t index) const;
  // Positions [position, position + tokens.size()) hold `tokens`: ids learned after they were
  // appended (fed from the backend's memory, SequenceInput::device_tokens), recorded before
  // they are sealed. All below length(), past the sealed positions.
  void rewrite_tokens(SequenceId sequence, int64_t position, std::span<const int32_t> tokens);

  std::span<const int32_t> block_table(SequenceId sequence) const { return get(sequence).blocks; }
  // Where position `position` of the sequence lives in the pool.
  int32_t slot(SequenceId sequence, int64_t position) const;

  // The pools of one layer: [num_blocks * block_size, num_kv_heads, head_dim] each, in
  // layout().dtype.
  void* keys(int64_t layer);
  void* values(int64_t layer);
  // Bytes of K and V a position takes over all layers.
  uint64_t bytes_per_token() const;

 private:
  // A block's identity: a 128-bit hash of its tokens chained with its prefix's key.
  struct BlockKey {
    uint64_t low = 0;
    uint64_t high = 0;
    bool operator==(const BlockKey&) const = default;
  };
  struct BlockKeyHash {
    size_t operator()(const BlockKey& key) const { return static_cast<size_t>(key.low); }
  };
  struct Block {
    int32_t references = 0;  // sequences whose table holds it
    bool cached = false;     // in the table under `key`, its tokens in block_tokens_
    BlockKey key;            // when cached
    BlockKey parent;         // the key of the block before it (the root key for a first block)
    uint64_t released = 0;   // when it last became evictable (orders eviction)
    std::vector<float> annotation;  // when cached: annotate()'s values, empty when none
  };
  struct Sequence {
    int64_t length = 0;            // positions held
    std::vector<int32_t> blocks;   // the block table
    std::vector<int32_t> tokens;   // the token at each position (with prefix caching)
    std::vector<BlockKey> sealed;  // the chained key of each sealed leading block
  };
  const Sequence& get(SequenceId sequence) const;
  Sequence& get(SequenceId sequence);
  BlockKey chain(const BlockKey& parent, std::span<const int32_t> tokens) const;
  int32_t take_block();
  void release_block(int32_t block);

  kernels::Backend& backend_;
  KvCacheLayout layout_;
  bool prefix_caching_;
  BlockKey salt_;              // per cache, so that no input can aim at a collision
  char* storage_ = nullptr;    // [num_layers, 2, slots, num_kv_heads, head_dim] layout_.dtype
  std::vector<Block> blocks_;  // [num_blocks]
  std::vector<int32_t> block_tokens_;  // [num_blocks, block_size] tokens of cached blocks
  std::vector<int32_t> free_;          // unused, uncached blocks: a stack, lowest ids first out
  std::set<std::pair<uint64_t, int32_t>> evictable_;  // cached, unreferenced: (released, block)
  std::unordered_map<BlockKey, int32_t, BlockKeyHash> table_;  // key -> cached block
  uint64_t clock_ = 0;                                         // release counter
  int64_t reused_positions_ = 0;                               // over every reuse_prefix()
  std::unordered_map<SequenceId, Sequence> sequences_;
  SequenceId next_sequence_ = 0;
};

}  // namespace specrun
