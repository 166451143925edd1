#include "specrun/chat.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"

namespace specrun {

struct ChatTemplate::Compiled {
  chat::ChatTemplate program;
  std::string bos_token;
  std::string eos_token;
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
    return ChatTemplate(std::make_shared<const Compiled>(
        Compiled{chat::ChatTemplate::compile(source, origin), info.bos_token, info.eos_token}));
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

std::string ChatTemplate::render(std::string_view messages, bool add_generation_prompt) const {
  nlohmann::ordered_json list;
  try {
    list = nlohmann::ordered_json::parse(messages);
  } catch (const nlohmann::json::exception& error) {
    throw Error(std::string("chat messages: not JSON: ") + error.what());
  }
  if (!list.is_array()) throw Error("chat messages: not a JSON list of messages");
  for (const auto& message : list) {
    if (!message.is_object()) throw Error("chat messages: a message is not a JSON object");
  }
  const nlohmann::ordered_json context = {{"messages", std::move(list)},
                                          {"add_generation_prompt", add_generation_prompt},
                                          {"bos_token", compiled_->bos_token},
                                          {"eos_token", compiled_->eos_token}};
  return compiled_->program.render(context);
}

}  // namespace specrun
