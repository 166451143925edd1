// A progress line on stderr for long loads: "uploading weights: 42% (3.4 of 8.0 GiB)". Shown only
// when stderr is a terminal and the work is large enough to be worth watching.
#pragma once

#include <cstdint>
#include <string>

namespace specrun {

class Progress {
 public:
  // `total` bytes of work; below `threshold` bytes nothing is shown.
  Progress(std::string what, uint64_t total, uint64_t threshold = uint64_t{1} << 30);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(uint64_t bytes);

 private:
  std::string what_;
  uint64_t total_;
  uint64_t done_ = 0;
  int shown_percent_ = -1;
  bool visible_;
};

}  // namespace specrun
