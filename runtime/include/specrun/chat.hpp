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
//
// ChatOptions carries apply_chat_template's other arguments: add_generation_prompt,
// continue_final_message, tools and extra template variables (chat_template_kwargs).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "specrun/specrun.hpp"

namespace specrun {

// How a conversation becomes prompt text beyond its messages: the arguments of transformers'
// apply_chat_template that change the rendering.
struct ChatOptions {
  // Open the assistant's turn after the messages, for the model to answer.
  bool add_generation_prompt = true;
  // End the text inside the last message, without closing it, for the model to continue it
  // (apply_chat_template's continue_final_message); excludes add_generation_prompt.
  bool continue_final_message = false;
  // A JSON list of tool definitions, the template's `tools` ("": none, which it sees as none).
  std::string tools{};
  // A JSON object whose members become extra template variables (e.g. Qwen3's
  // {"enable_thinking": false}), over bos_token and eos_token as apply_chat_template's keyword
  // arguments are; "": none.
  std::string variables{};
};

class ChatTemplate {
 public:
  // The engine's target's template, or the Jinja file `file` in its place; nullopt when the
  // target has none and no file is given. Compiled once: a syntax error or a construct outside
  // the supported subset is one Error naming it, its line and where the template came from.
  static std::optional<ChatTemplate> load(const EngineInfo& info, const std::string& file = "");

  // `messages`, a JSON list of message objects ({"role": ..., "content": ...}, their members in
  // the order given), as the prompt text, rendered with `options` as apply_chat_template renders
  // it. The target's BOS and EOS texts are the template's bos_token and eos_token. Throws Error
  // for JSON that is not a list of objects (or tools not a list, variables not an object), for
  // continue_final_message with add_generation_prompt or without a last message's text in the
  // output, or where the template refuses the conversation (raise_exception) or fails on it,
  // naming what.
  std::string render(std::string_view messages, const ChatOptions& options = {}) const;

  // The template's Jinja source, for what depends on its text (the server picks the tool-call
  // format the template teaches the model by it).
  const std::string& source() const;

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
