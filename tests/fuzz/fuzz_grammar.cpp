// Fuzzes the grammar engine (runtime/grammar), whose input is a request's: a GBNF grammar or a
// JSON Schema (a `response_format`, a tool's parameters). The first byte picks which; the text runs
// to a NUL byte, and the bytes after it drive a matcher over a small vocabulary (every byte alone,
// a few multi-byte tokens and an end-of-sequence id): each picks a token among those its mask
// allows, or rolls back. Compiling may refuse the text with specrun::Error (and the automaton its
// size past the matcher's bound); every mask must allow only tokens the matcher then accepts.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/matcher.h"
#include "specrun/error.hpp"
#include "tests/fuzz/fuzz_support.h"

namespace {

std::shared_ptr<const specrun::grammar::TokenVocabulary> vocabulary() {
  std::vector<std::string> tokens;
  for (int byte = 0; byte < 256; ++byte) tokens.emplace_back(1, static_cast<char>(byte));
  for (const char* piece : {"{\"", "\":", "\", \"", "true", "null", "  ", "\n  ", "\xE4\xBD\xA0"}) {
    tokens.emplace_back(piece);
  }
  tokens.emplace_back();  // the end-of-sequence id: no bytes
  const auto eos = static_cast<int32_t>(tokens.size() - 1);
  return std::make_shared<const specrun::grammar::TokenVocabulary>(std::move(tokens),
                                                                   std::vector<int32_t>{eos});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const auto tokens = vocabulary();
  const std::string_view input = specrun::fuzz::as_text(data + 1, size - 1);
  const size_t split = input.find('\0');
  const std::string_view text = input.substr(0, split);
  const std::string_view steps =
      split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  specrun::fuzz::expect_clean_refusal([&] {
    const auto grammar = (data[0] & 1) != 0 ? specrun::grammar::json_schema_grammar(text)
                                            : specrun::grammar::parse_gbnf(text, "fuzz grammar");
    specrun::grammar::Matcher matcher(grammar, tokens);
    std::vector<uint32_t> mask(tokens->mask_words());
    for (const char step : steps.substr(0, 256)) {
      const auto choice = static_cast<unsigned char>(step);
      if (choice == 0xFF) {
        if (matcher.accepted_steps() > 0) matcher.rollback(1);
        continue;
      }
      std::vector<int32_t> allowed;
      matcher.fill_mask(mask);
      for (int32_t id = 0; id < tokens->size(); ++id) {
        if ((mask[static_cast<size_t>(id / 32)] >> (id % 32)) & 1u) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      const int32_t token = allowed[choice % allowed.size()];
      if (!matcher.accept_token(token)) {
        throw std::logic_error("the mask allowed token " + std::to_string(token) +
                               ", which the matcher then refused");
      }
    }
  });
  return 0;
}
