#include "runtime/server/openai.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "specrun/settings.hpp"

namespace specrun::server {
namespace {

// Ordered: the members of what the client sent (tools, tool calls' arguments, template
// variables) reach the template in the client's order, as in Python.
using json = nlohmann::ordered_json;

[[noreturn]] void refuse(const std::string& param, const std::string& message,
                         const std::string& code = "") {
  throw ApiException(ApiError{400, "invalid_request_error", message, param, code});
}

std::string type_name(const json& value) {
  return value.is_number_integer() ? "an integer" : std::string("a ") + value.type_name();
}

// The request's fields, each read with its type checked; absent and null both mean "not given".
class Fields {
 public:
  // `prefix` ("speculative.") names nested fields in errors.
  explicit Fields(const json& body, std::string prefix = "")
      : body_(body), prefix_(std::move(prefix)) {}

  const json* get(const char* name) const {
    const auto it = body_.find(name);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }

  // In [minimum, maximum], or (minimum, maximum] where `exclusive_minimum`.
  std::optional<double> number(const char* name, double minimum, double maximum,
                               bool exclusive_minimum = false) const {
    const json* value = get(name);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number()) refuse(param(name), "'" + param(name) + "' must be a number");
    const double number = value->get<double>();
    const bool above = exclusive_minimum ? number > minimum : number >= minimum;
    if (!(above && number <= maximum)) {
      refuse(param(name), "'" + param(name) + "' must be in " + (exclusive_minimum ? "(" : "[") +
                              compact(minimum) + ", " + compact(maximum) + "], got " +
                              value->dump());
    }
    return number;
  }

  std::optional<int64_t> integer(const char* name, int64_t minimum, int64_t maximum) const {
    const json* value = get(name);
    if (value == nullptr) return std::nullopt;
    if (!value->is_number_integer()) {
      refuse(param(name), "'" + param(name) + "' must be an integer, got " + type_name(*value));
    }
    const bool too_large =
        value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(maximum);
    const int64_t number = too_large ? maximum : value->get<int64_t>();
    if (too_large || number < minimum || number > maximum) {
      refuse(param(name), "'" + param(name) + "' must be in [" + std::to_string(minimum) + ", " +
                              std::to_string(maximum) + "], got " + value->dump());
    }
    return number;
  }

  std::optional<bool> boolean(const char* name) const {
    const json* value = get(name);
    if (value == nullptr) return std::nullopt;
    if (!value->is_boolean()) refuse(param(name), "'" + param(name) + "' must be true or false");
    return value->get<bool>();
  }

  std::optional<std::string> string(const char* name) const {
    const json* value = get(name);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) {
      refuse(param(name), "'" + param(name) + "' must be a string, got " + type_name(*value));
    }
    return value->get<std::string>();
  }

  // A field specrun does not implement: refused unless absent or at its neutral value.
  void unsupported_unless(const char* name, bool neutral) const {
    if (get(name) != nullptr && !neutral) {
      refuse(param(name), "'" + param(name) + "' is not supported by this server");
    }
  }

 private:
  static std::string compact(double value) {
    std::string text = std::to_string(value);
    text.erase(text.find_last_not_of('0') + 1);
    if (!text.empty() && text.back() == '.') text.pop_back();
    return text;
  }
  std::string param(const char* name) const { return prefix_ + name; }

  const json& body_;
  std::string prefix_;
};

// The "speculative" extension: false turns speculation off for the request; an object overrides
// the engine's speculation settings field by field.
void apply_speculative(const json& value, SpeculationSettings& settings) {
  if (value.is_boolean()) {
    if (!value.get<bool>()) settings.method = SpeculationMethod::kNone;
    return;
  }
  if (!value.is_object()) {
    refuse("speculative", "'speculative' must be an object or a boolean");
  }
  // Every field by its row (specrun/settings.hpp); gamma last, as the command line's --gamma:
  // it moves the range that gamma_min and gamma_max set to take it.
  std::optional<int64_t> gamma;
  const std::span<const Setting<SpeculationSettings>> rows = speculation_settings();
  const Fields fields(value, "speculative.");
  for (const auto& [key, unused] : value.items()) {
    if (find_setting(rows, key) == nullptr) {
      refuse("speculative." + key,
             "'speculative." + key + "' is not a known field (" + setting_keys(rows) + ")");
    }
  }
  for (const Setting<SpeculationSettings>& row : rows) {
    const json* field = fields.get(row.key);
    if (field == nullptr) continue;
    const std::string param = std::string("speculative.") + row.key;
    SettingValue setting;
    switch (row.range.kind) {
      case SettingKind::kInteger:
        if (!field->is_number_integer()) {
          refuse(param, "'" + param + "' must be an integer, got " + type_name(*field));
        }
        // An unsigned past int64 is past every range: its maximum stands in for it.
        setting =
            field->is_number_unsigned() && field->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                ? INT64_MAX
                : field->get<int64_t>();
        break;
      case SettingKind::kNumber:
        if (!field->is_number()) {
          refuse(param, "'" + param + "' must be a number, got " + type_name(*field));
        }
        setting = field->get<double>();
        break;
      case SettingKind::kChoice:
        if (!field->is_string()) {
          refuse(param, "'" + param + "' must be " + describe_range(row.range) + ", got " +
                            type_name(*field));
        }
        setting = field->get<std::string>();
        break;
    }
    if (const std::optional<std::string> problem = setting_problem(row.range, setting)) {
      refuse(param, "'" + param + "' " + *problem);
    }
    if (std::string_view(row.key) == "gamma") {
      gamma = std::get<int64_t>(setting);
    } else {
      row.set(settings, setting);
    }
  }
  if (gamma) set_gamma_moving_range(settings, *gamma);
  // Keys that disagree (gamma_min past gamma_max, ...) are the object's fault, named as such.
  try {
    validate(settings);
  } catch (const Error& error) {
    refuse("speculative", std::string("'speculative': ") + error.what());
  }
}

// A message's content as one string: a string, null, or OpenAI's list of text parts.
std::string message_content(const json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) refuse(param, "'" + param + "' must be a string or a list of parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      refuse(param, "'" + param + "[" + std::to_string(i) +
                        "]' must be a text part ({\"type\": \"text\", \"text\": ...}): this "
                        "server takes text only");
    }
    if (i > 0) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// A message's string member `key`, if it has one; refused if it is there and not a string.
std::optional<std::string> string_member(const json& message, const char* key,
                                         const std::string& param) {
  const auto found = message.find(key);
  if (found == message.end() || found->is_null()) return std::nullopt;
  if (!found->is_string()) {
    refuse(param + "." + key,
           "'" + param + "." + key + "' must be a string, got " + type_name(*found));
  }
  return found->get<std::string>();
}

// An assistant message's tool_calls as vLLM gives them to the template: each call as sent, its
// function.arguments (JSON text in OpenAI's protocol) parsed into the object templates print.
json checked_tool_calls(const json& calls, const std::string& param) {
  json checked = calls;
  for (size_t j = 0; j < checked.size(); ++j) {
    const std::string at = param + "[" + std::to_string(j) + "]";
    json& call = checked[j];
    if (!call.is_object()) refuse(at, "'" + at + "' must be an object");
    if (call.contains("type") && call["type"] != "function") {
      refuse(at + ".type", "'" + at + ".type' must be \"function\"");
    }
    if (!call.contains("function") || !call["function"].is_object()) {
      refuse(at + ".function", "'" + at + ".function' must be an object with name and arguments");
    }
    json& function = call["function"];
    if (!function.contains("name") || !function["name"].is_string()) {
      refuse(at + ".function.name", "'" + at + ".function.name' must be a string");
    }
    json& arguments = function["arguments"];
    const std::string where = at + ".function.arguments";
    if (arguments.is_null() || (arguments.is_string() && arguments.get<std::string>().empty())) {
      arguments = json::object();  // no arguments
    } else if (arguments.is_string()) {
      json parsed = json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) {
        refuse(where, "'" + where + "' is not JSON: " + arguments.get<std::string>().substr(0, 64));
      }
      arguments = std::move(parsed);
    } else if (!arguments.is_object()) {
      refuse(where, "'" + where + "' must be a JSON object as text");
    }
  }
  return checked;
}

// The messages as vLLM hands them to apply_chat_template: {role, content} with content flattened
// to a string, then an assistant's tool_calls (arguments parsed), a tool's tool_call_id, any
// message's name; a message's other members are not part of the prompt.
json checked_messages(const json* messages) {
  if (messages == nullptr) refuse("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) {
    refuse("messages", "'messages' must be a non-empty list");
  }
  json checked = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& message = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) refuse(param, "'" + param + "' must be an object");
    const auto role = message.find("role");
    if (role == message.end() || !role->is_string()) {
      refuse(param + ".role", "'" + param + ".role' must be a string");
    }
    const std::string name = role->get<std::string>();
    if (name != "system" && name != "user" && name != "assistant" && name != "tool") {
      refuse(param + ".role", "'" + param +
                                  ".role' must be system, user, assistant or tool, got '" +
                                  name.substr(0, 64) + "'");
    }
    const auto function_call = message.find("function_call");
    if (function_call != message.end() && !function_call->is_null()) {
      refuse(param + ".function_call", "'" + param +
                                           ".function_call' is the deprecated form of "
                                           "'tool_calls', which this server takes instead");
    }
    const auto calls = message.find("tool_calls");
    const bool has_calls = calls != message.end() && !calls->is_null();
    if (has_calls && name != "assistant") {
      refuse(param + ".tool_calls", "'" + param + ".tool_calls' belongs to an assistant message");
    }
    if (has_calls && !calls->is_array()) {
      refuse(param + ".tool_calls", "'" + param + ".tool_calls' must be a list of tool calls");
    }
    const auto content = message.find("content");
    // Only the assistant's turn may be empty (null content); the others say something.
    if (name != "assistant" && (content == message.end() || content->is_null() ||
                                (content->is_array() && content->empty()))) {
      refuse(param + ".content", "'" + param + ".content' is required for a " + name +
                                     " message: a string or a list of text parts");
    }
    json entry = {{"role", name},
                  {"content", message_content(content == message.end() ? json() : *content, i)}};
    // An empty list is no calls, as vLLM drops it: the template takes the plain assistant path.
    if (has_calls && !calls->empty()) {
      entry["tool_calls"] = checked_tool_calls(*calls, param + ".tool_calls");
    }
    if (name == "tool") {
      if (auto id = string_member(message, "tool_call_id", param)) entry["tool_call_id"] = *id;
    }
    if (auto author = string_member(message, "name", param)) entry["name"] = *author;
    checked.push_back(std::move(entry));
  }
  return checked;
}

// tools: OpenAI's [{"type": "function", "function": {"name", "description", "parameters"}}],
// given to the template as sent; null when absent.
json checked_tools(const json* tools) {
  if (tools == nullptr) return nullptr;
  if (!tools->is_array()) refuse("tools", "'tools' must be a list of tools");
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& tool = (*tools)[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object() || tool.value("type", json()) != "function") {
      refuse(param + ".type",
             "'" + param + ".type' must be \"function\" (the only kind of tool there is)");
    }
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string() || (*function)["name"].get<std::string>().empty()) {
      refuse(param + ".function.name", "'" + param + ".function.name' must be a non-empty string");
    }
    const auto parameters = function->find("parameters");
    if (parameters != function->end() && !parameters->is_null() && !parameters->is_object()) {
      refuse(param + ".function.parameters",
             "'" + param + ".function.parameters' must be a JSON Schema object");
    }
  }
  return *tools;
}

// chat_template_kwargs: an object whose members become template variables, except the names the
// request sets through its own fields.
json checked_template_variables(const json* variables) {
  if (variables == nullptr) return nullptr;
  if (!variables->is_object()) {
    refuse("chat_template_kwargs",
           "'chat_template_kwargs' must be an object of template variables");
  }
  for (const auto& [key, unused] : variables->items()) {
    for (const char* own : {"messages", "tools", "documents", "add_generation_prompt",
                            "continue_final_message", "chat_template", "tokenize"}) {
      if (key == own) {
        refuse("chat_template_kwargs." + key,
               "'chat_template_kwargs." + key +
                   "' is not a template variable: give it as the request's own field, where "
                   "there is one");
      }
    }
  }
  return variables->empty() ? json() : *variables;
}

// The fields of a chat request that shape its prompt.
ChatPrompt read_chat_prompt(const Fields& fields) {
  ChatPrompt prompt;
  prompt.messages = checked_messages(fields.get("messages"));
  prompt.tools = checked_tools(fields.get("tools"));
  prompt.variables = checked_template_variables(fields.get("chat_template_kwargs"));
  prompt.add_generation_prompt = fields.boolean("add_generation_prompt").value_or(true);
  prompt.continue_final_message = fields.boolean("continue_final_message").value_or(false);
  // As vLLM: the generation prompt is on by default, so continuing needs it turned off.
  if (prompt.continue_final_message && prompt.add_generation_prompt) {
    refuse("continue_final_message",
           "'continue_final_message' continues the last message and 'add_generation_prompt' "
           "opens a new turn: set \"add_generation_prompt\": false with it");
  }
  return prompt;
}

void read_prompt(const json* prompt, CompletionRequest& request) {
  if (prompt == nullptr) refuse("prompt", "'prompt' is required");
  auto ids = [&](const json& list) {
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        refuse("prompt", "'prompt' token ids must be non-negative integers");
      }
      request.prompt_ids.push_back(id.get<int32_t>());
    }
  };
  if (prompt->is_string()) {
    request.prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    ids(*prompt);
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    request.prompt = (*prompt)[0].get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_array()) {
    ids((*prompt)[0]);
  } else {
    refuse("prompt",
           "'prompt' must be a string, a list of token ids, or a list of one of those (one "
           "prompt per request)");
  }
  if (request.prompt.empty() && request.prompt_ids.empty()) refuse("prompt", "'prompt' is empty");
}

// tool_choice and parallel_tool_calls of a chat request, after its tools.
void read_tool_choice(const Fields& fields, CompletionRequest& request) {
  const bool has_tools = !request.chat.tools.is_null() && !request.chat.tools.empty();
  // OpenAI's default: the model may call a tool when it has some.
  request.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
  if (const json* choice = fields.get("tool_choice")) {
    if (*choice == "none") {
      request.tool_choice = ToolChoice::kNone;
    } else if (*choice == "auto") {
      request.tool_choice = ToolChoice::kAuto;
    } else if (*choice == "required") {
      request.tool_choice = ToolChoice::kRequired;
    } else if (choice->is_object() && choice->value("type", json()) == "function") {
      const auto function = choice->find("function");
      const json* name = function != choice->end() && function->is_object() &&
                                 function->contains("name") && (*function)["name"].is_string()
                             ? &(*function)["name"]
                             : nullptr;
      if (name == nullptr) {
        refuse("tool_choice.function.name", "'tool_choice.function.name' must be a string");
      }
      request.tool_choice = ToolChoice::kFunction;
      request.tool_function = name->get<std::string>();
      bool known = false;
      for (const json& tool : has_tools ? request.chat.tools : json::array()) {
        known = known || tool["function"]["name"] == *name;
      }
      if (!known) {
        refuse("tool_choice.function.name", "'tool_choice.function.name' names '" +
                                                request.tool_function.substr(0, 64) +
                                                "', which is not one of the request's tools");
      }
    } else {
      refuse("tool_choice",
             "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
             "\"function\": {\"name\": ...}}, got " +
                 choice->dump().substr(0, 64));
    }
    if (request.tool_choice == ToolChoice::kRequired && !has_tools) {
      refuse("tool_choice", "'tool_choice' \"required\" needs 'tools' to call");
    }
    if (request.tool_choice == ToolChoice::kAuto && !has_tools) {
      refuse("tool_choice", "'tool_choice' \"auto\" needs 'tools' to choose from");
    }
  }
  request.parallel_tool_calls = fields.boolean("parallel_tool_calls").value_or(true);
}

// A sampling setting the request names as its row of the sampling table does.
void apply_sampling_row(const Fields& fields, const char* key, SamplingSettings& settings) {
  const json* field = fields.get(key);
  if (field == nullptr) return;
  const Setting<SamplingSettings>* row = find_setting(sampling_settings(), key);
  if (row == nullptr) refuse(key, std::string("'") + key + "' is not a sampling setting");
  if (!field->is_number()) {
    refuse(key, std::string("'") + key + "' must be a number, got " + type_name(*field));
  }
  const SettingValue value = field->get<double>();
  if (const std::optional<std::string> problem = setting_problem(row->range, value)) {
    refuse(key, std::string("'") + key + "' " + *problem);
  }
  row->set(settings, value);
}

// logit_bias: {"token id": bias}. The keys' form and the values' range are checked here; how many
// there are and whether the ids are in the vocabulary, at submit (the engine's Error).
std::map<int32_t, float> read_logit_bias(const json* bias) {
  std::map<int32_t, float> out;
  if (bias == nullptr) return out;
  if (!bias->is_object()) {
    refuse("logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
  }
  for (const auto& [key, value] : bias->items()) {
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      refuse("logit_bias", "'logit_bias' keys must be token ids (decimal integers), got '" +
                               key.substr(0, 64) + "'");
    }
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0)) {
      refuse("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " +
                               value.dump().substr(0, 64) + " for token " + key);
    }
    out[static_cast<int32_t>(id)] = value.get<float>();
  }
  return out;
}

// Chat: logprobs (true or false) and top_logprobs (0..20, with logprobs true). Completions:
// logprobs, the number of top tokens (0..20).
void read_logprobs(const Fields& fields, CompletionRequest& request) {
  if (request.endpoint == Endpoint::kChat) {
    const bool wanted = fields.boolean("logprobs").value_or(false);
    const std::optional<int64_t> top = fields.integer("top_logprobs", 0, kMaxTopLogprobs);
    if (top && !wanted) {
      refuse("top_logprobs", "'top_logprobs' needs \"logprobs\": true");
    }
    request.logprobs = wanted ? top.value_or(0) : -1;
  } else {
    if (fields.get("top_logprobs") != nullptr) {
      refuse("top_logprobs",
             "'top_logprobs' belongs to /v1/chat/completions: a completion's 'logprobs' is the "
             "number of top tokens");
    }
    request.logprobs = fields.integer("logprobs", 0, kMaxTopLogprobs).value_or(-1);
  }
}

// n, best_of and echo.
void read_choices(const Fields& fields, CompletionRequest& request) {
  request.n = fields.integer("n", 1, kMaxChoices).value_or(1);
  const bool completions = request.endpoint == Endpoint::kCompletions;
  for (const char* name : {"best_of", "echo"}) {
    if (!completions && fields.get(name) != nullptr) {
      refuse(name, "'" + std::string(name) + "' belongs to /v1/completions");
    }
  }
  request.best_of = fields.integer("best_of", 1, kMaxChoices).value_or(request.n);
  if (request.best_of < request.n) {
    refuse("best_of", "'best_of' (" + std::to_string(request.best_of) + ") must be at least 'n' (" +
                          std::to_string(request.n) + ")");
  }
  if (request.best_of > request.n && request.stream) {
    refuse("best_of",
           "'best_of' above 'n' cannot be streamed: the best choices are known only "
           "at the end");
  }
  request.echo = fields.boolean("echo").value_or(false);
}

// response_format, "grammar" (llama-server's GBNF) and vLLM's guided_json: at most one, compiled
// here so that a bad one is refused naming its field.
void read_constraint(const Fields& fields, CompletionRequest& request) {
  auto set = [&](const char* field, ConstraintKind kind, std::string text) {
    if (request.constraint.kind != ConstraintKind::kNone) {
      refuse(field, "'" + std::string(field) + "' and '" + request.constraint_field +
                        "' both constrain the output: give one");
    }
    request.constraint = {kind, std::move(text)};
    request.constraint_field = field;
  };
  if (const json* format = fields.get("response_format")) {
    const json* type =
        format->is_object() && format->contains("type") ? &(*format)["type"] : nullptr;
    if (type != nullptr && *type == "json_object") {
      set("response_format", ConstraintKind::kJsonObject, "");
    } else if (type != nullptr && *type == "json_schema") {
      const auto spec = format->find("json_schema");
      if (spec == format->end() || !spec->is_object() || !spec->contains("schema") ||
          !(*spec)["schema"].is_object()) {
        refuse("response_format",
               "'response_format.json_schema.schema' must be a JSON Schema object");
      }
      const json& entry = *spec;
      if (entry.contains("name") && !entry["name"].is_string()) {
        refuse("response_format", "'response_format.json_schema.name' must be a string");
      }
      if (entry.contains("strict") && !entry["strict"].is_boolean() && !entry["strict"].is_null()) {
        refuse("response_format", "'response_format.json_schema.strict' must be true or false");
      }
      // The ordered body keeps the schema's members in the client's order: the output's too.
      set("response_format", ConstraintKind::kJsonSchema, entry["schema"].dump());
    } else if (type == nullptr || *type != "text") {
      refuse("response_format",
             "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
             "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}");
    }
  }
  if (auto grammar = fields.string("grammar")) set("grammar", ConstraintKind::kGbnf, *grammar);
  if (const json* schema = fields.get("guided_json")) {
    if (schema->is_string()) {
      set("guided_json", ConstraintKind::kJsonSchema, schema->get<std::string>());
    } else if (schema->is_object()) {
      set("guided_json", ConstraintKind::kJsonSchema, schema->dump());
    } else {
      refuse("guided_json", "'guided_json' must be a JSON Schema, as an object or its text");
    }
  }
  if (request.constraint.kind != ConstraintKind::kNone &&
      (request.tool_choice == ToolChoice::kRequired ||
       request.tool_choice == ToolChoice::kFunction)) {
    refuse(request.constraint_field, "'" + request.constraint_field +
                                         "' and 'tool_choice' both constrain the output: give "
                                         "one");
  }
  try {
    check_constraint(request.constraint);
  } catch (const Error& error) {
    refuse(request.constraint_field,
           "'" + request.constraint_field + "' does not compile: " + error.what());
  }
}

json parse_body(std::string_view body) {
  // Deeper nesting than any request needs is refused while parsing, before it is built; so is a
  // key an object repeats (which of the two counts would be a guess).
  std::vector<std::set<std::string>> keys;  // each open object's keys so far
  const json::parser_callback_t bounded = [&keys](int depth, json::parse_event_t event,
                                                  json& parsed) {
    if (depth > kMaxJsonDepth) {
      refuse("", "the request body nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!keys.back().insert(key).second) {
        refuse(key.substr(0, 64),
               "the request body repeats the key '" + key.substr(0, 64) + "' in one object");
      }
    }
    return true;
  };
  json document;
  try {
    document = json::parse(body, bounded);
  } catch (const json::exception& error) {
    // A syntax error, or a number past double's range ("1e400").
    refuse("", std::string("the request body is not valid JSON: ") + error.what());
  }
  if (!document.is_object()) refuse("", "the request body must be a JSON object");
  return document;
}

}  // namespace

nlohmann::json ApiError::body() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json() : json(code)}}}};
}

CompletionRequest parse_completion_request(std::string_view body, Endpoint endpoint,
                                           const EngineConfig& defaults,
                                           const std::string& served_model) {
  const json document = parse_body(body);
  const Fields fields(document);
  CompletionRequest request;
  request.endpoint = endpoint;
  request.sampling = defaults.sampling;
  request.speculation = defaults.speculation;

  request.model = fields.string("model").value_or("");
  if (request.model.empty()) refuse("model", "'model' is required");
  if (request.model != served_model) {
    throw ApiException(ApiError{404, "invalid_request_error",
                                "the model '" + request.model.substr(0, 256) +
                                    "' does not exist; this server serves '" + served_model + "'",
                                "model", "model_not_found"});
  }
  // Each endpoint takes its own prompt field and refuses the other's, rather than ignore it.
  if (endpoint == Endpoint::kChat) {
    if (fields.get("prompt") != nullptr) {
      refuse("prompt", "'prompt' belongs to /v1/completions: a chat completion takes 'messages'");
    }
    request.chat = read_chat_prompt(fields);
    read_tool_choice(fields, request);
  } else {
    if (fields.get("messages") != nullptr) {
      refuse("messages", "'messages' belongs to /v1/chat/completions: a completion takes 'prompt'");
    }
    for (const char* chat_only :
         {"add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools",
          "tool_choice", "parallel_tool_calls"}) {
      if (fields.get(chat_only) != nullptr) {
        refuse(chat_only, "'" + std::string(chat_only) +
                              "' belongs to /v1/chat/completions: a completion's prompt is its "
                              "text as given");
      }
    }
    read_prompt(fields.get("prompt"), request);
  }
  request.add_special_tokens = fields.boolean("add_special_tokens");

  // max_completion_tokens is the newer name; either sets the limit.
  const int64_t most = std::numeric_limits<int32_t>::max();
  if (auto limit = fields.integer("max_tokens", 0, most)) request.sampling.max_tokens = *limit;
  if (auto limit = fields.integer("max_completion_tokens", 0, most)) {
    request.sampling.max_tokens = *limit;
  }
  if (auto value = fields.number("temperature", 0.0, 2.0)) {
    request.sampling.temperature = static_cast<float>(*value);
  }
  if (auto value = fields.number("top_p", 0.0, 1.0, /*exclusive_minimum=*/true)) {
    request.sampling.top_p = static_cast<float>(*value);
  }
  if (auto value = fields.integer("top_k", -1, most)) {
    request.sampling.top_k = static_cast<int32_t>(std::max<int64_t>(*value, 0));  // -1: off
  }
  if (auto value = fields.number("min_p", 0.0, 1.0)) {
    request.sampling.min_p = static_cast<float>(*value);
  }
  if (const json* seed = fields.get("seed")) {
    if (!seed->is_number_integer()) refuse("seed", "'seed' must be an integer");
    request.sampling.seed = seed->is_number_unsigned()
                                ? seed->get<uint64_t>()
                                : static_cast<uint64_t>(seed->get<int64_t>());
    request.seeded = true;
  }
  // The penalties by their rows of the sampling table: the TOML keys' names, ranges and checks.
  for (const char* key : {"frequency_penalty", "presence_penalty", "repetition_penalty"}) {
    apply_sampling_row(fields, key, request.sampling);
  }
  request.logit_bias = read_logit_bias(fields.get("logit_bias"));
  if (const json* stop = fields.get("stop")) {
    if (stop->is_string()) {
      request.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && stop->size() <= kMaxStopStrings) {
      for (const json& entry : *stop) {
        if (!entry.is_string()) refuse("stop", "'stop' must be a string or a list of strings");
        request.stop.push_back(entry.get<std::string>());
      }
    } else {
      refuse("stop", "'stop' must be a string or a list of at most " +
                         std::to_string(kMaxStopStrings) + " strings");
    }
    for (const std::string& entry : request.stop) {
      if (entry.empty() || entry.size() > kMaxStopLength) {
        refuse("stop",
               "each stop string must have 1 to " + std::to_string(kMaxStopLength) + " bytes");
      }
    }
  }
  // vLLM's: generate past the model's end-of-sequence tokens (to max_tokens).
  if (auto ignore = fields.boolean("ignore_eos")) request.sampling.stop_at_eos = !*ignore;
  request.stream = fields.boolean("stream").value_or(false);
  read_logprobs(fields, request);
  read_choices(fields, request);
  if (const json* options = fields.get("stream_options")) {
    if (!options->is_object()) refuse("stream_options", "'stream_options' must be an object");
    if (!request.stream) {
      refuse("stream_options", "'stream_options' is only allowed with \"stream\": true");
    }
    request.include_usage = Fields(*options).boolean("include_usage").value_or(false);
  }
  fields.string("user");  // accepted and ignored, but it must be a string
  if (const json* speculative = fields.get("speculative")) {
    apply_speculative(*speculative, request.speculation);
  }

  // What would change the output in ways specrun does not implement is refused, not ignored.
  auto zero = [&](const char* name) {
    const json* value = fields.get(name);
    return value == nullptr || (value->is_number() && value->get<double>() == 0.0);
  };
  auto equals = [&](const char* name, const json& neutral) {
    const json* value = fields.get(name);
    return value == nullptr || *value == neutral;
  };
  auto empty = [&](const char* name) {
    const json* value = fields.get(name);
    return value == nullptr || (value->is_structured() && value->empty());
  };
  fields.unsupported_unless("suffix", equals("suffix", ""));
  fields.unsupported_unless("functions", empty("functions"));
  fields.unsupported_unless("function_call", equals("function_call", "none"));
  // vLLM's extensions that change the output, refused unless neutral: a client moving from vLLM
  // learns here rather than from different text.
  fields.unsupported_unless("min_tokens", zero("min_tokens"));
  fields.unsupported_unless("stop_token_ids", empty("stop_token_ids"));
  fields.unsupported_unless("include_stop_str_in_output",
                            equals("include_stop_str_in_output", false));
  fields.unsupported_unless("skip_special_tokens", equals("skip_special_tokens", true));
  fields.unsupported_unless("spaces_between_special_tokens",
                            equals("spaces_between_special_tokens", true));
  fields.unsupported_unless("truncate_prompt_tokens", false);
  fields.unsupported_unless("allowed_token_ids", false);
  fields.unsupported_unless("bad_words", empty("bad_words"));
  fields.unsupported_unless("use_beam_search", equals("use_beam_search", false));
  fields.unsupported_unless("length_penalty", equals("length_penalty", 1));
  fields.unsupported_unless("prompt_logprobs", zero("prompt_logprobs"));
  fields.unsupported_unless("chat_template", false);
  fields.unsupported_unless("documents", false);
  fields.unsupported_unless("reasoning_effort", false);
  for (const char* guided :
       {"guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}) {
    fields.unsupported_unless(guided, false);
  }
  read_constraint(fields, request);
  return request;
}

ChatPrompt parse_chat_prompt(std::string_view body) {
  json document;
  try {
    document = json::parse(body);
  } catch (const json::exception& error) {
    refuse("", std::string("not valid JSON: ") + error.what());
  }
  // A bare list is the messages, with the request's defaults for the rest.
  if (document.is_array()) document = json{{"messages", std::move(document)}};
  if (!document.is_object()) {
    refuse("", "expected a JSON list of messages, or an object with \"messages\"");
  }
  std::string keys;
  for (const char* key : kChatPromptKeys) keys += (keys.empty() ? "" : ", ") + std::string(key);
  for (const auto& item : document.items()) {
    const std::string& key = item.key();
    if (std::find_if(std::begin(kChatPromptKeys), std::end(kChatPromptKeys),
                     [&](const char* known) { return key == known; }) ==
        std::end(kChatPromptKeys)) {
      refuse(key, "'" + key.substr(0, 64) + "' is not a key that shapes the prompt (" + keys + ")");
    }
  }
  return read_chat_prompt(Fields(document));
}

std::string render_chat_prompt(const ChatTemplate& chat_template, const ChatPrompt& prompt) {
  const bool has_tools = !prompt.tools.is_null() && !prompt.tools.empty();
  // Tools the model cannot call in a format read back would be a prompt promising what the
  // answer cannot deliver; a template that does not print them would drop them silently.
  if (has_tools && tool_call_format(chat_template.source()) == ToolCallFormat::kNone) {
    refuse("tools",
           "'tools' needs a chat template with a tool-call format this server reads (Hermes "
           "<tool_call> or Llama 3.1 JSON); this model's template has none");
  }
  ChatOptions options;
  options.add_generation_prompt = prompt.add_generation_prompt;
  options.continue_final_message = prompt.continue_final_message;
  if (!prompt.tools.is_null()) options.tools = prompt.tools.dump();
  if (!prompt.variables.is_null()) options.variables = prompt.variables.dump();
  try {
    return chat_template.render(prompt.messages.dump(), options);
  } catch (const Error& error) {
    refuse("messages", std::string("the chat template refused the messages: ") + error.what());
  }
}

std::optional<std::string> finish_reason(FinishReason reason, bool stopped_by_string) {
  if (stopped_by_string) return "stop";
  switch (reason) {
    case FinishReason::kEndOfSequence:
      return "stop";
    case FinishReason::kMaxTokens:
    case FinishReason::kContextLimit:
      return "length";
    case FinishReason::kCancelled:
    case FinishReason::kShutdown:
    case FinishReason::kFailed:
      return std::nullopt;
  }
  return std::nullopt;
}

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens,
                          int64_t cached_prompt_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_prompt_tokens}}}};
}

namespace {

json base(Endpoint endpoint, const ResponseHeader& header, bool chunk) {
  const char* object = endpoint == Endpoint::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", header.id},
          {"object", object},
          {"created", header.created},
          {"model", header.model},
          {"system_fingerprint", nullptr}};
}

}  // namespace

nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<ReportedToken>& tokens,
                             const TokenPieces& pieces) {
  auto bytes_of = [](const std::string& text) {
    json list = json::array();
    for (const char c : text) list.push_back(static_cast<uint8_t>(c));
    return list;
  };
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const ReportedToken& token : tokens) {
      const std::string text = pieces(token.logprob.token).bytes;
      json top = json::array();
      for (const TopLogprob& entry : token.logprob.top) {
        const std::string piece = pieces(entry.token).bytes;
        top.push_back({{"token", piece}, {"logprob", entry.logprob}, {"bytes", bytes_of(piece)}});
      }
      content.push_back({{"token", text},
                         {"logprob", token.logprob.logprob},
                         {"bytes", bytes_of(text)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json texts = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const ReportedToken& token : tokens) {
    texts.push_back(pieces(token.logprob.token).bytes);
    // An echoed prompt's first token has no log-probability (NaN): null, as OpenAI writes it.
    const bool none = std::isnan(token.logprob.logprob);
    values.push_back(none ? json() : json(token.logprob.logprob));
    json top = json::object();
    for (const TopLogprob& entry : token.logprob.top) {
      top[pieces(entry.token).bytes] = entry.logprob;
    }
    tops.push_back(none ? json() : std::move(top));
    offsets.push_back(token.offset);
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

nlohmann::json completion_response(Endpoint endpoint, const ResponseHeader& header,
                                   const std::vector<ChoiceOutput>& choices,
                                   const nlohmann::json& usage) {
  json response = base(endpoint, header, false);
  json list = json::array();
  for (size_t index = 0; index < choices.size(); ++index) {
    const ChoiceOutput& output = choices[index];
    json choice = {
        {"index", index}, {"logprobs", output.logprobs}, {"finish_reason", output.finish}};
    if (endpoint == Endpoint::kChat) {
      const bool content = output.calls.empty() || !output.text.empty();
      choice["message"] = {{"role", "assistant"},
                           {"content", content ? json(output.text) : json()}};
      if (!output.calls.empty()) {
        json calls = json::array();
        for (const IdentifiedCall& call : output.calls) {
          calls.push_back(
              {{"id", call.id},
               {"type", "function"},
               {"function", {{"name", call.call.name}, {"arguments", call.call.arguments}}}});
        }
        choice["message"]["tool_calls"] = std::move(calls);
      }
    } else {
      choice["text"] = output.text;
    }
    list.push_back(std::move(choice));
  }
  response["choices"] = std::move(list);
  response["usage"] = usage;
  return response;
}

nlohmann::json completion_chunk(Endpoint endpoint, const ResponseHeader& header, size_t index,
                                const std::string& text, bool first,
                                const std::optional<std::string>& finish, bool include_usage,
                                const nlohmann::json& speculative, const nlohmann::json& logprobs) {
  json chunk = base(endpoint, header, true);
  json choice = {
      {"index", index}, {"logprobs", logprobs}, {"finish_reason", finish ? json(*finish) : json()}};
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && !finish)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  chunk["choices"] = json::array({choice});
  if (include_usage) chunk["usage"] = nullptr;
  if (!speculative.is_null()) chunk["speculative"] = speculative;
  return chunk;
}

std::vector<nlohmann::json> tool_call_chunks(const ResponseHeader& header, size_t index,
                                             const IdentifiedCall& call, size_t call_index,
                                             bool first, bool include_usage) {
  std::vector<nlohmann::json> chunks;
  const json deltas[] = {
      {{"index", call_index},
       {"id", call.id},
       {"type", "function"},
       {"function", {{"name", call.call.name}, {"arguments", ""}}}},
      {{"index", call_index}, {"function", {{"arguments", call.call.arguments}}}}};
  for (const json& entry : deltas) {
    json chunk = base(Endpoint::kChat, header, true);
    json delta = json::object();
    if (first && chunks.empty()) delta["role"] = "assistant";
    delta["tool_calls"] = json::array({entry});
    chunk["choices"] = json::array(
        {{{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
    if (include_usage) chunk["usage"] = nullptr;
    chunks.push_back(std::move(chunk));
  }
  return chunks;
}

nlohmann::json usage_chunk(Endpoint endpoint, const ResponseHeader& header,
                           const nlohmann::json& usage) {
  json chunk = base(endpoint, header, true);
  chunk["choices"] = json::array();
  chunk["usage"] = usage;
  return chunk;
}

nlohmann::json speculative_json(const RequestStats& stats) {
  return {{"drafted", stats.drafted},
          {"accepted", stats.accepted},
          {"acceptance_rate", stats.acceptance_rate},
          {"steps", stats.steps},
          {"looked_up", stats.looked_up},
          {"looked_up_accepted", stats.looked_up_accepted},
          {"alternates", stats.alternates},
          {"alternates_accepted", stats.alternates_accepted}};
}

nlohmann::json chunk_speculative_json(const ChunkSpeculation& counts,
                                      const nlohmann::json& pieces) {
  return {{"tokens", counts.tokens},
          {"drafted", counts.drafted},
          {"accepted_drafts", counts.accepted_drafts},
          {"pieces", pieces}};
}

void TextOrigins::fed(std::string_view text, size_t accepted) {
  accepted = std::min(accepted, text.size());
  for (const auto& [length, from_draft] :
       {std::pair(accepted, true), std::pair(text.size() - accepted, false)}) {
    if (length == 0) continue;
    if (!runs_.empty() && runs_.back().second == from_draft) {
      runs_.back().first += length;
    } else {
      runs_.emplace_back(length, from_draft);
    }
  }
}

nlohmann::json TextOrigins::released(std::string_view text) {
  json pieces = json::array();
  size_t at = 0;
  while (at < text.size() && !runs_.empty()) {
    auto& [length, from_draft] = runs_.front();
    const size_t taken = std::min(length, text.size() - at);
    pieces.push_back({{"text", text.substr(at, taken)}, {"accepted_draft", from_draft}});
    at += taken;
    length -= taken;
    if (length == 0) runs_.pop_front();
  }
  // The matcher never releases more than it was fed; were it to, the rest would count as the
  // target's rather than vanish.
  if (at < text.size()) pieces.push_back({{"text", text.substr(at)}, {"accepted_draft", false}});
  return pieces;
}

void TokenAligner::fed(std::string_view text, const std::vector<TokenLogprob>& tokens,
                       const std::vector<size_t>& lengths) {
  fed_ += text.size();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t length = i < lengths.size() ? lengths[i] : 0;
    Placed placed{tokens[i], placed_, placed_ + length, offset_};
    // The event's text ends with the last token's bytes (and those of characters its
    // predecessors began); a token that ends inside a character runs on into the next event's.
    if (i + 1 == tokens.size()) placed.end = std::max(placed.end, fed_);
    placed_ = placed.end;
    offset_ += length;
    pending_.push_back(std::move(placed));
  }
}

std::vector<ReportedToken> TokenAligner::released(size_t bytes) {
  released_ += bytes;
  std::vector<ReportedToken> out;
  while (!pending_.empty() && pending_.front().end <= released_) {
    out.push_back({std::move(pending_.front().logprob), pending_.front().offset});
    pending_.pop_front();
  }
  return out;
}

std::vector<ReportedToken> TokenAligner::rest() {
  std::vector<ReportedToken> out;
  for (Placed& placed : pending_) out.push_back({std::move(placed.logprob), placed.offset});
  pending_.clear();
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopMatcher::feed(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that begins some stop string: the next text may complete it.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t length = std::min(stop.size() - 1, held_.size()); length > keep; --length) {
      if (held_.compare(held_.size() - length, length, stop, 0, length) == 0) {
        keep = length;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? "" : out;
}

}  // namespace specrun::server
