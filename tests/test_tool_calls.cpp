// Tool calls read from model output (runtime/server/tool_calls.h): the format a template teaches,
// whole outputs parsed (well-formed calls, several, text around them, malformed JSON left as
// content), and the stream parser equal to the whole-output parse wherever the text is split:
// at every single split point, and fed one byte at a time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/server/tool_calls.h"

#include "runtime/grammar/automaton.h"
#include "runtime/grammar/gbnf.h"
#include "specrun/specrun.hpp"

namespace specrun::server {
namespace {

TEST(ToolCallFormat, ChosenFromTheTemplateText) {
  EXPECT_EQ(tool_call_format("{%- if tools %}<tool_call>\n{\"name\": ...}</tool_call>{% endif %}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(
      tool_call_format("<|start_header_id|>ipython<|end_header_id|>{{- '\"parameters\": ' }}"),
      ToolCallFormat::kLlamaJson);
  EXPECT_EQ(tool_call_format("<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}"),
            ToolCallFormat::kNone);
  EXPECT_EQ(tool_call_format("{% for m in messages %}{{ m.content }}{% endfor %}"),
            ToolCallFormat::kNone);
  EXPECT_STREQ(to_string(ToolCallFormat::kHermes), "hermes");
  EXPECT_STREQ(to_string(ToolCallFormat::kLlamaJson), "llama3_json");
}

struct Case {
  ToolCallFormat format;
  std::string text;
  ParsedOutput expected;
};

std::vector<Case> cases() {
  const ToolCallFormat hermes = ToolCallFormat::kHermes;
  const ToolCallFormat llama = ToolCallFormat::kLlamaJson;
  const ToolCall weather{"get_weather", R"({"city":"Paris"})"};
  const ToolCall time{"get_time", R"({"zone":"UTC","fmt":{"h":24}})"};
  const ToolCall empty{"now", "{}"};
  return {
      // Hermes: plain text, one call, several, text before, whitespace around.
      {hermes, "The capital of France is Paris.", {"The capital of France is Paris.", {}}},
      {hermes, "", {"", {}}},
      {hermes, "  \n", {"  \n", {}}},
      {hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>",
       {"", {weather}}},
      {hermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
       "\"Paris\"}}\n</tool_call>\n",
       {"Let me check.\n", {weather}}},
      {hermes,
       "\n\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
       "</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\", "
       "\"fmt\": {\"h\": 24}}}</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}"
       "</tool_call>  ",
       {"", {weather, time, empty}}},
      // The last call without its end tag (the model stopped at its end of turn).
      {hermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
       {"", {weather}}},
      // Text after and between calls is content; whitespace-only stretches beside calls are not.
      {hermes,
       "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call> and then "
       "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
       {" and then ", {empty, empty}}},
      // Malformed: left as content, as written; the well-formed call beside it still counts.
      {hermes,
       "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call>",
       {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call>", {}}},
      {hermes,
       "\n<tool_call>{\"name\": \"f\"}</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": "
       "{}}</tool_call>",
       {"\n<tool_call>{\"name\": \"f\"}</tool_call>\n", {empty}}},
      {hermes,
       "<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>",
       {"<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>", {}}},
      {hermes,
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>",
       {"<tool_call>{\"name\": \"f\", \"arguments\": \"{}\"}</tool_call>", {}}},
      {hermes, "<tool_call>[1, 2]", {"<tool_call>[1, 2]", {}}},
      {hermes,
       "<tool_call>{\"name\": \"now\", \"argu",
       {"<tool_call>{\"name\": \"now\", \"argu", {}}},
      {hermes, "I write <tool_ in prose <tool", {"I write <tool_ in prose <tool", {}}},
      {hermes, "</tool_call> stray", {"</tool_call> stray", {}}},
      // A call inside a call's text: the first end tag ends the first block, which fails.
      {hermes,
       "<tool_call>{\"name\": <tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
       {"<tool_call>{\"name\": <tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>", {}}},
      // Unicode and escapes in the arguments survive.
      {hermes,
       "<tool_call>{\"name\": \"say\", \"arguments\": {\"text\": \"caf\u00e9 \\\"q\\\" \\n "
       "\U0001F600\"}}</tool_call>",
       {"", {{"say", "{\"text\":\"caf\u00e9 \\\"q\\\" \\n \U0001F600\"}"}}}},

      // Llama 3.1 / 3.2 JSON: the whole output is calls, or it is content.
      {llama,
       "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
       {"", {weather}}},
      {llama,
       "<|python_tag|>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
       {"", {weather}}},
      {llama,
       " \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"now\", "
       "\"parameters\": {}};\n",
       {"", {weather, empty}}},
      {llama, "The weather is fine.", {"The weather is fine.", {}}},
      {llama,
       "Sure: {\"name\": \"now\", \"parameters\": {}}",
       {"Sure: {\"name\": \"now\", \"parameters\": {}}", {}}},
      {llama,
       "{\"name\": \"now\", \"parameters\": {}} and more",
       {"{\"name\": \"now\", \"parameters\": {}} and more", {}}},
      {llama,
       "{\"name\": \"now\", \"parameters\": {\"x\": }",
       {"{\"name\": \"now\", \"parameters\": {\"x\": }", {}}},
      {llama,
       "{\"key\": \"a JSON answer, not a call\"}",
       {"{\"key\": \"a JSON answer, not a call\"}", {}}},
      {llama,
       "{\"name\": \"s\", \"parameters\": {\"t\": \"a } brace \\\" in a string\"}}",
       {"", {{"s", "{\"t\":\"a } brace \\\" in a string\"}"}}}},
      {llama, "<|python_tag|>", {"<|python_tag|>", {}}},
      {llama, "<|python", {"<|python", {}}},
      {llama, "   ", {"   ", {}}},
      {llama, "", {"", {}}},

      // No format: all content.
      {ToolCallFormat::kNone,
       "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
       {"<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>", {}}},
  };
}

std::string describe(const ParsedOutput& parsed) {
  std::string out = "content \"" + parsed.content + "\", calls [";
  for (const ToolCall& call : parsed.calls) out += call.name + " " + call.arguments + "; ";
  return out + "]";
}

// The stream's pieces, gathered as a whole-output parse gives them.
ParsedOutput gathered(const std::vector<std::vector<ToolCallPiece>>& batches) {
  ParsedOutput out;
  for (const auto& pieces : batches) {
    for (const ToolCallPiece& piece : pieces) {
      if (piece.is_call) {
        out.calls.push_back(piece.call);
      } else {
        out.content += piece.content;
      }
    }
  }
  return out;
}

TEST(ToolCallParsing, WholeOutputs) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(to_string(c.format)) + ": " + c.text);
    const ParsedOutput parsed = parse_tool_calls(c.format, c.text);
    EXPECT_EQ(parsed, c.expected) << describe(parsed);
  }
}

TEST(ToolCallParsing, StreamedAtEverySplitPointEqualsTheWholeParse) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(std::string(to_string(c.format)) + ": " + c.text);
    const ParsedOutput whole = parse_tool_calls(c.format, c.text);
    for (size_t split = 0; split <= c.text.size(); ++split) {
      ToolCallStream stream(c.format);
      const ParsedOutput streamed = gathered({stream.feed(c.text.substr(0, split)),
                                              stream.feed(c.text.substr(split)), stream.finish()});
      EXPECT_EQ(streamed, whole) << "split at " << split << ": " << describe(streamed);
    }
    ToolCallStream bytewise(c.format);
    std::vector<std::vector<ToolCallPiece>> batches;
    for (const char byte : c.text) batches.push_back(bytewise.feed(std::string(1, byte)));
    batches.push_back(bytewise.finish());
    EXPECT_EQ(gathered(batches), whole) << "fed byte by byte: " << describe(gathered(batches));
  }
}

// What a stream holds back: text that cannot begin a call goes out at once, a call only once it
// is complete, and content before a call before the call.
TEST(ToolCallParsing, StreamReleasesTextAsSoonAsItCannotBeACall) {
  ToolCallStream hermes(ToolCallFormat::kHermes);
  std::vector<ToolCallPiece> out = hermes.feed("Let me check <tool");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].content, "Let me check ");  // "<tool" may begin a call: held
  EXPECT_TRUE(hermes.feed("_call>{\"name\": \"now\", ").empty());
  out = hermes.feed("\"arguments\": {}}</tool_call>more");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].is_call);
  EXPECT_EQ(out[0].call, (ToolCall{"now", "{}"}));
  EXPECT_EQ(out[1].content, "more");
  EXPECT_TRUE(hermes.finish().empty());

  ToolCallStream prose(ToolCallFormat::kLlamaJson);
  out = prose.feed("  Hello");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].content, "  Hello");  // not a call: given at once
  ToolCallStream call(ToolCallFormat::kLlamaJson);
  EXPECT_TRUE(call.feed("{\"name\": \"now\", \"parameters\": {}}").empty());  // only the end says
  out = call.finish();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].is_call);
}

// Whether `text` is a sentence of the GBNF grammar `gbnf`.
bool accepts(const std::string& gbnf, const std::string& text) {
  grammar::Automaton automaton(grammar::parse_gbnf(gbnf));
  int32_t state = automaton.initial();
  for (const char c : text) {
    state = automaton.next(state, static_cast<uint8_t>(c));
    if (state == grammar::Automaton::kDead) return false;
  }
  return automaton.accepting(state);
}

// tool_choice "required" and a named function: the grammar's sentences are calls the format's
// parser reads, their arguments valid against the function's parameters.
TEST(ToolCallGrammar, ForcesCallsTheParserReadsWithValidArguments) {
  const auto tools = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
       "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
       "required": ["city"]}}},
      {"type": "function", "function": {"name": "now"}}])");
  const std::string many = tool_call_grammar(ToolCallFormat::kHermes, tools, "", true);
  const std::string weather =
      R"(<tool_call>
{"name":"get_weather","arguments":{"city":"Paris","days":3}}
</tool_call>)";
  const std::string now = R"(<tool_call>
{"name":"now","arguments":{}}
</tool_call>)";
  for (const std::string& output : {weather, weather + "\n" + now}) {
    EXPECT_TRUE(accepts(many, output)) << output;
    const ParsedOutput parsed = parse_tool_calls(ToolCallFormat::kHermes, output);
    EXPECT_TRUE(parsed.content.empty());
    EXPECT_EQ(parsed.calls.front(), (ToolCall{"get_weather", R"({"city":"Paris","days":3})"}));
  }
  EXPECT_FALSE(accepts(many, ""));                  // at least one call
  EXPECT_FALSE(accepts(many, "Sure. " + weather));  // nothing but calls
  // "city" is required; "lookup" is not a tool.
  const std::string cityless = R"(<tool_call>
{"name":"get_weather","arguments":{"days":3}}
</tool_call>)";
  const std::string unknown = R"(<tool_call>
{"name":"lookup","arguments":{}}
</tool_call>)";
  EXPECT_FALSE(accepts(many, cityless));
  EXPECT_FALSE(accepts(many, unknown));
  // One call only; a named function: only it.
  const std::string one = tool_call_grammar(ToolCallFormat::kHermes, tools, "", false);
  EXPECT_TRUE(accepts(one, now));
  EXPECT_FALSE(accepts(one, weather + "\n" + now));
  const std::string named = tool_call_grammar(ToolCallFormat::kHermes, tools, "now", false);
  EXPECT_TRUE(accepts(named, now));
  EXPECT_FALSE(accepts(named, weather));
  // Llama's JSON: "parameters", calls separated by "; ", which its parser reads.
  const std::string llama = tool_call_grammar(ToolCallFormat::kLlamaJson, tools, "", true);
  const std::string calls =
      R"({"name":"now","parameters":{}}; {"name":"get_weather","parameters":{"city":"Oslo"}})";
  EXPECT_TRUE(accepts(llama, calls));
  EXPECT_EQ(parse_tool_calls(ToolCallFormat::kLlamaJson, calls).calls.size(), 2u);
  EXPECT_FALSE(accepts(llama, R"({"name":"now","arguments":{}})"));
  // Parameters that do not compile name the problem.
  const auto bad = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"x": {"type": "number", "multipleOf": 2}}}}}])");
  try {
    tool_call_grammar(ToolCallFormat::kHermes, bad, "", true);
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("multipleOf"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace specrun::server
