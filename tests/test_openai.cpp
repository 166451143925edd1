// The OpenAI protocol of `specrun serve` without a server: request bodies checked field by field
// (each refusal names the field, with OpenAI's error shape and status), the response and chunk
// shapes, and stop strings matched across token boundaries.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "runtime/server/openai.h"
#include "tests/test_support.h"

namespace specrun::server {
namespace {

using nlohmann::json;

EngineConfig defaults() {
  EngineConfig config;
  config.sampling.max_tokens = 77;
  config.sampling.temperature = 0.5f;
  return config;
}

CompletionRequest parse(const std::string& body, Endpoint endpoint = Endpoint::kCompletions) {
  return parse_completion_request(body, endpoint, defaults(), "m");
}

// The body must be refused with `status`, naming `param` and every fragment.
void expect_refused(const std::string& body, int status, const std::string& param,
                    const std::vector<std::string>& fragments,
                    Endpoint endpoint = Endpoint::kCompletions) {
  SCOPED_TRACE(body.substr(0, 200));
  try {
    parse(body, endpoint);
    ADD_FAILURE() << "accepted";
  } catch (const ApiException& refusal) {
    const ApiError& error = refusal.error();
    EXPECT_EQ(error.status, status);
    EXPECT_EQ(error.param, param);
    for (const std::string& fragment : fragments) {
      EXPECT_NE(error.message.find(fragment), std::string::npos) << error.message;
    }
    EXPECT_EQ(error.message.find('\n'), std::string::npos) << error.message;
    const json shape = error.body();
    EXPECT_EQ(shape["error"]["message"], error.message);
    EXPECT_TRUE(shape["error"].contains("type") && shape["error"].contains("code"));
  }
}

TEST(OpenAiRequest, ReadsEveryFieldOverTheEngineDefaults) {
  const CompletionRequest request = parse(R"({
    "model": "m", "prompt": "hello", "max_tokens": 12, "temperature": 0, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "seed": 7, "stop": ["\n\n", "END"], "n": 1, "stream": true,
    "stream_options": {"include_usage": true}, "user": "someone",
    "speculative": {"method": "prompt_lookup", "gamma": 12, "controller": "fixed",
                    "verification": "rejection", "draft_lookup_ngram": 3,
                    "draft_lookup_below": 0.5, "draft_alternates": 2}})");
  EXPECT_EQ(request.prompt, "hello");
  EXPECT_EQ(request.sampling.max_tokens, 12);
  EXPECT_EQ(request.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(request.sampling.top_p, 0.9f);
  EXPECT_EQ(request.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(request.sampling.min_p, 0.05f);
  EXPECT_EQ(request.sampling.seed, 7u);
  EXPECT_TRUE(request.seeded);
  EXPECT_EQ(request.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(request.stream);
  EXPECT_TRUE(request.include_usage);
  EXPECT_EQ(request.speculation.method, SpeculationMethod::kPromptLookup);
  EXPECT_EQ(request.speculation.controller, GammaControl::kFixed);
  EXPECT_EQ(request.speculation.verification, Verification::kRejection);
  EXPECT_EQ(request.speculation.gamma, 12);
  EXPECT_EQ(request.speculation.gamma_max, 12);  // moved to admit the gamma asked for
  EXPECT_EQ(request.speculation.draft_lookup_ngram, 3);
  EXPECT_FLOAT_EQ(request.speculation.draft_lookup_below, 0.5f);
  EXPECT_EQ(request.speculation.draft_alternates, 2);

  const CompletionRequest plain = parse(R"({"model": "m", "prompt": "x", "stop": "END",
                                            "max_completion_tokens": 3, "speculative": false,
                                            "top_k": -1, "seed": -1})");
  EXPECT_EQ(plain.sampling.max_tokens, 3);
  EXPECT_FLOAT_EQ(plain.sampling.temperature, 0.5f);  // the engine's default
  EXPECT_EQ(plain.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(plain.speculation.method, SpeculationMethod::kNone);
  EXPECT_EQ(plain.sampling.top_k, 0);  // -1 turns it off, as 0 does
  EXPECT_EQ(plain.sampling.seed, ~uint64_t{0});
  EXPECT_FALSE(parse(R"({"model": "m", "prompt": "x"})").seeded);
  EXPECT_EQ(parse(R"({"model": "m", "prompt": "x"})").sampling.max_tokens, 77);
}

// Every row of the speculation table is a field of the "speculative" object: read, and refused out
// of range naming the field, by the same row the TOML file and the command line read it by.
TEST(OpenAiRequest, TakesEverySpeculationSettingOfTheTable) {
  const SpeculationSettings engine_defaults = defaults().speculation;
  for (const Setting<SpeculationSettings>& row : speculation_settings()) {
    SCOPED_TRACE(row.key);
    const auto as_json = [](const SettingValue& value) {
      return std::visit([](const auto& held) { return json(held); }, value);
    };
    const SettingValue value = testing::other_setting_value(row, engine_defaults);
    json body = {{"model", "m"}, {"prompt", "x"}, {"speculative", {{row.key, as_json(value)}}}};
    const SettingValue read = row.get(parse(body.dump()).speculation);
    if (std::holds_alternative<double>(value)) {
      EXPECT_FLOAT_EQ(static_cast<float>(std::get<double>(read)),
                      static_cast<float>(std::get<double>(value)));
    } else {
      EXPECT_EQ(read, value);
    }
    body["speculative"][row.key] = as_json(testing::bad_setting_value(row));
    expect_refused(body.dump(), 400, std::string("speculative.") + row.key, {"must be"});
  }
  // Keys that disagree name the object.
  expect_refused(
      R"({"model": "m", "prompt": "x", "speculative": {"gamma_min": 5, "gamma_max": 3}})", 400,
      "speculative", {"gamma_min", "gamma_max"});
  // gamma is set last, as --gamma: it moves the range given beside it.
  const SpeculationSettings moved =
      parse(R"({"model": "m", "prompt": "x", "speculative": {"gamma": 10, "gamma_max": 9}})")
          .speculation;
  EXPECT_EQ(moved.gamma, 10);
  EXPECT_EQ(moved.gamma_max, 10);
}

// Fields vLLM users send: taken where specrun does what they ask, refused with a 400 naming them
// where it does not, never accepted and ignored.
TEST(OpenAiRequest, VllmFieldsAreHonouredOrRefusedNeverIgnored) {
  EXPECT_TRUE(parse(R"({"model": "m", "prompt": "x"})").sampling.stop_at_eos);
  EXPECT_FALSE(parse(R"({"model": "m", "prompt": "x", "ignore_eos": true})").sampling.stop_at_eos);
  EXPECT_TRUE(parse(R"({"model": "m", "prompt": "x", "ignore_eos": false})").sampling.stop_at_eos);
  expect_refused(R"({"model": "m", "prompt": "x", "ignore_eos": 1})", 400, "ignore_eos",
                 {"true or false"});
  const std::string chat = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_TRUE(parse(chat + "}", Endpoint::kChat).chat.add_generation_prompt);
  // false: the prompt ends after the last message, no assistant turn opened.
  const CompletionRequest closed =
      parse(chat + R"(, "add_generation_prompt": false})", Endpoint::kChat);
  EXPECT_FALSE(closed.chat.add_generation_prompt);
  EXPECT_FALSE(closed.chat.continue_final_message);
  // continue_final_message needs the generation prompt off, as vLLM says.
  const std::string partial =
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"},
          {"role": "assistant", "content": "Once upon"}])";
  EXPECT_TRUE(
      parse(partial + R"(, "continue_final_message": true, "add_generation_prompt": false})",
            Endpoint::kChat)
          .chat.continue_final_message);
  expect_refused(partial + R"(, "continue_final_message": true})", 400, "continue_final_message",
                 {"add_generation_prompt", "false"}, Endpoint::kChat);
  for (const char* chat_only : {"add_generation_prompt", "continue_final_message"}) {
    expect_refused(R"({"model": "m", "prompt": "x", ")" + std::string(chat_only) + R"(": false})",
                   400, chat_only, {"belongs to /v1/chat/completions"});
  }
  // chat_template_kwargs: template variables, in the order given; the request's own fields are
  // not variables.
  EXPECT_TRUE(
      parse(chat + R"(, "chat_template_kwargs": {}})", Endpoint::kChat).chat.variables.is_null());
  EXPECT_EQ(parse(chat + R"(, "chat_template_kwargs": {"z": 1, "enable_thinking": false}})",
                  Endpoint::kChat)
                .chat.variables.dump(),
            R"({"z":1,"enable_thinking":false})");
  expect_refused(chat + R"(, "chat_template_kwargs": [1]})", 400, "chat_template_kwargs",
                 {"must be an object"}, Endpoint::kChat);
  expect_refused(chat + R"(, "chat_template_kwargs": {"add_generation_prompt": false}})", 400,
                 "chat_template_kwargs.add_generation_prompt", {"request's own field"},
                 Endpoint::kChat);
  expect_refused(R"({"model": "m", "prompt": "x", "chat_template_kwargs": {}})", 400,
                 "chat_template_kwargs", {"belongs to /v1/chat/completions"});
  // add_special_tokens: read for either endpoint (the server applies it when it encodes).
  EXPECT_FALSE(parse(R"({"model": "m", "prompt": "x"})").add_special_tokens.has_value());
  EXPECT_EQ(
      parse(R"({"model": "m", "prompt": "x", "add_special_tokens": false})").add_special_tokens,
      std::optional<bool>(false));
  // vLLM's sampling and output extras: refused unless neutral.
  for (const char* field :
       {R"("min_tokens": 4)", R"("stop_token_ids": [2])", R"("include_stop_str_in_output": true)",
        R"("skip_special_tokens": false)", R"("truncate_prompt_tokens": 5)",
        R"("use_beam_search": true)", R"("guided_regex": "a+")", R"("chat_template": "x")",
        R"("documents": [])", R"("reasoning_effort": "low")", R"("bad_words": ["x"])"}) {
    const std::string body = std::string(R"({"model": "m", "prompt": "x", )") + field + "}";
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    expect_refused(body, 400, name, {"not supported"});
  }
  EXPECT_NO_THROW(parse(R"({"model": "m", "prompt": "x", "min_tokens": 0, "stop_token_ids": [],
                           "skip_special_tokens": true, "include_stop_str_in_output": false})"));
}

// An assistant's tool calls and the tools' answers reach the template as vLLM hands them to
// apply_chat_template: arguments parsed from JSON text, tool_call_id and name kept.
TEST(OpenAiRequest, ToolHistoryReachesTheTemplateAsVllmGivesIt) {
  const CompletionRequest request = parse(R"({"model": "m", "messages": [
      {"role": "user", "content": "weather?", "name": "ann"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"a\": [1]}"}},
          {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": ""}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
       "content": [{"type": "text", "text": "sunny"}]},
      {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
      {"role": "assistant", "content": "x", "tool_calls": []}]})",
                                          Endpoint::kChat);
  EXPECT_EQ(request.chat.messages.dump(),
            R"([{"role":"user","content":"weather?","name":"ann"},)"
            R"({"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",)"
            R"("function":{"name":"get_weather","arguments":{"city":"Paris","a":[1]}}},)"
            R"({"id":"call_2","type":"function","function":{"name":"now","arguments":{}}}]},)"
            R"({"role":"tool","content":"sunny","tool_call_id":"call_1","name":"get_weather"},)"
            R"({"role":"tool","content":"noon","tool_call_id":"call_2"},)"
            R"({"role":"assistant","content":"x"}])");
  const std::string head = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}, )";
  expect_refused(head + R"({"role": "assistant", "tool_calls": [{"type": "function",
                     "function": {"name": "f", "arguments": "{oops"}}]}]})",
                 400, "messages[1].tool_calls[0].function.arguments", {"not JSON", "{oops"},
                 Endpoint::kChat);
  expect_refused(
      head + R"({"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})", 400,
      "messages[1].tool_calls[0].function.name", {"must be a string"}, Endpoint::kChat);
  expect_refused(head + R"({"role": "assistant", "tool_calls": {}}]})", 400,
                 "messages[1].tool_calls", {"list of tool calls"}, Endpoint::kChat);
  expect_refused(head + R"({"role": "user", "content": "a", "tool_calls": []}]})", 400,
                 "messages[1].tool_calls", {"belongs to an assistant message"}, Endpoint::kChat);
  expect_refused(head + R"({"role": "assistant", "content": "x",
                    "function_call": {"name": "f"}}]})",
                 400, "messages[1].function_call", {"deprecated", "tool_calls"}, Endpoint::kChat);
  expect_refused(head + R"({"role": "tool", "tool_call_id": 5, "content": "x"}]})", 400,
                 "messages[1].tool_call_id", {"must be a string"}, Endpoint::kChat);
  expect_refused(head + R"({"role": "tool", "tool_call_id": "1"}]})", 400, "messages[1].content",
                 {"required for a tool message"}, Endpoint::kChat);
}

// tools and tool_choice: the tools go to the template as given; "auto" (the default with tools)
// reads the output for calls, "none" does not; "required" and a named function (one of the tools)
// constrain it to calls.
TEST(OpenAiRequest, ToolsAndToolChoice) {
  const std::string head =
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type":
          "function", "function": {"name": "get_weather", "description": "d",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  const CompletionRequest automatic = parse(head + "}", Endpoint::kChat);
  EXPECT_EQ(automatic.tool_choice, ToolChoice::kAuto);
  EXPECT_TRUE(automatic.parallel_tool_calls);
  EXPECT_EQ(automatic.chat.tools.dump(),
            R"([{"type":"function","function":{"name":"get_weather","description":"d",)"
            R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  EXPECT_EQ(parse(head + R"(, "tool_choice": "none"})", Endpoint::kChat).tool_choice,
            ToolChoice::kNone);
  EXPECT_EQ(parse(head + R"(, "tool_choice": "auto"})", Endpoint::kChat).tool_choice,
            ToolChoice::kAuto);
  EXPECT_FALSE(
      parse(head + R"(, "parallel_tool_calls": false})", Endpoint::kChat).parallel_tool_calls);
  EXPECT_EQ(parse(head + R"(, "tool_choice": "required"})", Endpoint::kChat).tool_choice,
            ToolChoice::kRequired);
  const CompletionRequest named = parse(head + R"(, "tool_choice": {"type": "function",
                     "function": {"name": "get_weather"}}})",
                                        Endpoint::kChat);
  EXPECT_EQ(named.tool_choice, ToolChoice::kFunction);
  EXPECT_EQ(named.tool_function, "get_weather");
  expect_refused(head + R"(, "tool_choice": {"type": "function", "function": {"name": "other"}}})",
                 400, "tool_choice.function.name", {"'other'", "not one of the request's tools"},
                 Endpoint::kChat);
  expect_refused(head + R"(, "tool_choice": {"type": "function", "function": {}}})", 400,
                 "tool_choice.function.name", {"must be a string"}, Endpoint::kChat);
  expect_refused(head + R"(, "tool_choice": "required", "response_format": {"type":
                     "json_object"}})",
                 400, "response_format", {"'tool_choice' both constrain"}, Endpoint::kChat);
  expect_refused(head + R"(, "tool_choice": "sometimes"})", 400, "tool_choice",
                 {"\"none\", \"auto\"", "sometimes"}, Endpoint::kChat);
  // No tools: nothing to choose from, and no calls read.
  const std::string bare = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(parse(bare + "}", Endpoint::kChat).tool_choice, ToolChoice::kNone);
  EXPECT_EQ(parse(bare + R"(, "tool_choice": "none"})", Endpoint::kChat).tool_choice,
            ToolChoice::kNone);
  expect_refused(bare + R"(, "tool_choice": "auto"})", 400, "tool_choice", {"needs 'tools'"},
                 Endpoint::kChat);
  expect_refused(bare + R"(, "tools": [{"type": "code_interpreter"}]})", 400, "tools[0].type",
                 {"\"function\""}, Endpoint::kChat);
  expect_refused(bare + R"(, "tools": [{"type": "function", "function": {"name": ""}}]})", 400,
                 "tools[0].function.name", {"non-empty string"}, Endpoint::kChat);
  expect_refused(bare + R"(, "tools": [{"type": "function", "function": {"name": "f",
                     "parameters": "x"}}]})",
                 400, "tools[0].function.parameters", {"JSON Schema object"}, Endpoint::kChat);
  expect_refused(bare + R"(, "tools": {}})", 400, "tools", {"list of tools"}, Endpoint::kChat);
  expect_refused(bare + R"(, "functions": [{"name": "f"}]})", 400, "functions", {"not supported"},
                 Endpoint::kChat);
  for (const char* chat_only : {R"("tools": [])", R"("tool_choice": "none")"}) {
    const std::string body = std::string(R"({"model": "m", "prompt": "x", )") + chat_only + "}";
    const std::string name =
        std::string(chat_only).substr(1, std::string(chat_only).find('"', 1) - 1);
    expect_refused(body, 400, name, {"belongs to /v1/chat/completions"});
  }
}

// specrun template's input: a list of messages, or an object of the keys that shape the prompt.
TEST(OpenAiRequest, ChatPromptOfSpecrunTemplate) {
  const ChatPrompt bare = parse_chat_prompt(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(bare.messages.dump(), R"([{"role":"user","content":"hi"}])");
  EXPECT_TRUE(bare.add_generation_prompt);
  EXPECT_TRUE(bare.tools.is_null());
  const ChatPrompt full = parse_chat_prompt(R"({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": false,
      "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_FALSE(full.add_generation_prompt);
  EXPECT_EQ(full.tools.size(), 1u);
  EXPECT_EQ(full.variables.dump(), R"({"enable_thinking":false})");
  for (const auto& [body, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"{bad", "not valid JSON"},
           {"5", "list of messages"},
           {R"({"messages": [{"role": "user", "content": "x"}], "model": "m"})",
            "'model' is not a key that shapes the prompt"},
           {R"({"tools": []})", "'messages' is required"}}) {
    try {
      parse_chat_prompt(body);
      ADD_FAILURE() << body << " accepted";
    } catch (const ApiException& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  }
}

TEST(OpenAiRequest, PromptFormsAndMessages) {
  EXPECT_EQ(parse(R"({"model": "m", "prompt": ["one"]})").prompt, "one");
  EXPECT_EQ(parse(R"({"model": "m", "prompt": [1, 2, 3]})").prompt_ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(parse(R"({"model": "m", "prompt": [[4, 5]]})").prompt_ids,
            (std::vector<int32_t>{4, 5}));
  const CompletionRequest chat = parse(R"({"model": "m", "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "name": "x"}]})",
                                       Endpoint::kChat);
  EXPECT_EQ(chat.chat.messages.dump(),
            R"([{"role":"system","content":"be brief"},{"role":"user","content":"a\nb"},)"
            R"({"role":"assistant","content":"","name":"x"}])");
}

TEST(OpenAiRequest, MalformedBodiesAndWrongTypes) {
  expect_refused("{bad", 400, "", {"not valid JSON"});
  expect_refused("[1, 2]", 400, "", {"JSON object"});
  expect_refused(R"({"model": "m", "prompt": "x", "temperature": 1e400})", 400, "",
                 {"not valid JSON", "1e400"});
  expect_refused(std::string(100, '[') + std::string(100, ']'), 400, "", {"nests deeper"});
  expect_refused(R"({"prompt": "x"})", 400, "model", {"'model' is required"});
  expect_refused(R"({"model": 5, "prompt": "x"})", 400, "model", {"must be a string"});
  expect_refused(R"({"model": "m"})", 400, "prompt", {"'prompt' is required"});
  expect_refused(R"({"model": "m", "prompt": ["a", "b"]})", 400, "prompt", {"one prompt"});
  expect_refused(R"({"model": "m", "prompt": [1, -2]})", 400, "prompt", {"non-negative"});
  expect_refused(R"({"model": "m", "prompt": ""})", 400, "prompt", {"empty"});
  expect_refused(R"({"model": "m", "prompt": "x", "max_tokens": "9"})", 400, "max_tokens",
                 {"must be an integer"});
  expect_refused(R"({"model": "m", "prompt": "x", "max_tokens": 1.5})", 400, "max_tokens",
                 {"must be an integer"});
  expect_refused(R"({"model": "m", "prompt": "x", "stream": "yes"})", 400, "stream",
                 {"true or false"});
  expect_refused(R"({"model": "m", "prompt": "x", "temperature": "hot"})", 400, "temperature",
                 {"must be a number"});
  expect_refused(R"({"model": "m", "prompt": "x", "stop": [1]})", 400, "stop", {"list of strings"});
  expect_refused(R"({"model": "m", "prompt": "x", "user": 3})", 400, "user", {"string"});
  expect_refused(R"({"model": "m", "messages": "hi"})", 400, "messages", {"non-empty list"},
                 Endpoint::kChat);
  expect_refused(R"({"model": "m", "messages": [{"role": "narrator", "content": "x"}]})", 400,
                 "messages[0].role", {"system, user, assistant or tool", "narrator"},
                 Endpoint::kChat);
  expect_refused(R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", 400,
                 "messages[0].content", {"string or a list of parts"}, Endpoint::kChat);
  expect_refused(R"({"model": "m", "messages": [{"role": "user",
                     "content": [{"type": "image_url", "image_url": {}}]}]})",
                 400, "messages[0].content", {"text only"}, Endpoint::kChat);
  expect_refused(R"({"model": "m", "prompt": "x", "speculative": {"method": "medusa"}})", 400,
                 "speculative.method", {"draft, prompt_lookup, none"});
  expect_refused(R"({"model": "m", "prompt": "x", "speculative": {"depth": 3}})", 400,
                 "speculative.depth", {"not a known field"});
  expect_refused(R"({"model": "m", "prompt": "x", "speculative": {"draft_lookup_ngram": -1}})", 400,
                 "speculative.draft_lookup_ngram", {});
  expect_refused(R"({"model": "m", "prompt": "x", "stream_options": {"include_usage": true}})", 400,
                 "stream_options", {"only allowed with"});
}

// Inputs a lenient parser would take and guess at are refused, each naming what is wrong.
TEST(OpenAiRequest, AmbiguousOrEmptyInputsAreRefusedRatherThanGuessed) {
  // A key an object repeats: which one would count is a guess.
  expect_refused(R"({"model": "m", "prompt": "x", "max_tokens": 1, "max_tokens": 9})", 400,
                 "max_tokens", {"repeats the key 'max_tokens'"});
  expect_refused(R"({"model": "m", "prompt": "x", "speculative": {"gamma": 1, "gamma": 2}})", 400,
                 "gamma", {"repeats the key 'gamma'"});
  // The same key in different objects is fine.
  EXPECT_EQ(parse(R"({"model": "m", "messages": [{"role": "user", "content": "a"},
                 {"role": "user", "content": "b"}]})",
                  Endpoint::kChat)
                .chat.messages.size(),
            2u);
  // A system or user turn must say something.
  for (const std::string content : {"", R"(, "content": null)", R"(, "content": [])"}) {
    expect_refused(R"({"model": "m", "messages": [{"role": "user")" + content + "}]}", 400,
                   "messages[0].content", {"required for a user message"}, Endpoint::kChat);
  }
  // Each endpoint's prompt field, never the other's.
  expect_refused(R"({"model": "m", "prompt": "x", "messages": []})", 400, "messages",
                 {"/v1/chat/completions"});
  expect_refused(R"({"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "a"}]})",
                 400, "prompt", {"/v1/completions"}, Endpoint::kChat);
}

TEST(OpenAiRequest, OutOfRangeAndUnsupported) {
  expect_refused(R"({"model": "other", "prompt": "x"})", 404, "model",
                 {"'other' does not exist", "serves 'm'"});
  expect_refused(R"({"model": "m", "prompt": "x", "temperature": 2.5})", 400, "temperature",
                 {"[0, 2]", "2.5"});
  expect_refused(R"({"model": "m", "prompt": "x", "top_p": 0})", 400, "top_p", {"(0, 1]"});
  expect_refused(R"({"model": "m", "prompt": "x", "top_p": 1.5})", 400, "top_p", {"(0, 1]"});
  expect_refused(R"({"model": "m", "prompt": "x", "min_p": -0.1})", 400, "min_p", {"[0, 1]"});
  expect_refused(R"({"model": "m", "prompt": "x", "top_k": -2})", 400, "top_k", {"-2"});
  expect_refused(R"({"model": "m", "prompt": "x", "max_tokens": -1})", 400, "max_tokens", {"-1"});
  expect_refused(R"({"model": "m", "prompt": "x", "max_tokens": 99999999999999})", 400,
                 "max_tokens", {"[0, 2147483647]", "99999999999999"});
  expect_refused(R"({"model": "m", "prompt": "x", "n": 17})", 400, "n", {"[1, 16]", "17"});
  expect_refused(R"({"model": "m", "prompt": "x", "stop": ""})", 400, "stop", {"1 to"});
  expect_refused(R"({"model": "m", "prompt": "x", "speculative": {"gamma": 65}})", 400,
                 "speculative.gamma", {"[0, 64]"});
  // What the server does not implement is refused rather than ignored; neutral values pass.
  expect_refused(R"({"model": "m", "prompt": "x", "min_tokens": 3})", 400, "min_tokens",
                 {"not supported"});
  EXPECT_NO_THROW(parse(R"({"model": "m", "prompt": "x", "min_tokens": 0, "suffix": "",
                           "response_format": {"type": "text"}})"));
}

// The penalties walk the sampling table's rows: their ranges and messages are the TOML keys'.
TEST(OpenAiRequest, PenaltiesAndLogitBias) {
  const CompletionRequest request =
      parse(R"({"model": "m", "prompt": "x", "frequency_penalty": 0.5, "presence_penalty": -1,
                "repetition_penalty": 1.2, "logit_bias": {"5": 10, "17": -100}})");
  EXPECT_EQ(request.sampling.frequency_penalty, 0.5f);
  EXPECT_EQ(request.sampling.presence_penalty, -1.0f);
  EXPECT_EQ(request.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(request.logit_bias, (std::map<int32_t, float>{{5, 10.0f}, {17, -100.0f}}));
  expect_refused(R"({"model": "m", "prompt": "x", "frequency_penalty": 2.5})", 400,
                 "frequency_penalty", {"[-2, 2]", "2.5"});
  expect_refused(R"({"model": "m", "prompt": "x", "presence_penalty": "high"})", 400,
                 "presence_penalty", {"must be a number"});
  expect_refused(R"({"model": "m", "prompt": "x", "repetition_penalty": 0})", 400,
                 "repetition_penalty", {"> 0", "got 0"});
  expect_refused(R"({"model": "m", "prompt": "x", "logit_bias": [1]})", 400, "logit_bias",
                 {"must be an object"});
  expect_refused(R"({"model": "m", "prompt": "x", "logit_bias": {"a5": 1}})", 400, "logit_bias",
                 {"token ids", "'a5'"});
  expect_refused(R"({"model": "m", "prompt": "x", "logit_bias": {"-1": 1}})", 400, "logit_bias",
                 {"'-1'"});
  expect_refused(R"({"model": "m", "prompt": "x", "logit_bias": {"5": 101}})", 400, "logit_bias",
                 {"[-100, 100]", "101", "token 5"});
  expect_refused(R"({"model": "m", "prompt": "x", "logit_bias": {"5": "up"}})", 400, "logit_bias",
                 {"[-100, 100]"});
}

// Chat: logprobs true with top_logprobs; completions: logprobs as the number of top tokens.
TEST(OpenAiRequest, Logprobs) {
  const std::string chat = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(parse(chat + "}", Endpoint::kChat).logprobs, -1);
  EXPECT_EQ(parse(chat + R"(, "logprobs": false})", Endpoint::kChat).logprobs, -1);
  EXPECT_EQ(parse(chat + R"(, "logprobs": true})", Endpoint::kChat).logprobs, 0);
  EXPECT_EQ(parse(chat + R"(, "logprobs": true, "top_logprobs": 20})", Endpoint::kChat).logprobs,
            20);
  expect_refused(chat + R"(, "top_logprobs": 2})", 400, "top_logprobs", {"\"logprobs\": true"},
                 Endpoint::kChat);
  expect_refused(chat + R"(, "logprobs": true, "top_logprobs": 21})", 400, "top_logprobs",
                 {"[0, 20]"}, Endpoint::kChat);
  expect_refused(chat + R"(, "logprobs": 2})", 400, "logprobs", {"true or false"}, Endpoint::kChat);
  EXPECT_EQ(parse(R"({"model": "m", "prompt": "x"})").logprobs, -1);
  EXPECT_EQ(parse(R"({"model": "m", "prompt": "x", "logprobs": 0})").logprobs, 0);
  EXPECT_EQ(parse(R"({"model": "m", "prompt": "x", "logprobs": 5})").logprobs, 5);
  expect_refused(R"({"model": "m", "prompt": "x", "logprobs": 21})", 400, "logprobs", {"[0, 20]"});
  expect_refused(R"({"model": "m", "prompt": "x", "logprobs": true})", 400, "logprobs",
                 {"integer"});
  expect_refused(R"({"model": "m", "prompt": "x", "top_logprobs": 2})", 400, "top_logprobs",
                 {"/v1/chat/completions"});
}

// n, best_of (completions, not streamed, at least n) and echo (completions; with logprobs, the
// prompt's too).
TEST(OpenAiRequest, ChoicesBestOfAndEcho) {
  const CompletionRequest request =
      parse(R"({"model": "m", "prompt": "x", "n": 3, "best_of": 5, "echo": true})");
  EXPECT_EQ(request.n, 3);
  EXPECT_EQ(request.best_of, 5);
  EXPECT_TRUE(request.echo);
  const CompletionRequest plain = parse(R"({"model": "m", "prompt": "x", "n": 2})");
  EXPECT_EQ(plain.best_of, 2);  // best_of defaults to n
  EXPECT_FALSE(plain.echo);
  expect_refused(R"({"model": "m", "prompt": "x", "n": 0})", 400, "n", {"[1, 16]"});
  expect_refused(R"({"model": "m", "prompt": "x", "best_of": 17})", 400, "best_of", {"[1, 16]"});
  expect_refused(R"({"model": "m", "prompt": "x", "n": 3, "best_of": 2})", 400, "best_of",
                 {"at least 'n'"});
  expect_refused(R"({"model": "m", "prompt": "x", "best_of": 2, "stream": true})", 400, "best_of",
                 {"cannot be streamed"});
  const CompletionRequest echoed =
      parse(R"({"model": "m", "prompt": "x", "echo": true, "logprobs": 1})");
  EXPECT_TRUE(echoed.echo);
  EXPECT_EQ(echoed.logprobs, 1);
  const std::string chat = R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(parse(chat + R"(, "n": 4})", Endpoint::kChat).n, 4);
  expect_refused(chat + R"(, "best_of": 2})", 400, "best_of", {"/v1/completions"}, Endpoint::kChat);
  expect_refused(chat + R"(, "echo": true})", 400, "echo", {"/v1/completions"}, Endpoint::kChat);
}

// response_format, "grammar" and guided_json become the request's constraint, compiled while
// parsing: a schema or grammar that does not compile is a 400 naming its field.
TEST(OpenAiRequest, StructuredOutput) {
  const std::string head = R"({"model": "m", "prompt": "x", )";
  EXPECT_EQ(parse(head + R"("response_format": {"type": "text"}})").constraint.kind,
            ConstraintKind::kNone);
  EXPECT_EQ(parse(head + R"("response_format": {"type": "json_object"}})").constraint.kind,
            ConstraintKind::kJsonObject);
  // The schema's members keep the client's order.
  const CompletionRequest schema = parse(head + R"("response_format": {"type": "json_schema",
      "json_schema": {"name": "p", "strict": true, "schema": {"type": "object", "properties":
      {"zeta": {"type": "integer"}, "alpha": {"type": "string"}}}}}})");
  EXPECT_EQ(schema.constraint.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(
      schema.constraint.text,
      R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}})");
  EXPECT_EQ(schema.constraint_field, "response_format");
  const CompletionRequest grammar = parse(head + R"("grammar": "root ::= \"yes\" | \"no\""})");
  EXPECT_EQ(grammar.constraint.kind, ConstraintKind::kGbnf);
  EXPECT_EQ(grammar.constraint.text, R"(root ::= "yes" | "no")");
  EXPECT_EQ(parse(head + R"("guided_json": {"type": "integer"}})").constraint.kind,
            ConstraintKind::kJsonSchema);
  EXPECT_EQ(parse(head + R"("guided_json": "{\"type\": \"integer\"}"})").constraint.text,
            R"({"type": "integer"})");

  expect_refused(head + R"("response_format": {"type": "xml"}})", 400, "response_format",
                 {"json_schema"});
  expect_refused(head + R"("response_format": {"type": "json_schema"}})", 400, "response_format",
                 {"'response_format.json_schema.schema'"});
  expect_refused(head + R"("response_format": {"type": "json_schema", "json_schema": {"schema":
      {"type": "object", "multipleOf": 3}}}})",
                 400, "response_format", {"does not compile", "multipleOf"});
  expect_refused(head + R"("grammar": "root ::= missing"})", 400, "grammar",
                 {"does not compile", "missing"});
  expect_refused(head + R"("grammar": 3})", 400, "grammar", {"must be a string"});
  expect_refused(head + R"("guided_json": "{not json"})", 400, "guided_json",
                 {"does not compile", "not JSON"});
  expect_refused(head + R"("grammar": "root ::= \"a\"", "response_format": {"type":
      "json_object"}})",
                 400, "grammar", {"both constrain"});
  expect_refused(head + R"("guided_grammar": "root ::= \"a\""})", 400, "guided_grammar",
                 {"not supported"});
}

TEST(OpenAiResponse, ShapesOfResponsesAndChunks) {
  const ResponseHeader header{"chatcmpl-1", 1700000000, "m"};
  const json usage = usage_json(5, 3, 2);
  EXPECT_EQ(usage, json::parse(R"({"prompt_tokens": 5, "completion_tokens": 3,
                                   "total_tokens": 8, "prompt_tokens_details":
                                   {"cached_tokens": 2}})"));
  const json chat = completion_response(Endpoint::kChat, header, {{"hi", "stop"}}, usage);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"],
            json::parse(R"({"role": "assistant", "content": "hi"})"));
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chat["usage"], usage);
  const json text = completion_response(Endpoint::kCompletions, header,
                                        {{"hi", "length"}, {"ho", "stop"}}, usage);
  ASSERT_EQ(text["choices"].size(), 2u);
  EXPECT_EQ(text["choices"][1]["index"], 1);
  EXPECT_EQ(text["choices"][1]["text"], "ho");
  EXPECT_TRUE(text["choices"][1]["logprobs"].is_null());
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "hi");

  // Tool calls: OpenAI's message with tool_calls, content null where nothing else was said.
  const IdentifiedCall call{"call_7", {"get_weather", R"({"city":"Paris"})"}};
  const json called =
      completion_response(Endpoint::kChat, header, {{"", "tool_calls", {call}}}, usage);
  EXPECT_EQ(called["choices"][0]["message"], json::parse(R"({"role": "assistant", "content": null,
      "tool_calls": [{"id": "call_7", "type": "function", "function": {"name": "get_weather",
      "arguments": "{\"city\":\"Paris\"}"}}]})"));
  EXPECT_EQ(completion_response(Endpoint::kChat, header, {{"Let me see.", "tool_calls", {call}}},
                                usage)["choices"][0]["message"]["content"],
            "Let me see.");
  // Streamed: the id, type and name first (with the role where the stream opens), the arguments
  // next, each under the call's index.
  const std::vector<json> chunks = tool_call_chunks(header, 2, call, 1, true, true);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json::parse(R"({"role": "assistant", "tool_calls":
      [{"index": 1, "id": "call_7", "type": "function", "function": {"name": "get_weather",
      "arguments": ""}}]})"));
  EXPECT_EQ(chunks[1]["choices"][0]["delta"], json::parse(R"({"tool_calls": [{"index": 1,
      "function": {"arguments": "{\"city\":\"Paris\"}"}}]})"));
  EXPECT_TRUE(chunks[1].contains("usage") && chunks[1]["usage"].is_null());
  EXPECT_EQ(chunks[1]["object"], "chat.completion.chunk");
  EXPECT_EQ(chunks[1]["choices"][0]["index"], 2);

  const json opening = completion_chunk(Endpoint::kChat, header, 0, "He", true, std::nullopt, true);
  EXPECT_EQ(opening["object"], "chat.completion.chunk");
  EXPECT_EQ(opening["choices"][0]["delta"],
            json::parse(R"({"role": "assistant", "content": "He"})"));
  EXPECT_TRUE(opening["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(opening.contains("usage") && opening["usage"].is_null());
  const json closing = completion_chunk(Endpoint::kChat, header, 1, "", false, "stop", false);
  EXPECT_EQ(closing["choices"][0]["delta"], json::object());
  EXPECT_EQ(closing["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(closing["choices"][0]["index"], 1);
  EXPECT_FALSE(closing.contains("usage"));
  const json last = usage_chunk(Endpoint::kChat, header, usage);
  EXPECT_EQ(last["choices"], json::array());
  EXPECT_EQ(last["usage"], usage);
  EXPECT_FALSE(opening.contains("speculative"));

  // The "speculative" extension: a text chunk's counts and pieces, and a finished request's figures
  // (the non-streamed response's and the last chunk's).
  const json pieces = json::parse(R"([{"text": "He", "accepted_draft": true}])");
  const json extended =
      completion_chunk(Endpoint::kCompletions, header, 0, "He", true, std::nullopt, false,
                       chunk_speculative_json({3, 4, 2}, pieces));
  EXPECT_EQ(extended["speculative"],
            json::parse(R"({"tokens": 3, "drafted": 4, "accepted_drafts": 2, "pieces":
                            [{"text": "He", "accepted_draft": true}]})"));
  RequestStats stats;
  stats.drafted = 8;
  stats.accepted = 6;
  stats.acceptance_rate = 0.75;
  stats.steps = 5;
  stats.looked_up = 2;
  stats.looked_up_accepted = 1;
  stats.alternates = 4;
  stats.alternates_accepted = 1;
  EXPECT_EQ(speculative_json(stats),
            json::parse(R"({"drafted": 8, "accepted": 6, "acceptance_rate": 0.75, "steps": 5,
                            "looked_up": 2, "looked_up_accepted": 1, "alternates": 4,
                            "alternates_accepted": 1})"));

  EXPECT_EQ(finish_reason(FinishReason::kEndOfSequence, false), "stop");
  EXPECT_EQ(finish_reason(FinishReason::kMaxTokens, false), "length");
  EXPECT_EQ(finish_reason(FinishReason::kContextLimit, false), "length");
  EXPECT_EQ(finish_reason(FinishReason::kCancelled, true), "stop");
  EXPECT_EQ(finish_reason(FinishReason::kShutdown, false), std::nullopt);
}

// Feeds `pieces` through a matcher; returns what came out and whether it stopped.
std::pair<std::string, bool> match(const std::vector<std::string>& stops,
                                   const std::vector<std::string>& pieces) {
  StopMatcher matcher(stops);
  std::string out;
  for (const std::string& piece : pieces) out += matcher.feed(piece);
  out += matcher.flush();
  return {out, matcher.stopped()};
}

TEST(StopMatcher, StopsAcrossPiecesAndNeverEmitsTheStopString) {
  EXPECT_EQ(match({"END"}, {"abc", "E", "N", "Dxyz"}), std::make_pair(std::string("abc"), true));
  EXPECT_EQ(match({"END"}, {"abcEN", "D"}), std::make_pair(std::string("abc"), true));
  EXPECT_EQ(match({"END"}, {"END"}), std::make_pair(std::string(""), true));
  // A prefix that turns out not to be the stop string comes out whole, in order.
  EXPECT_EQ(match({"END"}, {"E", "N", "x", "EN"}), std::make_pair(std::string("ENxEN"), false));
  // The earliest of several, a multi-byte one among them.
  EXPECT_EQ(match({"zz", "\xc3\xa9t\xc3\xa9"}, {"un \xc3\xa9", "t\xc3", "\xa9 zz"}),
            std::make_pair(std::string("un "), true));
  EXPECT_EQ(match({"\n\n", "x"}, {"a\n", "\nb x"}), std::make_pair(std::string("a"), true));
  // Nothing held back without stop strings, and nothing after a stop.
  StopMatcher none({});
  EXPECT_EQ(none.feed("abc"), "abc");
  StopMatcher once({"b"});
  EXPECT_EQ(once.feed("abc"), "a");
  EXPECT_EQ(once.feed("more"), "");
  EXPECT_EQ(once.flush(), "");
}

// The pieces of released text by origin: `runs` are (text, accepted drafts' bytes at its start)
// as fed; `released` what the matcher let out, in order.
json origins(const std::vector<std::pair<std::string, size_t>>& runs,
             const std::vector<std::string>& released) {
  TextOrigins tracker;
  for (const auto& run : runs) tracker.fed(run.first, run.second);
  json all = json::array();
  for (const std::string& text : released) all.push_back(tracker.released(text));
  return all;
}

TEST(TextOrigins, ReleasedTextKeepsTheOriginOfTheBytesFedAtItsPlace) {
  // Released as fed: each event's accepted drafts' text, then the target's.
  EXPECT_EQ(origins({{"abcd", 3}, {"ef", 0}}, {"abcd", "ef"}), json::parse(R"([
      [{"text": "abc", "accepted_draft": true}, {"text": "d", "accepted_draft": false}],
      [{"text": "ef", "accepted_draft": false}]])"));
  // Held back and released later, across events: runs of one origin are one piece.
  EXPECT_EQ(origins({{"ab", 1}, {"cd", 2}, {"e", 0}}, {"a", "bcde"}), json::parse(R"([
      [{"text": "a", "accepted_draft": true}],
      [{"text": "b", "accepted_draft": false}, {"text": "cd", "accepted_draft": true},
       {"text": "e", "accepted_draft": false}]])"));
  // Through a real matcher: what it releases, whatever it held, keeps its origins; a stop drops
  // the rest.
  StopMatcher matcher({"STOP"});
  TextOrigins tracker;
  std::string out;
  json pieces = json::array();
  for (const auto& [text, accepted] :
       std::vector<std::pair<std::string, size_t>>{{"xS", 1}, {"Ty", 2}, {"zST", 0}, {"OPw", 3}}) {
    tracker.fed(text, accepted);
    const std::string released = matcher.feed(text);
    out += released;
    for (const json& piece : tracker.released(released)) pieces.push_back(piece);
  }
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(out, "xSTyz");
  EXPECT_EQ(pieces, json::parse(R"([{"text": "x", "accepted_draft": true},
                                    {"text": "S", "accepted_draft": false},
                                    {"text": "Ty", "accepted_draft": true},
                                    {"text": "z", "accepted_draft": false}])"));
}

TokenLogprob token(int32_t id, float logprob, std::vector<TopLogprob> top = {}) {
  return {id, logprob, std::move(top)};
}

// A token is released with the text that covers its bytes; one a stop string cut never is.
TEST(TokenAligner, TokensGoOutWithTheirTextAndThoseAStopCutsNever) {
  StopMatcher matcher({"STOP"});
  TokenAligner aligner;
  std::vector<std::vector<int32_t>> released;  // the tokens of each release
  std::vector<std::vector<size_t>> offsets;
  // (text, tokens, their lengths): "ab" "S" | "T" "c" | "ST" "OP" "x"
  const std::vector<std::tuple<std::string, std::vector<TokenLogprob>, std::vector<size_t>>>
      events = {{"abS", {token(1, -1), token(2, -2)}, {2, 1}},
                {"Tc", {token(3, -3), token(4, -4)}, {1, 1}},
                {"STOPx", {token(5, -5), token(6, -6), token(7, -7)}, {2, 2, 1}}};
  for (const auto& [text, tokens, lengths] : events) {
    aligner.fed(text, tokens, lengths);
    const std::string out = matcher.feed(text);
    std::vector<int32_t> ids;
    std::vector<size_t> at;
    for (const ReportedToken& reported : aligner.released(out.size())) {
      ids.push_back(reported.logprob.token);
      at.push_back(reported.offset);
    }
    released.push_back(ids);
    offsets.push_back(at);
  }
  EXPECT_TRUE(matcher.stopped());
  // "S" is held (it may begin STOP) with its token until "Tc" shows it does not.
  EXPECT_EQ(released, (std::vector<std::vector<int32_t>>{{1}, {2, 3, 4}, {}}));
  EXPECT_EQ(offsets, (std::vector<std::vector<size_t>>{{0}, {2, 3, 4}, {}}));

  // A token ending inside a character runs on into the next event's text; a special token has
  // no text; without a stop string, rest() gives what is left.
  TokenAligner split;
  split.fed("", {token(10, -0.5f)}, {2});  // the first two bytes of a three-byte character
  EXPECT_TRUE(split.released(0).empty());
  split.fed("\xe2\x82\xac", {token(11, -0.25f), token(2, -0.1f)}, {1, 0});
  const std::vector<ReportedToken> out = split.released(3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].offset, 0u);
  EXPECT_EQ(out[1].offset, 2u);
  EXPECT_EQ(out[2].offset, 3u);
  EXPECT_TRUE(split.rest().empty());
}

TEST(OpenAiResponse, LogprobsInEachEndpointsShape) {
  const TokenPieces pieces = [](int32_t id) {
    return id == 2 ? TokenPiece{"</s>", true} : TokenPiece{std::string(1, char('a' + id)), false};
  };
  const std::vector<ReportedToken> tokens = {{token(0, -0.5f, {{0, -0.5f}, {1, -1.5f}}), 3},
                                             {token(2, -0.25f, {{2, -0.25f}, {0, -2}}), 4}};
  EXPECT_EQ(logprobs_json(Endpoint::kChat, tokens, pieces), json::parse(R"({"content": [
      {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [
        {"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -1.5,
         "bytes": [98]}]},
      {"token": "</s>", "logprob": -0.25, "bytes": [60, 47, 115, 62], "top_logprobs": [
        {"token": "</s>", "logprob": -0.25, "bytes": [60, 47, 115, 62]},
        {"token": "a", "logprob": -2.0, "bytes": [97]}]}]})"));
  EXPECT_EQ(logprobs_json(Endpoint::kCompletions, tokens, pieces), json::parse(R"({
      "tokens": ["a", "</s>"], "token_logprobs": [-0.5, -0.25],
      "top_logprobs": [{"a": -0.5, "b": -1.5}, {"</s>": -0.25, "a": -2.0}],
      "text_offset": [3, 4]})"));
}

TEST(StopMatcher, HeldTextIsReleasedAsSoonAsItCannotStartAStop) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.feed("abcST"), "abc");  // "ST" may begin STOP
  EXPECT_EQ(matcher.feed("x"), "STx");
  EXPECT_EQ(matcher.feed("S"), "");
  EXPECT_EQ(matcher.feed("TO"), "");
  EXPECT_EQ(matcher.flush(), "STO");  // the end: it was not the stop string after all
}

}  // namespace
}  // namespace specrun::server
