#include "runtime/engine/pairing.h"

#include <map>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/model/checkpoint.h"

namespace specrun {
namespace {

using nlohmann::json;

// What must match between a draft's and a target's tokenizers: the model type, the vocabulary
// and the added tokens. Read with type checks that name the file, since the pairing check may run
// before either tokenizer is loaded (and validated) in full.
struct TokenizerIdentity {
  std::string model_type;                                 // "BPE", "Unigram", ...
  nlohmann::json vocab;                                   // token -> id, as the file holds it
  std::map<int64_t, std::pair<std::string, bool>> added;  // id -> (content, special)
};

// A member of `object` of the type `is_type` accepts, or `fallback` when absent.
json member(const json& object, const char* key, bool (json::*is_type)() const, const char* type,
            json fallback, const std::filesystem::path& path, const std::string& where) {
  const auto found = object.find(key);
  if (found == object.end()) return fallback;
  if (!((*found).*is_type)()) {
    throw Error("malformed tokenizer " + path.string() + ": " + where + "\"" + key + "\" must be " +
                type + ", not " + json_excerpt(*found));
  }
  return *found;
}

TokenizerIdentity read_identity(const std::filesystem::path& path) {
  // tokenizer.json, or the document a GGUF file's tokenizer metadata makes.
  const json document = read_tokenizer_document(path);
  if (!document.is_object()) {
    throw Error("malformed tokenizer " + path.string() + ": the document is not a JSON object");
  }
  TokenizerIdentity identity;
  const json model =
      member(document, "model", &json::is_object, "an object", json::object(), path, "");
  identity.model_type =
      member(model, "type", &json::is_string, "a string", "", path, "model.").get<std::string>();
  identity.vocab = member(model, "vocab", &json::is_structured, "an object or array",
                          json::object(), path, "model.");
  const json added =
      member(document, "added_tokens", &json::is_array, "an array", json::array(), path, "");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& token = added[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "].";
    if (!token.is_object()) {
      throw Error("malformed tokenizer " + path.string() + ": added_tokens[" + std::to_string(i) +
                  "] must be an object, not " + json_excerpt(token));
    }
    const json id = member(token, "id", &json::is_number_integer, "an integer", -1, path, where);
    const json content = member(token, "content", &json::is_string, "a string", "", path, where);
    const json special =
        member(token, "special", &json::is_boolean, "a boolean", false, path, where);
    identity.added[id.get<int64_t>()] = {content.get<std::string>(), special.get<bool>()};
  }
  return identity;
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string text = "[";
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? ", " : "") + std::to_string(ids[i]);
  return text + "]";
}

void compare_tokenizers(const std::filesystem::path& target_path,
                        const std::filesystem::path& draft_path) {
  const TokenizerIdentity target = read_identity(target_path);
  const TokenizerIdentity draft = read_identity(draft_path);
  const std::string where =
      " (target " + target_path.string() + ", draft " + draft_path.string() + ")";
  if (target.model_type != draft.model_type) {
    throw Error("draft and target tokenizers differ: model type '" + excerpt(target.model_type) +
                "' vs '" + excerpt(draft.model_type) + "'" + where);
  }
  if (target.vocab != draft.vocab) {
    if (target.vocab.is_object() && draft.vocab.is_object()) {
      for (const auto& [token, id] : target.vocab.items()) {
        const auto other = draft.vocab.find(token);
        if (other == draft.vocab.end()) {
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
    }
    throw Error("draft and target tokenizers differ: the draft's vocabulary has " +
                std::to_string(draft.vocab.size()) + " tokens, the target's " +
                std::to_string(target.vocab.size()) + where);
  }
  if (target.added != draft.added) {
    for (const auto& [id, token] : target.added) {
      const auto other = draft.added.find(id);
      if (other == draft.added.end() || other->second != token) {
        throw Error("draft and target tokenizers differ: added token " + std::to_string(id) + " " +
                    json_excerpt(json(token.first)) +
                    (other == draft.added.end()
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
