// The grammar engine on small inputs: GBNF parsing and its errors, strings accepted and refused
// (repetition bounds, classes, UTF-8), masks against a brute-force reference (every token tried
// on a copy of the matcher) over a hand-made vocabulary, end of sequence only when complete,
// rollback and copies, JSON Schema compilation and each refusal's error. The real vocabularies
// and the generated documents checked by Python's jsonschema are test_grammar_vocabulary.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/vocabulary.h"
#include "tests/grammar_testing.h"
#include "tests/test_support.h"

namespace specrun {
namespace {

using testing::brute_force_mask;
using testing::mask_of;

using grammar::Matcher;
using grammar::TokenVocabulary;
using json = nlohmann::ordered_json;

// Every single byte as a token (ids 0..255) and EOS at 256: enough to feed any text.
std::shared_ptr<const TokenVocabulary> byte_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.emplace_back("");
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::vector<int32_t>{256});
}

// A hand vocabulary with shared prefixes, multi-byte pieces and characters split over tokens
// (é = C3 A9, 叫 = E5 8F AB), duplicates, an empty (special) token and two EOS ids.
std::shared_ptr<const TokenVocabulary> hand_vocabulary() {
  std::vector<std::string> bytes = {
      "",         "a",    "b",        "ab",     "abc", "{",  "}",    "{\"",  "\"",   "\":",
      ":",        " ",    "  ",       ",",      ", ",  "\n", "true", "tr",   "ue",   "false",
      "null",     "nu",   "1",        "12",     "0",   "-",  ".5",   "e",    "\xC3", "\xA9",
      "\xC3\xA9", "\xE5", "\x8F\xAB", "[",      "]",   "[]", "{}",   "\"}",  "\\",   "\\n",
      "\\u00",    "x",    "name",     "\"name", "ab",  "é!", "!",    "\x01", "",     "abab"};
  const int32_t eos_a = static_cast<int32_t>(bytes.size());
  bytes.emplace_back("");
  bytes.emplace_back("</s>");  // an EOS id with bytes: still only EOS
  return std::make_shared<const TokenVocabulary>(std::move(bytes),
                                                 std::vector<int32_t>{eos_a, eos_a + 1});
}

bool matches(const std::shared_ptr<const grammar::Grammar>& compiled, const std::string& text) {
  Matcher matcher(compiled, byte_vocabulary());
  return matcher.accept_bytes(text) && matcher.can_end();
}

bool matches(const std::string& gbnf, const std::string& text) {
  return matches(grammar::parse_gbnf(gbnf), text);
}

bool allowed(const std::vector<uint32_t>& bits, int32_t id) {
  return (bits[static_cast<size_t>(id) / 32] >> (id % 32)) & 1;
}

// ---- GBNF --------------------------------------------------------------------------------------

TEST(Gbnf, ParsesLlamaCppSyntax) {
  const std::string arithmetic = R"gbnf(
    # llama.cpp's arithmetic example, with a comment
    root  ::= (expr "=" ws term "\n")+
    expr  ::= term ([-+*/] term)*
    term  ::= ident | num | "(" ws expr ")" ws
    ident ::= [a-z] [a-z0-9_]* ws
    num   ::= [0-9]+ ws
    ws    ::= [ \t\n]*
  )gbnf";
  EXPECT_TRUE(matches(arithmetic, "a+1=b\n"));
  EXPECT_TRUE(matches(arithmetic, "(x1 *2)=3\n(y)=4\n"));
  EXPECT_FALSE(matches(arithmetic, "a+=b\n"));
  EXPECT_FALSE(matches(arithmetic, "a=b"));
  // Alternatives and continuation lines: a rule ends where the next `name ::=` starts.
  const std::string multiline = "root ::= \"a\"\n  | \"b\"\n  \"c\"\nother ::= \"x\"";
  EXPECT_TRUE(matches(multiline, "a"));
  EXPECT_TRUE(matches(multiline, "bc"));
  EXPECT_FALSE(matches(multiline, "b"));
  // Empty alternatives and empty literals.
  EXPECT_TRUE(matches("root ::= | \"a\"", ""));
  EXPECT_TRUE(matches("root ::= \"\" \"a\"", "a"));
  EXPECT_TRUE(matches("root ::= ()", ""));
}

TEST(Gbnf, RepetitionBounds) {
  const std::string exact = "root ::= \"ab\"{3}";
  EXPECT_TRUE(matches(exact, "ababab"));
  EXPECT_FALSE(matches(exact, "abab"));
  EXPECT_FALSE(matches(exact, "abababab"));
  const std::string range = "root ::= [0-9]{2,4} \"x\"";
  EXPECT_FALSE(matches(range, "1x"));
  EXPECT_TRUE(matches(range, "12x"));
  EXPECT_TRUE(matches(range, "1234x"));
  EXPECT_FALSE(matches(range, "12345x"));
  const std::string at_least = "root ::= (\"a\" | \"b\"){2,}";
  EXPECT_FALSE(matches(at_least, "a"));
  EXPECT_TRUE(matches(at_least, "ab"));
  EXPECT_TRUE(matches(at_least, "abbbbbbbbbbbbbbbbbbba"));
  const std::string operators = "root ::= \"a\"? \"b\"+ \"c\"*";
  EXPECT_TRUE(matches(operators, "b"));
  EXPECT_TRUE(matches(operators, "abbccc"));
  EXPECT_FALSE(matches(operators, "ac"));
  EXPECT_FALSE(matches(operators, "aab"));
  EXPECT_TRUE(matches("root ::= \"x\"{0}", ""));
  EXPECT_FALSE(matches("root ::= \"x\"{0}", "x"));
  EXPECT_TRUE(matches("root ::= \"x\"{ 1 , 2 }", "xx"));
}

TEST(Gbnf, ClassesEscapesAndUtf8) {
  const std::string string_body = R"(root ::= "\"" [^"\\]* "\"")";
  EXPECT_TRUE(matches(string_body, "\"h\xC3\xA9llo \xE5\x8F\xAB \xF0\x9F\x98\x80\""));
  EXPECT_FALSE(matches(string_body, "\"a\"b\""));
  EXPECT_FALSE(matches(string_body, "\"a\\\""));
  EXPECT_FALSE(matches(string_body, "\"\xC3\""));          // a character cut short is not one
  EXPECT_FALSE(matches(string_body, "\"\xED\xA0\x80\""));  // a surrogate is not UTF-8
  EXPECT_TRUE(matches("root ::= [a-zé-ë]+", "aé\xC3\xAB"));
  EXPECT_FALSE(matches("root ::= [a-zé-ë]+", "\xC3\xAC"));
  EXPECT_TRUE(matches("root ::= .", "\xE5\x8F\xAB"));
  EXPECT_FALSE(matches("root ::= .", "ab"));
  EXPECT_TRUE(matches(R"(root ::= "\x41\u00e9\U0001F600\t\n\r\\\"\[\]")",
                      "A\xC3\xA9\xF0\x9F\x98\x80\t\n\r\\\"[]"));
  EXPECT_TRUE(matches(R"(root ::= [\x00-\x1f\]\-]+)", "\x01]-"));
  EXPECT_TRUE(matches("root ::= [a-]+", "a-a"));
  EXPECT_TRUE(matches("root ::= [^a]", "\xF4\x8F\xBF\xBF"));  // U+10FFFF
  EXPECT_TRUE(matches("root ::= \"叫\"", "\xE5\x8F\xAB"));
}

TEST(Gbnf, RuleReferencesAndRecursion) {
  const std::string nested = R"(
    root ::= list
    list ::= "[" (item ("," item)*)? "]"
    item ::= list | [0-9]
  )";
  EXPECT_TRUE(matches(nested, "[]"));
  EXPECT_TRUE(matches(nested, "[1,[2,[[]]],3]"));
  EXPECT_FALSE(matches(nested, "[1,]"));
  EXPECT_FALSE(matches(nested, "[[1]"));
  const auto compiled = grammar::parse_gbnf("start ::= \"s\"", "g", "start");
  EXPECT_TRUE(matches(compiled, "s"));
}

TEST(Gbnf, ErrorsNameLineAndColumn) {
  using testing::expect_error;
  expect_error([] { grammar::parse_gbnf("", "g.gbnf"); }, {"g.gbnf", "empty"});
  expect_error([] { grammar::parse_gbnf("  # only a comment\n\n"); }, {"grammar", "empty"});
  expect_error([] { grammar::parse_gbnf("\n  root \"a\""); },
               {"line 2, column 8", "expected '::=' after rule name 'root', found '\"'"});
  expect_error([] { grammar::parse_gbnf("root ::= \"abc"); },
               {"line 1, column 14", "unterminated string literal"});
  expect_error([] { grammar::parse_gbnf("root ::= [a-z"); }, {"unterminated character class"});
  expect_error([] { grammar::parse_gbnf("root ::= (\"a\" | \"b\""); },
               {"line 1, column 20", "expected ')'"});
  expect_error([] { grammar::parse_gbnf("root ::= \"a\")"); },
               {"line 1, column 13", "unmatched ')'"});
  expect_error([] { grammar::parse_gbnf("root ::= \"a\" ; \"b\""); },
               {"line 1, column 14", "expected a rule name, a string, a character class"});
  expect_error([] { grammar::parse_gbnf("root ::= \"\\q\""); },
               {"column 11", "unknown escape '\\q'"});
  expect_error([] { grammar::parse_gbnf("root ::= \"\\x4\""); }, {"expected 2 hex digits"});
  expect_error([] { grammar::parse_gbnf("root ::= [z-a]"); }, {"column 13", "out of order"});
  expect_error([] { grammar::parse_gbnf("root ::= \"a\"{3,2}"); }, {"column 13", "n < m"});
  expect_error([] { grammar::parse_gbnf("root ::= \"a\"{,2}"); }, {"expected a number"});
  expect_error([] { grammar::parse_gbnf("root ::= \"a\"{99999}"); }, {"above 10000"});
  expect_error([] { grammar::parse_gbnf("root ::= item\n\nthing ::= \"x\""); },
               {"line 1, column 10", "rule 'item' is referenced but never defined"});
  expect_error([] { grammar::parse_gbnf("start ::= \"x\""); }, {"no rule 'root'"});
  expect_error([] { grammar::parse_gbnf("root ::= \"x\"\nroot ::= \"y\""); },
               {"line 2, column 1", "defined twice", "line 1, column 1"});
  expect_error([] { grammar::parse_gbnf("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\""); },
               {"line 2, column 1", "rule 'expr' is left-recursive", "expr -> expr"});
  expect_error([] { grammar::parse_gbnf("root ::= a\na ::= b? \"x\"\nb ::= a \"y\""); },
               {"line 2, column 1", "rule 'a' is left-recursive"});
  expect_error([] { grammar::parse_gbnf("root ::= (\"a\"?)*"); },
               {"line 1, column 10", "left-recursive", "can be empty"});
  expect_error([] { grammar::parse_gbnf("root ::= \"\xC3(\""); }, {"invalid UTF-8"});
}

// ---- Masks -------------------------------------------------------------------------------------

// Walks `text` token by token with a greedy longest-token tokenization of the hand vocabulary,
// checking the mask against the reference at every position.
void expect_masks_match_reference(const std::string& gbnf,
                                  const std::vector<std::string>& prefixes) {
  const auto compiled = grammar::parse_gbnf(gbnf);
  const auto vocabulary = hand_vocabulary();
  for (const std::string& prefix : prefixes) {
    Matcher matcher(compiled, vocabulary);
    ASSERT_TRUE(matcher.accept_bytes(prefix)) << gbnf << " refuses the prefix " << prefix;
    EXPECT_EQ(mask_of(matcher), brute_force_mask(matcher)) << gbnf << " after '" << prefix << "'";
    // And one token further along each allowed token.
    const std::vector<uint32_t> bits = mask_of(matcher);
    for (int32_t id = 0; id < vocabulary->size(); ++id) {
      if (!allowed(bits, id) || vocabulary->is_eos(id)) continue;
      Matcher next = matcher;
      ASSERT_TRUE(next.accept_token(id));
      EXPECT_EQ(mask_of(next), brute_force_mask(next))
          << gbnf << " after '" << prefix << "' + token " << id;
    }
  }
}

TEST(GrammarMask, EqualsBruteForceOnAHandVocabulary) {
  expect_masks_match_reference("root ::= (\"ab\" | \"abc\")+ \"!\"?", {"", "ab", "abc"});
  expect_masks_match_reference(R"(root ::= "{\"name\":" " "? "\"" [^"\\]* "\"}")",
                               {"", "{", "{\"name\":", "{\"name\": \"\xC3", "{\"name\": \"ab"});
  expect_masks_match_reference("root ::= \"é!\" | [a-c]{1,3} | \"\\n\"", {"", "a", "\xC3"});
  expect_masks_match_reference(grammar::any_json_gbnf(false),
                               {"", "[", "{\"", "{\"a\":", "-", "1"});
  expect_masks_match_reference("root ::= \"true\" | \"tr\" \"ue\" \"x\"?", {"", "tr"});
}

TEST(GrammarMask, EndOfSequenceOnlyWhenComplete) {
  const auto vocabulary = hand_vocabulary();
  const int32_t eos = vocabulary->eos_ids()[0];
  const int32_t eos_with_bytes = vocabulary->eos_ids()[1];
  Matcher matcher(grammar::parse_gbnf("root ::= \"ab\"+"), vocabulary);
  EXPECT_FALSE(matcher.can_end());
  EXPECT_FALSE(allowed(mask_of(matcher), eos));
  EXPECT_FALSE(matcher.accept_token(eos));
  ASSERT_TRUE(matcher.accept_token(3));  // "ab"
  EXPECT_TRUE(matcher.can_end());
  EXPECT_FALSE(matcher.is_complete());  // more "ab" may follow
  std::vector<uint32_t> bits = mask_of(matcher);
  EXPECT_TRUE(allowed(bits, eos));
  EXPECT_TRUE(allowed(bits, eos_with_bytes));
  EXPECT_TRUE(allowed(bits, 3));
  EXPECT_FALSE(allowed(bits, 0));  // the empty special token is never allowed
  // A grammar that can only end: the mask is the EOS ids alone.
  Matcher done(grammar::parse_gbnf("root ::= \"ab\""), vocabulary);
  ASSERT_TRUE(done.accept_token(3));
  EXPECT_TRUE(done.is_complete());
  bits = mask_of(done);
  std::vector<uint32_t> only_eos(bits.size());
  for (const int32_t id : vocabulary->eos_ids()) only_eos[id / 32] |= 1u << (id % 32);
  EXPECT_EQ(bits, only_eos);
  EXPECT_EQ(done.fill_mask(bits), 2u);
  ASSERT_TRUE(done.accept_token(eos));
  EXPECT_TRUE(done.is_terminated());
  EXPECT_TRUE(done.is_complete());
  EXPECT_EQ(done.fill_mask(bits), 0u);  // nothing after the end
  EXPECT_FALSE(done.accept_token(3));
  EXPECT_FALSE(done.accept_token(eos));
  // Words past the vocabulary (a padded logits row) come back zeroed.
  std::vector<uint32_t> padded(vocabulary->mask_words() + 3, 0xFFFFFFFFu);
  Matcher fresh(grammar::parse_gbnf("root ::= \"ab\""), vocabulary);
  fresh.fill_mask(padded);
  EXPECT_EQ(padded.back(), 0u);
}

TEST(GrammarMask, RefusedTokensChangeNothing) {
  const auto vocabulary = hand_vocabulary();
  Matcher matcher(grammar::parse_gbnf("root ::= \"abc\" \"}\""), vocabulary);
  EXPECT_FALSE(matcher.accept_token(2));   // "b"
  EXPECT_FALSE(matcher.accept_token(0));   // special
  EXPECT_FALSE(matcher.accept_token(-1));  // out of range
  EXPECT_FALSE(matcher.accept_token(vocabulary->size()));
  EXPECT_EQ(matcher.accepted_steps(), 0u);
  ASSERT_TRUE(matcher.accept_token(1));  // "a"
  EXPECT_FALSE(matcher.accept_bytes("bcx"));
  EXPECT_EQ(matcher.accepted_steps(), 1u);
  EXPECT_TRUE(matcher.accept_bytes("bc}"));
  EXPECT_TRUE(matcher.is_complete());
}

TEST(GrammarMatcher, RollbackAndCopiesRestoreTheState) {
  const auto vocabulary = hand_vocabulary();
  const auto compiled = grammar::any_json_grammar(false);
  Matcher matcher(compiled, vocabulary);
  ASSERT_TRUE(matcher.accept_token(7));  // {"
  const std::vector<uint32_t> accepted_mask = mask_of(matcher);
  Matcher saved = matcher;
  // A draft: name":true} then EOS.
  for (const int32_t id : {42, 9, 16, 6}) ASSERT_TRUE(matcher.accept_token(id)) << id;
  ASSERT_TRUE(matcher.can_end());
  ASSERT_TRUE(matcher.accept_token(vocabulary->eos_ids()[0]));
  EXPECT_EQ(matcher.accepted_steps(), 6u);
  matcher.rollback(5);
  EXPECT_EQ(matcher.accepted_steps(), 1u);
  EXPECT_FALSE(matcher.is_terminated());
  EXPECT_EQ(mask_of(matcher), accepted_mask);
  EXPECT_EQ(mask_of(saved), accepted_mask);
  // The copy goes its own way; the original is unchanged by it.
  ASSERT_TRUE(saved.accept_token(9));  // ": closes the key
  EXPECT_EQ(mask_of(matcher), accepted_mask);
  EXPECT_NE(mask_of(saved), accepted_mask);
  testing::expect_error([&] { matcher.rollback(2); }, {"cannot roll back 2 steps, only 1"});
  matcher.reset();
  EXPECT_EQ(matcher.accepted_steps(), 0u);
  EXPECT_TRUE(matcher.accept_token(5));  // {
}

TEST(GrammarVocabulary, TrieIsPreorderWithEveryToken) {
  const auto vocabulary = hand_vocabulary();
  size_t tokens = 0;
  const auto& trie = vocabulary->trie();
  for (size_t i = 0; i < trie.size(); ++i) {
    tokens += trie[i].token_count;
    EXPECT_GT(trie[i].end, i);
    if (i + 1 < trie.size()) {
      EXPECT_LE(trie[i + 1].depth, trie[i].depth + 1);
    }
  }
  size_t with_bytes = 0;
  for (int32_t id = 0; id < vocabulary->size(); ++id) {
    with_bytes += !vocabulary->token_bytes(id).empty() && !vocabulary->is_eos(id);
  }
  EXPECT_EQ(tokens, with_bytes);
  testing::expect_error([] { TokenVocabulary({"a"}, {3}); },
                        {"end-of-sequence id 3 is outside the vocabulary of 1 tokens"});
}

// ---- JSON Schema -------------------------------------------------------------------------------

bool schema_matches(const json& schema, const std::string& text) {
  return matches(grammar::json_schema_grammar(schema), text);
}

TEST(JsonSchema, ObjectsRequiredOptionalAndAdditional) {
  const json schema = json::parse(R"({"type":"object","properties":{
      "a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]})");
  EXPECT_TRUE(schema_matches(schema, R"({"b":"x"})"));
  EXPECT_TRUE(schema_matches(schema, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(schema_matches(schema, "{ \"a\": -12 ,\n  \"b\" : \"\" }"));
  EXPECT_FALSE(schema_matches(schema, R"({"a":1})"));
  EXPECT_FALSE(schema_matches(schema, R"({"b":"x","a":1})"));  // the schema's order
  EXPECT_FALSE(schema_matches(schema, R"({"b":"x","d":1})"));  // additional: false by default
  EXPECT_FALSE(schema_matches(schema, R"({"b":"x",})"));
  json open = schema;
  open["additionalProperties"] = json{{"type", "null"}};
  EXPECT_TRUE(schema_matches(open, R"({"b":"x","d":null,"bb":null})"));
  EXPECT_FALSE(schema_matches(open, R"({"b":"x","d":1})"));
  EXPECT_FALSE(schema_matches(open, R"({"b":"x","b":null})"));  // a listed name is not another
  EXPECT_FALSE(schema_matches(open, R"({"b":"x","a":null})"));
  grammar::JsonSchemaOptions lenient;
  lenient.additional_properties_default = true;
  EXPECT_TRUE(matches(grammar::json_schema_grammar(schema, lenient), R"({"b":"x","zz":[1]})"));
  // Whitespace is bounded: one newline and at most max_indent spaces.
  EXPECT_TRUE(schema_matches(schema, "{\n" + std::string(20, ' ') + "\"b\":\"x\"}"));
  EXPECT_FALSE(schema_matches(schema, "{\n" + std::string(21, ' ') + "\"b\":\"x\"}"));
  EXPECT_FALSE(schema_matches(schema, "{\n\n\"b\":\"x\"}"));
}

TEST(JsonSchema, ArraysStringsNumbersAndEnums) {
  const json arrays =
      json::parse(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
  EXPECT_FALSE(schema_matches(arrays, "[1]"));
  EXPECT_TRUE(schema_matches(arrays, "[1, 2]"));
  EXPECT_TRUE(schema_matches(arrays, "[1,2,3]"));
  EXPECT_FALSE(schema_matches(arrays, "[1,2,3,4]"));
  const json tuple =
      json::parse(R"({"prefixItems":[{"const":"x"},{"type":"null"}],"items":false})");
  EXPECT_TRUE(schema_matches(tuple, R"(["x",null])"));
  EXPECT_FALSE(schema_matches(tuple, R"(["x",null,1])"));
  const json strings = json::parse(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(schema_matches(strings, R"("a")"));
  EXPECT_TRUE(schema_matches(strings, R"("a\n")"));
  EXPECT_TRUE(schema_matches(strings, "\"\xE5\x8F\xAB\xE5\x8F\xAB\xE5\x8F\xAB\""));
  EXPECT_FALSE(schema_matches(strings, R"("abcd")"));
  const json range = json::parse(R"({"type":"integer","minimum":-15,"maximum":120})");
  for (int v = -30; v <= 200; ++v) {
    EXPECT_EQ(schema_matches(range, std::to_string(v)), v >= -15 && v <= 120) << v;
  }
  EXPECT_FALSE(schema_matches(range, "007"));
  const json above = json::parse(R"({"type":"integer","exclusiveMinimum":99})");
  EXPECT_FALSE(schema_matches(above, "99"));
  EXPECT_TRUE(schema_matches(above, "100"));
  EXPECT_TRUE(schema_matches(above, "123456789"));
  EXPECT_FALSE(schema_matches(above, "-100"));
  const json below = json::parse(R"({"type":"integer","maximum":-7})");
  EXPECT_TRUE(schema_matches(below, "-7"));
  EXPECT_TRUE(schema_matches(below, "-700"));
  EXPECT_FALSE(schema_matches(below, "-6"));
  EXPECT_FALSE(schema_matches(below, "0"));
  const json numbers = json::parse(R"({"type":["number","null"]})");
  for (const char* ok : {"0", "-1.5", "3e7", "2.25E-3", "null"})
    EXPECT_TRUE(schema_matches(numbers, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "nul"})
    EXPECT_FALSE(schema_matches(numbers, bad)) << bad;
  const json choices = json::parse(R"({"enum":["red","gr\"een",3,null,{"a":[1]}]})");
  for (const char* ok : {R"("red")", R"("gr\"een")", "3", "null", R"({"a":[1]})"}) {
    EXPECT_TRUE(schema_matches(choices, ok)) << ok;
  }
  EXPECT_FALSE(schema_matches(choices, R"("blue")"));
  const json nullable = json::parse(R"({"type":"string","nullable":true,"format":"date"})");
  EXPECT_TRUE(schema_matches(nullable, R"("2024-02-28")"));
  EXPECT_TRUE(schema_matches(nullable, "null"));
  EXPECT_FALSE(schema_matches(nullable, R"("2024-02-30")"));
  EXPECT_FALSE(schema_matches(nullable, R"("2024-13-01")"));
}

TEST(JsonSchema, PatternsRefsAndComposition) {
  const json pattern = json::parse(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}(x|yz)?$"})");
  EXPECT_TRUE(schema_matches(pattern, R"("AB-123")"));
  EXPECT_TRUE(schema_matches(pattern, R"("AB-123yz")"));
  EXPECT_FALSE(schema_matches(pattern, R"("AB-12")"));
  EXPECT_FALSE(schema_matches(pattern, R"("xAB-123")"));
  const json unanchored = json::parse(R"({"type":"string","pattern":"a\"b"})");
  EXPECT_TRUE(schema_matches(unanchored, R"("xxa\"byy")"));
  EXPECT_FALSE(schema_matches(unanchored, R"("ab")"));
  const json recursive = json::parse(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["value"]}}})");
  EXPECT_TRUE(schema_matches(recursive,
                             R"({"value":1,"children":[{"value":2},{"value":3,"children":[]}]})"));
  EXPECT_FALSE(schema_matches(recursive, R"({"value":1,"children":[{}]})"));
  const json all_of =
      json::parse(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},
      "required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]})");
  EXPECT_TRUE(schema_matches(all_of, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(schema_matches(all_of, R"({"a":1})"));
  const json any_of =
      json::parse(R"({"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]})");
  EXPECT_TRUE(schema_matches(any_of, "12"));
  EXPECT_TRUE(schema_matches(any_of, R"("a")"));
  EXPECT_FALSE(schema_matches(any_of, R"("ab")"));
  const json formats = json::parse(R"({"type":"array","prefixItems":[{"format":"uuid"},
      {"format":"date-time"},{"format":"time"}]})");
  EXPECT_TRUE(schema_matches(
      formats,
      R"(["123e4567-e89b-12d3-a456-426614174000","2024-01-31T23:59:59.5+02:00","08:00:00Z"])"));
  EXPECT_FALSE(schema_matches(formats, R"(["123e4567","2024-01-31T23:59:59Z","08:00:00Z"])"));
  EXPECT_TRUE(schema_matches(json(true), "[1,{\"a\":null}]"));
  EXPECT_TRUE(matches(grammar::any_json_grammar(true), "{}"));
  EXPECT_FALSE(matches(grammar::any_json_grammar(true), "[]"));
}

TEST(JsonSchema, UnsupportedKeywordsAndMalformedSchemasAreOneError) {
  using testing::expect_error;
  auto compile = [](const char* text) { grammar::json_schema_grammar(json::parse(text)); };
  expect_error(
      [&] {
        compile(R"({"type":"object","properties":{"age":{"type":"integer","multipleOf":2}}})");
      },
      {"JSON schema: #/properties/age/multipleOf: keyword 'multipleOf' is not supported"});
  expect_error([&] { compile(R"({"type":"array","uniqueItems":true})"); },
               {"#/uniqueItems", "'uniqueItems' is not supported"});
  expect_error([&] { compile(R"({"not":{"type":"null"}})"); }, {"#/not", "'not'"});
  expect_error([&] { compile(R"({"if":{},"then":{}})"); }, {"#/if", "'if'"});
  expect_error([&] { compile(R"({"type":"object","patternProperties":{"a":{}}})"); },
               {"#/patternProperties"});
  expect_error([&] { compile(R"({"type":"object","minProperties":1})"); }, {"#/minProperties"});
  expect_error([&] { compile(R"({"type":"number","minimum":0})"); },
               {"#/minimum", "integers only"});
  expect_error([&] { compile(R"({"type":"string","format":"email"})"); },
               {"#/format", "format 'email' is not supported"});
  expect_error([&] { compile(R"({"type":"string","pattern":"(a)\\1"})"); },
               {"#/pattern", "backreferences"});
  expect_error([&] { compile(R"({"type":"string","pattern":"(?=a)b"})"); },
               {"#/pattern", "at character 2", "lookarounds"});
  expect_error([&] { compile(R"({"type":"string","pattern":"a^b"})"); }, {"#/pattern", "anchors"});
  expect_error([&] { compile(R"({"type":"string","pattern":"\\bword"})"); },
               {"#/pattern", "boundary"});
  expect_error([&] { compile(R"({"type":"string","pattern":"^a|b$"})"); }, {"top-level '|'"});
  expect_error([&] { compile(R"({"type":"string","pattern":"[a-"})"); },
               {"unterminated character class"});
  expect_error([&] { compile(R"({"type":"string","pattern":"a**"})"); },
               {"quantifier after a quantifier"});
  expect_error([&] { compile(R"({"type":"string","pattern":"x","maxLength":3})"); },
               {"#/pattern", "'pattern' with 'minLength' or 'maxLength'"});
  expect_error([&] { compile(R"({"$ref":"#/$defs/missing"})"); }, {"#/$ref", "does not resolve"});
  expect_error([&] { compile(R"({"$ref":"other.json#/a"})"); }, {"#/$ref", "leaves the document"});
  expect_error([&] { compile(R"({"$ref":"#/$defs/a","type":"string","$defs":{"a":{}}})"); },
               {"#/type", "beside '$ref'"});
  expect_error([&] { compile(R"({"anyOf":[]})"); }, {"#/anyOf", "non-empty array"});
  expect_error([&] { compile(R"({"allOf":[{"type":"string","maxLength":2},{"maxLength":3}]})"); },
               {"#/allOf/1/maxLength", "differs between allOf branches"});
  expect_error([&] { compile(R"({"allOf":[{"type":"string"},{"type":"integer"}]})"); },
               {"#/allOf/1/type", "share no type"});
  expect_error([&] { compile(R"({"type":"array","items":[{}]})"); }, {"#/items", "prefixItems"});
  expect_error([&] { compile(R"({"type":"array","prefixItems":[{}],"minItems":1})"); },
               {"#/prefixItems", "'minItems'"});
  expect_error([&] { compile(R"({"type":"strin"})"); }, {"#/type", "unknown type 'strin'"});
  expect_error([&] { compile(R"({"type":"string","maxLength":-1})"); },
               {"#/maxLength", "non-negative"});
  expect_error([&] { compile(R"({"type":"string","minLength":3,"maxLength":2})"); },
               {"#/minLength", "admits no string"});
  expect_error([&] { compile(R"({"properties":{"a":false}})"); },
               {"#/properties/a", "false admits no value"});
  expect_error([&] { compile(R"({"enum":[]})"); }, {"#/enum", "non-empty"});
  expect_error([&] { compile(R"({"type":"integer","minimum":5,"maximum":4})"); },
               {"admit no value"});
  expect_error([&] { compile("3"); }, {"#: a schema must be an object or a boolean"});
}

}  // namespace
}  // namespace specrun
