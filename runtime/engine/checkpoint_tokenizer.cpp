#include "runtime/engine/checkpoint_tokenizer.h"

#include <nlohmann/json.hpp>

namespace specrun {

std::unique_ptr<text::Tokenizer> load_tokenizer(const CheckpointPaths& paths) {
  if (!paths.tokenizer) return nullptr;
  if (paths.format == CheckpointFormat::kGguf) {
    return text::Tokenizer::from_json(read_tokenizer_document(*paths.tokenizer),
                                      paths.tokenizer->string());
  }
  return text::Tokenizer::load(*paths.tokenizer);
}

}  // namespace specrun
