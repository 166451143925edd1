#include "runtime/model/model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <limits>
#include <set>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "kernels/core/uniform_hash.h"
#include "runtime/base/check.h"
#include "runtime/base/progress.h"
#include "runtime/model/synthetic.h"

namespace specrun {

namespace {
// A default KV capacity that fits the tiny and the large alike; users size it explicitly.
constexpr int64_t kDefaultKvTokens = 8192;
// Slots are 32-bit indices.
constexpr int64_t kMaxKvTokens = INT32_MAX;

// The KV cache's capacity: the configured tokens (else the context, at most kDefaultKvTokens),
// rounded up to whole blocks.
int64_t kv_capacity_tokens(const ModelConfig& config, const ModelOptions& options) {
  const int64_t tokens = options.kv_cache_tokens > 0
                             ? options.kv_cache_tokens
                             : std::min(config.max_position_embeddings, kDefaultKvTokens);
  const int64_t block = std::max<int64_t>(options.kv_block_size, 1);
  return (tokens + block - 1) / block * block;
}

// The KV cache's options, checked the same way for a plan and for a load.
void check_cache_options(const ModelOptions& options) {
  if (options.kv_block_size <= 0) {
    throw Error("KV block size must be positive, got " + std::to_string(options.kv_block_size));
  }
  if (options.kv_cache_tokens < 0 || options.kv_cache_tokens > kMaxKvTokens) {
    throw Error("KV cache size must be in [0, " + std::to_string(kMaxKvTokens) + "] tokens, got " +
                std::to_string(options.kv_cache_tokens));
  }
  if (!kernels::is_kv_cache_dtype(options.kv_cache_dtype)) {
    throw Error("KV cache dtype must be bf16 or f32, got " +
                std::string(dtype_name(options.kv_cache_dtype)));
  }
  if (options.kv_block_size > kMaxKvTokens) {
    throw Error("KV block size must be at most " + std::to_string(kMaxKvTokens) + ", got " +
                std::to_string(options.kv_block_size));
  }
}

std::string layer_op(const char* what, int64_t layer) {
  return layer < 0 ? std::string(what) : "layer " + std::to_string(layer) + " " + what;
}

// A token tree's new tokens (SequenceInput::parents), by index among them: each one's depth
// below the cached text and the run of new tokens it does not read, [gap_begin, gap_end).
struct TreeLayout {
  std::vector<int64_t> depth;
  std::vector<int64_t> gap_begin;
  std::vector<int64_t> gap_end;
};

// Throws Error naming the sequence when a parent is not an earlier token, or a token's ancestors
// are not a run from the first new token and then a run ending at it.
TreeLayout tree_layout(const SequenceInput& input) {
  const auto n = static_cast<int64_t>(input.parents.size());
  TreeLayout tree{std::vector<int64_t>(static_cast<size_t>(n)),
                  std::vector<int64_t>(static_cast<size_t>(n)),
                  std::vector<int64_t>(static_cast<size_t>(n))};
  const auto fail = [&](int64_t i, const std::string& why) {
    return Error("forward: sequence " + std::to_string(input.sequence) + ": tree token " +
                 std::to_string(i) + " " + why);
  };
  std::vector<int64_t> path;  // a token and its ancestors among the new tokens, descending
  for (int64_t i = 0; i < n; ++i) {
    const int64_t parent = input.parents[static_cast<size_t>(i)];
    if (parent < -1 || parent >= i) {
      throw fail(i, "has parent " + std::to_string(parent) + ", not an earlier token or -1");
    }
    tree.depth[static_cast<size_t>(i)] =
        parent < 0 ? 0 : tree.depth[static_cast<size_t>(parent)] + 1;
    path.clear();
    for (int64_t at = i; at >= 0; at = input.parents[static_cast<size_t>(at)]) path.push_back(at);
    // Ascending, the path is 0, 1, .., x - 1 (the run from the first), then y, y + 1, .., i.
    std::reverse(path.begin(), path.end());
    size_t run = 0;
    while (run < path.size() && path[run] == static_cast<int64_t>(run)) ++run;
    const int64_t resume = run < path.size() ? path[run] : i;
    for (size_t k = run; k < path.size(); ++k) {
      if (path[k] != resume + static_cast<int64_t>(k - run)) {
        throw fail(i, "has ancestors that are not a chain from the first token and one branch");
      }
    }
    // No second run (a token of the chain): an empty gap.
    tree.gap_begin[static_cast<size_t>(i)] = run < path.size() ? static_cast<int64_t>(run) : i;
    tree.gap_end[static_cast<size_t>(i)] = run < path.size() ? resume : i;
  }
  return tree;
}
}  // namespace

// Activation buffers, grown to the largest call seen.
struct Model::Workspace {
  int64_t token_capacity = 0;      // rows the activation buffers hold
  int64_t logit_capacity = 0;      // rows the logits buffer holds
  int64_t metadata_capacity = 0;   // int32 entries of the metadata buffer
  DeviceBuffer x;                  // [tokens, hidden]: the residual stream
  DeviceBuffer normed;             // [tokens, hidden]
  DeviceBuffer q;                  // [tokens, heads * head_dim]
  DeviceBuffer k;                  // [tokens, kv_heads * head_dim]
  DeviceBuffer v;                  // [tokens, kv_heads * head_dim]
  DeviceBuffer attention;          // [tokens, heads * head_dim]
  DeviceBuffer projected;          // [tokens, hidden]
  DeviceBuffer gate;               // [tokens, intermediate]
  DeviceBuffer up;                 // [tokens, intermediate]
  DeviceBuffer token_embedding;    // [tokens, embedding_width]: a feature-reading draft's only
  DeviceBuffer features;           // [tokens, feature_width]: a feature-reading draft's only
  DeviceBuffer logits;             // [logit rows, output rows]: vocab, or a reduced head's
  std::vector<float> head_logits;  // host: [logit rows, output_token_ids] of a reduced head
  DeviceBuffer widened_logits;     // [logit rows, vocab]: a reduced head's, kept on the device
  DeviceBuffer metadata;  // int32: tokens, positions, slots, query_start, context, blocks, gaps
  // This call's slices of `metadata`.
  int32_t* tokens = nullptr;           // [tokens]
  int32_t* positions = nullptr;        // [tokens]
  int32_t* slots = nullptr;            // [tokens]
  int32_t* query_start = nullptr;      // [seqs + 1]
  int32_t* context_lengths = nullptr;  // [seqs]
  int32_t* key_gaps = nullptr;         // [tokens, 2] with a token tree, else null
  int32_t* block_tables = nullptr;     // [seqs, max_blocks]
};

std::unique_ptr<Model> Model::load(const std::filesystem::path& path, kernels::Backend& backend,
                                   const ModelOptions& options) {
  return std::make_unique<Model>(open_checkpoint(path), backend, options);
}

std::unique_ptr<Model> Model::synthetic(const ModelConfig& config, const std::string& label,
                                        uint64_t seed, kernels::Backend& backend,
                                        const ModelOptions& options) {
  Checkpoint checkpoint;
  checkpoint.paths.directory = label;
  checkpoint.config = config;
  return std::unique_ptr<Model>(new Model(std::move(checkpoint), backend, options, seed));
}

Model::Model(Checkpoint checkpoint, kernels::Backend& backend, const ModelOptions& options)
    : Model(std::move(checkpoint), backend, options, std::nullopt) {}

Model::Model(Checkpoint checkpoint, kernels::Backend& backend, const ModelOptions& options,
             std::optional<uint64_t> synthetic_seed)
    : checkpoint_(std::move(checkpoint)),
      backend_(backend),
      options_(options),
      workspace_(std::make_unique<Workspace>()) {
  ModelConfig& config = checkpoint_.config;
  if (options.rope_style) config.rope_style = *options.rope_style;
  if (synthetic_seed) {
    if (config.reads_features()) {
      throw Error("a synthetic model cannot read features (feature_width is for trained drafts)");
    }
    weights_ = synthetic_layout(config, DType::kBF16);
  } else {
    weights_ = bind_weights(checkpoint_);
    for (const TensorInfo* info : checkpoint_.tensors.all()) {
      parameter_count_ += info->num_elements();
    }
    if (config.tie_word_embeddings && checkpoint_.tensors.find("lm_head.weight") != nullptr) {
      parameter_count_ -= config.vocab_size * config.hidden_size;
    }
    if (config.norm_gain_offset) offset_norm_gains();
  }
  check_cache_options(options);
  if (synthetic_seed) {
    write_synthetic_weights(*synthetic_seed);
  } else {
    quantize_weights();
    // Before place_weights: a device's quantization at load sets scales already on the device.
    place_scales();
    place_weights();
  }
  lay_out_weights();
  // What a forward reads, as placed (a device holds bf16 copies).
  auto count = [&](const WeightView& view) {
    weight_bytes_ += view.size_bytes + static_cast<uint64_t>(view.scale_count) * sizeof(float);
  };
  count(weights_.embedding);
  count(weights_.token_projection);
  count(weights_.feature_projection);
  for (const LayerWeights& l : weights_.layers) {
    for (const WeightView* view : l.views()) count(*view);
  }
  count(weights_.final_norm);
  if (weights_.output.data != weights_.embedding.data) count(weights_.output);  // tied: once
  decode_read_bytes_ = weight_bytes_;
  if (weights_.output.data != weights_.embedding.data && config.vocab_size > 0) {
    // Untied: a decode step reads one row of the table, not the table.
    const uint64_t row_bytes = weights_.embedding.size_bytes / uint64_t(config.vocab_size);
    decode_read_bytes_ -= weights_.embedding.size_bytes - row_bytes;
  }

  auto upload_frequencies = [&](bool local) {
    const std::vector<float> inv_freq = rope_inverse_frequencies(config, local);
    DeviceBuffer buffer(backend_, inv_freq.size() * sizeof(float), "RoPE frequencies");
    SPECRUN_CHECK_OK(
        backend_.copy_to_device(buffer.data(), inv_freq.data(), inv_freq.size() * sizeof(float)),
        "uploading RoPE frequencies");
    return buffer;
  };
  inv_freq_ = upload_frequencies(false);
  if (config.local_rope_theta > 0.0) local_inv_freq_ = upload_frequencies(true);

  const int64_t blocks = kv_capacity_tokens(config, options) / options.kv_block_size;
  kv_cache_ = std::make_unique<KvCache>(
      backend_,
      KvCacheLayout{config.num_layers, config.num_kv_heads, config.head_dim, options.kv_block_size,
                    blocks, options.kv_cache_dtype},
      options.prefix_cache);
  spdlog::debug("loaded {} ({} layers, {:.1f}M parameters) on {}; KV cache {} tokens",
                checkpoint_.paths.weights.string(), config.num_layers, parameter_count_ / 1e6,
                backend_.name(), kv_cache_->capacity_tokens());
}

Model::~Model() = default;

namespace {

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

MemoryNeeds Model::plan_memory(const Checkpoint& checkpoint, const ModelOptions& options,
                               bool host_memory,
                               const std::function<kernels::WeightLayout(DType)>& layout_of,
                               int64_t max_logit_rows) {
  check_cache_options(options);
  const ModelConfig& c = checkpoint.config;
  MemoryNeeds needs;
  // Quantized at load: the linear layers (and the head, when asked) become one byte a weight and
  // one f32 scale a row. A pre-quantized checkpoint keeps its own codes.
  const bool quantizing = options.quantize != WeightQuantize::kNone && !c.quantization;
  // The table is laid out as the head when the head is the table itself (tied, not quantized).
  const bool table_is_head = c.tie_word_embeddings && !(quantizing && options.quantize_output);
  bool has_head = false;
  DType table_dtype = DType::kBF16;  // the embedding table's, as stored
  needs.kv_tokens = kv_capacity_tokens(c, options);
  // A forward holds at most the cache's tokens; its buffers grow no further (ensure_workspace).
  const auto logit_rows = std::clamp<int64_t>(max_logit_rows, 1, needs.kv_tokens);
  const DType quantized_to =
      options.quantize == WeightQuantize::kINT8 ? DType::kI8 : DType::kF8E4M3;
  const auto place = [&](DType placed, uint64_t bytes) {
    needs.weight_bytes += bytes;
    needs.weight_bytes_by_type[std::string(dtype_name(placed))] += bytes;
  };
  for (const TensorInfo* info : checkpoint.tensors.all()) {
    const std::string& name = info->name;
    const bool head = ends_with(name, "lm_head.weight") || name == "output.weight";
    has_head = has_head || head;
    const bool linear = ends_with(name, "_proj.weight") || (head && options.quantize_output);
    if (ends_with(name, "embed_tokens.weight")) table_dtype = info->dtype;
    // Matmul weights in the backend's layout for the dtype they are loaded in (padded to whole
    // tiles).
    const bool laid_out =
        info->shape.size() == 2 && (ends_with(name, "_proj.weight") || head ||
                                    (table_is_head && ends_with(name, "embed_tokens.weight")));
    const DType loaded_dtype =
        quantizing && linear ? quantized_to : (host_memory ? info->dtype : DType::kBF16);
    if ((ends_with(name, "_proj.weight") || head) && info->shape.size() == 2) {
      // A pre-quantized checkpoint's codes are multiplied as they are.
      needs.forward.matmuls.push_back(
          {head ? logit_rows : needs.kv_tokens, info->shape[1], info->shape[0],
           is_quantized(info->dtype) ? info->dtype : loaded_dtype, DType::kF32});
    }
    const auto elements =
        laid_out ? kernels::stored_elements(layout_of(loaded_dtype), info->shape[0], info->shape[1])
                 : static_cast<uint64_t>(info->num_elements());
    if (ends_with(name, ".weight_scale") || ends_with(name, ".weight_scale_inv")) {
      place(DType::kF32, elements * sizeof(float));  // placed as f32
    } else if (is_quantized(info->dtype)) {
      place(info->dtype, elements);
    } else if (quantizing && linear && info->shape.size() == 2) {
      place(quantized_to, elements);
      place(DType::kF32, static_cast<uint64_t>(info->shape[0]) * sizeof(float));
    } else if (!host_memory) {
      place(DType::kBF16, elements * sizeof(uint16_t));  // a device holds bf16
    } else {
      place(info->dtype, dtype_bytes(info->dtype, elements));  // GGUF blocks as stored
    }
  }
  if (quantizing && options.quantize_output && !has_head) {
    // A tied head quantized is a copy of the embedding table.
    place(quantized_to,
          kernels::stored_elements(layout_of(DType::kI8), c.vocab_size, c.hidden_size));
    place(DType::kF32, static_cast<uint64_t>(c.vocab_size) * sizeof(float));
  }
  if (!has_head) {
    // The tied head multiplies by the embedding table (or its quantized copy).
    const DType table = quantizing && options.quantize_output ? quantized_to
                        : host_memory                         ? table_dtype
                                                              : DType::kBF16;
    needs.forward.matmuls.push_back({logit_rows, c.hidden_size, c.vocab_size, table, DType::kF32});
  }
  // The rows of logits the step processes (the target's p) or samples (the draft's q) at once, as
  // wide as the head scores.
  needs.forward.logits = {logit_rows, c.output_token_ids.empty()
                                          ? c.vocab_size
                                          : static_cast<int64_t>(c.output_token_ids.size())};
  const int64_t block = options.kv_block_size;
  needs.forward.attention = {1,
                             needs.kv_tokens,
                             c.num_heads,
                             c.num_kv_heads,
                             c.head_dim,
                             block,
                             (needs.kv_tokens + block - 1) / block,
                             1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                             c.widest_window(),
                             options.kv_cache_dtype};
  needs.kv_bytes_per_token = 2 * static_cast<uint64_t>(c.num_layers) * c.num_kv_heads * c.head_dim *
                             dtype_size(options.kv_cache_dtype);
  needs.kv_bytes = needs.kv_bytes_per_token * static_cast<uint64_t>(needs.kv_tokens);
  const auto tokens = static_cast<uint64_t>(needs.kv_tokens);
  const uint64_t per_token = 3 * static_cast<uint64_t>(c.hidden_size) +
                             (c.reads_features() ? static_cast<uint64_t>(c.embedding_columns()) +
                                                       static_cast<uint64_t>(c.feature_width)
                                                 : 0) +
                             2 * static_cast<uint64_t>(c.num_heads) * c.head_dim +
                             2 * static_cast<uint64_t>(c.num_kv_heads) * c.head_dim +
                             2 * static_cast<uint64_t>(c.intermediate_size);
  // The logits, and the distributions processed from them (the scorer's p, the proposer's q) with
  // a status a row.
  needs.workspace_bytes = (tokens * per_token + 2 * static_cast<uint64_t>(logit_rows) *
                                                    static_cast<uint64_t>(c.vocab_size)) *
                              sizeof(float) +
                          static_cast<uint64_t>(logit_rows) * sizeof(int32_t);
  return needs;
}

int64_t Model::context_limit() const {
  return std::min(config().max_position_embeddings, kv_cache_->capacity_tokens());
}

namespace {

// The linear layers' weights: those that may be quantized.
std::vector<WeightView*> linear_weights(ModelWeights& weights) {
  std::vector<WeightView*> views;
  for (WeightView* view : {&weights.token_projection, &weights.feature_projection}) {
    if (*view) views.push_back(view);
  }
  for (LayerWeights& l : weights.layers) {
    for (WeightView* view :
         {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      views.push_back(view);
    }
  }
  return views;
}

// Every norm's gain: the layers' (those the config has) and the final one.
std::vector<WeightView*> norm_gains(ModelWeights& weights) {
  std::vector<WeightView*> views;
  for (LayerWeights& l : weights.layers) {
    for (WeightView* view : {&l.attention_norm, &l.q_norm, &l.k_norm, &l.attention_output_norm,
                             &l.mlp_norm, &l.mlp_output_norm}) {
      if (*view) views.push_back(view);
    }
  }
  views.push_back(&weights.final_norm);
  return views;
}

// Row `row` of `source` quantized into `codes` with one symmetric scale, returned.
float quantize_row(const WeightView& source, int64_t row, DType target, void* codes) {
  const int64_t columns = source.shape[1];
  const auto first = static_cast<size_t>(row * columns);
  float largest = 0.0f;
  for (int64_t i = 0; i < columns; ++i) {
    largest = std::max(largest, std::fabs(load_as_f32(source.data, source.dtype, first + i)));
  }
  const float code_max = target == DType::kI8 ? 127.0f : kF8E4M3Max;
  // A row of zeros keeps scale 1 (its codes are zero either way).
  const float scale = largest > 0.0f && std::isfinite(largest) ? largest / code_max : 1.0f;
  for (int64_t i = 0; i < columns; ++i) {
    const float scaled = load_as_f32(source.data, source.dtype, first + i) / scale;
    if (target == DType::kI8) {
      static_cast<int8_t*>(codes)[i] =
          static_cast<int8_t>(std::clamp(std::nearbyint(scaled), -127.0f, 127.0f));
    } else {
      static_cast<uint8_t*>(codes)[i] = f32_to_f8e4m3(scaled);
    }
  }
  return scale;
}

// Rows [first, first + count) of `source` quantized into `codes` ([count, columns]) and `scales`
// ([count]), split over the machine's cores (rows are independent).
void quantize_rows(const WeightView& source, int64_t first, int64_t count, DType target,
                   std::byte* codes, float* scales) {
  const int64_t columns = source.shape[1];
  const int64_t workers =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(count, 1));
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t row = w; row < count; row += workers) {
        scales[row] = quantize_row(source, first + row, target, codes + row * columns);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// The view of a weight quantized per output channel, over `codes` and `scales`.
void set_quantized(WeightView& view, DType target, const void* codes, const void* scales) {
  const int64_t rows = view.shape[0], columns = view.shape[1];
  view.data = codes;
  view.dtype = target;
  view.size_bytes = static_cast<uint64_t>(rows * columns);
  view.scales = scales;
  view.scale_dtype = DType::kF32;
  view.scale_block_rows = 1;
  view.scale_block_cols = columns;
  view.scale_count = rows;
}

}  // namespace

std::optional<DType> Model::quantize_target() const {
  if (options_.quantize == WeightQuantize::kNone || checkpoint_.config.quantization) {
    return std::nullopt;
  }
  return options_.quantize == WeightQuantize::kFP8 ? DType::kF8E4M3 : DType::kI8;
}

void Model::quantize_weights() {
  if (!quantize_target()) {
    if (options_.quantize != WeightQuantize::kNone) {
      // Published pre-quantized: its own codes and scales are the better ones; quantizing them
      // again could only lose precision.
      spdlog::debug(
          "{}: the checkpoint is already quantized ({}); read as it is, not quantized to {}",
          checkpoint_.paths.config.string(), checkpoint_.config.quantization->method,
          options_.quantize == WeightQuantize::kFP8 ? "fp8" : "int8");
    }
    return;
  }
  // A device quantizes on the way up, in place_weights.
  if (!backend_.uses_host_memory()) return;
  std::vector<WeightView*> views = linear_weights(weights_);
  if (options_.quantize_output) views.push_back(&weights_.output);  // a copy when tied
  for (WeightView* view : views) quantize_onto_backend(*view, nullptr);
}

void Model::quantize_onto_backend(WeightView& view, Progress* progress) {
  const DType target = *quantize_target();
  const int64_t rows = view.shape[0], columns = view.shape[1];
  DeviceBuffer codes(backend_, static_cast<size_t>(rows * columns), "quantized weights");
  DeviceBuffer scales(backend_, static_cast<size_t>(rows) * sizeof(float), "weight scales");
  if (backend_.uses_host_memory()) {
    // Straight from the mapped checkpoint into the codes: no second float copy of the model.
    quantize_rows(view, 0, rows, target, codes.as<std::byte>(), scales.as<float>());
  } else {
    // Through host buffers of at most 64 MiB of codes, uploaded as they fill.
    const int64_t chunk_rows = std::max<int64_t>(1, (int64_t{64} << 20) / columns);
    std::vector<std::byte> host_codes;
    std::vector<float> host_scales;
    for (int64_t first = 0; first < rows; first += chunk_rows) {
      const int64_t count = std::min(chunk_rows, rows - first);
      host_codes.resize(static_cast<size_t>(count * columns));
      host_scales.resize(static_cast<size_t>(count));
      quantize_rows(view, first, count, target, host_codes.data(), host_scales.data());
      SPECRUN_CHECK_OK(backend_.copy_to_device(codes.as<std::byte>() + first * columns,
                                               host_codes.data(), host_codes.size()),
                       "uploading quantized weights");
      SPECRUN_CHECK_OK(backend_.copy_to_device(scales.as<float>() + first, host_scales.data(),
                                               host_scales.size() * sizeof(float)),
                       "uploading weight scales");
      if (progress != nullptr) {
        progress->advance(dtype_bytes(view.dtype, static_cast<uint64_t>(count * columns)));
      }
    }
  }
  set_quantized(view, target, codes.data(), scales.data());
  weight_buffers_.push_back(std::move(codes));
  weight_buffers_.push_back(std::move(scales));
}

// Scales as every backend's matmul reads them: f32 in the backend's memory.
void Model::place_scales() {
  std::vector<WeightView*> views = linear_weights(weights_);
  views.push_back(&weights_.output);
  for (WeightView* view : views) {
    if (!view->scales || (view->scale_dtype == DType::kF32 && backend_.uses_host_memory())) {
      continue;
    }
    std::vector<float> values(static_cast<size_t>(view->scale_count));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = load_as_f32(view->scales, view->scale_dtype, i);
    }
    DeviceBuffer buffer(backend_, values.size() * sizeof(float), "weight scales");
    SPECRUN_CHECK_OK(
        backend_.copy_to_device(buffer.data(), values.data(), values.size() * sizeof(float)),
        "uploading weight scales");
    view->scales = buffer.data();
    view->scale_dtype = DType::kF32;
    weight_buffers_.push_back(std::move(buffer));
  }
}

void Model::place_weights() {
  if (backend_.uses_host_memory()) return;  // used in place from the mapping
  // A device computes with bf16 weights or 8-bit codes: f32 and f16 tensors are converted on the
  // way, and weights quantized at load are quantized on the way, a chunk at a time through host
  // buffers, so the host never holds a second copy of the model.
  constexpr uint64_t kChunkBytes = uint64_t{64} << 20;
  std::set<const WeightView*> to_quantize;
  if (quantize_target()) {
    for (const WeightView* view : linear_weights(weights_)) to_quantize.insert(view);
    if (options_.quantize_output) to_quantize.insert(&weights_.output);
  }
  std::set<const WeightView*> offset_gains;
  if (checkpoint_.config.norm_gain_offset) {
    for (const WeightView* view : norm_gains(weights_)) offset_gains.insert(view);
  }
  std::vector<WeightView*> views = {&weights_.embedding, &weights_.token_projection,
                                    &weights_.feature_projection};
  for (LayerWeights& l : weights_.layers) {
    for (WeightView* view : l.views()) views.push_back(view);
  }
  views.push_back(&weights_.final_norm);
  // A tied head shares the table, unless it is quantized: then it is a quantized copy.
  const bool shares_table =
      weights_.output.data == weights_.embedding.data && to_quantize.count(&weights_.output) == 0;
  if (!shares_table) views.push_back(&weights_.output);
  uint64_t total = 0;
  for (const WeightView* view : views) total += view->size_bytes;
  Progress progress("uploading weights to " + std::string(backend_.name()), total);
  std::vector<uint16_t> converted;
  for (WeightView* view : views) {
    if (!*view) continue;
    if (to_quantize.count(view) != 0) {
      quantize_onto_backend(*view, &progress);
      continue;
    }
    uint64_t elements = 1;
    for (const int64_t extent : view->shape) elements *= static_cast<uint64_t>(extent);
    if (is_quantized(view->dtype)) {
      // A pre-quantized checkpoint's codes, as they are (place_scales placed their scales).
      DeviceBuffer buffer(backend_, view->size_bytes, "quantized weights");
      for (uint64_t first = 0; first < elements; first += kChunkBytes) {
        const uint64_t count = std::min(kChunkBytes, elements - first);
        SPECRUN_CHECK_OK(
            backend_.copy_to_device(buffer.as<std::byte>() + first,
                                    static_cast<const std::byte*>(view->data) + first, count),
            "uploading quantized weights");
        progress.advance(count);
      }
      view->data = buffer.data();
      weight_buffers_.push_back(std::move(buffer));
      continue;
    }
    if (offset_gains.count(view) != 0) {
      // Gains of 1 + w stay f32 on the device too.
      DeviceBuffer buffer(backend_, view->size_bytes, "norm gains");
      SPECRUN_CHECK_OK(backend_.copy_to_device(buffer.data(), view->data, view->size_bytes),
                       "uploading norm gains");
      progress.advance(view->size_bytes);
      view->data = buffer.data();
      weight_buffers_.push_back(std::move(buffer));
      continue;
    }
    // Widened to bf16 where stored otherwise (GGUF blocks too: a device multiplies bf16).
    const bool convert = view->dtype != DType::kBF16;
    DeviceBuffer buffer(backend_, elements * sizeof(uint16_t), "weights");
    const uint64_t chunk = kChunkBytes / sizeof(float);  // elements per chunk: whole GGUF blocks
    for (uint64_t first = 0; first < elements; first += chunk) {
      const uint64_t count = std::min(chunk, elements - first);
      const void* source =
          static_cast<const std::byte*>(view->data) + dtype_bytes(view->dtype, first);
      if (convert) {
        converted.resize(count);
        for (uint64_t i = 0; i < count; ++i) {
          converted[i] = f32_to_bf16(load_as_f32(source, view->dtype, i));
        }
        source = converted.data();
      }
      SPECRUN_CHECK_OK(
          backend_.copy_to_device(buffer.as<uint16_t>() + first, source, count * sizeof(uint16_t)),
          "uploading weights");
      progress.advance(dtype_bytes(view->dtype, count));
    }
    view->data = buffer.data();
    view->dtype = DType::kBF16;
    view->size_bytes = elements * sizeof(uint16_t);
    weight_buffers_.push_back(std::move(buffer));
  }
  if (shares_table) weights_.output = weights_.embedding;
}

void Model::offset_norm_gains() {
  for (WeightView* view : norm_gains(weights_)) {
    const auto count = static_cast<size_t>(view->shape[0]);
    std::vector<float>& gains = offset_gains_.emplace_back(count);
    for (size_t i = 0; i < count; ++i) gains[i] = 1.0f + load_as_f32(view->data, view->dtype, i);
    view->data = gains.data();
    view->dtype = DType::kF32;
    view->size_bytes = count * sizeof(float);
  }
}

void Model::lay_out_weights() {
  const bool tied = weights_.output.data == weights_.embedding.data;
  std::vector<WeightView*> views = linear_weights(weights_);
  views.push_back(&weights_.output);
  for (WeightView* view : views) {
    if (!*view) continue;
    const kernels::WeightLayout layout = backend_.matmul_weight_layout(view->dtype);
    if (view->layout == layout) continue;
    // Laid out from where the weights are: only a backend in host memory asks for another layout.
    SPECRUN_CHECK(backend_.uses_host_memory() && view->layout == kernels::WeightLayout::kRows);
    const int64_t rows = view->shape[0], columns = view->shape[1];
    const uint64_t bytes = kernels::stored_weight_bytes(layout, rows, columns, view->dtype);
    DeviceBuffer buffer(backend_, bytes, "laid-out weights");
    SPECRUN_CHECK_OK(
        kernels::lay_out_weight(layout, view->data, rows, columns, view->dtype, buffer.data()),
        "laying out weights");
    // A copy made at load (quantized codes, a GGUF tensor dequantised) is not needed any more.
    std::erase_if(weight_buffers_,
                  [&](const DeviceBuffer& held) { return held.data() == view->data; });
    checkpoint_.tensors.release_converted(view->data);
    view->data = buffer.data();
    view->size_bytes = bytes;
    view->layout = layout;
    weight_buffers_.push_back(std::move(buffer));
  }
  if (tied) {
    // The table is the head's: the embedding reads it in the same layout.
    weights_.embedding.data = weights_.output.data;
    weights_.embedding.size_bytes = weights_.output.size_bytes;
    weights_.embedding.layout = weights_.output.layout;
  }
}

void Model::write_synthetic_weights(uint64_t seed) {
  uint64_t tensor = 0;  // each tensor draws from its own stream
  auto write = [&](WeightView& view, float low, float high) {
    int64_t count = 1;
    for (const int64_t dimension : view.shape) count *= dimension;
    DeviceBuffer buffer(backend_, view.size_bytes, "synthetic weights");
    SPECRUN_CHECK_OK(
        backend_.fill_uniform({count, view.dtype, kernels::mix64(seed + tensor++), low, high},
                              buffer.data()),
        "writing synthetic weights");
    view.data = buffer.data();
    weight_buffers_.push_back(std::move(buffer));
    parameter_count_ += count;
  };
  // Quantized (--quantize): codes uniform over the code range and one scale per row mapping it to
  // the bf16 weights' range, written directly (never a bf16 copy: a 70B model's would not fit).
  const std::optional<DType> quantize_to = quantize_target();
  auto write_quantized = [&](WeightView& view, float bound) {
    const DType target = *quantize_to;
    const int64_t rows = view.shape[0], columns = view.shape[1];
    const float code_max = target == DType::kI8 ? 127.0f : kF8E4M3Max;
    view.dtype = target;
    view.size_bytes = static_cast<uint64_t>(rows * columns);
    write(view, -code_max, code_max);
    DeviceBuffer scales(backend_, static_cast<size_t>(rows) * sizeof(float), "weight scales");
    const float scale = bound / code_max;
    SPECRUN_CHECK_OK(backend_.fill_uniform({rows, DType::kF32, 0, scale, scale}, scales.data()),
                     "writing synthetic weight scales");
    set_quantized(view, target, view.data, scales.data());
    weight_buffers_.push_back(std::move(scales));
  };
  // Uniform on [-b, b] has variance b^2 / 3: b = sqrt(3 / fan_in) keeps each projection's output
  // variance that of its input. Norm gains are one.
  auto projection = [&](WeightView& view) {
    const float bound = std::sqrt(3.0f / static_cast<float>(view.shape[1]));
    const bool quantized = quantize_to && (&view != &weights_.output || options_.quantize_output);
    if (quantized) {
      write_quantized(view, bound);
    } else {
      write(view, -bound, bound);
    }
  };
  auto gain = [&](WeightView& view) { write(view, 1.0f, 1.0f); };
  write(weights_.embedding, -std::sqrt(3.0f), std::sqrt(3.0f));
  for (LayerWeights& l : weights_.layers) {
    gain(l.attention_norm);
    if (checkpoint_.config.qk_norm) {
      gain(l.q_norm);
      gain(l.k_norm);
    }
    for (WeightView* view : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj}) projection(*view);
    gain(l.mlp_norm);
    for (WeightView* view : {&l.gate_proj, &l.up_proj, &l.down_proj}) projection(*view);
  }
  gain(weights_.final_norm);
  // The layout gives an untied head a shape and no data yet: the config says which it is. A tied
  // head quantized is a quantized copy of the table, as at load (its own draws here).
  if (checkpoint_.config.tie_word_embeddings && !(quantize_to && options_.quantize_output)) {
    weights_.output = weights_.embedding;
  } else {
    const bool tied = checkpoint_.config.tie_word_embeddings;
    if (tied) {
      weights_.output = WeightView{nullptr, weights_.embedding.dtype, weights_.embedding.shape,
                                   weights_.embedding.size_bytes};
    }
    const int64_t parameters = parameter_count_;
    projection(weights_.output);
    if (tied) parameter_count_ = parameters;  // the table's parameters, counted once
  }
}

void Model::ensure_workspace(int64_t tokens, int64_t logit_rows, int64_t metadata_ints) {
  Workspace& w = *workspace_;
  const ModelConfig& c = config();
  auto floats = [&](int64_t rows, int64_t width) {
    return static_cast<size_t>(rows * width) * sizeof(float);
  };
  if (tokens > w.token_capacity) {
    // Doubling, but never past what one forward can hold (the cache): the memory plan counts that.
    const int64_t rows =
        std::max(tokens, std::min(2 * w.token_capacity, kv_cache_->capacity_tokens()));
    w.x = DeviceBuffer(backend_, floats(rows, c.hidden_size), "workspace");
    w.normed = DeviceBuffer(backend_, floats(rows, c.hidden_size), "workspace");
    w.q = DeviceBuffer(backend_, floats(rows, c.num_heads * c.head_dim), "workspace");
    w.k = DeviceBuffer(backend_, floats(rows, c.num_kv_heads * c.head_dim), "workspace");
    w.v = DeviceBuffer(backend_, floats(rows, c.num_kv_heads * c.head_dim), "workspace");
    w.attention = DeviceBuffer(backend_, floats(rows, c.num_heads * c.head_dim), "workspace");
    w.projected = DeviceBuffer(backend_, floats(rows, c.hidden_size), "workspace");
    w.gate = DeviceBuffer(backend_, floats(rows, c.intermediate_size), "workspace");
    w.up = DeviceBuffer(backend_, floats(rows, c.intermediate_size), "workspace");
    if (c.reads_features()) {
      w.token_embedding = DeviceBuffer(backend_, floats(rows, c.embedding_columns()), "workspace");
      w.features = DeviceBuffer(backend_, floats(rows, c.feature_width), "workspace");
    }
    w.token_capacity = rows;
  }
  if (logit_rows > w.logit_capacity) {
    const int64_t rows = std::max(logit_rows, 2 * w.logit_capacity);
    w.logits = DeviceBuffer(backend_, floats(rows, c.vocab_size), "logits");
    w.logit_capacity = rows;
  }
  if (metadata_ints > w.metadata_capacity) {
    const int64_t count = std::max(metadata_ints, 2 * w.metadata_capacity);
    w.metadata = DeviceBuffer(backend_, static_cast<size_t>(count) * sizeof(int32_t), "metadata");
    w.metadata_capacity = count;
  }
}

namespace {

kernels::MatmulTarget matmul_target(const WeightView& weight, const WeightView& bias, int64_t rows,
                                    float* out) {
  const kernels::MatmulParams params{rows,
                                     weight.shape[1],
                                     weight.shape[0],
                                     weight.dtype,
                                     bias ? bias.dtype : DType::kF32,
                                     weight.scale_block_rows,
                                     weight.scale_block_cols,
                                     weight.layout};
  return {params, weight.data, static_cast<const float*>(weight.scales), bias.data, out};
}

}  // namespace

void Model::matmul(const float* x, const WeightView& weight, const WeightView& bias, int64_t rows,
                   float* out, const char* what, int64_t layer) {
  const kernels::MatmulTarget target = matmul_target(weight, bias, rows, out);
  SPECRUN_CHECK_OK(backend_.matmul(target.params, x, target.weight, target.weight_scales,
                                   target.bias, target.out),
                   layer_op(what, layer));
}

void Model::matmul_group(const float* x, std::span<const GroupMember> members, int64_t rows,
                         const char* what, int64_t layer) {
  SPECRUN_CHECK(members.size() <= kernels::kMaxMatmulGroup);
  kernels::MatmulTarget targets[kernels::kMaxMatmulGroup];
  for (size_t i = 0; i < members.size(); ++i) {
    targets[i] = matmul_target(*members[i].weight, *members[i].bias, rows, members[i].out);
  }
  SPECRUN_CHECK_OK(backend_.matmul_group(x, targets, members.size()), layer_op(what, layer));
}

void Model::copy_device_tokens(std::span<const SequenceInput> batch, int32_t* tokens) {
  // [tokens] in batch order. Inputs whose ids lie back to back on the backend (a draft's rows,
  // fed in the order they were sampled) are one copy.
  int64_t at = 0;
  const int32_t* run_source = nullptr;
  int64_t run_begin = 0;
  int64_t run_length = 0;
  const auto flush = [&] {
    if (run_length == 0) return;
    SPECRUN_CHECK_OK(backend_.copy_on_device(tokens + run_begin, run_source,
                                             static_cast<size_t>(run_length) * sizeof(int32_t)),
                     "gathering the token ids the backend drew");
    run_length = 0;
  };
  for (const SequenceInput& input : batch) {
    const auto count = static_cast<int64_t>(input.tokens.size());
    if (input.device_tokens == nullptr) {
      flush();
    } else if (run_length > 0 && input.device_tokens == run_source + run_length) {
      run_length += count;
    } else {
      flush();
      run_source = input.device_tokens;
      run_begin = at;
      run_length = count;
    }
    at += count;
  }
  flush();
}

void Model::forward(std::span<const SequenceInput> batch, Logits* logits, Features* features) {
  const ModelConfig& c = config();
  logits->vocab_size = c.vocab_size;
  logits->values.clear();
  logits->device = nullptr;
  logits->row_begin.assign(1, 0);
  if (features != nullptr) {
    features->width = c.hidden_size;
    features->values.clear();
    features->row_begin.assign(1, 0);
  }
  if (batch.empty()) return;

  // Validate everything before the cache is touched.
  std::set<SequenceId> seen;
  int64_t num_tokens = 0;
  bool any_tree = false;
  for (const SequenceInput& input : batch) {
    if (!kv_cache_->has_sequence(input.sequence)) {
      throw Error("forward: no sequence " + std::to_string(input.sequence) + " in the KV cache");
    }
    if (!seen.insert(input.sequence).second) {
      throw Error("forward: sequence " + std::to_string(input.sequence) + " appears twice");
    }
    if (input.tokens.empty()) {
      throw Error("forward: sequence " + std::to_string(input.sequence) + " has no new tokens");
    }
    for (const int32_t token : input.tokens) {
      // Ids on the backend are the sample op's, in range by its contract.
      if (input.device_tokens == nullptr && (token < 0 || token >= c.vocab_size)) {
        throw Error("forward: token id " + std::to_string(token) +
                    " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      }
    }
    const size_t wanted = c.reads_features() ? input.tokens.size() * size_t(c.feature_width) : 0;
    if (input.features.size() != wanted) {
      throw Error("forward: sequence " + std::to_string(input.sequence) + " brings " +
                  std::to_string(input.features.size()) + " feature values for " +
                  std::to_string(input.tokens.size()) + " tokens; the model reads " +
                  (c.reads_features() ? std::to_string(c.feature_width) + " per token"
                                      : std::string("none")));
    }
    if (!input.parents.empty()) {
      if (input.parents.size() != input.tokens.size()) {
        throw Error("forward: sequence " + std::to_string(input.sequence) + " brings " +
                    std::to_string(input.parents.size()) + " parents for " +
                    std::to_string(input.tokens.size()) + " tokens");
      }
      if (!backend_.attends_with_key_gaps()) {
        throw Error("forward: the " + std::string(backend_.name()) +
                    " backend does not take token trees");
      }
      any_tree = true;
    }
    num_tokens += static_cast<int64_t>(input.tokens.size());
  }
  const int64_t num_seqs = static_cast<int64_t>(batch.size());
  // Each tree token's depth and key gap, relative to its sequence's first new token.
  std::vector<TreeLayout> trees(any_tree ? batch.size() : 0);
  for (size_t s = 0; s < trees.size(); ++s) {
    if (!batch[s].parents.empty()) trees[s] = tree_layout(batch[s]);
  }

  std::vector<KvGrowth> growth;
  std::vector<int64_t> old_lengths;
  for (const SequenceInput& input : batch) {
    growth.push_back({input.sequence, input.tokens});
    old_lengths.push_back(kv_cache_->length(input.sequence));
  }
  kv_cache_->append(growth);  // all or nothing

  try {
    // Host-side metadata, laid out as in the workspace's metadata buffer.
    int64_t max_blocks = 0;
    for (const SequenceInput& input : batch) {
      max_blocks = std::max<int64_t>(
          max_blocks, static_cast<int64_t>(kv_cache_->block_table(input.sequence).size()));
    }
    const int64_t gap_ints = any_tree ? 2 * num_tokens : 0;
    std::vector<int32_t> metadata(static_cast<size_t>(3 * num_tokens + (num_seqs + 1) + num_seqs +
                                                      num_seqs * max_blocks + gap_ints),
                                  0);
    int32_t* tokens = metadata.data();
    int32_t* positions = tokens + num_tokens;
    int32_t* slots = positions + num_tokens;
    int32_t* query_start = slots + num_tokens;
    int32_t* context_lengths = query_start + num_seqs + 1;
    int32_t* block_tables = context_lengths + num_seqs;
    int32_t* key_gaps = block_tables + num_seqs * max_blocks;  // [tokens, 2] with a tree

    logits->row_begin.assign(1, 0);
    int64_t token = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      const SequenceInput& input = batch[static_cast<size_t>(s)];
      query_start[s] = static_cast<int32_t>(token);
      context_lengths[s] = static_cast<int32_t>(kv_cache_->length(input.sequence));
      const std::span<const int32_t> table = kv_cache_->block_table(input.sequence);
      std::copy(table.begin(), table.end(), block_tables + s * max_blocks);
      const int64_t old_length = old_lengths[static_cast<size_t>(s)];
      for (size_t i = 0; i < input.tokens.size(); ++i, ++token) {
        const int64_t position = old_length + static_cast<int64_t>(i);
        tokens[token] = input.tokens[i];
        positions[token] = static_cast<int32_t>(position);
        slots[token] = kv_cache_->slot(input.sequence, position);
        if (any_tree && !input.parents.empty()) {
          const TreeLayout& tree = trees[static_cast<size_t>(s)];
          positions[token] = static_cast<int32_t>(old_length + tree.depth[i]);
          key_gaps[2 * token] = static_cast<int32_t>(old_length + tree.gap_begin[i]);
          key_gaps[2 * token + 1] = static_cast<int32_t>(old_length + tree.gap_end[i]);
        }
      }
      const int64_t rows = input.all_logits ? static_cast<int64_t>(input.tokens.size()) : 1;
      logits->row_begin.push_back(logits->row_begin.back() + rows);
    }
    query_start[num_seqs] = static_cast<int32_t>(num_tokens);
    const int64_t logit_rows = logits->row_begin.back();

    ensure_workspace(num_tokens, logit_rows, static_cast<int64_t>(metadata.size()));
    Workspace& w = *workspace_;
    if (c.reads_features()) {
      // [tokens, feature_width], in batch order
      float* destination = w.features.as<float>();
      for (const SequenceInput& input : batch) {
        SPECRUN_CHECK_OK(backend_.copy_to_device(destination, input.features.data(),
                                                 input.features.size() * sizeof(float)),
                         "uploading features");
        destination += input.features.size();
      }
    }
    SPECRUN_CHECK_OK(backend_.copy_to_device(w.metadata.data(), metadata.data(),
                                             metadata.size() * sizeof(int32_t)),
                     "uploading batch metadata");
    int32_t* device_metadata = w.metadata.as<int32_t>();
    w.tokens = device_metadata + (tokens - metadata.data());
    w.positions = device_metadata + (positions - metadata.data());
    w.slots = device_metadata + (slots - metadata.data());
    w.query_start = device_metadata + (query_start - metadata.data());
    w.context_lengths = device_metadata + (context_lengths - metadata.data());
    w.block_tables = device_metadata + (block_tables - metadata.data());
    w.key_gaps = any_tree ? device_metadata + (key_gaps - metadata.data()) : nullptr;
    copy_device_tokens(batch, w.tokens);

    run_layers(num_tokens, num_seqs, max_blocks);

    float* x = w.x.as<float>();
    if (features != nullptr) {
      // Every token's row after the final norm: [tokens, hidden].
      float* normed = w.normed.as<float>();
      SPECRUN_CHECK_OK(
          backend_.rmsnorm({num_tokens, c.hidden_size, static_cast<float>(c.rms_norm_eps),
                            weights_.final_norm.dtype},
                           x, weights_.final_norm.data, normed),
          "final norm of the features");
      features->values.resize(static_cast<size_t>(num_tokens * c.hidden_size));
      SPECRUN_CHECK_OK(backend_.copy_to_host(features->values.data(), normed,
                                             features->values.size() * sizeof(float)),
                       "reading features");
      for (int64_t s = 0; s < num_seqs; ++s) features->row_begin.push_back(query_start[s + 1]);
    }
    // Gather the rows whose logits are wanted, then the final norm and the output projection.
    float* gathered = w.normed.as<float>();
    const size_t row_bytes = static_cast<size_t>(c.hidden_size) * sizeof(float);
    for (int64_t s = 0; s < num_seqs; ++s) {
      const int64_t rows =
          logits->row_begin[static_cast<size_t>(s) + 1] - logits->row_begin[static_cast<size_t>(s)];
      const int64_t first_token = query_start[s + 1] - rows;
      SPECRUN_CHECK_OK(backend_.copy_on_device(
                           gathered + logits->row_begin[static_cast<size_t>(s)] * c.hidden_size,
                           x + first_token * c.hidden_size, static_cast<size_t>(rows) * row_bytes),
                       "gathering logit rows");
    }
    SPECRUN_CHECK_OK(
        backend_.rmsnorm({logit_rows, c.hidden_size, static_cast<float>(c.rms_norm_eps),
                          weights_.final_norm.dtype},
                         gathered, weights_.final_norm.data, gathered),
        "final norm");
    matmul(gathered, weights_.output, WeightView{}, logit_rows, w.logits.as<float>(), "lm_head",
           -1);
    // A reduced head scores its tokens only; every other token's logit is -infinity, so it is
    // never drawn and its probability is exactly zero.
    const bool reduced = !c.output_token_ids.empty();
    const int64_t output_rows = weights_.output.shape[0];  // vocab, or the reduced head's tokens
    if (logits->keep_on_device && (!reduced || logits->compact_head)) {
      logits->device = w.logits.as<float>();
      logits->device_width = output_rows;
      logits->values.clear();
      return;
    }
    std::vector<float>& scored = reduced ? w.head_logits : logits->values;
    scored.resize(static_cast<size_t>(logit_rows * output_rows));  // [rows, output rows]
    SPECRUN_CHECK_OK(
        backend_.copy_to_host(scored.data(), w.logits.data(), scored.size() * sizeof(float)),
        "reading logits");
    SPECRUN_CHECK_OK(backend_.synchronize(), "forward");
    if (reduced) {
      logits->values.assign(static_cast<size_t>(logit_rows * c.vocab_size),
                            -std::numeric_limits<float>::infinity());
      for (int64_t row = 0; row < logit_rows; ++row) {
        const float* head = scored.data() + row * output_rows;
        float* full = logits->values.data() + row * c.vocab_size;
        for (int64_t i = 0; i < output_rows; ++i) {
          full[c.output_token_ids[static_cast<size_t>(i)]] = head[i];
        }
      }
      if (logits->keep_on_device) {
        const size_t bytes = logits->values.size() * sizeof(float);
        w.widened_logits.reserve(backend_, bytes, "widened logits");
        SPECRUN_CHECK_OK(
            backend_.copy_to_device(w.widened_logits.data(), logits->values.data(), bytes),
            "uploading widened logits");
        logits->device = w.widened_logits.as<float>();
        logits->device_width = c.vocab_size;
        logits->values.clear();
      }
    }
  } catch (...) {
    for (size_t s = 0; s < batch.size(); ++s)
      kv_cache_->truncate(batch[s].sequence, old_lengths[s]);
    throw;
  }
}

void Model::run_layers(int64_t num_tokens, int64_t num_seqs, int64_t max_blocks) {
  const ModelConfig& c = config();
  Workspace& w = *workspace_;
  float* x = w.x.as<float>();
  float* normed = w.normed.as<float>();
  float* q = w.q.as<float>();
  float* k = w.k.as<float>();
  float* v = w.v.as<float>();
  float* attention = w.attention.as<float>();
  float* projected = w.projected.as<float>();
  float* gate = w.gate.as<float>();
  float* up = w.up.as<float>();
  const float eps = static_cast<float>(c.rms_norm_eps);

  if (c.reads_features()) {
    // x = token_proj(embedding(token)) + feature_proj(feature): [tokens, hidden]
    float* embedded = w.token_embedding.as<float>();
    SPECRUN_CHECK_OK(backend_.embedding({num_tokens, c.vocab_size, c.embedding_columns(),
                                         weights_.embedding.dtype, weights_.embedding.layout},
                                        w.tokens, weights_.embedding.data, embedded),
                     "embedding");
    matmul(embedded, weights_.token_projection, WeightView{}, num_tokens, x, "token_proj", -1);
    matmul(w.features.as<float>(), weights_.feature_projection, WeightView{}, num_tokens,
           w.projected.as<float>(), "feature_proj", -1);
    SPECRUN_CHECK_OK(backend_.add(num_tokens * c.hidden_size, w.projected.as<float>(), x),
                     "adding the projected features");
  } else {
    SPECRUN_CHECK_OK(
        backend_.embedding({num_tokens, c.vocab_size, c.hidden_size, weights_.embedding.dtype,
                            weights_.embedding.layout, c.embedding_scale},
                           w.tokens, weights_.embedding.data, x),
        "embedding");
  }
  // Each residual add runs with the norm after it (one launch on a device); only the first layer's
  // attention norm runs alone, and only the last residual add.
  if (c.num_layers > 0) {
    const WeightView& norm = weights_.layers[0].attention_norm;
    SPECRUN_CHECK_OK(
        backend_.rmsnorm({num_tokens, c.hidden_size, eps, norm.dtype}, x, norm.data, normed),
        layer_op("attention norm", 0));
  }
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& l = weights_.layers[static_cast<size_t>(layer)];
    matmul_group(
        normed, {{{&l.q_proj, &l.q_bias, q}, {&l.k_proj, &l.k_bias, k}, {&l.v_proj, &l.v_bias, v}}},
        num_tokens, "q/k/v projections", layer);
    if (c.qk_norm) {
      // Each head's channels normalised on their own, in place: [tokens * heads, head_dim].
      SPECRUN_CHECK_OK(backend_.rmsnorm({num_tokens * c.num_heads, c.head_dim, eps, l.q_norm.dtype},
                                        q, l.q_norm.data, q),
                       layer_op("query norm", layer));
      SPECRUN_CHECK_OK(
          backend_.rmsnorm({num_tokens * c.num_kv_heads, c.head_dim, eps, l.k_norm.dtype}, k,
                           l.k_norm.data, k),
          layer_op("key norm", layer));
    }
    const float* inv_freq =
        c.local_rope(layer) ? local_inv_freq_.as<float>() : inv_freq_.as<float>();
    SPECRUN_CHECK_OK(
        backend_.rope_kv_write({num_tokens, c.num_heads, c.num_kv_heads, c.head_dim, c.rope_style},
                               {num_tokens, c.num_kv_heads, c.head_dim,
                                kv_cache_->capacity_tokens(), kv_cache_->layout().dtype},
                               w.positions, inv_freq, w.slots, q, k, v, kv_cache_->keys(layer),
                               kv_cache_->values(layer)),
        layer_op("rope and KV cache write", layer));
    const float query_scale =
        c.query_scale > 0.0f ? c.query_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const kernels::AttentionParams attention_params{num_seqs,
                                                    num_tokens,
                                                    c.num_heads,
                                                    c.num_kv_heads,
                                                    c.head_dim,
                                                    kv_cache_->layout().block_size,
                                                    max_blocks,
                                                    query_scale,
                                                    c.layer_window(layer),
                                                    kv_cache_->layout().dtype};
    SPECRUN_CHECK_OK(
        backend_.attention(attention_params, q, kv_cache_->keys(layer), kv_cache_->values(layer),
                           w.query_start, w.context_lengths, w.block_tables, w.key_gaps, attention),
        layer_op("attention", layer));
    matmul(attention, l.o_proj, l.o_bias, num_tokens, projected, "o_proj", layer);
    if (c.output_norms) {
      SPECRUN_CHECK_OK(
          backend_.rmsnorm({num_tokens, c.hidden_size, eps, l.attention_output_norm.dtype},
                           projected, l.attention_output_norm.data, projected),
          layer_op("attention output norm", layer));
    }
    SPECRUN_CHECK_OK(backend_.add_rmsnorm({num_tokens, c.hidden_size, eps, l.mlp_norm.dtype},
                                          projected, x, l.mlp_norm.data, normed),
                     layer_op("attention residual and mlp norm", layer));

    matmul_group(normed, {{{&l.gate_proj, &l.gate_bias, gate}, {&l.up_proj, &l.up_bias, up}}},
                 num_tokens, "gate/up projections", layer);
    const kernels::GateActivation activation = c.mlp_activation == MlpActivation::kGeluTanh
                                                   ? kernels::GateActivation::kGeluTanh
                                                   : kernels::GateActivation::kSilu;
    SPECRUN_CHECK_OK(
        backend_.gated_activation({num_tokens, c.intermediate_size, activation}, gate, up, gate),
        layer_op("gated activation", layer));
    matmul(gate, l.down_proj, l.down_bias, num_tokens, projected, "down_proj", layer);
    if (c.output_norms) {
      SPECRUN_CHECK_OK(backend_.rmsnorm({num_tokens, c.hidden_size, eps, l.mlp_output_norm.dtype},
                                        projected, l.mlp_output_norm.data, projected),
                       layer_op("mlp output norm", layer));
    }
    if (layer + 1 < c.num_layers) {
      const WeightView& next_norm = weights_.layers[static_cast<size_t>(layer) + 1].attention_norm;
      SPECRUN_CHECK_OK(backend_.add_rmsnorm({num_tokens, c.hidden_size, eps, next_norm.dtype},
                                            projected, x, next_norm.data, normed),
                       layer_op("mlp residual and the next attention norm", layer));
    } else {
      SPECRUN_CHECK_OK(backend_.add(num_tokens * c.hidden_size, projected, x),
                       layer_op("mlp residual", layer));
    }
  }
}

}  // namespace specrun
