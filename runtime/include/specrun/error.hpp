// specrun::Error, the one exception type specrun raises (public: part of the C++ API).
#pragma once

#include <stdexcept>
#include <string>

namespace specrun {

// Every error specrun raises. The message is one line, complete enough to act on: it names the
// file, key, value or request that is wrong.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace specrun
