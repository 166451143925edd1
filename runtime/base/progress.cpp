#include "runtime/base/progress.h"

#include <unistd.h>

#include <cstdio>

namespace specrun {

Progress::Progress(std::string what, uint64_t total, uint64_t threshold)
    : what_(std::move(what)),
      total_(total),
      visible_(total >= threshold && ::isatty(STDERR_FILENO)) {}

Progress::~Progress() {
  if (visible_ && shown_percent_ >= 0) std::fprintf(stderr, "\n");
}

void Progress::advance(uint64_t bytes) {
  done_ += bytes;
  if (!visible_ || total_ == 0) return;
  const int percent = static_cast<int>(100 * done_ / total_);
  if (percent == shown_percent_) return;  // one redraw per percent
  shown_percent_ = percent;
  constexpr double kGiB = double(uint64_t{1} << 30);
  std::fprintf(stderr, "\r%s: %3d%% (%.1f of %.1f GiB)", what_.c_str(), percent,
               static_cast<double>(done_) / kGiB, static_cast<double>(total_) / kGiB);
  std::fflush(stderr);
}

}  // namespace specrun
