// Status: what every kernel launcher returns. Kernels never throw; the runtime turns a failed
// status into an exception that says what was being done (runtime/base/check.h).
#pragma once

#include <string>
#include <utility>

namespace specrun {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // shapes, pointers or parameters the kernel cannot accept
  kOutOfRange,       // an index (token id, slot, position) outside its table
  kUnsupported,      // a dtype or variant this backend does not implement
  kOutOfMemory,      // an allocation failed
  kDeviceError,      // the device reported an error (CUDA error string in the message)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(StatusCode code, std::string message) {
    return Status(code, std::move(message));
  }
  static Status invalid_argument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status out_of_range(std::string message) {
    return Status(StatusCode::kOutOfRange, std::move(message));
  }
  static Status unsupported(std::string message) {
    return Status(StatusCode::kUnsupported, std::move(message));
  }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: rows must be positive"
  std::string to_string() const;

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace specrun
