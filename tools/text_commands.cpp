#include "tools/text_commands.h"

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/model/checkpoint.h"
#include "runtime/text/tokenizer.h"
#include "tools/cli_support.h"

namespace specrun::tools {
namespace {

// A tokenizer.json (or its folder), or the tokenizer a .gguf file's metadata holds.
std::unique_ptr<text::Tokenizer> open_tokenizer(const std::string& path) {
  if (path.ends_with(".gguf")) {
    return text::Tokenizer::from_json(read_tokenizer_document(path), path);
  }
  return text::Tokenizer::load(path);
}

}  // namespace

int run_tokenize(const std::string& tokenizer_path, bool add_special) {
  const auto tokenizer = open_tokenizer(tokenizer_path);
  std::string line;
  std::string out;
  while (std::getline(std::cin, line)) {
    const std::vector<int32_t> ids = tokenizer->encode(line, add_special);
    out.assign(1, '[');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

int run_detokenize(const std::string& tokenizer_path, bool skip_special, bool json) {
  const auto tokenizer = open_tokenizer(tokenizer_path);
  std::string line;
  size_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    std::vector<int32_t> ids;
    nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    bool good = parsed.is_array();
    for (const auto& id : parsed) {
      good = good && id.is_number_integer() && id.get<int64_t>() >= 0 &&
             id.get<int64_t>() <= INT32_MAX;
      if (good) ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    if (!good) {
      throw Error("stdin line " + std::to_string(number) +
                  ": expected a JSON array of token ids, e.g. [9906,1917]");
    }
    std::string text = tokenizer->decode(ids, skip_special);
    if (json) text = nlohmann::json(text).dump();
    text += '\n';
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

TextCommands::TextCommands(CLI::App& app) {
  tokenize_ = app.add_subcommand(
      "tokenize", "Print the token ids of each stdin line as a JSON array, one line per line");
  tokenize_
      ->add_option("--tokenizer", tokenizer_path_,
                   "tokenizer.json or its directory, or a .gguf file")
      ->required();
  tokenize_->add_flag("--add-special", add_special_,
                      "Add the special tokens the tokenizer's template declares (BOS etc.)");
  detokenize_ = app.add_subcommand(
      "detokenize", "Print the text of each stdin line's JSON array of token ids, one line each");
  detokenize_
      ->add_option("--tokenizer", tokenizer_path_,
                   "tokenizer.json or its directory, or a .gguf file")
      ->required();
  detokenize_->add_flag("--skip-special", skip_special_, "Leave out special tokens");
  detokenize_->add_flag("--json", json_, "Print each text as a JSON string");
}

bool TextCommands::ran() const {
  return tokenize_->parsed() || detokenize_->parsed();
}

int TextCommands::run() const {
  if (tokenize_->parsed()) {
    return run_reporting_errors("specrun", "warn",
                                [&] { return run_tokenize(tokenizer_path_, add_special_); });
  }
  return run_reporting_errors(
      "specrun", "warn", [&] { return run_detokenize(tokenizer_path_, skip_special_, json_); });
}

}  // namespace specrun::tools
