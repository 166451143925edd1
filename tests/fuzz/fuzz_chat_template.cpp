// Fuzzes the chat template renderer (runtime/chat). The input is a template source, optionally
// followed by a NUL byte and conversation bytes: the template is compiled (a construct outside the
// subset, a syntax error or a source over the bounds is a clean refusal), then rendered with a
// fixed conversation and with one made of the conversation bytes (roles and contents cut at
// 0x01 bytes, some contents given as a list of parts, some left out). Templates run within the
// renderer's bounds on steps, output, nesting and recursion, so none may hang or exhaust memory.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/chat/chat_template.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using json = nlohmann::ordered_json;

json message(const std::string& role, json content) {
  return {{"role", role}, {"content", std::move(content)}};
}

json base_context(json messages, bool add_generation_prompt) {
  return {{"messages", std::move(messages)},
          {"add_generation_prompt", add_generation_prompt},
          {"bos_token", "<s>"},
          {"eos_token", "</s>"},
          {"tools", nullptr},
          {"documents", nullptr}};
}

json fixed_context() {
  return base_context(
      {message("system", "You are helpful."), message("user", "  Hi \xE4\xBD\xA0\xE5\xA5\xBD \n"),
       message("assistant", "<think>\nhm\n</think>\n\nHello! \xF0\x9F\x98\x80"),
       message("user", "{{ not a template }}")},
      true);
}

// Messages cut from `bytes` at 0x01: the first byte of each piece picks the role and the shape of
// the content (a string, a list of parts, or no content), the rest is the text.
json context_from(std::string_view bytes) {
  static constexpr const char* kRoles[] = {"user", "assistant", "system", "tool"};
  json messages = json::array();
  size_t start = 0;
  while (start <= bytes.size() && messages.size() < 64) {
    size_t end = bytes.find('\x01', start);
    if (end == std::string_view::npos) end = bytes.size();
    const std::string_view piece = bytes.substr(start, end - start);
    const unsigned char selector = piece.empty() ? 0 : static_cast<unsigned char>(piece[0]);
    const std::string text(piece.empty() ? piece : piece.substr(1));
    json entry = {{"role", kRoles[selector % 4]}};
    switch ((selector >> 2) % 8) {
      case 0:
        break;  // no content
      case 1:
        entry["content"] = json::array({{{"text", text}, {"type", "text"}}});
        break;
      case 2:
        entry["content"] = nullptr;
        break;
      default:
        entry["content"] = text;
    }
    if ((selector >> 5) == 7) entry["reasoning_content"] = text;
    messages.push_back(std::move(entry));
    start = end + 1;
  }
  const bool add_generation_prompt = !bytes.empty() && (bytes.back() & 1) != 0;
  return base_context(std::move(messages), add_generation_prompt);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = specrun::fuzz::as_text(data, size);
  const size_t split = input.find('\0');
  const std::string source(input.substr(0, split));
  const std::string_view conversation =
      split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  specrun::fuzz::expect_clean_refusal([&] {
    const auto compiled =
        specrun::chat::ChatTemplate::compile(source, "fuzz tokenizer_config.json");
    specrun::fuzz::expect_clean_refusal([&] { (void)compiled.render(fixed_context()); });
    specrun::fuzz::expect_clean_refusal([&] { (void)compiled.render(context_from(conversation)); });
  });
  return 0;
}
