#include "runtime/base/device_buffer.h"

#include "runtime/base/check.h"

namespace specrun {

DeviceBuffer::DeviceBuffer(kernels::Backend& backend, size_t bytes, const std::string& what)
    : backend_(&backend), data_(backend.allocate(bytes)), size_(bytes) {
  if (data_ == nullptr) {
    throw Error(what + ": cannot allocate " + std::to_string(bytes) + " bytes on " +
                std::string(backend.name()));
  }
}

}  // namespace specrun
