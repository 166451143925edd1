// A Hugging Face tokenizer.json, loaded and run exactly as the reference library (Rust
// `tokenizers`) runs it: added and special tokens, normalizer, pre-tokenizer, BPE model,
// post-processor and decoder. Plus a streaming detokenizer for generated ids.
//
//   auto tokenizer = specrun::text::Tokenizer::load("path/to/tokenizer.json");
//   std::vector<int32_t> ids = tokenizer->encode("Hello world", /*add_special_tokens=*/true);
//   std::string text = tokenizer->decode(ids, /*skip_special_tokens=*/false);
//
// Input that is not valid UTF-8 is repaired first, each maximal invalid subsequence becoming
// U+FFFD, which is what the reference sees when its bindings turn bytes into a string.
// Truncation and padding settings in the file are ignored: specrun never truncates a prompt.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specrun::text {

class Bpe;
class StringIdMap;
class Normalizer;
class PreTokenizer;
class PostProcessor;
class Decoder;

struct AddedToken {
  std::string content;       // the text it matches
  int32_t id = -1;           // its id (the model's when the vocabulary has the content)
  bool single_word = false;  // matches only when not inside a word
  bool lstrip = false;       // swallows the whitespace on its left
  bool rstrip = false;       // swallows the whitespace on its right
  bool normalized = true;    // matched in the normalized text rather than the raw input
  bool special = false;      // dropped by decode(..., skip_special_tokens = true)
};

class Tokenizer {
 public:
  // Loads a tokenizer.json, or the tokenizer.json inside a directory. The bos and eos tokens and
  // the chat template come from tokenizer_config.json beside it when present. Throws specrun::Error
  // naming the file and the component (e.g. "pre_tokenizer.pretokenizers[0] (Split)") for anything
  // malformed or unsupported.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& path);
  // Builds from a parsed tokenizer.json document; `source` names it in errors.
  static std::unique_ptr<Tokenizer> from_json(const nlohmann::json& document,
                                              const std::string& source);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`; `add_special_tokens` applies the post-processor's template (BOS etc.).
  // Special-token strings inside the text are always recognized. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  // Text of `ids`; ids the tokenizer does not know are skipped, as the reference does. Byte
  // sequences that are not valid UTF-8 come out as U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // One past the largest id of the model vocabulary and the added tokens: the number of rows an
  // embedding needs.
  int32_t vocab_size() const { return id_limit_; }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  // tokenizer_config.json's chat_template (the one named "default" when it lists several); ""
  // when there is none.
  const std::string& chat_template() const { return chat_template_; }
  // Added tokens first, then the model vocabulary.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullopt for an id neither knows.
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The bytes token `id` adds to a detokenized text it does not begin: the decoder's rules for one
  // token (byte-level characters and byte-fallback <0xNN> tokens as their raw bytes,
  // SentencePiece's replacement character as a space) without those for the text's first token or
  // its ends and without repairing UTF-8, so that a token ending inside a character gives its
  // partial bytes. Concatenated after a first token, they are decode()'s bytes before its UTF-8
  // repair. "" for a special token and an id the tokenizer does not know. What a grammar matcher
  // checks a token by.
  std::string token_bytes(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // decode() that also reports whether the decoded bytes end inside a UTF-8 character (which
  // then shows as a trailing U+FFFD); the streaming decoder holds such text back.
  std::string decode_checked(std::span<const int32_t> ids, bool skip_special_tokens,
                             bool& incomplete) const;
  // The piece decode() reads for `id` before its decoder runs, or null where it reads none (an id
  // it does not know, a special token it skips): such an id changes no decoding it is part of.
  const std::string* decoded_piece(int32_t id, bool skip_special_tokens) const;

 private:
  class Matcher;
  Tokenizer();
  void encode_piece(std::string_view piece, bool at_origin, std::vector<int32_t>& ids) const;
  void encode_normalized(std::string_view segment, bool at_origin, std::vector<int32_t>& ids) const;

  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;                  // in file order, duplicates dropped
  std::vector<int32_t> added_index_by_id_;         // id -> index into added_, -1 when not added
  std::unique_ptr<StringIdMap> added_by_content_;  // content -> id of the added tokens
  std::unique_ptr<StringIdMap> special_contents_;  // contents of the special ones
  std::unique_ptr<Matcher> raw_matcher_;           // added tokens with normalized = false
  std::unique_ptr<Matcher> normalized_matcher_;    // the others, as the normalizer rewrites them
  int32_t id_limit_ = 0;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::string chat_template_;
};

// Turns generated ids into text as they arrive: each step returns the text that became final,
// never part of a UTF-8 character, and the pieces add up to decode() of all the ids (the
// SentencePiece leading-space rule and byte-fallback tokens included), with one exception: when a
// run of byte-fallback tokens that was valid UTF-8 (and was shown) turns invalid with later
// bytes, decode() replaces every byte of the run, while the stream keeps what it showed and
// replaces only the later bytes.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Feeds one id; returns the newly completed text (often empty while a character is split over
  // byte tokens).
  std::string step(int32_t id);
  // Returns whatever is still held back (an unfinished character comes out as U+FFFD) and starts
  // over.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // the window: context ids, then ids not yet emitted
  std::string prefix_;        // decode of the context ids
  size_t prefix_index_ = 0;   // how many of ids_ are context
};

}  // namespace specrun::text
