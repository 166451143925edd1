// The grammar engine on real vocabularies (../shared/tokenizers; skipped when absent):
// Tokenizer::token_bytes against decode, masks against the brute-force reference, and documents
// generated under held-out JSON schemas by random walks under the mask, every one validated by
// Python's jsonschema (tools/setup-python.sh jsonschema; skipped without it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/vocabulary.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"
#include "tests/grammar_testing.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

using testing::brute_force_mask;
using testing::mask_of;

namespace fs = std::filesystem;
using grammar::Matcher;
using grammar::TokenVocabulary;
using json = nlohmann::ordered_json;

std::unique_ptr<text::Tokenizer> load(const std::string& family) {
  const fs::path path = testing::shared_path("tokenizers/" + family + "/tokenizer.json");
  if (!fs::exists(path)) return nullptr;
  return text::Tokenizer::load(path);
}

std::shared_ptr<const TokenVocabulary> vocabulary_of(const text::Tokenizer& tokenizer) {
  std::vector<int32_t> eos;
  if (tokenizer.eos_id()) eos.push_back(*tokenizer.eos_id());
  return TokenVocabulary::from_tokenizer(tokenizer, eos);
}

std::vector<int32_t> allowed_ids(const std::vector<uint32_t>& bits) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < bits.size(); ++w) {
    for (uint32_t word = bits[w]; word != 0; word &= word - 1) {
      ids.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(word))));
    }
  }
  return ids;
}

class GrammarVocabularyTest : public ::testing::TestWithParam<std::string> {};

// Concatenated after a first token, the tokens' bytes are what decode() gives.
TEST_P(GrammarVocabularyTest, TokenBytesAreWhatDecodeAdds) {
  const auto tokenizer = load(GetParam());
  if (!tokenizer) GTEST_SKIP() << "../shared/tokenizers/" << GetParam() << " is absent";
  const int32_t anchor = tokenizer->encode("Hello", false).at(0);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> pick(0, tokenizer->vocab_size() - 1);
  int checked = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ids = {anchor};
    std::string expected = tokenizer->decode(ids, false);
    for (int k = 0; k < 4; ++k) {
      const int32_t id = pick(rng);
      if (tokenizer->is_special(id) || !tokenizer->id_to_token(id)) continue;
      const std::string bytes = tokenizer->token_bytes(id);
      if (!text::is_valid_utf8(bytes)) continue;  // a partial character: decode repairs it
      ids.push_back(id);
      expected += bytes;
    }
    ASSERT_EQ(tokenizer->decode(ids, false), expected) << "trial " << trial;
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
  // Characters split over byte tokens come out as their raw bytes, whole when joined.
  const std::vector<int32_t> split = tokenizer->encode("\xE5\x8F\xAB\xF0\x9F\xA6\x80", false);
  std::string joined;
  for (const int32_t id : split) joined += tokenizer->token_bytes(id);
  const std::string whole = tokenizer->decode(split, false);
  EXPECT_EQ(joined.substr(joined.size() - 7), whole.substr(whole.size() - 7));
  for (const int32_t id : split) EXPECT_FALSE(tokenizer->token_bytes(id).empty());
  if (tokenizer->eos_id()) {
    EXPECT_EQ(tokenizer->token_bytes(*tokenizer->eos_id()), "");
  }
}

TEST_P(GrammarVocabularyTest, MasksEqualBruteForce) {
  const auto tokenizer = load(GetParam());
  if (!tokenizer) GTEST_SKIP() << "../shared/tokenizers/" << GetParam() << " is absent";
  const auto vocabulary = vocabulary_of(*tokenizer);
  const auto schema = grammar::json_schema_grammar(std::string_view(R"({"type":"object",
      "properties":{"name":{"type":"string","maxLength":12},"tags":{"type":"array",
      "items":{"enum":["red","green","blue"]}},"age":{"type":"integer","minimum":0,"maximum":130},
      "when":{"format":"date"}},"required":["name"]})"));
  const std::vector<std::string> prefixes = {"",
                                             "{",
                                             "{\"name\": \"",
                                             "{\"name\":\"J\xC3\xB6rg",
                                             "{\"name\":\"ab\\u00",
                                             "{\"name\":\"a\", \"tags\":[\"gr",
                                             "{\"name\":\"a\",\"age\":1",
                                             "{\"name\":\"a\",\"when\":\"2024-0"};
  for (const std::string& prefix : prefixes) {
    Matcher matcher(schema, vocabulary);
    ASSERT_TRUE(matcher.accept_bytes(prefix)) << prefix;
    EXPECT_EQ(mask_of(matcher), brute_force_mask(matcher)) << "after '" << prefix << "'";
  }
  Matcher any(grammar::any_json_grammar(false), vocabulary);
  EXPECT_EQ(mask_of(any), brute_force_mask(any));
  ASSERT_TRUE(any.accept_bytes("[1.5e"));
  EXPECT_EQ(mask_of(any), brute_force_mask(any));
}

INSTANTIATE_TEST_SUITE_P(Families, GrammarVocabularyTest,
                         ::testing::Values("llama2", "llama3", "qwen3", "gemma3"));

// The held-out schemas: none of them was used to write the compiler's other tests.
std::vector<std::pair<std::string, std::string>> held_out_schemas() {
  return {
      {"person", R"({"type":"object","properties":{"name":{"type":"string","minLength":1,
        "maxLength":20},"age":{"type":"integer","minimum":0,"maximum":150},
        "email":{"type":"string","pattern":"^[a-z0-9.]{1,10}@[a-z]{2,8}\\.(com|org)$"}},
        "required":["name","age"]})"},
      {"nested", R"({"type":"object","properties":{"address":{"type":"object","properties":{
        "street":{"type":"string","maxLength":16},"city":{"type":"string","maxLength":12},
        "zip":{"type":"string","pattern":"^\\d{5}$"}},"required":["city","zip"]},
        "tags":{"type":"array","items":{"type":"string","maxLength":8},"maxItems":3}},
        "required":["address"]})"},
      {"bounded-array", R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":4})"},
      {"enums", R"({"type":"object","properties":{"color":{"enum":["red","green","dark blue"]},
        "size":{"type":"integer","enum":[1,2,3]},"unit":{"const":"cm"}},
        "required":["color","size","unit"]})"},
      {"any-of", R"({"type":"object","properties":{"value":{"anyOf":[{"type":"integer"},
        {"type":"string","maxLength":5},{"type":"null"}]}},"required":["value"]})"},
      {"recursive-ref", R"({"$ref":"#/$defs/tree","$defs":{"tree":{"type":"object","properties":{
        "label":{"type":"string","maxLength":6},"kids":{"type":"array","maxItems":2,
        "items":{"$ref":"#/$defs/tree"}}},"required":["label"]}}})"},
      {"formats", R"({"type":"object","properties":{"day":{"type":"string","format":"date"},
        "at":{"type":"string","format":"time"},"stamp":{"type":"string","format":"date-time"},
        "id":{"type":"string","format":"uuid"}},"required":["day","at","stamp","id"]})"},
      {"patterns", R"({"type":"object","properties":{"code":{"type":"string",
        "pattern":"^[A-Z]{3}-[0-9]{2,4}$"},"phone":{"type":"string","pattern":"^\\+?[0-9 ]{7,12}$"},
        "loose":{"type":"string","pattern":"[a-z]{2}"}},"required":["code","phone","loose"]})"},
      {"nullable", R"({"type":"object","properties":{"nickname":{"type":"string","maxLength":10,
        "nullable":true},"score":{"type":"integer","nullable":true}},
        "required":["nickname","score"]})"},
      {"type-lists", R"({"type":"array","items":{"type":["string","null","boolean"],"maxLength":4},
        "maxItems":5})"},
      {"all-of", R"({"allOf":[{"type":"object","properties":{"id":{"type":"integer",
        "exclusiveMinimum":0}},"required":["id"]},{"$ref":"#/definitions/named"}],
        "definitions":{"named":{"properties":{"name":{"type":"string","maxLength":10}},
        "required":["name"]}}})"},
      {"tuple", R"({"type":"array","prefixItems":[{"type":"string","maxLength":6},
        {"type":"integer","minimum":-5,"maximum":5},{"type":"boolean"}],"items":false})"},
      {"additional", R"({"type":"object","properties":{"id":{"type":"string","maxLength":6}},
        "required":["id"],"additionalProperties":{"type":"integer","minimum":10,"maximum":99}})"},
      {"one-of", R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},
        "r":{"type":"number"}},"required":["kind","r"]},{"type":"array","items":{"type":"integer"},
        "maxItems":3}]})"},
  };
}

// A document by a random walk under the mask: a random allowed token each step, ending as soon
// as the text is a sentence; after a while, mostly tokens that close something (a quote, a
// bracket, a brace) so that walks finish. `finished` is false when the walk hits the cap first
// (or the mask is empty).
std::string random_document(const std::shared_ptr<const grammar::Grammar>& compiled,
                            const std::shared_ptr<const TokenVocabulary>& vocabulary,
                            std::mt19937_64& rng, bool& finished) {
  finished = false;
  Matcher matcher(compiled, vocabulary);
  std::vector<uint32_t> bits(vocabulary->mask_words());
  std::string text;
  for (int steps = 0; steps < 400; ++steps) {
    if (matcher.can_end()) {
      finished = true;
      return text;
    }
    matcher.fill_mask(bits);
    const std::vector<int32_t> allowed = allowed_ids(bits);
    if (allowed.empty()) return text;
    std::vector<int32_t> closing;
    if (steps > 24) {
      for (const int32_t id : allowed) {
        const std::string& bytes = vocabulary->token_bytes(id);
        if (bytes.find_first_of("{[") == std::string::npos &&
            bytes.find_first_of("\"]}") != std::string::npos) {
          closing.push_back(id);
        }
      }
    }
    const std::vector<int32_t>& from =
        !closing.empty() && std::uniform_real_distribution<>(0, 1)(rng) < 0.6 ? closing : allowed;
    const int32_t id = from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
    EXPECT_TRUE(matcher.accept_token(id));
    text += vocabulary->token_bytes(id);
  }
  return text;
}

TEST(GrammarJsonSchemaWalks, GeneratedDocumentsValidate) {
  const auto tokenizer = load("llama3");
  if (!tokenizer) GTEST_SKIP() << "../shared/tokenizers/llama3 is absent";
  const std::string python = testing::venv_python_with("jsonschema, rfc3339_validator");
  if (python.empty()) {
    GTEST_SKIP() << "no jsonschema in the venv (SPECRUN_VENV=... bash tools/setup-python.sh "
                    "jsonschema)";
  }
  const auto vocabulary = vocabulary_of(*tokenizer);
  const testing::TempDir directory;
  const fs::path cases = directory.path() / "documents.jsonl";
  std::ofstream out(cases);
  std::mt19937_64 rng(20240611);
  constexpr int kDocuments = 12;
  int total = 0;
  for (const auto& [name, text] : held_out_schemas()) {
    const json schema = json::parse(text);
    const auto compiled = grammar::json_schema_grammar(schema);
    for (int k = 0; k < kDocuments; ++k) {
      bool finished = false;
      const std::string document = random_document(compiled, vocabulary, rng, finished);
      ASSERT_TRUE(finished) << name << ": the walk did not finish in 400 tokens: " << document;
      out << json{{"name", name}, {"schema", schema}, {"document", document}}.dump() << "\n";
      ++total;
    }
  }
  out.close();
  const testing::CommandResult result =
      testing::run_command("'" + python + "' '" +
                           testing::source_path("tests/reference/jsonschema_validate.py").string() +
                           "' '" + cases.string() + "'");
  EXPECT_EQ(result.exit_code, 0) << result.stdout_text << result.stderr_text;
  EXPECT_NE(result.stdout_text.find(std::to_string(total) + " documents valid"), std::string::npos)
      << result.stdout_text;
}

}  // namespace
}  // namespace specrun
