// The components of a Hugging Face tokenizer.json pipeline other than the model: normalizers,
// pre-tokenizers, decoders and post-processors, each parsed from its JSON object and behaving as
// the reference library's component of the same name. Internal to runtime/text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specrun::text {

// A non-owning reference to a callable, for the per-piece callbacks of the pre-tokenizers.
template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): passed like a lambda
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

// The deepest a Sequence (of normalizers, pre-tokenizers, decoders or processors) may nest in
// another. Published tokenizers nest one or two; the bound keeps the component tree and the
// paths that name its parts (which grow with depth) small whatever the file says.
inline constexpr int kMaxSequenceDepth = 16;

// Where a component sits in tokenizer.json, for error messages: "<file>: <path>".
struct JsonContext {
  std::string source;  // the file
  std::string path;    // e.g. "pre_tokenizer.pretokenizers[0]"
  int depth = 0;       // how many Sequences enclose the component
  JsonContext at(const std::string& child) const { return {source, path + child, depth}; }
  // A step of a Sequence: one level deeper, refused past kMaxSequenceDepth.
  JsonContext step(const std::string& child) const;
  [[noreturn]] void fail(const std::string& what) const;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites valid UTF-8 `text` in place.
  virtual void normalize(std::string& text) const = 0;
};

// Receives one piece: its text and whether it starts at offset 0 of the original input (what
// Metaspace's prepend_scheme "first" asks).
using PieceSink = FunctionRef<void(std::string_view, bool)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and possibly rewrites) one piece, passing each non-empty sub-piece to `emit`.
  virtual void split(std::string_view piece, bool at_origin, PieceSink emit) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings in place (the reference's decode_chain). A decoder that turns
  // tokens into bytes sets `incomplete` when those bytes end in an unfinished UTF-8 character.
  virtual void decode_chain(std::vector<std::string>& tokens, bool& incomplete) const = 0;
  // Rewrites one token's string into the bytes it adds to a text it does not begin: the rules
  // for a text's first token (Metaspace dropping its leading space, Strip at the start) do not
  // apply and nothing is repaired, so a byte-fallback or byte-level token yields its raw byte.
  // `fused` is set once a Fuse step has run: a later Strip then sees the whole text, whose ends
  // this token is not at.
  virtual void piece(std::string& token, bool& fused) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens around one sequence's ids when `add_special_tokens` is set.
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

// Each returns nullptr for a JSON null and throws Error naming the component (file, JSON path,
// type) for anything malformed or unsupported. `token_ids` resolves token names for the
// post-processors.
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& json, const JsonContext& where);
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const nlohmann::json& json,
                                                  const JsonContext& where);
std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& json, const JsonContext& where);
std::unique_ptr<PostProcessor> parse_post_processor(const nlohmann::json& json,
                                                    const JsonContext& where);

// The byte-level alphabet (GPT-2's bytes_to_unicode): the character standing for each byte.
char32_t byte_level_char(uint8_t byte);

}  // namespace specrun::text
