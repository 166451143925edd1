// Chat templates: the Jinja templates real instruct models ship in tokenizer_config.json (or GGUF
// metadata), rendered by a Jinja subset so that `specrun serve` formats conversations exactly as
// Hugging Face transformers' apply_chat_template does. A template is compiled once at startup; a
// construct outside the subset is one Error then, naming the construct and its line.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace specrun::chat {

class ChatTemplate {
 public:
  // Compiles `source`; `origin` (a file name, "tokenizer_config.json of MODEL") names it in
  // errors. Throws specrun::Error for a syntax error or a construct outside the subset, naming it
  // and the line.
  static ChatTemplate compile(const std::string& source, const std::string& origin);

  // Renders with the variables of `context` (an object: messages, add_generation_prompt,
  // bos_token, eos_token, ...), whose objects keep their members' order as Python dicts do (a
  // template printing a message, or its tojson, shows it). Throws specrun::Error when the template
  // raises (raise_exception) or fails at run time (an undefined call, a type error), naming what.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  struct Program;
  explicit ChatTemplate(std::shared_ptr<const Program> program);
  std::shared_ptr<const Program> program_;
};

}  // namespace specrun::chat
