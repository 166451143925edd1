#include "runtime/grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "runtime/text/tokenizer.h"
#include "specrun/error.hpp"

namespace specrun::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)) {
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
  for (const int32_t id : eos_ids_) {
    if (id < 0 || id >= size()) {
      throw Error("grammar vocabulary: end-of-sequence id " + std::to_string(id) +
                  " is outside the vocabulary of " + std::to_string(size()) + " tokens");
    }
  }
  // The ids with bytes (EOS ids never walk the trie), sorted by their bytes: then each trie node
  // comes right after its prefix's, in preorder, as the sorted list is read once.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id) {
    const std::string& bytes = bytes_[static_cast<size_t>(id)];
    if (bytes.empty() || is_eos(id)) continue;
    if (bytes.size() > 0xFFFF) {
      throw Error("grammar vocabulary: token " + std::to_string(id) + " is " +
                  std::to_string(bytes.size()) + " bytes long (at most 65535)");
    }
    order.push_back(id);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
  });
  std::vector<uint32_t> open;  // the node at each depth of the current path: open[d - 1]
  const std::string* previous = nullptr;
  for (const int32_t id : order) {
    const std::string& bytes = bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    if (previous != nullptr) {
      const size_t limit = std::min(previous->size(), bytes.size());
      while (common < limit && (*previous)[common] == bytes[common]) ++common;
    }
    while (open.size() > common) {
      trie_[open.back()].end = static_cast<uint32_t>(trie_.size());
      open.pop_back();
    }
    for (size_t d = common; d < bytes.size(); ++d) {
      TrieNode node;
      node.byte = static_cast<uint8_t>(bytes[d]);
      node.depth = static_cast<uint16_t>(d + 1);
      node.token_begin = static_cast<uint32_t>(trie_tokens_.size());
      open.push_back(static_cast<uint32_t>(trie_.size()));
      trie_.push_back(node);
    }
    TrieNode& last = trie_[open.back()];
    if (last.token_count == 0) last.token_begin = static_cast<uint32_t>(trie_tokens_.size());
    trie_tokens_.push_back(id);
    ++last.token_count;
    max_depth_ = std::max(max_depth_, bytes.size());
    previous = &bytes;
  }
  while (!open.empty()) {
    trie_[open.back()].end = static_cast<uint32_t>(trie_.size());
    open.pop_back();
  }
}

bool TokenVocabulary::is_eos(int32_t id) const {
  return std::binary_search(eos_ids_.begin(), eos_ids_.end(), id);
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(
    const text::Tokenizer& tokenizer, std::vector<int32_t> eos_ids) {
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(eos_ids));
}

}  // namespace specrun::grammar
