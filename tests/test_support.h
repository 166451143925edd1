// Helpers shared by the test suites: temporary directories, raw files, generated checkpoints,
// running the command-line tools.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "runtime/engine/batch_engine.h"
#include "runtime/model/model.h"
#include "specrun/specrun.hpp"
#include "tools/fixtures/checkpoint_generator.h"

namespace specrun::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_file(const std::filesystem::path& path, const std::string& bytes);
std::string read_file(const std::filesystem::path& path);

// `depth` nested JSON arrays around `inner` ("[[[...1...]]]"): 100k deep is a 200 KB file, the
// input that overflows the stack of any recursive walk over the parsed value.
std::string nested_json_arrays(size_t depth, const std::string& inner = "1");

// A CPU backend over a pool of `threads` threads (0: one per core), with f32 activations.
std::unique_ptr<kernels::cpu::CpuBackend> make_cpu_backend(int threads = 0);

// One quantization a quality test measures: the weights quantized at load, on a backend.
struct QuantizedVariant {
  WeightQuantize quantize;
  kernels::cpu::CpuBackend* backend;
  const char* name;  // "fp8", "int8", "int8 (int8 activations)"
};
// FP8 and INT8 weights on `stored` (the backend the weights as stored run on), and INT8 on
// `int8_activations`, a backend quantizing activations to int8 (kernels::cpu::Activations::kInt8).
std::vector<QuantizedVariant> quantized_variants(kernels::cpu::CpuBackend& stored,
                                                 kernels::cpu::CpuBackend& int8_activations);
// The CPU backend an engine with the default settings runs on (make_backend's, activations
// "auto" resolved for this CPU): what an engine's output is compared against.
std::unique_ptr<kernels::Backend> make_engine_cpu_backend(int threads = 0);
// The layouts `backend` lays matmul weights out in, by dtype (Model::plan_memory's layout_of).
std::function<kernels::WeightLayout(DType)> layouts_of(const kernels::Backend& backend);

struct CommandResult {
  int exit_code;            // the process's exit status (-1 when it did not exit normally)
  std::string stdout_text;  // everything it wrote to stdout
  std::string stderr_text;  // everything it wrote to stderr
};

// Runs a shell command line, capturing both streams.
CommandResult run_command(const std::string& command_line);

// Paths of things the build and the repository provide.
std::filesystem::path tool_path(const std::string& name);  // build/bin/NAME
std::filesystem::path source_path(const std::string& relative);
std::filesystem::path shared_path(const std::string& relative);  // ../shared/RELATIVE
// The Python with NumPy found at configure time; empty when none.
std::string reference_python();
// The project's virtual environment's Python (tools/setup-python.sh: $SPECRUN_VENV, else .venv in
// the source tree), where the pinned reference packages are installed; empty when there is none.
std::string venv_python();
// venv_python() when it can import every module in `modules` (as Python's `import` lists them:
// "torch, transformers"), else empty. A test skips on empty: a venv whose install stopped partway
// must skip, not fail in the reference's first line.
std::string venv_python_with(const std::string& modules);

// Runs the NumPy reference (tests/reference/llama_ref.py) on one sequence and returns its logits
// [tokens, vocab] in float64, written through the file `out`. Fails the test on a script error.
std::vector<double> reference_logits(const std::filesystem::path& model_dir,
                                     std::span<const int32_t> tokens, bool interleaved_rope,
                                     const std::filesystem::path& out);

// A layer-skip pair of small untied models: `directory`/target, whose second layer changes the
// logits little, and `directory`/draft, its first layer alone, so drafts are accepted often but
// not always.
void write_layer_skip_pair(const std::filesystem::path& directory);

// A byte-level tokenizer.json for the generated models' 256-token vocabulary: <unk> 0, <s> 1
// (BOS, added by encode), </s> 2 (EOS), then one byte-fallback token per byte value for ids
// 3..255 (bytes 0x00..0xFC); bytes 0xFD..0xFF have no token. Any text encodes (as bytes), and
// random ids decode to broken UTF-8 often, which streaming must hold back or repair.
std::string byte_tokenizer_json();

// The reference the engine's plain decoding is checked against: the simplest loop over
// Model::forward and the Sampler (the n-th token drawn with output position n's numbers, as
// `verification` draws them), on a fresh sequence of the model's cache, independent of the
// engine's step. Stops at EOS (when asked), max_tokens, or a full context. The sampling's
// penalties and `logit_bias` edit each position's logits first (the CPU kernel's edits of the
// LogitProcessor's), as the engine's do.
struct ReferenceRun {
  std::vector<int32_t> tokens;                     // generated, EOS excluded
  FinishReason reason = FinishReason::kMaxTokens;  // why it stopped
  std::vector<double> logprobs;  // each token's log-softmax of its edited logits, in double
};
ReferenceRun reference_decode(Model& model, std::span<const int32_t> prompt,
                              const SamplingSettings& sampling,
                              Verification verification = SpeculationSettings{}.verification,
                              const std::map<int32_t, float>& logit_bias = {});

// The mean next-token cross-entropy (nats per token) of `tokens` under `model`: one prefill on a
// fresh sequence of its cache, every position but the last predicting the next.
double cross_entropy(Model& model, const std::vector<int32_t>& tokens);

// Greedy settings for `max_tokens` tokens that do not stop at EOS.
SamplingSettings greedy(int64_t max_tokens);

// One request through a fresh engine on these models (which nothing else may use meanwhile).
Completion decode(Model& target, Model* draft, std::vector<int32_t> prompt,
                  const SamplingSettings& sampling, const SpeculationSettings& speculation = {},
                  const BatchEngineOptions& options = {});

// Speculation settings: `method` with `controller` starting at `gamma`, within [gamma_min, 8]
// (gamma_min = gamma for the fixed controller, 0 otherwise).
SpeculationSettings speculation(SpeculationMethod method, GammaControl controller, int64_t gamma);

// Asserts that `body` throws specrun::Error with a one-line message holding every fragment.
void expect_error(const std::function<void()>& body, std::initializer_list<std::string> fragments);
void expect_error(const std::function<void()>& body, const std::vector<std::string>& fragments);

// `count` floats uniform in [-scale, scale), the same for the same seed.
std::vector<float> random_floats(size_t count, uint64_t seed, float scale = 1.0f);

// f32 values stored in `dtype`: the bytes, and the values as stored (rounded), so that a
// reference can compute with exactly what a kernel reads.
struct StoredTensor {
  std::vector<uint16_t> halves;  // F16/BF16 storage
  std::vector<float> floats;     // F32 storage, or the widened halves
  const void* data(DType dtype) const {
    return dtype == DType::kF32 ? static_cast<const void*>(floats.data())
                                : static_cast<const void*>(halves.data());
  }
  size_t bytes(DType dtype) const { return floats.size() * dtype_size(dtype); }
  // The stored bytes: a weight's or a KV cache's contents as a kernel reads them.
  std::vector<uint8_t> raw(DType dtype) const {
    const auto* first = static_cast<const uint8_t*>(data(dtype));
    return {first, first + bytes(dtype)};
  }
};
StoredTensor store(const std::vector<float>& values, DType dtype);

// A safetensors tensor copied out of its file, so that the file can be rewritten while nothing
// maps it.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};
// Every tensor of the safetensors file at `path`, in its order.
std::vector<OwnedTensor> read_tensors(const std::filesystem::path& path);
// Writes `tensors` as a safetensors file (metadata format "pt").
void write_tensors(const std::filesystem::path& path, const std::vector<OwnedTensor>& tensors);
// Rewrites the safetensors file at `path` through `edit`.
void edit_tensors(const std::filesystem::path& path,
                  const std::function<void(std::vector<OwnedTensor>&)>& edit);

// Writes `values` as bytes (a tensor's data).
template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// How the test writes a checkpoint's linear layers in FP8.
struct Fp8Layout {
  std::string label;
  std::string method;  // quant_method
  int64_t block_rows;  // 0: per channel (or per tensor when per_tensor)
  int64_t block_cols;  // block-wise: weight_block_size[1]
  bool per_tensor;     // one scale per tensor
};

// Test names and failures print a layout by its label.
void PrintTo(const Fp8Layout& layout, std::ostream* out);

// Rewrites the f32 checkpoint in `directory` with FP8 linear weights and their scales, as
// `layout` publishes them, and writes the dequantized weights (code * scale in f32) into the
// f32 checkpoint at `twin`, which must hold a copy of the original.
void write_fp8_checkpoint(const std::filesystem::path& directory, const std::filesystem::path& twin,
                          const Fp8Layout& layout);

// Forwards every op to another backend; a test backend derives from it and overrides only what
// it changes.
class ForwardingBackend : public kernels::Backend {
 public:
  explicit ForwardingBackend(kernels::Backend& inner) : inner_(inner) {}
  std::string_view name() const override { return inner_.name(); }
  bool uses_host_memory() const override { return inner_.uses_host_memory(); }
  bool runs_models_concurrently() const override { return inner_.runs_models_concurrently(); }
  kernels::WeightLayout matmul_weight_layout(DType dtype) const override {
    return inner_.matmul_weight_layout(dtype);
  }
  void* allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void deallocate(void* pointer) noexcept override { inner_.deallocate(pointer); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    return inner_.copy_to_device(dst, src, bytes);
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    return inner_.copy_to_host(dst, src, bytes);
  }
  Status copy_on_device(void* dst, const void* src, size_t bytes) override {
    return inner_.copy_on_device(dst, src, bytes);
  }
  Status synchronize() override { return inner_.synchronize(); }
  kernels::TransferCounts transfer_counts() const override { return inner_.transfer_counts(); }
  Status time_ms(const std::function<Status()>& work, double* milliseconds) override {
    return inner_.time_ms(work, milliseconds);
  }
  Status available_memory(uint64_t* bytes) override { return inner_.available_memory(bytes); }
  uint64_t scratch_bytes_bound(const std::vector<kernels::ForwardShape>& shapes) const override {
    return inner_.scratch_bytes_bound(shapes);
  }
  Status run_embedding(const kernels::EmbeddingParams& p, const int32_t* ids, const void* table,
                       float* out) override {
    return inner_.embedding(p, ids, table, out);
  }
  Status run_rmsnorm(const kernels::RmsNormParams& p, const float* x, const void* w,
                     float* out) override {
    return inner_.rmsnorm(p, x, w, out);
  }
  Status run_matmul(const kernels::MatmulParams& p, const float* x, const void* w,
                    const float* scales, const void* bias, float* out) override {
    return inner_.matmul(p, x, w, scales, bias, out);
  }
  Status run_matmul_group(const float* x, const kernels::MatmulTarget* targets,
                          size_t count) override {
    return inner_.matmul_group(x, targets, count);
  }
  Status run_rope(const kernels::RopeParams& p, const int32_t* positions, const float* inv_freq,
                  float* q, float* k) override {
    return inner_.rope(p, positions, inv_freq, q, k);
  }
  Status run_rope_kv_write(const kernels::RopeParams& rope, const kernels::KvWriteParams& cache,
                           const int32_t* positions, const float* inv_freq, const int32_t* slots,
                           float* q, float* k, const float* v, void* k_cache,
                           void* v_cache) override {
    return inner_.rope_kv_write(rope, cache, positions, inv_freq, slots, q, k, v, k_cache, v_cache);
  }
  Status run_kv_write(const kernels::KvWriteParams& p, const float* k, const float* v,
                      const int32_t* slots, void* k_cache, void* v_cache) override {
    return inner_.kv_write(p, k, v, slots, k_cache, v_cache);
  }
  Status run_attention(const kernels::AttentionParams& p, const float* q, const void* k_cache,
                       const void* v_cache, const int32_t* query_start, const int32_t* context,
                       const int32_t* tables, const int32_t* key_gaps, float* out) override {
    return inner_.attention(p, q, k_cache, v_cache, query_start, context, tables, key_gaps, out);
  }
  bool attends_with_key_gaps() const override { return inner_.attends_with_key_gaps(); }
  Status run_gated_activation(const kernels::GatedActivationParams& p, const float* gate,
                              const float* up, float* out) override {
    return inner_.gated_activation(p, gate, up, out);
  }
  Status run_fill_uniform(const kernels::FillParams& p, void* out) override {
    return inner_.fill_uniform(p, out);
  }
  Status run_add(int64_t count, const float* addend, float* accumulator) override {
    return inner_.add(count, addend, accumulator);
  }
  Status run_gather(const kernels::GatherParams& p, const int32_t* source, const int32_t* index,
                    int32_t* out) override {
    return inner_.gather(p, source, index, out);
  }
  Status run_gather_rows(const kernels::RowGatherParams& p, const float* source,
                         const int32_t* index, const int32_t* columns, float* out) override {
    return inner_.gather_rows(p, source, index, columns, out);
  }
  Status run_add_rmsnorm(const kernels::RmsNormParams& p, const float* addend, float* accumulator,
                         const void* weight, float* out) override {
    return inner_.add_rmsnorm(p, addend, accumulator, weight, out);
  }
  Status run_process_logits(const kernels::LogitsParams& p, const float* logits,
                            const kernels::LogitsSettings* settings, float* probs,
                            int32_t* row_status) override {
    return inner_.process_logits(p, logits, settings, probs, row_status);
  }
  Status run_argmax(const kernels::LogitsParams& p, const float* values, int32_t* out) override {
    return inner_.argmax(p, values, out);
  }
  Status run_edit_logits(const kernels::LogitEditParams& p, const int64_t* edit_begin,
                         const kernels::LogitEdit* edits, const uint32_t* masks,
                         float* logits) override {
    return inner_.edit_logits(p, edit_begin, edits, masks, logits);
  }
  Status run_token_logprobs(const kernels::LogprobParams& p, const float* logits,
                            const int32_t* token_slots, const int32_t* tokens, float* chosen,
                            int32_t* top_tokens, float* top_logprobs) override {
    return inner_.token_logprobs(p, logits, token_slots, tokens, chosen, top_tokens, top_logprobs);
  }
  // The inner backend's stream: a test backend's overrides do not reach it.
  std::unique_ptr<kernels::Backend> create_stream() override { return inner_.create_stream(); }
  std::unique_ptr<kernels::Event> create_event() override { return inner_.create_event(); }
  Status record(kernels::Event& event) override { return inner_.record(event); }
  Status wait(const kernels::Event& event) override { return inner_.wait(event); }
  Status run_sample(const kernels::SampleParams& p, const kernels::SampleRow* rows,
                    const float* logits, const int32_t* tokens, float* q, kernels::SampledRow* out,
                    int32_t* drawn) override {
    return inner_.sample(p, rows, logits, tokens, q, out, drawn);
  }
  Status run_verify(const kernels::VerifyParams& p, const kernels::VerifyRow* rows,
                    const float* probs, const int32_t* p_status, const float* q,
                    const int32_t* drafts, const int32_t* alternates, const int64_t* alternate_rows,
                    int32_t* tokens, int32_t* accepted, int32_t* alternate_taken) override {
    return inner_.verify(p, rows, probs, p_status, q, drafts, alternates, alternate_rows, tokens,
                         accepted, alternate_taken);
  }

 private:
  kernels::Backend& inner_;
};

// Holds the CPU backend a test backend forwards to; a base listed before ForwardingBackend, so
// that the CPU backend is constructed first.
struct OwnsCpuBackend {
  explicit OwnsCpuBackend(std::shared_ptr<kernels::cpu::ThreadPool> pool) : cpu(std::move(pool)) {}
  kernels::cpu::CpuBackend cpu;
};

// The CPU backend posing as a device: memory it hands out must be written through
// copy_to_device, as on a GPU, so the model uploads (and converts) its weights. It reads weights
// as a device does by default (kRows, matmuls one by one), not in the CPU's packed layouts.
class DeviceLikeBackend final : private OwnsCpuBackend, public ForwardingBackend {
 public:
  explicit DeviceLikeBackend(std::shared_ptr<kernels::cpu::ThreadPool> pool)
      : OwnsCpuBackend(std::move(pool)), ForwardingBackend(cpu) {}
  std::string_view name() const override { return "device-like"; }
  bool uses_host_memory() const override { return false; }
  kernels::WeightLayout matmul_weight_layout(DType dtype) const override {
    return kernels::Backend::matmul_weight_layout(dtype);
  }
  Status run_matmul_group(const float* x, const kernels::MatmulTarget* targets,
                          size_t count) override {
    return kernels::Backend::run_matmul_group(x, targets, count);
  }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    uploaded += bytes;
    return ForwardingBackend::copy_to_device(dst, src, bytes);
  }
  uint64_t uploaded = 0;  // bytes through copy_to_device
};

// For a test that walks a settings table (specrun/settings.hpp) through a front end: a value of
// the row other than its default and consistent with the other defaults (one step up, or down at
// the maximum; the middle of a bounded number's range, one more than an unbounded one's default;
// another choice), and one outside its range.
template <typename Settings>
SettingValue other_setting_value(const Setting<Settings>& row, const Settings& defaults) {
  const SettingValue value = row.get(defaults);
  switch (row.range.kind) {
    case SettingKind::kInteger: {
      const int64_t integer = std::get<int64_t>(value);
      return integer < row.range.integer_maximum ? integer + 1 : integer - 1;
    }
    case SettingKind::kNumber:
      return std::isinf(row.range.number_maximum)
                 ? std::get<double>(value) + 1.0
                 : (row.range.number_minimum + row.range.number_maximum) / 2.0;
    case SettingKind::kChoice:
      for (const std::string& name : row.range.choices) {
        if (name != std::get<std::string>(value)) return name;
      }
  }
  return value;
}
template <typename Settings>
SettingValue bad_setting_value(const Setting<Settings>& row) {
  switch (row.range.kind) {
    case SettingKind::kInteger:  // past the maximum, or below the minimum where none is past it
      return row.range.integer_maximum < std::numeric_limits<int64_t>::max()
                 ? row.range.integer_maximum + 1
                 : row.range.integer_minimum - 1;
    case SettingKind::kNumber:
      return std::isinf(row.range.number_maximum) ? row.range.number_minimum - 1.0
                                                  : row.range.number_maximum + 1.0;
    case SettingKind::kChoice:
      return std::string("nonsense");
  }
  return int64_t{0};
}

}  // namespace specrun::testing
