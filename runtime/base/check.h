// The one CHECK macro family.
//
//   SPECRUN_CHECK(cond) << "what";   always on; throws specrun::Error with file, line and the
//                                     stringised condition, plus the streamed context.
//   SPECRUN_DCHECK(cond) << "what";  the same in debug builds; compiled out (never evaluated)
//                                     under NDEBUG.
//   SPECRUN_CHECK_OK(status, what);   turns a failed kernel Status into an Error that names what
//                                     was being done.
//
// Errors meant for users (a malformed file, a bad key) are thrown as specrun::Error directly with
// a message that names the file, tensor or key; CHECK is for violated internal invariants.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "kernels/core/status.h"
#include "specrun/error.hpp"

namespace specrun {

namespace detail {

// Collects the streamed context of a failed check and throws when the statement ends.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expression) {
    stream_ << "check failed: " << expression << " at " << file << ":" << line;
  }
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() noexcept(false) { throw Error(stream_.str()); }

  template <typename T>
  CheckFailure& operator<<(const T& value) {
    if (!has_context_) {
      stream_ << ": ";
      has_context_ = true;
    }
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
  bool has_context_ = false;
};

// Lets `SPECRUN_CHECK(x) << ...` be a single expression with the streamed part evaluated only
// on failure.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

[[noreturn]] void throw_status(const Status& status, const char* what, const char* file, int line);

}  // namespace detail
}  // namespace specrun

#define SPECRUN_CHECK(condition)               \
  (condition) ? (void)0                        \
              : ::specrun::detail::Voidify() & \
                    ::specrun::detail::CheckFailure(__FILE__, __LINE__, #condition)

#ifdef NDEBUG
#define SPECRUN_DCHECK(condition)       \
  true ? (void)0                        \
       : ::specrun::detail::Voidify() & \
             ::specrun::detail::CheckFailure(__FILE__, __LINE__, #condition)
#else
#define SPECRUN_DCHECK(condition) SPECRUN_CHECK(condition)
#endif

// `what` is a std::string or const char* describing the operation, e.g. "layer 3 q_proj".
#define SPECRUN_CHECK_OK(status_expression, what)                                           \
  do {                                                                                      \
    const ::specrun::Status specrun_status_ = (status_expression);                          \
    if (!specrun_status_.is_ok()) {                                                         \
      ::specrun::detail::throw_status(specrun_status_, std::string(what).c_str(), __FILE__, \
                                      __LINE__);                                            \
    }                                                                                       \
  } while (0)
