// Unicode regular expressions for the tokenizer's Split pre-tokenizer and Replace normalizer and
// decoder, through PCRE2 (UTF and UCP, JIT-compiled). The Hugging Face library compiles these
// patterns with Oniguruma; translate_pattern() rewrites the few constructs whose meaning differs
// between the two engines so that both find the same matches.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specrun::text {

// Rewrites an Oniguruma pattern into a PCRE2 pattern with the same matches:
//   - \s and \S also cover U+0085 (Oniguruma's \s is White_Space; PCRE2's is Z + ASCII spaces);
//   - \w and \W mean letters, marks, numbers and connector punctuation, as in Oniguruma;
//   - a case-insensitive group made only of literals, like Llama 3's (?i:'s|'t|...), becomes
//     explicit [sS] classes: Oniguruma folds only ASCII case there, PCRE2 would also let
//     U+017F match s.
std::string translate_pattern(std::string_view pattern);

class Regex {
 public:
  // Compiles `pattern` (Oniguruma syntax, translated); throws Error naming `component` when it
  // does not compile.
  Regex(std::string_view pattern, const std::string& component);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match in `subject` (valid UTF-8), left to right, as byte ranges
  // [begin, end). An empty match right where the previous match ended is skipped, as Oniguruma's
  // iterator does.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& matches) const;

 private:
  // Throws Error naming the component for a failed match (PCRE2's error `code`).
  [[noreturn]] void fail_match(int code, size_t subject_bytes) const;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specrun::text
