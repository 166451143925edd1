// A Llama-family transformer on one backend, with its own weights, KV cache and workspace. The
// forward pass is written once against the op interface; prefill, a decode step and a
// (gamma + 1)-token verification are all the same call.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/base/device_buffer.h"
#include "runtime/kv/kv_cache.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/weights.h"

namespace specrun {

class Progress;

// Quantization at load: the linear layers' f32, f16 or bf16 weights become 8-bit codes with one
// symmetric scale per output channel (max |w| over the row maps to the code's largest value).
enum class WeightQuantize {
  kNone,  // weights as stored
  kFP8,   // FP8 E4M3 codes, scale = max |w| / 448
  kINT8,  // int8 codes in [-127, 127], scale = max |w| / 127
};

struct ModelOptions {
  int64_t kv_cache_tokens = 0;  // cache capacity in tokens; 0: the model's context, at most 8192
  int64_t kv_block_size = 16;   // tokens per KV-cache block
  DType kv_cache_dtype = DType::kBF16;  // storage of keys and values: kBF16 or kF32 (exact)
  bool prefix_cache = true;  // sealed full blocks are reused by sequences with the same prefix
  WeightQuantize quantize = WeightQuantize::kNone;  // quantize the linear layers at load
  bool quantize_output = false;  // the output projection (lm_head) too; it stays bf16 otherwise
  // Overrides the checkpoint's pairing (rotate-half for Hugging Face, interleaved for GGUF).
  std::optional<kernels::RopeStyle> rope_style;
};

// What a model will hold on its backend, worked out from its config and tensor headers alone (no
// weight is read).
struct MemoryNeeds {
  uint64_t weight_bytes = 0;  // as placed: stored bytes on the host, bf16 on a device, 8-bit
                              // codes plus f32 scales where quantized (Model::weight_bytes)
  // weight_bytes by the type they are placed in ("Q4_1", "BF16", "F32": scales and norms too).
  std::map<std::string, uint64_t> weight_bytes_by_type;
  uint64_t kv_bytes_per_token = 0;  // K and V of every layer, in the cache's dtype
  int64_t kv_tokens = 0;            // the cache's capacity, whole blocks
  uint64_t kv_bytes = 0;            // kv_bytes_per_token * kv_tokens
  uint64_t workspace_bytes = 0;     // activations of a forward filling the cache, logits rows and
                                    // the distributions processed from them
  uint64_t total_bytes() const { return weight_bytes + kv_bytes + workspace_bytes; }
  // The model's forwards at their largest (a forward filling the cache; the logits rows), for the
  // scratch its backend's ops take beyond the above (Backend::scratch_bytes_bound).
  kernels::ForwardShape forward;
};

// One sequence's part of a forward batch.
struct SequenceInput {
  SequenceId sequence;              // a sequence of this model's KV cache
  std::span<const int32_t> tokens;  // new tokens, fed at positions [length, length + n)
  bool all_logits = false;          // logits for every new token, not only the last
  // What a feature-reading draft (ModelConfig::feature_width) reads beside each new token: its
  // target's feature at the position before it (zeros before the first), [tokens, feature_width].
  // Empty for any other model.
  std::span<const float> features{};
  // A token tree (empty: a chain, each new token following the one before): the parent of each
  // new token, the index of an earlier one, or -1 where it continues the cached text. The tokens
  // take the cache positions [length, length + n) in order, but each reads only the cached text
  // and its own ancestors, at the position of its depth (length + its ancestors among the new
  // tokens). The ancestors of each must be a run of new tokens from the first, then a run ending
  // at its parent: a chain with branches forking from it (what Backend::attention's key gaps
  // express; backends without them take no tree).
  std::span<const int32_t> parents{};
  // Where the new tokens' ids lie in the backend's memory, [tokens], when the host has not read
  // them (a draft's draws, fed on without waiting for them: Backend::sample's `drawn`); `tokens`
  // then gives only their count, and the KV cache records its values until they are rewritten
  // (KvCache::rewrite_tokens) once known. Null: the ids are `tokens`.
  const int32_t* device_tokens = nullptr;
};

// Every new token's last hidden state after the final norm (the row the head scores): what a
// feature-reading draft reads of its target, and of itself as it drafts on.
struct Features {
  int64_t width = 0;          // hidden_size
  std::vector<float> values;  // [tokens, width], the call's tokens in batch order
  std::vector<int64_t>
      row_begin;  // [num_seqs + 1]: sequence s owns rows [row_begin[s], row_begin[s+1])

  // Sequence s's rows: [its new tokens, width].
  std::span<const float> of(int64_t sequence_index) const {
    const auto s = static_cast<size_t>(sequence_index);
    return {values.data() + row_begin[s] * width,
            static_cast<size_t>((row_begin[s + 1] - row_begin[s]) * width)};
  }
};

struct Logits {
  // Set by the caller: leave the rows on the model's backend, at `device`, rather than copying
  // them into `values` (nothing is copied to the host or waited for). A reduced head's rows are
  // widened to the vocabulary through the host, then uploaded, unless compact_head.
  bool keep_on_device = false;
  // Set by the caller, with keep_on_device: a reduced head's rows stay as it scores them,
  // [rows, output_token_ids], entry i standing for token output_token_ids[i] (Backend::sample
  // takes such rows with the map); device_width says which.
  bool compact_head = false;
  int64_t vocab_size = 0;         // row width of `values`
  std::vector<float> values;      // [rows, vocab_size] on the host, unless keep_on_device
  const float* device = nullptr;  // [rows, device_width] in the model's workspace with
                                  // keep_on_device, valid until its next forward
  int64_t device_width = 0;       // vocab_size, or a compact reduced head's tokens
  std::vector<int64_t>
      row_begin;  // [num_seqs + 1]: sequence s owns rows [row_begin[s], row_begin[s+1])

  int64_t rows() const {
    return vocab_size == 0 ? 0 : static_cast<int64_t>(values.size()) / vocab_size;
  }
  std::span<const float> row(int64_t index) const {
    return {values.data() + index * vocab_size, static_cast<size_t>(vocab_size)};
  }
  // The logits after sequence s's last new token.
  std::span<const float> last(int64_t sequence_index) const {
    return row(row_begin[static_cast<size_t>(sequence_index) + 1] - 1);
  }
};

class Model {
 public:
  // Opens, validates and binds the checkpoint, then places weights and allocates the KV cache.
  // Throws Error naming the file, tensor or key on any problem; no half-loaded model remains.
  static std::unique_ptr<Model> load(const std::filesystem::path& path, kernels::Backend& backend,
                                     const ModelOptions& options = {});
  Model(Checkpoint checkpoint, kernels::Backend& backend, const ModelOptions& options);
  // A model of `config`'s shape with synthetic bf16 weights (runtime/model/synthetic.h) written
  // on the backend from `seed`, or 8-bit codes and scales with options.quantize: the same seed
  // gives the same weights on every backend. `label`
  // stands for the checkpoint directory in reports. Throws Error when the backend runs out of
  // memory.
  static std::unique_ptr<Model> synthetic(const ModelConfig& config, const std::string& label,
                                          uint64_t seed, kernels::Backend& backend,
                                          const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return checkpoint_.config; }
  const CheckpointPaths& paths() const { return checkpoint_.paths; }
  kernels::Backend& backend() { return backend_; }
  KvCache& kv_cache() { return *kv_cache_; }
  // The most positions one sequence may hold: the trained context or the cache, whichever is less.
  int64_t context_limit() const;
  // Parameters, for reports.
  int64_t parameter_count() const { return parameter_count_; }
  // What `checkpoint` would take on a backend (`host_memory`: the CPU's, where weights are used
  // as stored; `layout_of`: its matmul_weight_layout, by the weight's loaded dtype) under
  // `options`, with logits for at most `max_logit_rows` rows at once.
  static MemoryNeeds plan_memory(const Checkpoint& checkpoint, const ModelOptions& options,
                                 bool host_memory,
                                 const std::function<kernels::WeightLayout(DType)>& layout_of,
                                 int64_t max_logit_rows);
  // Bytes of weights one forward reads (each bound tensor once, a tied table once): a decode
  // step's floor is this over the memory bandwidth.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Bytes of weights one decode step reads: every weight once, but of an untied embedding table
  // only the row of the token it embeds. A decode step's floor is this over the memory bandwidth.
  uint64_t decode_read_bytes() const { return decode_read_bytes_; }

  // Appends each sequence's tokens to the KV cache and computes logits (on the host, or left on
  // the backend with logits->keep_on_device), and with `features` each
  // new token's final hidden state. Batch-invariant: a sequence's logits are bitwise the same
  // whatever else shares the call. On error (unknown sequence, bad token id, features missing or
  // of the wrong size, KV cache full) throws, leaving every sequence's cache as it was.
  void forward(std::span<const SequenceInput> batch, Logits* logits, Features* features = nullptr);

 private:
  struct Workspace;
  Model(Checkpoint checkpoint, kernels::Backend& backend, const ModelOptions& options,
        std::optional<uint64_t> synthetic_seed);
  void place_weights();
  // The dtype the linear layers are quantized to at load: none without --quantize, or when the
  // checkpoint is already quantized.
  std::optional<DType> quantize_target() const;
  void quantize_weights();
  // Quantizes `view` per output channel to quantize_target() into the backend's memory (straight
  // into it on the host, through bounded host buffers for a device; `progress`, if any, advances
  // by the source bytes) and points the view at the codes and scales.
  void quantize_onto_backend(WeightView& view, Progress* progress);
  void place_scales();
  // Lays the matmul weights (and a table a tied head shares) out as the backend's matmul reads
  // them fastest (Backend::matmul_weight_layout): copies in its memory, made once at load.
  // Gemma: each norm gain w replaced by 1 + w, in f32 (offset_gains_).
  void offset_norm_gains();
  void lay_out_weights();
  void write_synthetic_weights(uint64_t seed);
  void ensure_workspace(int64_t tokens, int64_t logit_rows, int64_t metadata_ints);
  void run_layers(int64_t num_tokens, int64_t num_seqs, int64_t max_blocks);
  // Copies the ids of the inputs that bring SequenceInput::device_tokens over their places in
  // the uploaded metadata's `tokens` ([batch's tokens], device).
  void copy_device_tokens(std::span<const SequenceInput> batch, int32_t* tokens);
  void matmul(const float* x, const WeightView& weight, const WeightView& bias, int64_t rows,
              float* out, const char* what, int64_t layer);
  // Linear layers reading the same x (q, k and v; gate and up), through Backend::matmul_group.
  struct GroupMember {
    const WeightView* weight;
    const WeightView* bias;  // absent: no bias
    float* out;              // [rows, out_features]
  };
  void matmul_group(const float* x, std::span<const GroupMember> members, int64_t rows,
                    const char* what, int64_t layer);

  Checkpoint checkpoint_;
  kernels::Backend& backend_;
  ModelOptions options_;
  ModelWeights weights_;
  std::vector<DeviceBuffer> weight_buffers_;  // device copies, quantized weights, f32 scales
  DeviceBuffer inv_freq_;                     // [head_dim / 2] f32
  DeviceBuffer local_inv_freq_;  // [head_dim / 2] f32: the windowed layers' (local_rope_theta)
  // Gemma's norm gains as the model multiplies by them, 1 + w, in f32 (in bf16 1 + w would lose
  // w's low bits): host copies the views point at until the weights are placed.
  std::vector<std::vector<float>> offset_gains_;
  std::unique_ptr<KvCache> kv_cache_;
  std::unique_ptr<Workspace> workspace_;
  int64_t parameter_count_ = 0;
  uint64_t weight_bytes_ = 0;
  uint64_t decode_read_bytes_ = 0;
};

}  // namespace specrun
