// The byte-pair-encoding model of a Hugging Face tokenizer.json: vocabulary, ranked merges,
// byte fallback, unknown token, ignore_merges, continuing-subword prefix and end-of-word suffix.
// Merging follows the reference exactly: the lowest-ranked adjacent pair is merged first, the
// leftmost one among equals.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specrun::text {

// Token string -> id, open addressing over one arena of key bytes (the vocabularies have up to a
// few hundred thousand entries and are probed once per character and once per word).
class StringIdMap {
 public:
  void reserve(size_t count);
  // Returns false when `key` is already present (the id is not changed).
  bool insert(std::string_view key, int32_t id);
  std::optional<int32_t> find(std::string_view key) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;  // -1: empty
  };
  void grow();
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

class Bpe {
 public:
  // Builds the model from tokenizer.json's "model" object; `source` names the file in errors.
  static std::unique_ptr<Bpe> from_json(const nlohmann::json& model, const std::string& source);

  // Appends the ids of one pre-tokenized word (valid UTF-8, non-empty).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const { return vocab_.find(token); }
  // nullptr for an id the vocabulary does not have.
  const std::string* id_to_token(int32_t id) const;
  // Distinct ids in the vocabulary.
  size_t vocab_size() const { return vocab_.size(); }
  // One past the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    uint32_t rank = 0;
    int32_t new_id = -1;
  };
  // (left id, right id) -> merge, open addressing on the packed pair.
  class PairMap {
   public:
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(int32_t left, int32_t right) const;

   private:
    struct Slot {
      uint64_t key = ~uint64_t{0};
      Merge merge;
    };
    std::vector<Slot> slots_;
    uint64_t mask_ = 0;
  };

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  // Adjacent character pairs, packed, that occur inside some vocabulary token.
  class PairSet {
   public:
    void insert(uint64_t key);
    bool contains(uint64_t key) const;

   private:
    std::vector<uint64_t> slots_ = std::vector<uint64_t>(16, ~uint64_t{0});
    size_t size_ = 0;
  };

  void merge_cached(std::string_view word, std::vector<int32_t>& out) const;
  void merge_in_parts(std::string_view word, std::vector<int32_t>& out) const;
  const PairSet& inner_pairs() const;
  bool is_single_char_token(std::string_view character) const;
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge(std::vector<int32_t>& symbols) const;
  void merge_small(std::vector<int32_t>& symbols) const;
  void merge_large(std::vector<int32_t>& symbols) const;

  StringIdMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  PairMap merges_;
  int32_t ascii_ids_[128];          // id of each one-byte character, -1 when not in the vocab
  int32_t byte_fallback_ids_[256];  // id of "<0xXX>", -1 when absent
  std::optional<int32_t> unk_id_;   // the unknown token, when the model names one
  std::string missing_unk_token_;   // names an unk_token absent from the vocab, else empty
  std::string continuing_subword_prefix_;  // prepended to every character but the first
  std::string end_of_word_suffix_;         // appended to the last character
  bool fuse_unk_ = false;                  // consecutive unknown characters give one unk
  bool byte_fallback_ = false;             // unknown characters become <0xXX> tokens
  bool ignore_merges_ = false;             // a word that is itself a token is not merged

  mutable std::once_flag inner_pairs_once_;
  mutable PairSet inner_pairs_;

  // Word -> ids, as the reference caches its merges (bounded: once full, nothing is added).
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace specrun::text
