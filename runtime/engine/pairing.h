// Draft and target must speak the same tokens, or acceptance collapses without any error.
#pragma once

#include "runtime/model/model.h"

namespace specrun {

// Throws Error naming what differs when the draft cannot serve the target:
// - with both tokenizer.json files: a different tokenizer model type, a token with different ids,
//   a token only one has, or different added/special tokens;
// - without them: different BOS or EOS ids, or a different vocabulary size.
// Embeddings padded beyond the tokenizer's vocabulary (vocab_size in config.json) may differ
// when both tokenizers are present and equal. One tokenizer.json without the other is an error:
// nothing could be compared.
void check_pairing(const Model& target, const Model& draft);

}  // namespace specrun
