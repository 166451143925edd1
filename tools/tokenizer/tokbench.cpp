// specrun-tokbench: single-thread encode throughput of specrun's tokenizer on a text file, in the
// same two shapes tools/tokenizer/bench.sh times the reference in: the whole file as one string,
// and line by line. Prints one JSON object per shape.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/base/check.h"
#include "runtime/text/tokenizer.h"

namespace {

// FNV-1a over the ids, the same on the reference side: both must have produced the same ids.
uint32_t checksum(const std::vector<int32_t>& ids, uint32_t hash) {
  for (const int32_t id : ids) hash = (hash ^ static_cast<uint32_t>(id)) * 16777619u;
  return hash;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path;
  std::string input_path;
  int repeats = 3;
  CLI::App app{"specrun-tokbench: single-thread tokenizer encode throughput"};
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json")->required();
  app.add_option("--input", input_path, "UTF-8 text file to encode")->required();
  app.add_option("--repeats", repeats, "Timed runs per shape; the fastest is reported")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const auto tokenizer = specrun::text::Tokenizer::load(tokenizer_path);
    std::ifstream file(input_path, std::ios::binary);
    if (!file) throw specrun::Error(input_path + ": cannot be opened");
    std::ostringstream contents;
    contents << file.rdbuf();
    const std::string text = contents.str();
    std::vector<std::string_view> lines;
    for (size_t start = 0; start <= text.size();) {
      const size_t end = std::min(text.find('\n', start), text.size());
      lines.push_back(std::string_view(text).substr(start, end - start));
      start = end + 1;
    }
    const double megabytes = static_cast<double>(text.size()) / 1e6;
    // Warm-up, as the reference side gets: the first encode fills the word cache.
    tokenizer->encode(std::string_view(text).substr(0, 100000), false);
    double best_whole = 1e30;
    double best_lines = 1e30;
    size_t whole_tokens = 0;
    size_t line_tokens = 0;
    uint32_t whole_sum = 0;
    uint32_t line_sum = 0;
    for (int r = 0; r < std::max(1, repeats); ++r) {
      auto start = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = tokenizer->encode(text, false);
      best_whole = std::min(best_whole, seconds_since(start));
      whole_tokens = ids.size();
      whole_sum = checksum(ids, 2166136261u);
      std::vector<std::vector<int32_t>> per_line(lines.size());
      start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < lines.size(); ++i) per_line[i] = tokenizer->encode(lines[i], false);
      best_lines = std::min(best_lines, seconds_since(start));
      line_tokens = 0;
      line_sum = 2166136261u;
      for (const auto& line_ids : per_line) {
        line_tokens += line_ids.size();
        line_sum = checksum(line_ids, line_sum);
      }
    }
    const char* format =
        "{\"impl\":\"specrun\",\"shape\":\"%s\",\"mb_per_s\":%.3f,\"tokens\":%zu,"
        "\"checksum\":%u}\n";
    std::printf(format, "whole", megabytes / best_whole, whole_tokens, whole_sum);
    std::printf(format, "lines", megabytes / best_lines, line_tokens, line_sum);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "specrun-tokbench: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
