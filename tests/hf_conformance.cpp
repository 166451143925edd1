#include "tests/hf_conformance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

namespace specrun::testing {

std::vector<std::string> hf_case_names() {
  std::vector<std::string> names;
  for (const char* family : {"llama_gqa", "llama_tied", "llama3_rope_scaling",
                             "mistral_sliding_window", "qwen2_qkv_bias", "qwen3_qk_norm",
                             "qwen3_tied", "gemma3_local_global", "gemma3_multimodal"}) {
    for (const char* dtype : {"bf16", "f32"}) names.push_back(std::string(family) + "_" + dtype);
  }
  return names;
}

std::span<const float> HfReference::row(const Prompt& prompt, int64_t position) const {
  return {logits.data() + (prompt.row_offset + position) * vocab_size,
          static_cast<size_t>(vocab_size)};
}

std::filesystem::path hf_reference_dir(const std::string& name, const TempDir& scratch,
                                       std::string* skip_reason) {
  std::filesystem::path directory;
  if (const char* fixture = std::getenv("SPECRUN_HF_REFERENCE_DIR")) {
    directory = fixture;
  } else {
    const std::string python = venv_python();
    if (python.empty()) {
      *skip_reason =
          "Hugging Face transformers is not installed (no .venv): tools/setup-python.sh "
          "transformers installs it";
      return {};
    }
    directory = scratch.path();
    const std::string command = "'" + python + "' '" +
                                source_path("tests/reference/hf_reference.py").string() +
                                "' cases --case " + name + " --out '" + directory.string() + "'";
    const CommandResult result = run_command(command);
    EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.stderr_text;
  }
  std::string status = read_file(directory / "status.txt");
  while (!status.empty() && status.back() == '\n') status.pop_back();
  if (status != "ok") {
    *skip_reason = status.empty() ? "no reference in " + directory.string() : status;
    return {};
  }
  return directory;
}

HfReference load_hf_reference(const std::filesystem::path& directory, const std::string& name) {
  const nlohmann::json manifest = nlohmann::json::parse(read_file(directory / (name + ".json")));
  HfReference reference;
  reference.vocab_size = manifest.at("vocab_size").get<int64_t>();
  reference.versions = "torch " + manifest.at("torch").get<std::string>() + ", transformers " +
                       manifest.at("transformers").get<std::string>();
  for (const nlohmann::json& prompt : manifest.at("prompts")) {
    reference.prompts.push_back({prompt.at("tokens").get<std::vector<int32_t>>(),
                                 prompt.at("continuation").get<std::vector<int32_t>>(),
                                 prompt.at("row_offset").get<int64_t>()});
  }
  const std::string bytes = read_file(directory / (name + ".bin"));
  reference.logits.resize(bytes.size() / sizeof(float));
  std::memcpy(reference.logits.data(), bytes.data(), reference.logits.size() * sizeof(float));
  const HfReference::Prompt& last = reference.prompts.back();
  EXPECT_EQ(
      static_cast<int64_t>(reference.logits.size()),
      (last.row_offset + static_cast<int64_t>(last.tokens.size() + last.continuation.size())) *
          reference.vocab_size)
      << name << ".bin does not hold every row";
  return reference;
}

namespace {

int64_t argmax(std::span<const float> row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

// Compares one row; returns its bound.
double compare_row(std::span<const float> got, std::span<const float> want, double tolerance,
                   const std::string& where, HfComparison* c, double* error_sum) {
  double scale = 0.0;
  for (const float value : want) scale = std::max(scale, std::abs(static_cast<double>(value)));
  const double bound = tolerance * scale;
  c->max_reference = std::max(c->max_reference, scale);
  ++c->rows;
  for (size_t v = 0; v < want.size(); ++v) {
    const double error = std::abs(static_cast<double>(got[v]) - want[v]);
    *error_sum += error;
    c->max_error = std::max(c->max_error, error);
    c->worst_ratio = std::max(c->worst_ratio, error / bound);
    if (!(error <= bound) && c->violations++ == 0) {
      std::ostringstream text;
      text.precision(9);
      text << where << " token " << v << ": specrun " << got[v] << ", transformers " << want[v]
           << ", bound " << bound;
      c->first_violation = text.str();
    }
  }
  return bound;
}

}  // namespace

HfComparison compare_with_hf(Model& model, const HfReference& reference, double tolerance) {
  HfComparison c;
  const size_t count = reference.prompts.size();
  std::vector<SequenceId> sequences;
  std::vector<SequenceInput> batch;
  for (const HfReference::Prompt& prompt : reference.prompts) {
    sequences.push_back(model.kv_cache().add_sequence());
    batch.push_back({sequences.back(), prompt.tokens, /*all_logits=*/true});
  }
  // rows[p][i]: specrun's logits after token i of prompt p's tokens + continuation.
  std::vector<std::vector<std::vector<float>>> rows(count);
  Logits logits;
  model.forward(batch, &logits);
  for (size_t p = 0; p < count; ++p) {
    for (int64_t r = logits.row_begin[p]; r < logits.row_begin[p + 1]; ++r) {
      rows[p].emplace_back(logits.row(r).begin(), logits.row(r).end());
    }
  }
  // Teacher forcing: every sequence is fed the reference's continuation, so that every row is
  // compared on the same prefix even past a near tie. Where specrun's argmax agrees at each step,
  // its own greedy continuation is the reference's token for token.
  const size_t steps = reference.prompts.front().continuation.size();
  for (size_t step = 0; step < steps; ++step) {
    batch.clear();
    for (size_t p = 0; p < count; ++p) {
      batch.push_back({sequences[p],
                       std::span<const int32_t>(reference.prompts[p].continuation).subspan(step, 1),
                       /*all_logits=*/true});
    }
    model.forward(batch, &logits);
    for (size_t p = 0; p < count; ++p) {
      rows[p].emplace_back(logits.last(static_cast<int64_t>(p)).begin(),
                           logits.last(static_cast<int64_t>(p)).end());
    }
  }
  // The model may be shared with other tests (a real model is loaded once per suite).
  for (const SequenceId sequence : sequences) model.kv_cache().remove_sequence(sequence);

  double error_sum = 0.0;
  for (size_t p = 0; p < count; ++p) {
    const HfReference::Prompt& prompt = reference.prompts[p];
    const int64_t prompt_length = static_cast<int64_t>(prompt.tokens.size());
    for (size_t i = 0; i < rows[p].size(); ++i) {
      const std::string where = "prompt " + std::to_string(p) + " position " + std::to_string(i);
      const std::span<const float> want = reference.row(prompt, static_cast<int64_t>(i));
      const double bound = compare_row(rows[p][i], want, tolerance, where, &c, &error_sum);
      // The rows from the last prompt token on chose the continuation.
      const int64_t step = static_cast<int64_t>(i) - (prompt_length - 1);
      if (step < 0 || step >= static_cast<int64_t>(prompt.continuation.size())) continue;
      ++c.greedy_steps;
      const int32_t expected = prompt.continuation[static_cast<size_t>(step)];
      const int64_t chosen = argmax(rows[p][i]);
      if (chosen == expected) {
        ++c.greedy_agreed;
        continue;
      }
      const double margin = static_cast<double>(want[static_cast<size_t>(expected)]) -
                            want[static_cast<size_t>(chosen)];
      std::ostringstream text;
      text << "prompt " << p << " step " << step << ": specrun " << chosen << ", transformers "
           << expected << ", reference margin " << margin << " (bound " << bound << ")";
      if (margin <= 2.0 * bound) {
        c.near_ties.push_back(text.str());
      } else if (c.greedy_failures++ == 0) {
        c.first_greedy_failure = text.str();
      }
    }
  }
  c.mean_error = error_sum / static_cast<double>(c.rows * reference.vocab_size);
  return c;
}

std::string describe(const std::string& name, const HfComparison& c, double tolerance) {
  std::ostringstream text;
  text.precision(3);
  text << name << ": " << c.rows << " positions, max |logit| " << c.max_reference
       << "; abs error max " << c.max_error << " mean " << c.mean_error << " (worst error/bound "
       << c.worst_ratio << ", bound " << tolerance << " x row max); greedy " << c.greedy_agreed
       << "/" << c.greedy_steps << " agree";
  for (const std::string& tie : c.near_ties) text << "; near tie at " << tie;
  return text.str();
}

}  // namespace specrun::testing
