// A model's vocabulary as the grammar matcher sees it: each token id's exact bytes (what the
// token adds to the detokenized text), the end-of-sequence ids, and a trie of the bytes in
// preorder, so that a mask is one walk over shared prefixes rather than one match per token.
// Built once per model and shared (std::shared_ptr<const TokenVocabulary>) by every matcher.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace specrun::text {
class Tokenizer;
}

namespace specrun::grammar {

class TokenVocabulary {
 public:
  // One trie node: the byte it adds to its parent's prefix. Nodes are in preorder, so a node's
  // subtree is [its index, end) and skipping it is one jump.
  struct TrieNode {
    uint32_t end = 0;          // one past the last node of its subtree
    uint32_t token_begin = 0;  // the tokens spelling exactly this prefix:
    uint16_t token_count = 0;  //   trie_tokens()[token_begin, token_begin + token_count)
    uint16_t depth = 0;        // its prefix's length in bytes (1 for a child of the root)
    uint8_t byte = 0;          // the prefix's last byte
  };

  // `token_bytes[id]` is what token id adds to the text; an empty string marks a token the
  // grammar never allows (a special or control token, an unused id). `eos_ids` end generation:
  // allowed exactly when the text so far is a sentence, whatever their bytes. Throws
  // specrun::Error for an eos id out of range or a token longer than 65535 bytes.
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids);

  // Every id of `tokenizer` with its Tokenizer::token_bytes(); special (and other added control)
  // tokens contribute nothing and are never allowed, but for `eos_ids`.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const text::Tokenizer& tokenizer,
                                                               std::vector<int32_t> eos_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  // 32-bit words of a mask over this vocabulary.
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& token_bytes(int32_t id) const { return bytes_.at(static_cast<size_t>(id)); }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  bool is_eos(int32_t id) const;

  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }
  // The longest token in bytes: the depth of the trie.
  size_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> bytes_;    // [id] -> its bytes
  std::vector<int32_t> eos_ids_;      // sorted
  std::vector<TrieNode> trie_;        // preorder; the root (empty prefix) is not stored
  std::vector<int32_t> trie_tokens_;  // ids grouped by trie node
  size_t max_depth_ = 0;              // longest token, bytes
};

}  // namespace specrun::grammar
