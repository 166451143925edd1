// Fuzzes tokenizer.json and the text paths over it. The input is the document, optionally followed
// by a NUL byte and a text: the document is loaded (bounded JSON, every component checked), the
// text (or a fixed sample with spaces, digits, punctuation and multi-byte characters) is encoded
// with and without special tokens, and the ids, plus ids taken from the text's bytes (in range
// and out of it), are decoded whole and streamed.
#include <cstring>
#include <string>
#include <vector>

#include "runtime/base/json.h"
#include "runtime/text/tokenizer.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

constexpr std::string_view kSample =
    "Hello, world! 123 4567 \xC3\xA9t\xC3\xA9  \t\n\xE4\xBD\xA0\xE5\xA5\xBD "
    "\xF0\x9F\x98\x80 <s>don't</s>";

void decode_all_ways(const specrun::text::Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (const bool skip_special : {false, true}) {
    (void)tokenizer.decode(ids, skip_special);
    specrun::text::StreamingDecoder stream(tokenizer, skip_special);
    std::string streamed;
    for (const int32_t id : ids) streamed += stream.step(id);
    streamed += stream.flush();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = specrun::fuzz::as_text(data, size);
  const size_t split = input.find('\0');
  const std::string_view document_text = input.substr(0, split);
  const std::string_view text = split == std::string_view::npos ? kSample : input.substr(split + 1);
  specrun::fuzz::expect_clean_refusal([&] {
    const auto tokenizer = specrun::text::Tokenizer::from_json(
        specrun::parse_json(document_text, "tokenizer.json"), "tokenizer.json");
    for (const bool add_special : {false, true}) {
      decode_all_ways(*tokenizer, tokenizer->encode(text, add_special));
    }
    // Ids straight from the text's bytes: known ones, unknown ones and negative ones.
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < text.size(); i += 2) {
      int16_t raw = 0;
      std::memcpy(&raw, text.data() + i, sizeof(raw));
      ids.push_back(raw);
    }
    decode_all_ways(*tokenizer, ids);
    for (int32_t id = 0; id < std::min<int32_t>(tokenizer->vocab_size(), 512); ++id) {
      (void)tokenizer->id_to_token(id);
      (void)tokenizer->is_special(id);
    }
  });
  return 0;
}
