#include "tests/test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "kernels/cpu/logit_edits.h"
#include "kernels/cpu/logprobs.h"
#include "runtime/base/check.h"
#include "runtime/engine/device.h"
#include "runtime/engine/settings.h"
#include "runtime/model/safetensors.h"
#include "runtime/sampling/logit_processor.h"
#include "runtime/sampling/rng.h"
#include "tests/host_sampling.h"

namespace specrun::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "specrun-test-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!stream) throw std::runtime_error("cannot write " + path.string());
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  std::ostringstream text;
  text << stream.rdbuf();
  return text.str();
}

std::string nested_json_arrays(size_t depth, const std::string& inner) {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

std::vector<QuantizedVariant> quantized_variants(kernels::cpu::CpuBackend& stored,
                                                 kernels::cpu::CpuBackend& int8_activations) {
  return {{WeightQuantize::kFP8, &stored, "fp8"},
          {WeightQuantize::kINT8, &stored, "int8"},
          {WeightQuantize::kINT8, &int8_activations, "int8 (int8 activations)"}};
}

std::unique_ptr<kernels::cpu::CpuBackend> make_cpu_backend(int threads) {
  return std::make_unique<kernels::cpu::CpuBackend>(
      std::make_shared<kernels::cpu::ThreadPool>(threads));
}

std::unique_ptr<kernels::Backend> make_engine_cpu_backend(int threads) {
  return make_backend("cpu", std::make_shared<kernels::cpu::ThreadPool>(threads));
}

std::function<kernels::WeightLayout(DType)> layouts_of(const kernels::Backend& backend) {
  return [&backend](DType dtype) { return backend.matmul_weight_layout(dtype); };
}

void write_layer_skip_pair(const std::filesystem::path& directory) {
  fixtures::GeneratorOptions options;
  options.shallow_layers = 1;
  options.deep_layer_scale = 0.3f;
  fixtures::write_random_checkpoint(options, directory / "target");
  fixtures::write_truncated_checkpoint(directory / "target", 1, directory / "draft");
}

std::string byte_tokenizer_json() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int byte = 0; byte + 3 < 256; ++byte) {
    char name[16];
    std::snprintf(name, sizeof(name), "<0x%02X>", byte);
    vocab += ", \"" + std::string(name) + "\": " + std::to_string(byte + 3);
  }
  return R"({"version": "1.0", "added_tokens": [)"
         R"({"id": 1, "content": "<s>", "special": true, "normalized": false},)"
         R"({"id": 2, "content": "</s>", "special": true, "normalized": false}],)"
         R"("normalizer": null, "pre_tokenizer": null,)"
         R"("post_processor": {"type": "TemplateProcessing",)"
         R"("single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},)"
         R"({"Sequence": {"id": "A", "type_id": 0}}], "pair": [],)"
         R"("special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},)"
         R"("decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},)"
         R"("model": {"type": "BPE", "vocab": {)" +
         vocab + R"(}, "merges": [], "unk_token": "<unk>", "byte_fallback": true}})";
}

CommandResult run_command(const std::string& command_line) {
  TempDir capture;
  const std::string out = (capture / "stdout").string();
  const std::string err = (capture / "stderr").string();
  // A subshell, so that a pipeline inside the command keeps its own stdin.
  const int status =
      std::system(("(" + command_line + ") >" + out + " 2>" + err + " </dev/null").c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.stdout_text = read_file(out);
  result.stderr_text = read_file(err);
  return result;
}

std::filesystem::path tool_path(const std::string& name) {
  return std::filesystem::path(SPECRUN_BIN_DIR) / name;
}

std::filesystem::path source_path(const std::string& relative) {
  return std::filesystem::path(SPECRUN_SOURCE_DIR) / relative;
}

std::filesystem::path shared_path(const std::string& relative) {
  return std::filesystem::path(SPECRUN_SHARED_DIR) / relative;
}

std::string reference_python() {
  return SPECRUN_PYTHON;
}

std::string venv_python() {
  const char* venv = std::getenv("SPECRUN_VENV");
  const std::filesystem::path python =
      (venv != nullptr && *venv != '\0' ? std::filesystem::path(venv) : source_path(".venv")) /
      "bin" / "python";
  return ::access(python.c_str(), X_OK) == 0 ? python.string() : std::string();
}

std::string venv_python_with(const std::string& modules) {
  const std::string python = venv_python();
  if (python.empty()) return python;
  const CommandResult result =
      run_command("'" + python + "' -c 'import " + modules + "' >/dev/null 2>&1");
  return result.exit_code == 0 ? python : std::string();
}

std::vector<double> reference_logits(const std::filesystem::path& model_dir,
                                     std::span<const int32_t> tokens, bool interleaved_rope,
                                     const std::filesystem::path& out) {
  std::string token_list;
  for (const int32_t token : tokens) {
    if (!token_list.empty()) token_list += ",";
    token_list += std::to_string(token);
  }
  const std::string command =
      "'" + reference_python() + "' '" + source_path("tests/reference/llama_ref.py").string() +
      "' --model '" + model_dir.string() + "' --tokens " + token_list + " --out '" + out.string() +
      "'" + (interleaved_rope ? " --rope-style interleaved" : "");
  const CommandResult result = run_command(command);
  EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.stderr_text;
  const std::string bytes = read_file(out);
  std::vector<double> values(bytes.size() / sizeof(double));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(double));
  return values;
}

ReferenceRun reference_decode(Model& model, std::span<const int32_t> prompt,
                              const SamplingSettings& sampling, Verification verification,
                              const std::map<int32_t, float>& logit_bias) {
  Sampler sampler(sampling_params(sampling, verification));
  LogitProcessor processor(sampling, prompt, logit_bias);
  std::vector<kernels::LogitEdit> edits;
  std::vector<int64_t> row_ends;
  std::vector<float> row;
  const std::vector<int32_t>& eos = model.config().eos_token_ids;
  const SequenceId sequence = model.kv_cache().add_sequence();
  ReferenceRun run;
  std::vector<int32_t> fed(prompt.begin(), prompt.end());
  Logits logits;
  while (static_cast<int64_t>(run.tokens.size()) < sampling.max_tokens) {
    if (model.kv_cache().length(sequence) + static_cast<int64_t>(fed.size()) >
        model.context_limit()) {
      run.reason = FinishReason::kContextLimit;
      break;
    }
    const SequenceInput input[] = {{sequence, fed, false}};
    model.forward(input, &logits);
    row.assign(logits.last(0).begin(), logits.last(0).end());
    edits.clear();
    processor.edits({}, 1, edits, row_ends);
    kernels::cpu::edit_logits(edits, {}, row);
    const int32_t token = sampler.sample(row);
    if (sampling.stop_at_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) {
      run.reason = FinishReason::kEndOfSequence;
      break;
    }
    run.tokens.push_back(token);
    processor.commit({&token, 1});
    run.logprobs.push_back(row[static_cast<size_t>(token)] - kernels::cpu::log_sum_exp(row));
    fed = {token};
  }
  model.kv_cache().remove_sequence(sequence);
  return run;
}

double cross_entropy(Model& model, const std::vector<int32_t>& tokens) {
  const SequenceId sequence = model.kv_cache().add_sequence();
  const SequenceInput input{sequence, tokens, /*all_logits=*/true};
  Logits logits;
  model.forward({&input, 1}, &logits);
  model.kv_cache().remove_sequence(sequence);
  double total = 0.0;
  for (size_t position = 0; position + 1 < tokens.size(); ++position) {
    const std::span<const float> row = logits.row(static_cast<int64_t>(position));
    double max_logit = row[0];
    for (const float value : row) max_logit = std::max(max_logit, double(value));
    double sum = 0.0;
    for (const float value : row) sum += std::exp(double(value) - max_logit);
    total += max_logit + std::log(sum) - row[static_cast<size_t>(tokens[position + 1])];
  }
  return total / double(tokens.size() - 1);
}

SamplingSettings greedy(int64_t max_tokens) {
  SamplingSettings sampling;
  sampling.temperature = 0.0f;
  sampling.max_tokens = max_tokens;
  sampling.stop_at_eos = false;
  return sampling;
}

Completion decode(Model& target, Model* draft, std::vector<int32_t> prompt,
                  const SamplingSettings& sampling, const SpeculationSettings& speculation,
                  const BatchEngineOptions& options) {
  BatchEngine engine(target, draft, options);
  EngineRequest request;
  request.prompt = std::move(prompt);
  request.sampling = sampling;
  request.speculation = speculation;
  return engine.run(std::move(request));
}

SpeculationSettings speculation(SpeculationMethod method, GammaControl controller, int64_t gamma) {
  SpeculationSettings settings;
  settings.method = method;
  settings.controller = controller;
  settings.gamma = gamma;
  settings.gamma_min = controller == GammaControl::kFixed ? gamma : 0;
  settings.gamma_max = std::max<int64_t>(8, gamma);
  return settings;
}

void expect_error(const std::function<void()>& body, std::initializer_list<std::string> fragments) {
  expect_error(body, std::vector<std::string>(fragments));
}

void expect_error(const std::function<void()>& body, const std::vector<std::string>& fragments) {
  try {
    body();
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
    return;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "threw a non-specrun exception: " << other.what();
    return;
  }
  ADD_FAILURE() << "no error thrown";
}

std::vector<float> random_floats(size_t count, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> values(count);
  for (float& v : values) v = scale * static_cast<float>(2.0 * rng.uniform() - 1.0);
  return values;
}

StoredTensor store(const std::vector<float>& values, DType dtype) {
  StoredTensor tensor;
  tensor.floats = values;
  if (dtype != DType::kF32) {
    for (float& v : tensor.floats) {
      const uint16_t bits = dtype == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
      tensor.halves.push_back(bits);
      v = dtype == DType::kBF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
    }
  }
  return tensor;
}

std::vector<OwnedTensor> read_tensors(const std::filesystem::path& path) {
  const TensorStore store = TensorStore::open_file(path);
  std::vector<OwnedTensor> tensors;
  for (const TensorInfo* info : store.all()) {
    const auto* begin = static_cast<const std::byte*>(info->data);
    tensors.push_back({info->name, info->dtype, info->shape,
                       std::vector<std::byte>(begin, begin + info->size_bytes())});
  }
  return tensors;
}

void write_tensors(const std::filesystem::path& path, const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorToWrite> views;
  for (const OwnedTensor& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes});
  write_safetensors(path, views, {{"format", "pt"}});
}

void edit_tensors(const std::filesystem::path& path,
                  const std::function<void(std::vector<OwnedTensor>&)>& edit) {
  std::vector<OwnedTensor> tensors = read_tensors(path);
  edit(tensors);
  write_tensors(path, tensors);
}

namespace {

std::vector<float> floats_of(const OwnedTensor& t) {
  std::vector<float> values(t.bytes.size() / sizeof(float));
  std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

bool is_linear(const std::string& name) {
  return name.size() > 12 && name.compare(name.size() - 12, 12, "_proj.weight") == 0;
}

}  // namespace

void PrintTo(const Fp8Layout& layout, std::ostream* out) {
  *out << layout.label;
}

// Rewrites the f32 checkpoint in `directory` with FP8 linear weights and their scales, as
// `layout` publishes them, and writes the dequantized weights (code * scale in f32) into the
// f32 checkpoint at `twin`, which must hold a copy of the original.
void write_fp8_checkpoint(const std::filesystem::path& directory, const std::filesystem::path& twin,
                          const Fp8Layout& layout) {
  std::vector<OwnedTensor> quantized, dequantized;
  for (OwnedTensor& tensor : read_tensors(directory / "model.safetensors")) {
    if (!is_linear(tensor.name)) {
      quantized.push_back(tensor);
      dequantized.push_back(tensor);
      continue;
    }
    ASSERT_EQ(tensor.dtype, DType::kF32);
    const std::vector<float> values = floats_of(tensor);
    const int64_t rows = tensor.shape[0], cols = tensor.shape[1];
    const int64_t block_rows = layout.per_tensor       ? rows
                               : layout.block_rows > 0 ? layout.block_rows
                                                       : 1;
    const int64_t block_cols =
        layout.per_tensor || layout.block_rows == 0 ? cols : layout.block_cols;
    const int64_t grid_rows = (rows + block_rows - 1) / block_rows;
    const int64_t grid_cols = (cols + block_cols - 1) / block_cols;
    std::vector<float> scales(static_cast<size_t>(grid_rows * grid_cols));
    for (int64_t br = 0; br < grid_rows; ++br) {
      for (int64_t bc = 0; bc < grid_cols; ++bc) {
        float largest = 0.0f;
        for (int64_t r = br * block_rows; r < std::min(rows, (br + 1) * block_rows); ++r) {
          for (int64_t c = bc * block_cols; c < std::min(cols, (bc + 1) * block_cols); ++c) {
            largest = std::max(largest, std::fabs(values[static_cast<size_t>(r * cols + c)]));
          }
        }
        scales[static_cast<size_t>(br * grid_cols + bc)] = largest / kF8E4M3Max;
      }
    }
    std::vector<uint8_t> codes(values.size());
    std::vector<float> twin_values(values.size());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const float scale =
            scales[static_cast<size_t>((r / block_rows) * grid_cols + c / block_cols)];
        codes[i] = f32_to_f8e4m3(values[i] / scale);
        twin_values[i] = f8e4m3_to_f32(codes[i]) * scale;
      }
    }
    const std::string module = tensor.name.substr(0, tensor.name.size() - 7);  // drop ".weight"
    quantized.push_back({tensor.name, DType::kF8E4M3, tensor.shape, bytes_of(codes)});
    std::vector<int64_t> scale_shape;
    if (layout.per_tensor) {
      scale_shape = {1};
    } else if (layout.block_rows == 0) {
      scale_shape = {rows, 1};
    } else {
      scale_shape = {grid_rows, grid_cols};
    }
    const std::string suffix = layout.block_rows > 0 ? ".weight_scale_inv" : ".weight_scale";
    quantized.push_back({module + suffix, DType::kF32, scale_shape, bytes_of(scales)});
    dequantized.push_back({tensor.name, DType::kF32, tensor.shape, bytes_of(twin_values)});
  }
  write_tensors(directory / "model.safetensors", quantized);
  write_tensors(twin / "model.safetensors", dequantized);

  nlohmann::json config = nlohmann::json::parse(read_file(directory / "config.json"));
  if (layout.method == "fp8") {
    config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
    if (layout.block_rows > 0) {
      config["quantization_config"]["weight_block_size"] = {layout.block_rows, layout.block_cols};
    }
  } else {
    config["quantization_config"] = {
        {"quant_method", "compressed-tensors"},
        {"format", "float-quantized"},
        {"ignore", {"lm_head"}},
        {"config_groups",
         {{"group_0",
           {{"targets", {"Linear"}},
            {"weights",
             {{"num_bits", 8},
              {"type", "float"},
              {"symmetric", true},
              {"dynamic", false},
              {"strategy", layout.per_tensor ? "tensor" : "channel"}}},
            {"input_activations",
             {{"num_bits", 8}, {"type", "float"}, {"dynamic", true}, {"strategy", "token"}}}}}}}};
  }
  write_file(directory / "config.json", config.dump(2));
}

}  // namespace specrun::testing
