// An owning handle to backend memory.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "kernels/backend.h"

namespace specrun {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws Error naming `what` when the backend cannot allocate.
  DeviceBuffer(kernels::Backend& backend, size_t bytes, const std::string& what);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = std::exchange(other.backend_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  // Makes the buffer hold at least `bytes` on `backend`, reallocating (contents not kept) only when
  // it holds fewer: scratch reused from call to call. Throws Error naming `what`, as the
  // constructor does.
  void reserve(kernels::Backend& backend, size_t bytes, const std::string& what) {
    if (size_ < bytes) *this = DeviceBuffer(backend, bytes, what);
  }

 private:
  void reset() noexcept {
    if (data_ != nullptr) backend_->deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }

  kernels::Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace specrun
