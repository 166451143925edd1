// Chat templates: a conversation as the prompt text its model was trained on, rendered from the
// Jinja template the checkpoint ships (tokenizer_config.json, or a GGUF file's metadata) exactly
// as Hugging Face transformers' apply_chat_template renders it. The template writes the special
// tokens itself: tokenize its text with add_special_tokens false.
//
//   auto engine = specrun::Engine::create(config);
//   const auto chat = specrun::ChatTemplate::load(engine->info());
//   specrun::Request request;
//   request.prompt_ids = engine->tokenize(
//       chat->render(R"([{"role": "user", "content": "Hello"}])"), false);
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "specrun/specrun.hpp"

namespace specrun {

class ChatTemplate {
 public:
  // The engine's target's template, or the Jinja file `file` in its place; nullopt when the
  // target has none and no file is given. Compiled once: a syntax error or a construct outside
  // the supported subset is one Error naming it, its line and where the template came from.
  static std::optional<ChatTemplate> load(const EngineInfo& info, const std::string& file = "");

  // `messages`, a JSON list of message objects ({"role": ..., "content": ...}, their members in
  // the order given), as the prompt text: with add_generation_prompt the assistant's turn is
  // opened for the model to answer. The target's BOS and EOS texts are the template's bos_token
  // and eos_token. Throws Error for JSON that is not a list of objects, or where the template
  // refuses the conversation (raise_exception) or fails on it, naming what.
  std::string render(std::string_view messages, bool add_generation_prompt = true) const;

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&);
  ChatTemplate& operator=(const ChatTemplate&);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

 private:
  struct Compiled;
  explicit ChatTemplate(std::shared_ptr<const Compiled> compiled);
  std::shared_ptr<const Compiled> compiled_;
};

}  // namespace specrun
