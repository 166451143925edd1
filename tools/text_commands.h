// The `specrun tokenize`, `specrun detokenize` and `specrun template` subcommands: token counting
// and conformance checks from outside (one input line at a time on stdin, one output line per
// input line), and the prompt text a chat request renders to.
#pragma once

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace specrun::tools {

// Reads lines from stdin (the '\n' is not part of a line; a '\r' is) and prints each line's ids
// as a JSON array, e.g. [9906,1917]. `add_special` applies the tokenizer's template (BOS etc.).
int run_tokenize(const std::string& tokenizer_path, bool add_special);

// Reads one JSON array of ids per line from stdin and prints each line's text; with `json` as a
// JSON string (one line even when the text holds newlines). A line that is not an array of ids
// is an error naming its line number.
int run_detokenize(const std::string& tokenizer_path, bool skip_special, bool json);

// Where `specrun template` finds its chat template: a checkpoint (loaded as a run loads it), a
// tokenizer (tokenizer.json or its folder, with tokenizer_config.json beside it), or a Jinja file
// (over either's template, or alone).
struct TemplateSource {
  std::string target;         // --target: a checkpoint, as a run's
  std::string tokenizer;      // --tokenizer: tokenizer.json, its folder, or tokenizer_config.json
  std::string chat_template;  // --chat-template: a Jinja file in place of their template
};

// Reads a chat request's prompt (a JSON list of messages, or an object of the keys of a chat
// request that shape the prompt) from `input` ("" or "-": stdin) and prints the prompt text the
// server renders for it, exactly; with `ids`, one JSON object {"prompt", "token_ids"} instead.
int run_template(const TemplateSource& source, const std::string& input, bool ids);

// Registers the subcommands on `app`; after parsing, ran() says whether one was given and run()
// executes it.
class TextCommands {
 public:
  explicit TextCommands(CLI::App& app);
  bool ran() const;
  int run() const;

 private:
  CLI::App* tokenize_;
  CLI::App* detokenize_;
  CLI::App* template_;
  TemplateSource template_source_;  // template's --target, --tokenizer, --chat-template
  std::string template_input_;      // template's messages file; "" or "-": stdin
  bool template_ids_ = false;       // template --ids
  std::string tokenizer_path_;      // --tokenizer: tokenizer.json or its directory
  bool add_special_ = false;        // tokenize --add-special
  bool skip_special_ = false;       // detokenize --skip-special
  bool json_ = false;               // detokenize --json
};

}  // namespace specrun::tools
