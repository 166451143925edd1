#include "runtime/base/check.h"

#include <sstream>

namespace specrun::detail {

void throw_status(const Status& status, const char* what, const char* file, int line) {
  std::ostringstream message;
  message << what << ": " << status.to_string() << " (" << file << ":" << line << ")";
  throw Error(message.str());
}

}  // namespace specrun::detail
