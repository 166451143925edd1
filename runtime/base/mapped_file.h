// A read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string_view>

namespace specrun {

class MappedFile {
 public:
  // Throws Error naming the file when it cannot be opened or mapped, or is not a regular file
  // (a FIFO or a device is refused rather than waited on or read).
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::byte* data() const { return data_; }
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }
  size_t size() const { return size_; }

 private:
  std::filesystem::path path_;
  std::byte* data_ = nullptr;  // null for an empty file
  size_t size_ = 0;
};

}  // namespace specrun
