#include "tools/text_commands.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/base/check.h"
#include "runtime/model/checkpoint.h"
#include "runtime/server/openai.h"
#include "runtime/text/tokenizer.h"
#include "specrun/chat.hpp"
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

int run_template(const TemplateSource& source, const std::string& input, bool ids) {
  if (!source.target.empty() && !source.tokenizer.empty()) {
    throw Error("template: --target and --tokenizer exclude each other: give one");
  }
  if (source.target.empty() && source.tokenizer.empty() && source.chat_template.empty()) {
    throw Error("template: give --target CHECKPOINT, --tokenizer PATH or --chat-template FILE");
  }
  std::string body;
  if (input.empty() || input == "-") {
    std::ostringstream text;
    text << std::cin.rdbuf();
    body = text.str();
  } else {
    std::error_code status;
    if (!std::filesystem::is_regular_file(input, status)) {
      throw Error("template: " + input + ": no such file");
    }
    std::ifstream stream(input, std::ios::binary);
    std::ostringstream text;
    text << stream.rdbuf();
    if (!stream) throw Error("template: " + input + ": cannot read it");
    body = text.str();
  }
  const std::string origin = input.empty() || input == "-" ? "stdin" : input;
  server::ChatPrompt prompt;
  try {
    prompt = server::parse_chat_prompt(body);
  } catch (const server::ApiException& error) {
    throw Error("template: " + origin + ": " + error.what());
  }

  // The template, BOS and EOS as the server has them: from the loaded checkpoint, or from the
  // tokenizer the checkpoint's would be.
  std::unique_ptr<Engine> engine;
  std::unique_ptr<text::Tokenizer> tokenizer;
  EngineInfo info;
  if (!source.target.empty()) {
    EngineConfig config;
    config.target = source.target;
    config.speculation.method = SpeculationMethod::kNone;
    config.max_batch = 1;
    config.kv_cache_tokens = 16;  // nothing is generated
    engine = Engine::create(config);
    info = engine->info();
  } else if (!source.tokenizer.empty()) {
    std::filesystem::path path(source.tokenizer);
    if (path.filename() == "tokenizer_config.json") path = path.parent_path();
    tokenizer = text::Tokenizer::load(path);
    const std::filesystem::path folder =
        std::filesystem::is_directory(path) ? path : path.parent_path();
    info.target = source.tokenizer;
    info.chat_template = tokenizer->chat_template();
    info.chat_template_origin = (folder / "tokenizer_config.json").string();
    if (tokenizer->bos_id())
      info.bos_token = tokenizer->id_to_token(*tokenizer->bos_id()).value_or("");
    if (tokenizer->eos_id())
      info.eos_token = tokenizer->id_to_token(*tokenizer->eos_id()).value_or("");
  }
  const std::optional<ChatTemplate> chat_template = ChatTemplate::load(info, source.chat_template);
  if (!chat_template) {
    throw Error("template: " + info.target +
                " has no chat template: give one with --chat-template FILE");
  }
  std::string text;
  try {
    text = server::render_chat_prompt(*chat_template, prompt);
  } catch (const server::ApiException& error) {
    throw Error("template: " + origin + ": " + error.what());
  }
  if (!ids) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (!engine && !tokenizer) throw Error("template: --ids needs --target or --tokenizer");
  // As the server encodes a chat prompt: the template wrote the special tokens.
  const std::vector<int32_t> token_ids =
      engine ? engine->tokenize(text, false) : tokenizer->encode(text, false);
  const std::string line = nlohmann::json{{"prompt", text}, {"token_ids", token_ids}}.dump(
                               -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                           "\n";
  std::fwrite(line.data(), 1, line.size(), stdout);
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
  template_ = app.add_subcommand(
      "template",
      "Print the prompt text a chat request renders to, exactly as specrun serve renders it: "
      "the messages (a JSON list, or an object with messages, tools, add_generation_prompt, "
      "continue_final_message, chat_template_kwargs) from FILE or stdin");
  template_->add_option("file", template_input_, "The messages JSON (default, or -: stdin)");
  template_->add_option("--target", template_source_.target,
                        "A checkpoint, loaded as a run loads it: its chat template, BOS and EOS");
  template_->add_option("--tokenizer", template_source_.tokenizer,
                        "tokenizer.json, its folder or the tokenizer_config.json beside it: the "
                        "chat template, BOS and EOS of tokenizer_config.json (quicker than "
                        "--target)");
  template_->add_option("--chat-template", template_source_.chat_template,
                        "A Jinja chat template file in place of theirs, or alone");
  template_->add_flag("--ids", template_ids_,
                      "Print {\"prompt\": ..., \"token_ids\": [...]} as one JSON line (needs "
                      "--target or --tokenizer)");
}

bool TextCommands::ran() const {
  return tokenize_->parsed() || detokenize_->parsed() || template_->parsed();
}

int TextCommands::run() const {
  if (template_->parsed()) {
    return run_reporting_errors("specrun", "warn", [&] {
      return run_template(template_source_, template_input_, template_ids_);
    });
  }
  if (tokenize_->parsed()) {
    return run_reporting_errors("specrun", "warn",
                                [&] { return run_tokenize(tokenizer_path_, add_special_); });
  }
  return run_reporting_errors(
      "specrun", "warn", [&] { return run_detokenize(tokenizer_path_, skip_special_, json_); });
}

}  // namespace specrun::tools
