// What the command-line tools share: argument parsing helpers and the top-level error handler.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace specrun::tools {

// "1,2,3" -> {1, 2, 3}; throws Error naming `flag` on anything that is not a token id.
std::vector<int32_t> parse_token_ids(const std::string& text, const std::string& flag);

// Sends logs to stderr at `log_level`, runs `body`, and turns any exception into one line on
// stderr ("<program>: error: ...") and exit code 1.
int run_reporting_errors(const char* program, const std::string& log_level,
                         const std::function<int()>& body);

}  // namespace specrun::tools
