#include "runtime/kv/kv_cache.h"

#include <limits>
#include <optional>
#include <string>

#include "runtime/model/tensor_checks.h"

namespace specrun {

KvCache::KvCache(kernels::Backend& backend, const KvCacheLayout& layout)
    : backend_(backend), layout_(layout) {
  if (layout.num_layers <= 0 || layout.num_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0 || layout.num_blocks <= 0) {
    throw Error("KV cache: every dimension of the layout must be positive");
  }
  const int64_t slots = layout.num_blocks * layout.block_size;
  if (slots > std::numeric_limits<int32_t>::max()) {
    throw Error("KV cache: " + std::to_string(slots) + " slots exceed the 32-bit slot index");
  }
  // The layout comes from a checkpoint's config and the caller's options: checked, not trusted.
  const uint64_t extents[] = {
      static_cast<uint64_t>(layout.num_layers), 2, static_cast<uint64_t>(slots),
      static_cast<uint64_t>(layout.num_kv_heads), static_cast<uint64_t>(layout.head_dim)};
  const std::optional<uint64_t> checked = checked_byte_count(extents, sizeof(float));
  if (!checked) {
    throw Error("KV cache: " + std::to_string(layout.num_layers) + " layers of " +
                std::to_string(slots) + " slots of " + std::to_string(layout.num_kv_heads) +
                " heads of " + std::to_string(layout.head_dim) + " floats overflow a byte count");
  }
  const auto bytes = static_cast<size_t>(*checked);
  storage_ = static_cast<float*>(backend_.allocate(bytes));
  if (storage_ == nullptr) {
    throw Error("KV cache: cannot allocate " + std::to_string(bytes >> 20) + " MiB on " +
                std::string(backend_.name()));
  }
  free_blocks_.reserve(static_cast<size_t>(layout.num_blocks));
  for (int64_t block = layout.num_blocks - 1; block >= 0; --block) {
    free_blocks_.push_back(static_cast<int32_t>(block));
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

void KvCache::append(std::span<const std::pair<SequenceId, int64_t>> growth) {
  int64_t needed = 0;
  for (size_t i = 0; i < growth.size(); ++i) {
    const auto& [sequence, count] = growth[i];
    if (count < 0) throw Error("KV cache: cannot append a negative count");
    for (size_t j = 0; j < i; ++j) {
      if (growth[j].first == sequence) {
        throw Error("KV cache: sequence " + std::to_string(sequence) +
                    " appears twice in one append");
      }
    }
    const Sequence& entry = get(sequence);
    needed += blocks_for(entry.length + count) - static_cast<int64_t>(entry.blocks.size());
  }
  if (needed > free_blocks()) {
    throw KvCacheFullError("KV cache full: " + std::to_string(needed) + " more blocks of " +
                           std::to_string(layout_.block_size) + " tokens needed, " +
                           std::to_string(free_blocks()) + " of " +
                           std::to_string(layout_.num_blocks) + " free");
  }
  for (const auto& [sequence, count] : growth) {
    Sequence& entry = get(sequence);
    entry.length += count;
    while (static_cast<int64_t>(entry.blocks.size()) < blocks_for(entry.length)) {
      entry.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
  }
}

void KvCache::append(SequenceId sequence, int64_t count) {
  const std::pair<SequenceId, int64_t> growth[] = {{sequence, count}};
  append(growth);
}

void KvCache::truncate(SequenceId sequence, int64_t length) {
  Sequence& entry = get(sequence);
  if (length < 0 || length > entry.length) {
    throw Error("KV cache: cannot truncate sequence " + std::to_string(sequence) + " of length " +
                std::to_string(entry.length) + " to " + std::to_string(length));
  }
  entry.length = length;
  while (static_cast<int64_t>(entry.blocks.size()) > blocks_for(length)) {
    free_blocks_.push_back(entry.blocks.back());
    entry.blocks.pop_back();
  }
}

int32_t KvCache::slot(SequenceId sequence, int64_t position) const {
  const Sequence& entry = get(sequence);
  SPECRUN_CHECK(position >= 0 && position < entry.length)
      << "position " << position << " of a sequence of length " << entry.length;
  return static_cast<int32_t>(entry.blocks[static_cast<size_t>(position / layout_.block_size)] *
                                  layout_.block_size +
                              position % layout_.block_size);
}

float* KvCache::keys(int64_t layer) {
  SPECRUN_CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  const int64_t pool =
      layout_.num_blocks * layout_.block_size * layout_.num_kv_heads * layout_.head_dim;
  return storage_ + (2 * layer) * pool;
}

float* KvCache::values(int64_t layer) {
  return keys(layer) +
         layout_.num_blocks * layout_.block_size * layout_.num_kv_heads * layout_.head_dim;
}

}  // namespace specrun
