#include "runtime/model/module_list.h"

#include <utility>

namespace specrun {

ModuleList::ModuleList(std::vector<std::string> entries, std::string origin)
    : entries_(std::move(entries)), origin_(std::move(origin)) {}

bool ModuleList::contains(std::string_view module) {
  for (const std::string& entry : entries_) {
    if (entry.rfind("re:", 0) == 0) {
      std::vector<std::pair<size_t, size_t>> matches;
      pattern(entry).find_all(module, matches);
      if (!matches.empty()) return true;  // anchored: a match is the whole name
      continue;
    }
    if (module == entry) return true;
    if (module.size() > entry.size() && module.ends_with(entry) &&
        module[module.size() - entry.size() - 1] == '.') {
      return true;
    }
  }
  return false;
}

const text::Regex& ModuleList::pattern(const std::string& entry) {
  auto found = patterns_.find(entry);
  if (found == patterns_.end()) {
    found = patterns_
                .emplace(entry, std::make_unique<text::Regex>(
                                    "\\A(?:" + entry.substr(3) + ")\\z",
                                    origin_ + ": quantization_config's entry '" + entry + "'"))
                .first;
  }
  return *found->second;
}

}  // namespace specrun
