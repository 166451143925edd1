#include "runtime/engine/pairing.h"

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/model/checkpoint.h"

namespace specrun {
namespace {

using nlohmann::json;

// tokenizer.json, or the document a GGUF file's tokenizer metadata makes: pairs of either format.
json read_tokenizer(const std::filesystem::path& path) {
  return read_tokenizer_document(path);
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string text = "[";
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? ", " : "") + std::to_string(ids[i]);
  return text + "]";
}

void compare_tokenizers(const std::filesystem::path& target_path,
                        const std::filesystem::path& draft_path) {
  const json target = read_tokenizer(target_path);
  const json draft = read_tokenizer(draft_path);
  const std::string where =
      " (target " + target_path.string() + ", draft " + draft_path.string() + ")";
  const json target_model = target.value("model", json::object());
  const json draft_model = draft.value("model", json::object());
  if (target_model.value("type", "") != draft_model.value("type", "")) {
    throw Error("draft and target tokenizers differ: model type '" +
                target_model.value("type", "") + "' vs '" + draft_model.value("type", "") + "'" +
                where);
  }
  const json target_vocab = target_model.value("vocab", json::object());
  const json draft_vocab = draft_model.value("vocab", json::object());
  if (target_vocab != draft_vocab) {
    for (const auto& [token, id] : target_vocab.items()) {
      const auto other = draft_vocab.find(token);
      if (other == draft_vocab.end()) {
        throw Error("draft and target tokenizers differ: token " + json_excerpt(json(token)) +
                    " (id " + json_excerpt(id) + " in the target) is missing from the draft" +
                    where);
      }
      if (*other != id) {
        throw Error("draft and target tokenizers differ: token " + json_excerpt(json(token)) +
                    " is id " + json_excerpt(id) + " in the target and " + json_excerpt(*other) +
                    " in the draft" + where);
      }
    }
    throw Error("draft and target tokenizers differ: the draft's vocabulary has " +
                std::to_string(draft_vocab.size()) + " tokens, the target's " +
                std::to_string(target_vocab.size()) + where);
  }
  // Added and special tokens: content, id and whether special.
  auto added = [](const json& tokenizer) {
    std::map<int64_t, std::pair<std::string, bool>> tokens;
    for (const json& token : tokenizer.value("added_tokens", json::array())) {
      tokens[token.value("id", int64_t{-1})] = {token.value("content", ""),
                                                token.value("special", false)};
    }
    return tokens;
  };
  const auto target_added = added(target);
  const auto draft_added = added(draft);
  if (target_added != draft_added) {
    for (const auto& [id, token] : target_added) {
      const auto other = draft_added.find(id);
      if (other == draft_added.end() || other->second != token) {
        throw Error("draft and target tokenizers differ: added token " + std::to_string(id) + " " +
                    json_excerpt(json(token.first)) +
                    (other == draft_added.end()
                         ? " is missing from the draft"
                         : " is " + json_excerpt(json(other->second.first)) + " in the draft") +
                    where);
      }
    }
    throw Error("draft and target tokenizers differ: the draft has added tokens the target lacks" +
                where);
  }
}

}  // namespace

void check_pairing(const Model& target, const Model& draft) {
  const auto& target_tokenizer = target.paths().tokenizer;
  const auto& draft_tokenizer = draft.paths().tokenizer;
  if (target_tokenizer.has_value() != draft_tokenizer.has_value()) {
    throw Error(std::string("draft and target cannot be compared: only the ") +
                (target_tokenizer ? "target" : "draft") + " has a tokenizer.json (target " +
                target.paths().directory.string() + ", draft " + draft.paths().directory.string() +
                ")");
  }
  const ModelConfig& t = target.config();
  const ModelConfig& d = draft.config();
  if (t.bos_token_ids != d.bos_token_ids) {
    throw Error("draft and target differ: bos_token_id " + ids_to_string(t.bos_token_ids) +
                " in the target, " + ids_to_string(d.bos_token_ids) + " in the draft");
  }
  if (t.eos_token_ids != d.eos_token_ids) {
    throw Error("draft and target differ: eos_token_id " + ids_to_string(t.eos_token_ids) +
                " in the target, " + ids_to_string(d.eos_token_ids) + " in the draft");
  }
  if (target_tokenizer) {
    compare_tokenizers(*target_tokenizer, *draft_tokenizer);
  } else if (t.vocab_size != d.vocab_size) {
    throw Error("draft and target differ: vocab_size " + std::to_string(t.vocab_size) +
                " in the target, " + std::to_string(d.vocab_size) +
                " in the draft (and no tokenizer.json shows they share a vocabulary)");
  }
}

}  // namespace specrun
