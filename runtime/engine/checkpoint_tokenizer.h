// A checkpoint's tokenizer: where model/ (which finds the tokenizer's document in a checkpoint)
// meets text/ (which builds tokenizers), above both.
#pragma once

#include <memory>

#include "runtime/model/checkpoint.h"
#include "runtime/text/tokenizer.h"

namespace specrun {

// The checkpoint's tokenizer, one loader for both formats (tokenizer.json, or the one a .gguf
// file's metadata describes); nullptr when it has none. Throws Error naming the file.
std::unique_ptr<text::Tokenizer> load_tokenizer(const CheckpointPaths& paths);

}  // namespace specrun
