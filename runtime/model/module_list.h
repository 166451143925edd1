// A quantization_config's list of modules (modules_to_not_convert, ignored_layers,
// compressed-tensors' ignore): the linear layers a checkpoint leaves unquantized.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/text/regex.h"

namespace specrun {

class ModuleList {
 public:
  // `entries` as config.json gives them; `origin` ("path/config.json") starts their errors.
  ModuleList(std::vector<std::string> entries, std::string origin);

  // Whether `module` ("model.layers.0.self_attn.q_proj") is listed: by its exact name, as the
  // suffix after a dot, or by a "re:" regular expression (compressed-tensors' spelling) matching
  // the whole name. A pattern is compiled once, on first use, through the tokenizer's regex
  // engine (PCRE2), whose match limit stops one that would backtrack without end: a pattern that
  // does not compile or runs away is one Error naming the entry, never a hang.
  bool contains(std::string_view module);

 private:
  const text::Regex& pattern(const std::string& entry);

  std::vector<std::string> entries_;
  std::string origin_;
  std::map<std::string, std::unique_ptr<text::Regex>> patterns_;  // "re:" entries, compiled
};

}  // namespace specrun
