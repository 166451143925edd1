// The tokenizer on small hand-made tokenizer.json documents: BPE merging, byte fallback and the
// unknown token, added-token options, the pipeline components, the errors a malformed file gives,
// invalid UTF-8, the streaming detokenizer and the tokenize/detokenize subcommands. The expected
// values were checked against the reference library (tools/tokenizer/reference.py); the
// real-checkpoint comparison is test_tokenizer_conformance.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/text/pipeline.h"
#include "runtime/text/regex.h"
#include "runtime/text/tokenizer.h"
#include "runtime/text/unicode.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using text::Tokenizer;
using Ids = std::vector<int32_t>;

// A character-level BPE over a few letters, with SentencePiece-style byte fallback tokens for
// 0xC3, 0xA9 (é) and 0xE5 0x8F 0xAB (叫), and merges a+b, ab+c, b+c.
json tiny_model() {
  json vocab = {{"<unk>", 0},
                {"a", 1},
                {"b", 2},
                {"c", 3},
                {"ab", 4},
                {"bc", 5},
                {"abc", 6},
                {"\xE2\x96\x81", 7},
                {"<0xC3>", 8},
                {"<0xA9>", 9},
                {"<0xE5>", 10},
                {"<0x8F>", 11},
                {"<0xAB>", 12},
                {"\xE2\x96\x81"
                 "a",
                 13},
                {"<s>", 14},
                {"</s>", 15},
                {"aa", 16},
                {"x", 17},
                {" ", 18}};
  return {{"type", "BPE"},
          {"vocab", vocab},
          {"merges", {"a b", "ab c", "b c", "a a", "\xE2\x96\x81 a"}},
          {"unk_token", "<unk>"},
          {"byte_fallback", true},
          {"fuse_unk", true}};
}

json tiny_document() {
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 14}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
            {{"id", 15}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", nullptr},
          {"model", tiny_model()}};
}

std::unique_ptr<Tokenizer> build(const json& document) {
  return Tokenizer::from_json(document, "test.json");
}

// SentencePiece-style settings (Llama 2): Prepend + Replace normalizer, byte-fallback decoder
// chain that strips the first leading space, BOS template.
json sentencepiece_document() {
  json document = tiny_document();
  document["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  document["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  document["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", json::array()},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", json::array({14})}, {"tokens", json::array({"<s>"})}}}}}};
  return document;
}

TEST(TokenizerBpe, MergesLowestRankFirstAndLeftmostAmongEquals) {
  const auto tokenizer = build(tiny_document());
  EXPECT_EQ(tokenizer->encode("abc", false), (Ids{6}));
  EXPECT_EQ(tokenizer->encode("abcbc", false), (Ids{6, 5}));
  EXPECT_EQ(tokenizer->encode("bcab", false), (Ids{5, 4}));
  EXPECT_EQ(tokenizer->encode("aaa", false), (Ids{16, 1}));
  EXPECT_EQ(tokenizer->encode("", false), (Ids{}));
}

TEST(TokenizerBpe, PairFormMergesEqualStringForm) {
  json document = tiny_document();
  json pairs = json::array();
  for (const json& merge : document["model"]["merges"]) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    pairs.push_back({text.substr(0, space), text.substr(space + 1)});
  }
  document["model"]["merges"] = pairs;
  const auto pair_form = build(document);
  const auto string_form = build(tiny_document());
  for (const char* input : {"abc", "abcbc", "aaab", "cabba"}) {
    EXPECT_EQ(pair_form->encode(input, false), string_form->encode(input, false)) << input;
  }
}

TEST(TokenizerBpe, LongWordsMergeLikeShortOnes) {
  // Past the short-word threshold the merge runs on a heap and in independent parts; the result
  // must not change with the word's length.
  const auto tokenizer = build(tiny_document());
  std::string word;
  Ids expected;
  for (int i = 0; i < 200; ++i) {
    word += "abcbcaa";
    expected.insert(expected.end(), {6, 5, 16});
  }
  EXPECT_EQ(tokenizer->encode(word, false), expected);
}

TEST(TokenizerBpe, ByteFallbackAndFusedUnknown) {
  const auto tokenizer = build(tiny_document());
  // é is not in the vocabulary but its bytes are; 叫's are too; z and q are neither, and the
  // unknown run is fused into one <unk>.
  EXPECT_EQ(tokenizer->encode("a\xC3\xA9"
                              "b",
                              false),
            (Ids{1, 8, 9, 2}));
  EXPECT_EQ(tokenizer->encode("\xE5\x8F\xAB", false), (Ids{10, 11, 12}));
  EXPECT_EQ(tokenizer->encode("azqb", false), (Ids{1, 0, 2}));

  json document = tiny_document();
  document["model"]["fuse_unk"] = false;
  document["model"]["byte_fallback"] = false;
  EXPECT_EQ(build(document)->encode("azq\xC3\xA9"
                                    "b",
                                    false),
            (Ids{1, 0, 0, 0, 2}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json document = tiny_document();
  document["model"]["merges"] = {"a b"};
  EXPECT_EQ(build(document)->encode("abc", false), (Ids{4, 3}));
  document["model"]["ignore_merges"] = true;
  EXPECT_EQ(build(document)->encode("abc", false), (Ids{6}));
  EXPECT_EQ(build(document)->encode("abcc", false), (Ids{4, 3, 3}));
}

TEST(TokenizerAddedTokens, MatchedBeforeNormalizationWithTheirOptions) {
  json document = tiny_document();
  // <mask> strips the spaces around it; "ab" (normalized, not special) only as a single word.
  document["added_tokens"].push_back({{"id", 0},
                                      {"content", "<mask>"},
                                      {"special", true},
                                      {"lstrip", true},
                                      {"rstrip", true},
                                      {"normalized", false}});
  document["added_tokens"].push_back(
      {{"id", 0}, {"content", "bc"}, {"special", false}, {"single_word", true}});
  document["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  const auto tokenizer = build(document);
  // New content gets the next id after the model's vocabulary; content the vocabulary has keeps
  // its id.
  EXPECT_EQ(tokenizer->token_to_id("<mask>"), 19);
  EXPECT_EQ(tokenizer->token_to_id("bc"), 5);
  EXPECT_EQ(tokenizer->vocab_size(), 20);
  EXPECT_EQ(tokenizer->encode("a  <mask>  b", false), (Ids{1, 19, 2}));
  EXPECT_EQ(tokenizer->encode("a bc abc bca", false), (Ids{1, 5, 6, 5, 1}));
  EXPECT_EQ(tokenizer->encode("<s>ab</s>", false), (Ids{14, 4, 15}));
  EXPECT_TRUE(tokenizer->is_special(19));
  EXPECT_FALSE(tokenizer->is_special(5));
  EXPECT_EQ(tokenizer->decode(Ids{14, 4, 19, 15}, true), "ab");
}

TEST(TokenizerAddedTokens, NormalizedTokensMatchTheNormalizedText) {
  json document = tiny_document();
  document["normalizer"] = {{"type", "Lowercase"}};
  document["added_tokens"].push_back({{"id", 0}, {"content", "XA"}, {"normalized", true}});
  document["added_tokens"].push_back({{"id", 0}, {"content", "CB"}, {"normalized", false}});
  const auto tokenizer = build(document);
  // "XA" is matched as its normalized "xa", in any case; "CB" only as written.
  EXPECT_EQ(tokenizer->encode("aXAxa", false), (Ids{1, 19, 19}));
  EXPECT_EQ(tokenizer->encode("CBcb", false), (Ids{20, 3, 2}));
}

// A later entry with the same content replaces the earlier one and keeps its id; an exact
// duplicate is dropped. 200,000 entries load in linear time (quadratic bookkeeping took minutes,
// past the suite's timeout).
TEST(TokenizerAddedTokens, ReplacementsAndManyEntries) {
  json document = tiny_document();
  document["added_tokens"].push_back({{"id", 0}, {"content", "<x>"}, {"special", false}});
  document["added_tokens"].push_back({{"id", 0}, {"content", "<y>"}, {"special", true}});
  document["added_tokens"].push_back({{"id", 0}, {"content", "<x>"}, {"special", true}});
  document["added_tokens"].push_back({{"id", 0}, {"content", "<y>"}, {"special", true}});
  const size_t own = build(tiny_document())->added_tokens().size();  // the document's <s>, </s>
  auto tokenizer = build(document);
  EXPECT_EQ(tokenizer->token_to_id("<x>"), 19);
  EXPECT_EQ(tokenizer->token_to_id("<y>"), 20);
  EXPECT_TRUE(tokenizer->is_special(19));
  ASSERT_EQ(tokenizer->added_tokens().size(), own + 2);
  EXPECT_EQ(tokenizer->added_tokens()[own].content, "<y>");  // the replacement comes last
  EXPECT_EQ(tokenizer->added_tokens()[own + 1].content, "<x>");

  constexpr int kEntries = 200'000;
  document = tiny_document();
  for (int i = 0; i < kEntries; ++i) {
    document["added_tokens"].push_back(
        {{"content", "<t" + std::to_string(i % (kEntries / 2)) + ">"},
         {"special", i >= kEntries / 2}});
  }
  tokenizer = build(document);
  EXPECT_EQ(tokenizer->added_tokens().size(), own + kEntries / 2);
  EXPECT_EQ(tokenizer->token_to_id("<t7>"), 19 + 7);
  EXPECT_TRUE(tokenizer->is_special(19 + 7));
}

TEST(TokenizerPipeline, SentencePieceStyleEncodeDecodeAndTemplate) {
  const auto tokenizer = build(sentencepiece_document());
  // "a b" -> "▁a▁b": ▁a is a token, ▁ b stay apart. The template puts <s> first.
  EXPECT_EQ(tokenizer->encode("a b", false), (Ids{13, 7, 2}));
  EXPECT_EQ(tokenizer->encode("a b", true), (Ids{14, 13, 7, 2}));
  // Each piece around an added token is normalized on its own, so each gets its own ▁.
  EXPECT_EQ(tokenizer->encode("a<s>a", false), (Ids{13, 14, 13}));
  EXPECT_EQ(tokenizer->decode(Ids{14, 13, 7, 2}, false), "<s> a b");
  EXPECT_EQ(tokenizer->decode(Ids{14, 13, 7, 2}, true), "a b");
  // Byte tokens that form UTF-8 become the character; a broken run is one U+FFFD per byte.
  EXPECT_EQ(tokenizer->decode(Ids{13, 10, 11, 12}, false), "a\xE5\x8F\xAB");
  EXPECT_EQ(tokenizer->decode(Ids{10, 11, 1}, false),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");
  // Ids outside the vocabulary are skipped.
  EXPECT_EQ(tokenizer->decode(Ids{13, 999, -1}, false), "a");
}

TEST(TokenizerPipeline, MetaspacePrependSchemes) {
  json document = tiny_document();
  document["decoder"] = {{"type", "Metaspace"},
                         {"replacement", "\xE2\x96\x81"},
                         {"prepend_scheme", "always"},
                         {"split", true}};
  for (const auto& [scheme, expected] :
       std::vector<std::pair<std::string, Ids>>{{"always", {13, 14, 13, 7, 13}},
                                                {"first", {13, 14, 1, 7, 13}},
                                                {"never", {1, 14, 1, 7, 13}}}) {
    document["pre_tokenizer"] = {{"type", "Metaspace"},
                                 {"replacement", "\xE2\x96\x81"},
                                 {"prepend_scheme", scheme},
                                 {"split", true}};
    const auto tokenizer = build(document);
    EXPECT_EQ(tokenizer->encode("a<s>a  a", false), expected) << scheme;
  }
  // The decoder drops the first token's replacement characters (all of them) and turns the
  // others into spaces.
  EXPECT_EQ(build(document)->decode(Ids{13, 7, 13}, false), "a  a");
}

TEST(TokenizerPipeline, SplitBehaviors) {
  json document = tiny_document();
  document["model"]["vocab"]["bb"] = 19;
  document["model"]["merges"].push_back("b b");
  auto encode_with = [&](const std::string& behavior, bool invert) {
    document["pre_tokenizer"] = {{"type", "Split"},
                                 {"pattern", {{"Regex", "b"}}},
                                 {"behavior", behavior},
                                 {"invert", invert}};
    return build(document)->encode("abbcb", false);
  };
  EXPECT_EQ(encode_with("Isolated", false), (Ids{1, 2, 2, 3, 2}));
  EXPECT_EQ(encode_with("Removed", false), (Ids{1, 3}));
  EXPECT_EQ(encode_with("Contiguous", false), (Ids{1, 19, 3, 2}));
  // A match joins its neighbour only when that neighbour is not a match itself.
  EXPECT_EQ(encode_with("MergedWithPrevious", false), (Ids{4, 2, 3, 2}));
  EXPECT_EQ(encode_with("MergedWithNext", false), (Ids{1, 2, 5, 2}));
  EXPECT_EQ(encode_with("Removed", true), (Ids{2, 2, 2}));
}

TEST(TokenizerPipeline, NormalizerChain) {
  json document = tiny_document();
  document["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "NFKC"}},
        {{"type", "Lowercase"}},
        {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
        {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "x"}}}}};
  // Fullwidth ＡＢ -> AB -> ab; surrounding whitespace stripped; inner whitespace -> x.
  EXPECT_EQ(build(document)->encode(" \xEF\xBC\xA1\xEF\xBC\xA2 \t c ", false), (Ids{4, 17, 3}));
}

TEST(TokenizerPipeline, ByteLevelRoundTripsAnyBytes) {
  // A byte-level vocabulary: the 256 byte characters, no merges.
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string key;
    text::append_utf8(key, text::byte_level_char(static_cast<uint8_t>(b)));
    vocab[key] = b;
  }
  json document = tiny_document();
  document["added_tokens"] = json::array();
  document["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
  document["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  document["decoder"] = {{"type", "ByteLevel"}};
  const auto tokenizer = build(document);
  const std::string input = "Hi \xE4\xB8\xAD\t\xF0\x9F\x98\x80!";
  const Ids ids = tokenizer->encode(input, false);
  EXPECT_EQ(ids.size(), input.size());
  EXPECT_EQ(ids[0], 'H');
  EXPECT_EQ(tokenizer->decode(ids, false), input);
  // Half a character decodes to U+FFFD, as the reference's lossy conversion does.
  EXPECT_EQ(tokenizer->decode(Ids{'a', 0xE4, 0xB8}, false), "a\xEF\xBF\xBD");
}

TEST(TokenizerUnicode, InvalidUtf8IsRepairedAsTheReferenceSeesIt) {
  EXPECT_EQ(text::repair_utf8("a\xFF"
                              "b"),
            "a\xEF\xBF\xBD"
            "b");
  // A truncated sequence is one U+FFFD; an overlong or surrogate lead and its continuation
  // bytes are one each (maximal subparts).
  EXPECT_EQ(text::repair_utf8("\xE4\xB8"
                              "x"),
            "\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(text::repair_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(text::repair_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(text::repair_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(text::incomplete_utf8_suffix("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(text::incomplete_utf8_suffix("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(text::incomplete_utf8_suffix("a\x80"), 0u);

  const auto tokenizer = build(sentencepiece_document());
  EXPECT_EQ(tokenizer->encode("a\xFF"
                              "b",
                              false),
            tokenizer->encode("a\xEF\xBF\xBD"
                              "b",
                              false));
}

TEST(TokenizerRegex, OnigurumaConstructsAreTranslated) {
  EXPECT_EQ(text::translate_pattern("\\s+(?!\\S)"), "[\\s\\x{85}]+(?![^\\s\\x{85}])");
  EXPECT_EQ(text::translate_pattern("[^\\s\\p{L}]"), "[^\\s\\x{85}\\p{L}]");
  EXPECT_EQ(text::translate_pattern("(?i:'s|'ll)"), "(?:'[sS]|'[lL][lL])");
  std::vector<std::pair<size_t, size_t>> matches;
  text::Regex("(?i:'s)|\\s+", "test").find_all("'S '\xC5\xBF\xC2\x85x", matches);
  // 'S matches; the long s does not (Oniguruma folds only ASCII here); NEL is whitespace.
  ASSERT_EQ(matches.size(), 3u);
  EXPECT_EQ(matches[0], (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(matches[2], (std::pair<size_t, size_t>{6, 8}));
}

TEST(TokenizerErrors, MalformedFilesNameTheComponent) {
  auto expect = [](const json& document, std::initializer_list<std::string> fragments) {
    testing::expect_error([&] { build(document); }, fragments);
  };
  json document = tiny_document();
  document.erase("model");
  expect(document, {"test.json", "model", "missing"});

  document = tiny_document();
  document["model"]["type"] = "WordPiece";
  expect(document, {"test.json", "model", "WordPiece"});

  document = tiny_document();
  document["normalizer"] = {{"type", "Bogus"}};
  expect(document, {"test.json", "normalizer", "'Bogus'"});

  document = tiny_document();
  document["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "Digits"}}, {{"type", "Nope"}}}}};
  expect(document, {"test.json", "pre_tokenizer.pretokenizers[1]", "'Nope'"});

  document = tiny_document();
  document["decoder"] = {{"type", "CTC"}};
  expect(document, {"test.json", "decoder", "'CTC'"});

  document = tiny_document();
  document["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<bos>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
      {"special_tokens", json::object()}};
  expect(document, {"test.json", "post_processor", "'<bos>'"});

  document = tiny_document();
  document["model"]["merges"].push_back("a zz");
  expect(document, {"test.json", "model", "merges[5]", "'zz'", "not in the vocabulary"});

  document = tiny_document();
  document["model"]["merges"].push_back("abc");
  expect(document, {"test.json", "merges[5]", "two tokens"});

  document = tiny_document();
  document["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"Regex", "(unclosed"}}},
                               {"behavior", "Isolated"},
                               {"invert", false}};
  expect(document, {"test.json", "pre_tokenizer (Split).pattern", "(unclosed", "does not compile"});

  document = tiny_document();
  document["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Sideways"}};
  expect(document, {"test.json", "pre_tokenizer", "behavior"});

  document = tiny_document();
  document["model"]["vocab"]["a"] = "one";
  expect(document, {"test.json", "vocab entry 'a'"});

  const testing::TempDir dir;
  testing::write_file(dir / "tokenizer.json", "{\"model\": ");
  testing::expect_error([&] { Tokenizer::load(dir.path()); },
                        {(dir / "tokenizer.json").string(), "not valid JSON"});
  testing::expect_error([&] { Tokenizer::load(dir / "missing.json"); },
                        {"missing.json", "no such tokenizer file"});
}

// --- Limits on what a file can make the loader do ---

TEST(TokenizerLimits, DeeplyNestedFileIsOneError) {
  // 100k levels in 200 KB: refused while parsing, naming the file and the limit.
  const testing::TempDir dir;
  testing::write_file(dir / "tokenizer.json", testing::nested_json_arrays(100'000));
  testing::expect_error([&] { Tokenizer::load(dir.path()); },
                        {(dir / "tokenizer.json").string(), "nests deeper than 64 levels"});
  testing::write_file(dir / "tokenizer.json",
                      "{\"normalizer\": " + testing::nested_json_arrays(100'000) + "}");
  testing::expect_error([&] { Tokenizer::load(dir.path()); },
                        {(dir / "tokenizer.json").string(), "nests deeper than 64 levels"});
  // tokenizer_config.json is read the same way.
  testing::write_file(dir / "tokenizer.json", tiny_document().dump());
  testing::write_file(dir / "tokenizer_config.json", testing::nested_json_arrays(100'000));
  testing::expect_error([&] { Tokenizer::load(dir.path()); },
                        {(dir / "tokenizer_config.json").string(), "nests deeper than 64 levels"});
}

// `depth` Sequences of `key` (normalizers, pretokenizers, decoders) around `leaf`, built in
// memory: a document handed to from_json need not have come through the parser's depth limit.
json nested_sequences(int depth, const char* key, json leaf) {
  for (int i = 0; i < depth; ++i) {
    leaf = json{{"type", "Sequence"}, {key, json::array({std::move(leaf)})}};
  }
  return leaf;
}

TEST(TokenizerLimits, SequenceNestingIsBounded) {
  json document = tiny_document();
  document["normalizer"] =
      nested_sequences(text::kMaxSequenceDepth, "normalizers", json{{"type", "Lowercase"}});
  EXPECT_EQ(build(document)->encode("ABC", false), (Ids{6}));
  document["normalizer"] =
      nested_sequences(text::kMaxSequenceDepth + 1, "normalizers", json{{"type", "Lowercase"}});
  testing::expect_error([&] { build(document); },
                        {"test.json", "normalizer", "nest deeper than 16 levels"});
  // 10k deep used to take gigabytes in the paths naming each level; now one short error.
  document["normalizer"] = nested_sequences(10'000, "normalizers", json{{"type", "Lowercase"}});
  try {
    build(document);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("nest deeper than 16 levels"), std::string::npos);
    EXPECT_LT(std::string(error.what()).size(), 1000u);
  }
  document = tiny_document();
  document["pre_tokenizer"] = nested_sequences(10'000, "pretokenizers", json{{"type", "Digits"}});
  testing::expect_error([&] { build(document); }, {"pre_tokenizer", "nest deeper than 16"});
  document = tiny_document();
  document["decoder"] = nested_sequences(10'000, "decoders", json{{"type", "Fuse"}});
  testing::expect_error([&] { build(document); }, {"decoder", "nest deeper than 16"});
}

TEST(TokenizerLimits, VocabularyIdsFarBeyondTheEntriesAreRefused) {
  // One entry with id 50M would size every id-indexed table for 50M tokens.
  json document = tiny_document();
  document["model"]["vocab"]["far"] = 50'000'000;
  testing::expect_error([&] { build(document); }, {"test.json", "vocab entry 'far'", "50000000",
                                                   "far beyond the 20 entries"});
  // Sparse ids within the allowance are fine (vocabularies with gaps exist).
  document["model"]["vocab"]["far"] = 1'000'000;
  const auto tokenizer = build(document);
  EXPECT_EQ(tokenizer->token_to_id("far"), 1'000'000);
  EXPECT_EQ(tokenizer->id_to_token(1'000'000), "far");
}

TEST(TokenizerLimits, RegexMatchLimitNamesTheComponent) {
  // A pattern that backtracks exponentially on a long run of a's without a b.
  json document = tiny_document();
  document["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"Regex", "(a|a)+b"}}},
                               {"behavior", "Isolated"},
                               {"invert", false}};
  const auto tokenizer = build(document);
  EXPECT_EQ(tokenizer->encode("aab", false), (Ids{1, 4}));
  testing::expect_error([&] { tokenizer->encode(std::string(40, 'a') + "c b", false); },
                        {"test.json", "pre_tokenizer (Split).pattern", "(a|a)+b",
                         "the input exceeded the regex's match limit"});
}

TEST(TokenizerLoad, DirectoryAndTokenizerConfig) {
  const testing::TempDir dir;
  testing::write_file(dir / "tokenizer.json", sentencepiece_document().dump());
  testing::write_file(dir / "tokenizer_config.json",
                      R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  const auto tokenizer = Tokenizer::load(dir.path());
  EXPECT_EQ(tokenizer->bos_id(), 14);
  EXPECT_EQ(tokenizer->eos_id(), 15);
  EXPECT_EQ(tokenizer->id_to_token(13),
            "\xE2\x96\x81"
            "a");
  EXPECT_EQ(tokenizer->id_to_token(15), "</s>");
  EXPECT_EQ(tokenizer->id_to_token(1000), std::nullopt);
  EXPECT_EQ(tokenizer->token_to_id("abc"), 6);
  EXPECT_EQ(tokenizer->token_to_id("nope"), std::nullopt);
  EXPECT_EQ(tokenizer->vocab_size(), 19);
}

TEST(StreamingDecoder, NeverSplitsACharacterAndAddsUpToDecode) {
  const auto tokenizer = build(sentencepiece_document());
  text::StreamingDecoder stream(*tokenizer);
  // ▁a, then 叫 as three byte tokens, then ▁a.
  EXPECT_EQ(stream.step(13), "a");  // the SentencePiece leading space is stripped
  EXPECT_EQ(stream.step(10), "");
  EXPECT_EQ(stream.step(11), "");
  EXPECT_EQ(stream.step(12), "\xE5\x8F\xAB");
  EXPECT_EQ(stream.step(13), " a");
  EXPECT_EQ(stream.step(15), "");  // </s> is skipped
  EXPECT_EQ(stream.flush(), "");

  // An unfinished character at the end comes out of flush() as the reference decodes it.
  EXPECT_EQ(stream.step(7), "");
  EXPECT_EQ(stream.step(10), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");

  const Ids ids = {14, 13, 7, 2, 10, 11, 12, 13, 8, 9, 7, 15};
  for (const bool skip : {false, true}) {
    text::StreamingDecoder again(*tokenizer, skip);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = again.step(id);
      EXPECT_TRUE(text::is_valid_utf8(piece));
      streamed += piece;
    }
    streamed += again.flush();
    EXPECT_EQ(streamed, tokenizer->decode(ids, skip));
  }
}

TEST(StreamingDecoder, IdsThatDecodeToNothingChangeNothing) {
  // Unknown ids and skipped special tokens between the others, many of them: the stream still adds
  // up to decode(), and a character split over byte tokens around them is still whole.
  const auto tokenizer = build(sentencepiece_document());
  Ids ids;
  for (int round = 0; round < 200; ++round) {
    for (const int32_t id : {13, 10, -5, 11, 1000, 12, 15, 7, 2000}) ids.push_back(id);
  }
  for (const bool skip : {false, true}) {
    text::StreamingDecoder stream(*tokenizer, skip);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string piece = stream.step(id);
      EXPECT_TRUE(text::is_valid_utf8(piece));
      streamed += piece;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, tokenizer->decode(ids, skip)) << "skip " << skip;
  }
}

TEST(StreamingDecoder, ARunOfBytesThatTurnsInvalidSplitsNoCharacter) {
  const testing::TempDir dir;
  testing::write_file(dir / "tokenizer.json", testing::byte_tokenizer_json());
  const auto tokenizer = Tokenizer::load(dir / "tokenizer.json");
  const auto byte = [](int value) { return static_cast<int32_t>(value + 3); };  // <0xNN>
  // EF A5 9B is U+F95B, shown once complete; CF then starts a character that 0x50 does not
  // continue, which makes the whole run of byte tokens invalid for decode().
  text::StreamingDecoder stream(*tokenizer, true);
  std::string streamed;
  for (const int value : {0x61, 0xEF, 0xA5, 0x9B, 0xCF, 0x50, 0x62}) {
    const std::string piece = stream.step(byte(value));
    EXPECT_TRUE(text::is_valid_utf8(piece)) << "after byte " << value;
    streamed += piece;
  }
  streamed += stream.flush();
  EXPECT_TRUE(text::is_valid_utf8(streamed));
  EXPECT_EQ(streamed.substr(0, 4), "a\xEF\xA5\x9B");            // what was shown stays
  EXPECT_NE(streamed.find("\xEF\xBF\xBD"), std::string::npos);  // CF was replaced
}

// ---- The subcommands ---------------------------------------------------------------------------

class TextCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_file(dir_ / "tokenizer.json", sentencepiece_document().dump());
  }
  testing::CommandResult specrun(const std::string& arguments, const std::string& input) {
    testing::write_file(dir_ / "input.txt", input);
    // In a subshell, so that its own stdin redirection wins over run_command's </dev/null.
    return testing::run_command("(" + testing::tool_path("specrun").string() + " " + arguments +
                                " < " + (dir_ / "input.txt").string() + ")");
  }
  std::string tokenizer_path() const { return (dir_ / "tokenizer.json").string(); }
  testing::TempDir dir_;
};

TEST_F(TextCommandsTest, TokenizePrintsOneJsonArrayPerLine) {
  const auto result = specrun("tokenize --tokenizer " + tokenizer_path(), "a b\n\nabc\r\nab");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stdout_text, "[13,7,2]\n[]\n[7,6,0]\n[7,4]\n");
  const auto special = specrun("tokenize --add-special --tokenizer " + tokenizer_path(), "a b\n");
  EXPECT_EQ(special.stdout_text, "[14,13,7,2]\n");
}

TEST_F(TextCommandsTest, DetokenizePrintsTextOrJson) {
  auto result = specrun("detokenize --tokenizer " + tokenizer_path(), "[14,13,7,2]\n[]\n");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_EQ(result.stdout_text, "<s> a b\n\n");
  result =
      specrun("detokenize --skip-special --json --tokenizer " + tokenizer_path(), "[14,13,7,2]\n");
  EXPECT_EQ(result.stdout_text, "\"a b\"\n");
}

TEST_F(TextCommandsTest, BadInputIsOneErrorLine) {
  auto result = specrun("detokenize --tokenizer " + tokenizer_path(), "[1,2]\n[1,\"x\"]\n");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.stdout_text, "ab\n");
  EXPECT_NE(result.stderr_text.find("specrun: error: stdin line 2"), std::string::npos)
      << result.stderr_text;
  result = specrun("tokenize --tokenizer " + (dir_ / "missing.json").string(), "a\n");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.stdout_text, "");
  EXPECT_NE(result.stderr_text.find("missing.json"), std::string::npos) << result.stderr_text;
}

}  // namespace
}  // namespace specrun
