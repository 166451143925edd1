#include "runtime/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/base/allocation.h"
#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/text/bpe.h"
#include "runtime/text/pipeline.h"
#include "runtime/text/unicode.h"

namespace specrun::text {
namespace {

using nlohmann::json;

// A segment of the input: an added token (id >= 0) or text to tokenize.
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

size_t leading_whitespace(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t next = i;
    if (!is_whitespace(next_code_point(text, next))) break;
    i = next;
  }
  return i;
}

// Where the whitespace at the end of `text` starts.
size_t trailing_whitespace_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t at = start;
    if (!is_whitespace(next_code_point(text, at))) break;
    end = start;
  }
  return end;
}

std::optional<std::string> token_name(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

// The chat template: a string, or a list of {"name", "template"} of which transformers uses the
// one named "default".
std::string chat_template_of(const json& config, const std::filesystem::path& path) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& entry : *it) {
      if (entry.is_object() && entry.value("name", json()) == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
    return "";
  }
  throw Error(path.string() + ": chat_template must be a string or a list of named templates");
}

json read_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(path.string() + ": cannot be opened");
  std::ostringstream contents;
  contents << file.rdbuf();
  return parse_json(contents.str(), path.string());
}

}  // namespace

// Finds added tokens in text, leftmost first and longest at a position, as the reference's
// Aho-Corasick automaton (MatchKind::LeftmostLongest) does, over a byte trie.
class Tokenizer::Matcher {
 public:
  void add(std::string_view pattern, size_t token_index) {
    if (pattern.empty()) return;
    int32_t node = 0;
    for (const char c : pattern) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t child = find_child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].children.emplace_back(byte, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    auto& terminal = nodes_[static_cast<size_t>(node)].token_index;
    if (terminal < 0) terminal = static_cast<int32_t>(token_index);
    first_bytes_[static_cast<uint8_t>(pattern[0])] = true;
    empty_ = false;
  }

  bool empty() const { return empty_; }

  // The first match starting at or after `from`: [begin, end) and the token index.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end,
            size_t& token_index) const {
    for (size_t start = from; start < text.size(); ++start) {
      if (!first_bytes_[static_cast<uint8_t>(text[start])]) continue;
      int32_t node = 0;
      int32_t best = -1;
      size_t best_end = 0;
      for (size_t i = start; i < text.size(); ++i) {
        node = find_child(node, static_cast<uint8_t>(text[i]));
        if (node < 0) break;
        if (nodes_[static_cast<size_t>(node)].token_index >= 0) {
          best = nodes_[static_cast<size_t>(node)].token_index;
          best_end = i + 1;
        }
      }
      if (best >= 0) {
        begin = start;
        end = best_end;
        token_index = static_cast<size_t>(best);
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token_index = -1;
  };
  int32_t find_child(int32_t node, uint8_t byte) const {
    for (const auto& [b, child] : nodes_[static_cast<size_t>(node)].children) {
      if (b == byte) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> first_bytes_{};
  bool empty_ = true;
};

namespace {

// The reference's AddedVocabulary::find_matches: the added tokens in `text` and the text between
// them, with single_word, lstrip and rstrip applied.
template <typename Matcher>
void split_added(std::string_view text, const Matcher& matcher,
                 const std::vector<AddedToken>& tokens, std::vector<Segment>& segments) {
  segments.clear();
  size_t start_offset = 0;
  size_t from = 0;
  size_t match_begin = 0;
  size_t match_end = 0;
  size_t index = 0;
  while (matcher.find(text, from, match_begin, match_end, index)) {
    from = match_end;
    const AddedToken& token = tokens[index];
    size_t start = match_begin;
    size_t stop = match_end;
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_code_point(text, start));
      size_t after = stop;
      const bool stop_space = stop == text.size() || !is_word_char(next_code_point(text, after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip)
      start = std::max(trailing_whitespace_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_whitespace(text.substr(stop));
    if (start_offset < start) segments.push_back({start_offset, start, -1});
    segments.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) segments.push_back({start_offset, text.size(), -1});
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) file = path / "tokenizer.json";
  if (!std::filesystem::exists(file, error)) {
    throw Error(file.string() + ": no such tokenizer file");
  }
  if (!std::filesystem::is_regular_file(file, error)) {
    throw Error(file.string() + ": not a regular file");
  }
  auto tokenizer =
      naming_allocation_failure(file, [&] { return from_json(read_json(file), file.string()); });
  const std::filesystem::path config_path = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, error)) {
    if (!std::filesystem::is_regular_file(config_path, error)) {
      throw Error(config_path.string() + ": not a regular file");
    }
    const json config = read_json(config_path);
    if (config.is_object()) {
      if (const auto bos = token_name(config, "bos_token")) {
        tokenizer->bos_id_ = tokenizer->token_to_id(*bos);
      }
      if (const auto eos = token_name(config, "eos_token")) {
        tokenizer->eos_id_ = tokenizer->token_to_id(*eos);
      }
      tokenizer->chat_template_ = chat_template_of(config, config_path);
    }
  }
  return tokenizer;
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(const json& document, const std::string& source) {
  if (!document.is_object()) throw Error(source + ": not a tokenizer.json object");
  auto tokenizer = std::unique_ptr<Tokenizer>(new Tokenizer);
  const JsonContext root{source, ""};
  auto component = [&](const char* key) -> const json& {
    static const json null_json;
    const auto it = document.find(key);
    return it == document.end() ? null_json : *it;
  };

  const json& model = component("model");
  if (!model.is_object()) throw Error(source + ": model: missing (a tokenizer.json needs one)");
  const auto model_type = model.find("type");
  // Files written before the "type" tag existed hold a BPE model when they have merges.
  const std::string type = model_type != model.end() && model_type->is_string()
                               ? model_type->get<std::string>()
                               : (model.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    throw Error(source + ": model: unsupported type '" + type + "' (supported: BPE)");
  }
  tokenizer->model_ = Bpe::from_json(model, source);
  tokenizer->normalizer_ = parse_normalizer(component("normalizer"), root.at("normalizer"));
  tokenizer->pre_tokenizer_ =
      parse_pre_tokenizer(component("pre_tokenizer"), root.at("pre_tokenizer"));
  tokenizer->post_processor_ =
      parse_post_processor(component("post_processor"), root.at("post_processor"));
  tokenizer->decoder_ = parse_decoder(component("decoder"), root.at("decoder"));

  // Added tokens take the model's id when the vocabulary has their content, else the next id
  // after the model's vocabulary and the earlier added tokens (the reference's add_tokens).
  const json& added = component("added_tokens");
  if (!added.is_null() && !added.is_array()) throw Error(source + ": added_tokens: not a list");
  int32_t max_added = -1;
  const auto model_size = static_cast<int32_t>(tokenizer->model_->vocab_size());
  // At most one entry per content is live (a later one replaces the earlier); `latest` finds it in
  // constant time, so that a file with many added tokens loads in linear time.
  std::vector<AddedToken> entries;
  std::vector<bool> replaced;
  std::unordered_map<std::string, size_t> latest;
  for (size_t i = 0; !added.is_null() && i < added.size(); ++i) {
    const json& entry = added[i];
    const JsonContext at = root.at("added_tokens[" + std::to_string(i) + "]");
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string()) {
      at.fail("has no 'content'");
    }
    AddedToken token;
    token.content = entry["content"].get<std::string>();
    if (!is_valid_utf8(token.content)) at.fail("'content' is not valid UTF-8");
    auto flag = [&](const char* key, bool fallback) {
      const auto it = entry.find(key);
      if (it == entry.end() || it->is_null()) return fallback;
      if (!it->is_boolean()) at.fail(std::string("'") + key + "' must be true or false");
      return it->get<bool>();
    };
    token.special = flag("special", false);
    token.single_word = flag("single_word", false);
    token.lstrip = flag("lstrip", false);
    token.rstrip = flag("rstrip", false);
    token.normalized = flag("normalized", !token.special);
    if (token.content.empty()) continue;
    std::optional<int32_t> id;
    const auto earlier = latest.find(token.content);
    if (earlier != latest.end()) {
      const AddedToken& other = entries[earlier->second];
      const bool duplicate = other.special == token.special &&
                             other.single_word == token.single_word &&
                             other.lstrip == token.lstrip && other.rstrip == token.rstrip &&
                             other.normalized == token.normalized;
      if (duplicate) continue;
      id = other.id;
    }
    if (!id) id = tokenizer->model_->token_to_id(token.content);
    if (!id) {
      id = max_added < 0
               ? model_size
               : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
    }
    token.id = *id;
    // A later entry with the same content replaces the earlier one (and takes its place last).
    if (earlier != latest.end()) replaced[earlier->second] = true;
    latest[token.content] = entries.size();
    max_added = std::max(max_added, token.id);
    entries.push_back(std::move(token));
    replaced.push_back(false);
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!replaced[i]) tokenizer->added_.push_back(std::move(entries[i]));
  }

  tokenizer->id_limit_ = std::max(tokenizer->model_->id_limit(), max_added + 1);
  tokenizer->added_index_by_id_.assign(static_cast<size_t>(tokenizer->id_limit_), -1);
  tokenizer->raw_matcher_ = std::make_unique<Matcher>();
  tokenizer->normalized_matcher_ = std::make_unique<Matcher>();
  tokenizer->added_by_content_ = std::make_unique<StringIdMap>();
  tokenizer->special_contents_ = std::make_unique<StringIdMap>();
  for (size_t i = 0; i < tokenizer->added_.size(); ++i) {
    const AddedToken& token = tokenizer->added_[i];
    tokenizer->added_index_by_id_[static_cast<size_t>(token.id)] = static_cast<int32_t>(i);
    tokenizer->added_by_content_->insert(token.content, token.id);
    if (token.special) tokenizer->special_contents_->insert(token.content, token.id);
  }
  // The reference builds its automatons from the special tokens first, then the others.
  for (const bool special : {true, false}) {
    for (size_t i = 0; i < tokenizer->added_.size(); ++i) {
      const AddedToken& token = tokenizer->added_[i];
      if (token.special != special) continue;
      if (!token.normalized) {
        tokenizer->raw_matcher_->add(token.content, i);
      } else {
        std::string pattern = token.content;
        if (tokenizer->normalizer_) tokenizer->normalizer_->normalize(pattern);
        tokenizer->normalized_matcher_->add(pattern, i);
      }
    }
  }
  return tokenizer;
}

void Tokenizer::encode_piece(std::string_view piece, bool at_origin,
                             std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (!pre_tokenizer_) {
    model_->tokenize(piece, ids);
    return;
  }
  pre_tokenizer_->split(piece, at_origin,
                        [&](std::string_view word, bool) { model_->tokenize(word, ids); });
}

void Tokenizer::encode_normalized(std::string_view segment, bool at_origin,
                                  std::vector<int32_t>& ids) const {
  std::string normalized;
  if (normalizer_) {
    normalized.assign(segment);
    normalizer_->normalize(normalized);
    segment = normalized;
  }
  if (normalized_matcher_->empty()) {
    encode_piece(segment, at_origin, ids);
    return;
  }
  std::vector<Segment> parts;
  split_added(segment, *normalized_matcher_, added_, parts);
  for (const Segment& part : parts) {
    if (part.id >= 0) {
      ids.push_back(part.id);
    } else {
      encode_piece(segment.substr(part.begin, part.end - part.begin), at_origin && part.begin == 0,
                   ids);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_->empty()) {
    if (!text.empty()) encode_normalized(text, true, ids);
  } else {
    std::vector<Segment> segments;
    split_added(text, *raw_matcher_, added_, segments);
    for (const Segment& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
      } else {
        encode_normalized(text.substr(segment.begin, segment.end - segment.begin),
                          segment.begin == 0, ids);
      }
    }
  }
  if (post_processor_) post_processor_->process(ids, add_special_tokens);
  return ids;
}

std::string Tokenizer::decode_checked(std::span<const int32_t> ids, bool skip_special_tokens,
                                      bool& incomplete) const {
  incomplete = false;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (const std::string* piece = decoded_piece(id, skip_special_tokens)) tokens.push_back(*piece);
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  decoder_->decode_chain(tokens, incomplete);
  std::string joined;
  for (const std::string& token : tokens) joined += token;
  return joined;
}

const std::string* Tokenizer::decoded_piece(int32_t id, bool skip_special_tokens) const {
  if (id < 0 || id >= id_limit_) return nullptr;
  const int32_t added = added_index_by_id_[static_cast<size_t>(id)];
  if (added >= 0) {
    const AddedToken& token = added_[static_cast<size_t>(added)];
    return skip_special_tokens && token.special ? nullptr : &token.content;
  }
  const std::string* token = model_->id_to_token(id);
  // A model token that happens to spell a special token is skipped too, as the reference decides
  // by content.
  if (token != nullptr && skip_special_tokens && special_contents_->find(*token)) return nullptr;
  return token;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  bool incomplete = false;
  return decode_checked(ids, skip_special_tokens, incomplete);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto id = added_by_content_->find(token)) return id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit_) return std::nullopt;
  const int32_t added = added_index_by_id_[static_cast<size_t>(id)];
  if (added >= 0) return added_[static_cast<size_t>(added)].content;
  if (const std::string* token = model_->id_to_token(id)) return *token;
  return std::nullopt;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= id_limit_) return "";
  std::string token;
  const int32_t added = added_index_by_id_[static_cast<size_t>(id)];
  if (added >= 0) {
    const AddedToken& entry = added_[static_cast<size_t>(added)];
    if (entry.special) return "";
    token = entry.content;
  } else if (const std::string* model_token = model_->id_to_token(id)) {
    if (special_contents_->find(*model_token)) return "";
    token = *model_token;
  } else {
    return "";
  }
  // Without a decoder, decode() joins the tokens with spaces.
  if (!decoder_) return " " + token;
  bool fused = false;
  decoder_->piece(token, fused);
  return token;
}

bool Tokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= id_limit_) return false;
  const int32_t added = added_index_by_id_[static_cast<size_t>(id)];
  return added >= 0 && added_[static_cast<size_t>(added)].special;
}

// ---- StreamingDecoder ------------------------------------------------------------------------

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDecoder::step(int32_t id) {
  // The reference's DecodeStream: decode a window of context ids plus the new ones, and emit
  // what extends the context's own decoding, once it no longer ends inside a character. The
  // context keeps rules such as SentencePiece's "strip the first leading space" right.
  // An id that decode() skips changes no decoding: it stays out of the window, which would
  // otherwise grow with every such id and make each step decode all of them again.
  if (tokenizer_.decoded_piece(id, skip_special_tokens_) == nullptr) return "";
  bool incomplete = false;
  if (prefix_.empty() && !ids_.empty()) {
    std::string text = tokenizer_.decode_checked(ids_, skip_special_tokens_, incomplete);
    if (!incomplete) {
      prefix_ = std::move(text);
      prefix_index_ = ids_.size();
    }
  }
  ids_.push_back(id);
  std::string text = tokenizer_.decode_checked(ids_, skip_special_tokens_, incomplete);
  if (text.size() <= prefix_.size() || incomplete) return "";
  std::string fresh;
  if (text.compare(0, prefix_.size(), prefix_) == 0) {
    fresh = text.substr(prefix_.size());
  } else {
    // The context decodes differently with the new ids: a run of byte-fallback tokens that was
    // valid UTF-8 is not any more, and the rule replaces every byte of an invalid run, the
    // shown ones too. What was shown stays shown; the ids not yet shown are decoded on their own,
    // so that no piece starts inside a character.
    const std::span<const int32_t> unshown = std::span<const int32_t>(ids_).subspan(prefix_index_);
    bool unshown_incomplete = false;
    fresh = tokenizer_.decode_checked(unshown, skip_special_tokens_, unshown_incomplete);
  }
  const size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_.decode_checked(ids_, skip_special_tokens_, incomplete);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamingDecoder::flush() {
  std::string fresh;
  if (!ids_.empty()) {
    const std::string text = tokenizer_.decode(ids_, skip_special_tokens_);
    if (text.size() > prefix_.size() && text.compare(0, prefix_.size(), prefix_) == 0) {
      fresh = text.substr(prefix_.size());
    }
  }
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return fresh;
}

}  // namespace specrun::text
