#include "tools/cli_support.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "runtime/base/check.h"

namespace specrun::tools {

std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    const size_t first = item.find_first_not_of(' ');
    const size_t last = item.find_last_not_of(' ');
    item = first == std::string::npos ? "" : item.substr(first, last - first + 1);
    int32_t id = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() || id < 0) {
      throw Error(flag + ": '" + item + "' is not a token id (expected e.g. 1,450,4996)");
    }
    ids.push_back(id);
    start = comma + 1;
  }
  return ids;
}

int run_reporting_errors(const char* program, const std::string& log_level,
                         const std::function<int()>& body) {
  try {
    auto logger = spdlog::stderr_color_mt(program);
    logger->set_pattern("%n: %l: %v");
    spdlog::set_default_logger(logger);
    const spdlog::level::level_enum level = spdlog::level::from_str(log_level);
    if (level == spdlog::level::off && log_level != "off") {
      throw Error("--log-level: '" + log_level + "' is not a level");
    }
    spdlog::set_level(level);
    const int status = body();
    // Output that never reached its file (a full disk, /dev/full) is a failure, not success.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      throw Error(std::string("writing the output failed: ") + std::strerror(errno));
    }
    return status;
  } catch (const std::exception& error) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", program, error.what());
    return 1;
  }
}

}  // namespace specrun::tools
