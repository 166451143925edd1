// The paged KV cache of one model instance: a pool of fixed-size blocks in backend memory and a
// block table per sequence. Appending and truncating only move bookkeeping; the forward pass
// writes and reads the blocks.
#pragma once

#include <cstdint>
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
};

using SequenceId = int64_t;

// Thrown when the pool cannot hold a requested growth; nothing was changed.
class KvCacheFullError : public Error {
 public:
  using Error::Error;
};

class KvCache {
 public:
  // Allocates the pool on the backend; throws Error when the layout is impossible or memory is
  // short.
  KvCache(kernels::Backend& backend, const KvCacheLayout& layout);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheLayout& layout() const { return layout_; }
  int64_t capacity_tokens() const { return layout_.num_blocks * layout_.block_size; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_blocks_.size()); }
  // Blocks needed to hold `tokens` positions.
  int64_t blocks_for(int64_t tokens) const {
    return (tokens + layout_.block_size - 1) / layout_.block_size;
  }

  SequenceId add_sequence();
  // Frees the sequence's blocks.
  void remove_sequence(SequenceId sequence);
  bool has_sequence(SequenceId sequence) const { return sequences_.count(sequence) != 0; }
  int64_t num_sequences() const { return static_cast<int64_t>(sequences_.size()); }
  // Positions held.
  int64_t length(SequenceId sequence) const { return get(sequence).length; }

  // Grows each sequence by its count, allocating blocks. All or nothing: if the pool cannot hold
  // every growth, throws KvCacheFullError and changes nothing.
  void append(std::span<const std::pair<SequenceId, int64_t>> growth);
  void append(SequenceId sequence, int64_t count);
  // Keeps the first `length` positions and frees the blocks past them (the speculative rollback).
  void truncate(SequenceId sequence, int64_t length);

  std::span<const int32_t> block_table(SequenceId sequence) const { return get(sequence).blocks; }
  // Where position `position` of the sequence lives in the pool.
  int32_t slot(SequenceId sequence, int64_t position) const;

  // The pools of one layer: [num_blocks * block_size, num_kv_heads, head_dim] f32 each.
  float* keys(int64_t layer);
  float* values(int64_t layer);

 private:
  struct Sequence {
    int64_t length = 0;           // positions held
    std::vector<int32_t> blocks;  // the block table
  };
  const Sequence& get(SequenceId sequence) const;
  Sequence& get(SequenceId sequence);

  kernels::Backend& backend_;
  KvCacheLayout layout_;
  float* storage_ = nullptr;          // [num_layers, 2, slots, num_kv_heads, head_dim]
  std::vector<int32_t> free_blocks_;  // a stack; the lowest ids are handed out first
  std::unordered_map<SequenceId, Sequence> sequences_;
  SequenceId next_sequence_ = 0;
};

}  // namespace specrun
