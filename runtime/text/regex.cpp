#include "runtime/text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "runtime/base/check.h"
#include "runtime/base/json.h"
#include "runtime/text/unicode.h"

namespace specrun::text {
namespace {

// Oniguruma's \w for Unicode text, as the body of a character class.
constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";

bool is_ascii_letter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// The per-thread matching state: PCRE2 code objects are shared between threads, match data and
// the JIT stack are not. A generous JIT stack keeps backtracking over long whitespace runs
// (\s+(?!\S) on a megabyte of spaces) inside the JIT.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;

  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    SPECRUN_CHECK(data != nullptr && context != nullptr && stack != nullptr)
        << "PCRE2 allocation failed";
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string translate_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char next = p[i + 1];
      ++i;
      if (next == 's') {
        out += class_depth > 0 ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (next == 'S' && class_depth == 0) {
        out += "[^\\s\\x{85}]";
      } else if (next == 'w') {
        out += class_depth > 0 ? std::string(kWordClass) : "[" + std::string(kWordClass) + "]";
      } else if (next == 'W' && class_depth == 0) {
        out += "[^" + std::string(kWordClass) + "]";
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (class_depth == 0 && p.substr(i, 4) == "(?i:") {
      size_t j = i + 4;
      int depth = 1;
      bool simple = true;
      for (; j < p.size(); ++j) {
        const char d = p[j];
        if (d == '\\' || d == '[' || d == '(') {
          simple = false;
          break;
        }
        if (d == ')' && --depth == 0) break;
      }
      if (simple && j < p.size()) {
        out += "(?:";
        for (size_t k = i + 4; k < j; ++k) {
          const char d = p[k];
          if (is_ascii_letter(d)) {
            out += '[';
            out += static_cast<char>(d | 0x20);
            out += static_cast<char>(d & ~0x20);
            out += ']';
          } else {
            out += d;
          }
        }
        out += ')';
        i = j;
        continue;
      }
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string component;  // names the regex in errors: "<file>: <JSON path>"
  std::string pattern;    // as written, for errors
};

Regex::Regex(std::string_view pattern, const std::string& component) : impl_(new Impl) {
  impl_->component = component;
  impl_->pattern = excerpt(pattern);
  const std::string translated = translate_pattern(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw Error(component + ": regex '" + std::string(pattern) +
                "' does not compile: " + reinterpret_cast<const char*>(message) + " (at offset " +
                std::to_string(error_offset) + ")");
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  pcre2_code_free(impl_->code);
}

void Regex::fail_match(int code, size_t subject_bytes) const {
  // A pattern that backtracks catastrophically on some input hits PCRE2's limits rather than
  // running for hours: that is the input's doing, so it is reported, not checked.
  const std::string where = impl_->component + ": regex '" + impl_->pattern + "' on an input of " +
                            std::to_string(subject_bytes) + " bytes: ";
  if (code == PCRE2_ERROR_MATCHLIMIT || code == PCRE2_ERROR_DEPTHLIMIT ||
      code == PCRE2_ERROR_HEAPLIMIT || code == PCRE2_ERROR_JIT_STACKLIMIT) {
    throw Error(where + "the input exceeded the regex's match limit");
  }
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof(message));
  throw Error(where + "matching failed: " + reinterpret_cast<const char*>(message));
}

void Regex::find_all(std::string_view subject,
                     std::vector<std::pair<size_t, size_t>>& matches) const {
  MatchState& state = match_state();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t search_from = 0;
  size_t last_match_end = static_cast<size_t>(-1);
  while (search_from <= subject.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, data, subject.size(), search_from, 0,
                                          state.data, state.context)
                        : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      // Out of JIT stack (or no JIT): the interpreter keeps its backtracking on the heap.
      rc = pcre2_match(impl_->code, data, subject.size(), search_from,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, state.data, state.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) fail_match(rc, subject.size());
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && end == last_match_end) {
      if (search_from >= subject.size()) return;
      search_from += utf8_length(static_cast<unsigned char>(subject[search_from]));
      continue;
    }
    matches.emplace_back(begin, end);
    search_from = end;
    last_match_end = end;
  }
}

}  // namespace specrun::text
