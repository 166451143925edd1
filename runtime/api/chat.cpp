#include "specrun/chat.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"

namespace specrun {

struct ChatTemplate::Compiled {
  chat::ChatTemplate program;
  std::string bos_token;  // the template's bos_token
  std::string eos_token;  // the template's eos_token
  std::string source;     // the Jinja text, for source() and continue_final_message's check
};

ChatTemplate::ChatTemplate(std::shared_ptr<const Compiled> compiled)
    : compiled_(std::move(compiled)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(const ChatTemplate&) = default;
ChatTemplate& ChatTemplate::operator=(const ChatTemplate&) = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::optional<ChatTemplate> ChatTemplate::load(const EngineInfo& info, const std::string& file) {
  const auto compiled = [&](const std::string& source, const std::string& origin) {
    return ChatTemplate(std::make_shared<const Compiled>(Compiled{
        chat::ChatTemplate::compile(source, origin), info.bos_token, info.eos_token, source}));
  };
  if (!file.empty()) {
    std::error_code status;
    if (!std::filesystem::is_regular_file(file, status)) {
      throw Error(file + ": no such chat template file");
    }
    std::ifstream stream(file, std::ios::binary);
    std::ostringstream source;
    source << stream.rdbuf();
    if (!stream) throw Error(file + ": cannot read the chat template");
    return compiled(source.str(), file);
  }
  if (info.chat_template.empty()) return std::nullopt;
  return compiled(info.chat_template, info.chat_template_origin.empty()
                                          ? "the chat template of " + info.target
                                          : info.chat_template_origin);
}

namespace {

using Json = nlohmann::ordered_json;

Json parse_part(std::string_view text, const char* what) {
  try {
    return Json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw Error(std::string("chat ") + what + ": not JSON: " + error.what());
  }
}

// What transformers appends to the text continue_final_message continues, to find where the
// template put it: the prompt ends where the marker begins.
constexpr std::string_view kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";

std::string strip(const std::string& text) {
  const char* space = " \t\n\r\f\v";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

}  // namespace

std::string ChatTemplate::render(std::string_view messages, const ChatOptions& options) const {
  Json list = parse_part(messages, "messages");
  if (!list.is_array()) throw Error("chat messages: not a JSON list of messages");
  for (const auto& message : list) {
    if (!message.is_object()) throw Error("chat messages: a message is not a JSON object");
  }
  // transformers passes tools and documents as None when there are none: defined, and false.
  Json tools;
  if (!options.tools.empty()) {
    tools = parse_part(options.tools, "tools");
    if (!tools.is_array()) throw Error("chat tools: not a JSON list of tools");
  }
  // continue_final_message as transformers does it: the last text of the last message gets a
  // marker, and the rendering ends where the marker begins (trailing space trimmed where the
  // template trimmed the marker's).
  std::string final_text;
  if (options.continue_final_message) {
    if (options.add_generation_prompt) {
      throw Error(
          "chat: continue_final_message and add_generation_prompt exclude each other: one "
          "continues the last message, the other opens a new assistant turn");
    }
    if (list.empty()) throw Error("chat: continue_final_message needs a last message");
    Json& content = list.back()["content"];
    Json* text = nullptr;
    if (content.is_string()) {
      text = &content;
    } else if (content.is_array()) {
      for (auto part = content.rbegin(); part != content.rend() && text == nullptr; ++part) {
        if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) {
          text = &(*part)["text"];
        }
      }
    }
    if (text == nullptr) {
      throw Error("chat: continue_final_message: the last message has no text to continue");
    }
    if (compiled_->source.find("content") == std::string::npos) {
      throw Error(
          "chat: continue_final_message: the chat template does not read a message's content");
    }
    final_text = text->get<std::string>();
    *text = final_text + std::string(kContinueTag);
  }
  Json context = {{"messages", std::move(list)},
                  {"tools", std::move(tools)},
                  {"documents", nullptr},
                  {"add_generation_prompt", options.add_generation_prompt},
                  {"bos_token", compiled_->bos_token},
                  {"eos_token", compiled_->eos_token}};
  if (!options.variables.empty()) {
    const Json variables = parse_part(options.variables, "template variables");
    if (!variables.is_object()) throw Error("chat template variables: not a JSON object");
    for (const auto& [name, value] : variables.items()) {
      // Those the renderer sets from its arguments are not variables a caller may replace.
      if (name == "messages" || name == "tools" || name == "documents" ||
          name == "add_generation_prompt" || name == "continue_final_message") {
        throw Error("chat template variables: '" + name +
                    "' is set by the renderer, not a variable to pass");
      }
      context[name] = value;
    }
  }
  std::string rendered = compiled_->program.render(context);
  if (options.continue_final_message) {
    const std::string tag = strip(std::string(kContinueTag));
    const size_t at = rendered.rfind(tag);
    if (at == std::string::npos || rendered.find(strip(final_text)) == std::string::npos) {
      throw Error(
          "chat: continue_final_message: the last message does not appear in the rendered "
          "prompt (the template changed it)");
    }
    const bool spaced = rendered.compare(at, kContinueTag.size(), kContinueTag) == 0;
    rendered.erase(at);
    if (!spaced) rendered.erase(rendered.find_last_not_of(" \t\n\r\f\v") + 1);
  }
  return rendered;
}

const std::string& ChatTemplate::source() const {
  return compiled_->source;
}

}  // namespace specrun
