#include "runtime/kv/kv_cache.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include "kernels/core/uniform_hash.h"
#include "runtime/base/byte_count.h"

namespace specrun {

KvCache::KvCache(kernels::Backend& backend, const KvCacheLayout& layout, bool prefix_caching)
    : backend_(backend), layout_(layout), prefix_caching_(prefix_caching) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0 || layout.num_blocks <= 0) {
    throw Error("KV cache: every dimension of the layout must be positive");
  }
  if (!kernels::is_kv_cache_dtype(layout.dtype)) {
    throw Error("KV cache: keys and values are stored as bf16 or f32, not " +
                std::string(dtype_name(layout.dtype)));
  }
  const int64_t slots = layout.num_blocks * layout.block_size;
  if (slots > std::numeric_limits<int32_t>::max()) {
    throw Error("KV cache: " + std::to_string(slots) + " slots exceed the 32-bit slot index");
  }
  // The layout comes from a checkpoint's config and the caller's options: checked, not trusted.
  const uint64_t extents[] = {
      static_cast<uint64_t>(layout.num_layers), 2, static_cast<uint64_t>(slots),
      static_cast<uint64_t>(layout.num_kv_heads), static_cast<uint64_t>(layout.head_dim)};
  const std::optional<uint64_t> checked = checked_byte_count(extents, dtype_size(layout.dtype));
  if (!checked) {
    throw Error("KV cache: " + std::to_string(layout.num_layers) + " layers of " +
                std::to_string(slots) + " slots of " + std::to_string(layout.num_kv_heads) +
                " heads of " + std::to_string(layout.head_dim) + " " +
                std::string(dtype_name(layout.dtype)) + " values overflow a byte count");
  }
  const auto bytes = static_cast<size_t>(*checked);
  storage_ = static_cast<char*>(backend_.allocate(bytes));
  if (storage_ == nullptr) {
    throw Error("KV cache: cannot allocate " + std::to_string(bytes >> 20) + " MiB on " +
                std::string(backend_.name()));
  }
  blocks_.resize(static_cast<size_t>(layout.num_blocks));
  free_.reserve(static_cast<size_t>(layout.num_blocks));
  for (int64_t block = layout.num_blocks - 1; block >= 0; --block) {
    free_.push_back(static_cast<int32_t>(block));
  }
  if (prefix_caching_) {
    block_tokens_.resize(static_cast<size_t>(slots));
    std::random_device entropy;
    salt_.low = (static_cast<uint64_t>(entropy()) << 32) | entropy();
    salt_.high = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  }
}

KvCache::~KvCache() {
  backend_.deallocate(storage_);
}

SequenceId KvCache::add_sequence() {
  const SequenceId id = next_sequence_++;
  sequences_.emplace(id, Sequence{});
  return id;
}

void KvCache::remove_sequence(SequenceId sequence) {
  truncate(sequence, 0);
  sequences_.erase(sequence);
}

const KvCache::Sequence& KvCache::get(SequenceId sequence) const {
  const auto it = sequences_.find(sequence);
  if (it == sequences_.end()) throw Error("KV cache: no sequence " + std::to_string(sequence));
  return it->second;
}

KvCache::Sequence& KvCache::get(SequenceId sequence) {
  return const_cast<Sequence&>(static_cast<const KvCache*>(this)->get(sequence));
}

KvCache::BlockKey KvCache::chain(const BlockKey& parent, std::span<const int32_t> tokens) const {
  // Two independent 64-bit lanes, each seeded by the parent's key and the cache's salt: a 128-bit
  // key, checked against the block's stored tokens and parent on every match anyway.
  uint64_t low = kernels::mix64(parent.low ^ salt_.low);
  uint64_t high = kernels::mix64(parent.high + salt_.high + 0x9e3779b97f4a7c15ull);
  for (const int32_t token : tokens) {
    const uint64_t value = static_cast<uint32_t>(token);
    low = kernels::mix64(low ^ (value + 0x632be59bd9b4e019ull));
    high = kernels::mix64(high + value * 0xff51afd7ed558ccdull);
  }
  return {low, high};
}

int32_t KvCache::take_block() {
  int32_t block = -1;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    // The cached block released longest ago gives up its contents.
    SPECRUN_CHECK(!evictable_.empty()) << "no block to take";
    block = evictable_.begin()->second;
    evictable_.erase(evictable_.begin());
    Block& evicted = blocks_[static_cast<size_t>(block)];
    table_.erase(evicted.key);
    evicted.cached = false;
    evicted.annotation.clear();
  }
  blocks_[static_cast<size_t>(block)].references = 1;
  return block;
}

void KvCache::release_block(int32_t block) {
  Block& state = blocks_[static_cast<size_t>(block)];
  SPECRUN_CHECK(state.references > 0) << "block " << block << " released more than held";
  if (--state.references > 0) return;
  if (state.cached) {
    state.released = ++clock_;
    evictable_.emplace(state.released, block);
  } else {
    free_.push_back(block);
  }
}

int64_t KvCache::reuse_prefix(SequenceId sequence, std::span<const int32_t> tokens) {
  Sequence& entry = get(sequence);
  if (entry.length != 0) {
    throw Error("KV cache: sequence " + std::to_string(sequence) + " already holds " +
                std::to_string(entry.length) + " positions; a prefix is reused only when empty");
  }
  if (!prefix_caching_) return 0;
  const auto block_size = static_cast<size_t>(layout_.block_size);
  BlockKey parent{};
  for (size_t first = 0; first + block_size <= tokens.size(); first += block_size) {
    const std::span<const int32_t> block_tokens = tokens.subspan(first, block_size);
    const BlockKey key = chain(parent, block_tokens);
    const auto found = table_.find(key);
    if (found == table_.end()) break;
    const int32_t block = found->second;
    Block& state = blocks_[static_cast<size_t>(block)];
    const auto stored = block_tokens_.begin() + static_cast<std::ptrdiff_t>(block * block_size);
    if (!(state.parent == parent) ||
        !std::equal(block_tokens.begin(), block_tokens.end(), stored)) {
      break;  // a key collision: never reuse what is not the same prefix
    }
    if (state.references++ == 0) evictable_.erase({state.released, block});
    entry.blocks.push_back(block);
    entry.sealed.push_back(key);
    entry.tokens.insert(entry.tokens.end(), block_tokens.begin(), block_tokens.end());
    entry.length += layout_.block_size;
    parent = key;
  }
  reused_positions_ += entry.length;
  return entry.length;
}

void KvCache::append(std::span<const KvGrowth> growth) {
  int64_t needed = 0;
  for (size_t i = 0; i < growth.size(); ++i) {
    const SequenceId sequence = growth[i].sequence;
    for (size_t j = 0; j < i; ++j) {
      if (growth[j].sequence == sequence) {
        throw Error("KV cache: sequence " + std::to_string(sequence) +
                    " appears twice in one append");
      }
    }
    const Sequence& entry = get(sequence);
    needed += blocks_for(entry.length + static_cast<int64_t>(growth[i].tokens.size())) -
              static_cast<int64_t>(entry.blocks.size());
  }
  if (needed > free_blocks()) {
    throw KvCacheFullError("KV cache full: " + std::to_string(needed) + " more blocks of " +
                           std::to_string(layout_.block_size) + " tokens needed, " +
                           std::to_string(free_blocks()) + " of " +
                           std::to_string(layout_.num_blocks) + " free");
  }
  for (const KvGrowth& grow : growth) {
    Sequence& entry = get(grow.sequence);
    entry.length += static_cast<int64_t>(grow.tokens.size());
    if (prefix_caching_)
      entry.tokens.insert(entry.tokens.end(), grow.tokens.begin(), grow.tokens.end());
    while (static_cast<int64_t>(entry.blocks.size()) < blocks_for(entry.length)) {
      entry.blocks.push_back(take_block());
    }
  }
}

void KvCache::append(SequenceId sequence, std::span<const int32_t> tokens) {
  const KvGrowth growth[] = {{sequence, tokens}};
  append(growth);
}

void KvCache::seal(SequenceId sequence, int64_t length) {
  Sequence& entry = get(sequence);
  if (length < 0 || length > entry.length) {
    throw Error("KV cache: cannot seal " + std::to_string(length) + " positions of sequence " +
                std::to_string(sequence) + ", which holds " + std::to_string(entry.length));
  }
  if (!prefix_caching_) return;
  const auto block_size = static_cast<size_t>(layout_.block_size);
  for (auto index = entry.sealed.size(); static_cast<int64_t>((index + 1) * block_size) <= length;
       ++index) {
    const BlockKey parent = index == 0 ? BlockKey{} : entry.sealed[index - 1];
    const std::span<const int32_t> tokens =
        std::span<const int32_t>(entry.tokens).subspan(index * block_size, block_size);
    const BlockKey key = chain(parent, tokens);
    entry.sealed.push_back(key);
    const int32_t block = entry.blocks[index];
    Block& state = blocks_[static_cast<size_t>(block)];
    // Another block may already hold this prefix (two sequences computed it at once): this one
    // then stays the sequence's own, and the first is the one reused.
    if (state.cached || !table_.emplace(key, block).second) continue;
    state.cached = true;
    state.key = key;
    state.parent = parent;
    std::copy(tokens.begin(), tokens.end(),
              block_tokens_.begin() + static_cast<std::ptrdiff_t>(block * block_size));
  }
}

void KvCache::truncate(SequenceId sequence, int64_t length) {
  Sequence& entry = get(sequence);
  if (length < 0 || length > entry.length) {
    throw Error("KV cache: cannot truncate sequence " + std::to_string(sequence) + " of length " +
                std::to_string(entry.length) + " to " + std::to_string(length));
  }
  const int64_t sealed_length = static_cast<int64_t>(entry.sealed.size()) * layout_.block_size;
  if (length < sealed_length && length % layout_.block_size != 0) {
    // Its next append would write into a block other sequences may share.
    throw Error("KV cache: cannot truncate sequence " + std::to_string(sequence) + " to " +
                std::to_string(length) + " positions, inside its sealed first " +
                std::to_string(sealed_length));
  }
  entry.length = length;
  if (prefix_caching_) entry.tokens.resize(static_cast<size_t>(length));
  entry.sealed.resize(
      std::min(entry.sealed.size(), static_cast<size_t>(length / layout_.block_size)));
  // The deepest block first, so that a chain's tail is evicted before its head.
  while (static_cast<int64_t>(entry.blocks.size()) > blocks_for(length)) {
    release_block(entry.blocks.back());
    entry.blocks.pop_back();
  }
}

void KvCache::copy_position(SequenceId sequence, int64_t from, int64_t to) {
  Sequence& entry = get(sequence);
  const int64_t sealed_length = static_cast<int64_t>(entry.sealed.size()) * layout_.block_size;
  if (from < 0 || from >= entry.length || to < sealed_length || to >= entry.length) {
    throw Error("KV cache: cannot copy position " + std::to_string(from) + " over " +
                std::to_string(to) + " in sequence " + std::to_string(sequence) + " of length " +
                std::to_string(entry.length) + ", sealed to " + std::to_string(sealed_length));
  }
  if (from == to) return;
  const size_t row_bytes =
      static_cast<size_t>(layout_.num_kv_heads * layout_.head_dim) * dtype_size(layout_.dtype);
  const auto offset = [&](int64_t position) {
    return static_cast<size_t>(slot(sequence, position)) * row_bytes;
  };
  for (int64_t layer = 0; layer < layout_.num_layers; ++layer) {
    for (char* pool : {static_cast<char*>(keys(layer)), static_cast<char*>(values(layer))}) {
      SPECRUN_CHECK_OK(backend_.copy_on_device(pool + offset(to), pool + offset(from), row_bytes),
                       "copying a KV-cache position");
    }
  }
  if (prefix_caching_) {
    entry.tokens[static_cast<size_t>(to)] = entry.tokens[static_cast<size_t>(from)];
  }
}

void KvCache::annotate(SequenceId sequence, int64_t index, std::span<const float> values) {
  const Sequence& entry = get(sequence);
  if (index < 0 || index >= static_cast<int64_t>(entry.sealed.size())) {
    throw Error("KV cache: cannot annotate block " + std::to_string(index) + " of sequence " +
                std::to_string(sequence) + ", which has " + std::to_string(entry.sealed.size()) +
                " sealed");
  }
  // The cached block under the key: the sequence's own, or the one another sequence sealed
  // first with the same prefix.
  const auto found = table_.find(entry.sealed[static_cast<size_t>(index)]);
  if (found == table_.end()) return;
  std::vector<float>& annotation = blocks_[static_cast<size_t>(found->second)].annotation;
  if (annotation.empty()) annotation.assign(values.begin(), values.end());
}

std::span<const float> KvCache::annotation(SequenceId sequence, int64_t index) const {
  const Sequence& entry = get(sequence);
  if (index < 0 || index >= static_cast<int64_t>(entry.sealed.size())) return {};
  const auto found = table_.find(entry.sealed[static_cast<size_t>(index)]);
  if (found == table_.end()) return {};
  return blocks_[static_cast<size_t>(found->second)].annotation;
}

void KvCache::rewrite_tokens(SequenceId sequence, int64_t position,
                             std::span<const int32_t> tokens) {
  Sequence& entry = get(sequence);
  const int64_t sealed_length = static_cast<int64_t>(entry.sealed.size()) * layout_.block_size;
  const auto count = static_cast<int64_t>(tokens.size());
  if (position < sealed_length || count > entry.length - position) {
    throw Error("KV cache: cannot rewrite " + std::to_string(count) + " tokens at position " +
                std::to_string(position) + " of sequence " + std::to_string(sequence) +
                " of length " + std::to_string(entry.length) + ", sealed to " +
                std::to_string(sealed_length));
  }
  if (!prefix_caching_) return;
  std::copy(tokens.begin(), tokens.end(), entry.tokens.begin() + static_cast<ptrdiff_t>(position));
}

int32_t KvCache::slot(SequenceId sequence, int64_t position) const {
  const Sequence& entry = get(sequence);
  SPECRUN_CHECK(position >= 0 && position < entry.length)
      << "position " << position << " of a sequence of length " << entry.length;
  return static_cast<int32_t>(entry.blocks[static_cast<size_t>(position / layout_.block_size)] *
                                  layout_.block_size +
                              position % layout_.block_size);
}

namespace {

// Bytes of one layer's K (or V) pool.
int64_t pool_bytes(const KvCacheLayout& layout) {
  return layout.num_blocks * layout.block_size * layout.num_kv_heads * layout.head_dim *
         static_cast<int64_t>(dtype_size(layout.dtype));
}

}  // namespace

void* KvCache::keys(int64_t layer) {
  SPECRUN_CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  return storage_ + (2 * layer) * pool_bytes(layout_);
}

void* KvCache::values(int64_t layer) {
  return static_cast<char*>(keys(layer)) + pool_bytes(layout_);
}

uint64_t KvCache::bytes_per_token() const {
  return 2 * static_cast<uint64_t>(layout_.num_layers) *
         static_cast<uint64_t>(layout_.num_kv_heads) * static_cast<uint64_t>(layout_.head_dim) *
         dtype_size(layout_.dtype);
}

}  // namespace specrun
