#include "runtime/grammar/matcher.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "runtime/base/check.h"
#include "runtime/grammar/automaton.h"

namespace specrun::grammar {

namespace {

// The masks kept for states already seen are dropped, all at once, past this many bytes: a
// 262k-token vocabulary's mask is 32 KiB, so a few hundred of them.
constexpr size_t kMaskCacheBytes = size_t{16} << 20;

}  // namespace

struct Matcher::Shared {
  Shared(std::shared_ptr<const Grammar> grammar, bool cache)
      : automaton(std::move(grammar)), cache_masks(cache) {}

  std::mutex mutex;                                          // guards what follows
  Automaton automaton;                                       // states and transitions
  std::unordered_map<int32_t, std::vector<uint32_t>> masks;  // state -> its mask
  size_t mask_bytes = 0;                                     // held by `masks`
  const bool cache_masks;                                    // fill `masks` at all
  std::vector<int32_t> walk_states;                          // fill_mask's path
};

Matcher::Matcher(std::shared_ptr<const Grammar> grammar,
                 std::shared_ptr<const TokenVocabulary> vocabulary, bool cache_masks)
    : vocabulary_(std::move(vocabulary)) {
  SPECRUN_CHECK(grammar != nullptr && vocabulary_ != nullptr);
  shared_ = std::make_shared<Shared>(std::move(grammar), cache_masks);
  states_.push_back(shared_->automaton.initial());
}

const Grammar& Matcher::grammar() const {
  return shared_->automaton.grammar();
}

int32_t Matcher::walk(int32_t state, std::string_view bytes) const {
  std::lock_guard lock(shared_->mutex);
  for (const char byte : bytes) {
    state = shared_->automaton.next(state, static_cast<uint8_t>(byte));
    if (state == Automaton::kDead) break;
  }
  return state;
}

bool Matcher::accept_token(int32_t id) {
  const int32_t state = states_.back();
  if (state == kTerminated || id < 0 || id >= vocabulary_->size()) return false;
  if (vocabulary_->is_eos(id)) {
    if (!can_end()) return false;
    states_.push_back(kTerminated);
    return true;
  }
  const std::string& bytes = vocabulary_->token_bytes(id);
  if (bytes.empty()) return false;
  const int32_t next = walk(state, bytes);
  if (next == Automaton::kDead) return false;
  states_.push_back(next);
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  const int32_t state = states_.back();
  if (state == kTerminated) return false;
  const int32_t next = walk(state, bytes);
  if (next == Automaton::kDead) return false;
  states_.push_back(next);
  return true;
}

bool Matcher::can_end() const {
  const int32_t state = states_.back();
  if (state == kTerminated) return false;
  std::lock_guard lock(shared_->mutex);
  return shared_->automaton.accepting(state);
}

bool Matcher::is_complete() const {
  const int32_t state = states_.back();
  if (state == kTerminated) return true;
  std::lock_guard lock(shared_->mutex);
  return shared_->automaton.accepting(state) && !shared_->automaton.continues(state);
}

void Matcher::rollback(size_t tokens) {
  if (tokens > accepted_steps()) {
    throw Error("grammar matcher: cannot roll back " + std::to_string(tokens) + " steps, only " +
                std::to_string(accepted_steps()) + " were accepted");
  }
  states_.resize(states_.size() - tokens);
}

size_t Matcher::fill_mask(std::span<uint32_t> bits) const {
  const TokenVocabulary& vocabulary = *vocabulary_;
  const size_t words = vocabulary.mask_words();
  SPECRUN_CHECK(bits.size() >= words)
      << "the mask has " << bits.size() << " words, the vocabulary needs " << words;
  std::fill(bits.begin(), bits.end(), 0u);
  const int32_t state = states_.back();
  if (state == kTerminated) return 0;

  std::lock_guard lock(shared_->mutex);
  Automaton& automaton = shared_->automaton;
  if (const auto cached = shared_->masks.find(state); cached != shared_->masks.end()) {
    std::copy(cached->second.begin(), cached->second.end(), bits.begin());
  } else {
    // One preorder walk of the trie: a node's state is its parent's stepped by its byte, and a
    // node no stack accepts is skipped with its whole subtree.
    const std::vector<TokenVocabulary::TrieNode>& trie = vocabulary.trie();
    const int32_t* tokens = vocabulary.trie_tokens().data();
    std::vector<int32_t>& path = shared_->walk_states;
    path.resize(vocabulary.max_depth() + 1);
    path[0] = state;
    const size_t count = trie.size();
    size_t i = 0;
    if (automaton.continues(state)) {
      while (i < count) {
        const TokenVocabulary::TrieNode& node = trie[i];
        const int32_t next = automaton.next(path[node.depth - 1], node.byte);
        if (next == Automaton::kDead) {
          i = node.end;
          continue;
        }
        path[node.depth] = next;
        for (uint32_t k = 0; k < node.token_count; ++k) {
          const auto id = static_cast<uint32_t>(tokens[node.token_begin + k]);
          bits[id >> 5] |= uint32_t{1} << (id & 31);
        }
        ++i;
      }
    }
    if (automaton.accepting(state)) {
      for (const int32_t id : vocabulary.eos_ids()) {
        bits[static_cast<uint32_t>(id) >> 5] |= uint32_t{1} << (id & 31);
      }
    }
    const size_t bytes = words * sizeof(uint32_t);
    if (shared_->cache_masks) {
      if (shared_->mask_bytes + bytes > kMaskCacheBytes) {
        shared_->masks.clear();
        shared_->mask_bytes = 0;
      }
      shared_->masks.emplace(state, std::vector<uint32_t>(bits.begin(), bits.begin() + words));
      shared_->mask_bytes += bytes;
    }
  }
  size_t allowed = 0;
  for (size_t w = 0; w < words; ++w) allowed += static_cast<size_t>(__builtin_popcount(bits[w]));
  return allowed;
}

}  // namespace specrun::grammar
