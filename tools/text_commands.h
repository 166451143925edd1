// The `specrun tokenize` and `specrun detokenize` subcommands: token counting and conformance
// checks from outside, one input line at a time on stdin, one output line per input line.
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

// Registers both subcommands on `app`; after parsing, ran() says whether one was given and run()
// executes it.
class TextCommands {
 public:
  explicit TextCommands(CLI::App& app);
  bool ran() const;
  int run() const;

 private:
  CLI::App* tokenize_;
  CLI::App* detokenize_;
  std::string tokenizer_path_;  // --tokenizer: tokenizer.json or its directory
  bool add_special_ = false;    // tokenize --add-special
  bool skip_special_ = false;   // detokenize --skip-special
  bool json_ = false;           // detokenize --json
};

}  // namespace specrun::tools
