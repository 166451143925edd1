// The op interface. The transformer forward in runtime/ is written once against Backend; the
// CPU backend (kernels/cpu/) is the reference and the embedded default, the CUDA backend
// (kernels/cuda/) implements the same calls on a stream.
//
// Conventions shared by every op:
// - Pointers are device pointers of the backend (host pointers for the CPU backend).
// - Activations are f32, row-major; weights keep their stored dtype (F32, F16, BF16).
// - A Backend is one stream of its device's work: ops are enqueued in order, and their results
//   are visible to later ops of the same stream, and to the host after synchronize() or a copy to
//   the host. Another stream of the same device (create_stream) runs beside it, ordered against
//   it only by events: record() on one stream, wait() on the other.
// - Every op returns a Status and never throws; a failed status leaves outputs unspecified.
// - Batch invariance: every output element is computed by the same instructions in the same
//   reduction order however many rows or tokens share the call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/core/dtype.h"
#include "kernels/core/random_stream.h"
#include "kernels/core/status.h"
#include "kernels/core/weight_layout.h"

namespace specrun::kernels {

struct EmbeddingParams {
  int64_t num_tokens;  // rows to gather
  int64_t vocab_size;  // rows in the table; an id outside [0, vocab_size) is kOutOfRange
  int64_t dim;         // row width
  DType table_dtype;   // storage dtype of the table
  // The table's layout: a tied LM head shares it, so it is laid out as the backend's matmul
  // weights are (Backend::matmul_weight_layout).
  WeightLayout table_layout = WeightLayout::kRows;
  float scale = 1.0f;  // every gathered element is multiplied by it (Gemma: sqrt(dim)); finite
};

struct RmsNormParams {
  int64_t rows;        // independent rows to normalise
  int64_t dim;         // row width
  float eps;           // added to the mean square before the reciprocal square root
  DType weight_dtype;  // storage dtype of the per-channel gain
};

// out[rows, out_features] = x[rows, in_features] @ weight[out_features, in_features]^T + bias
//
// A quantized weight (FP8, INT8) holds codes: weight[o, i] = code[o, i] * scale, where the scale of
// (o, i) is scales[(o / scale_block_rows) * scale_grid_columns() + i / scale_block_cols]. Per
// output channel: blocks of 1 x in_features; per tensor: out_features x in_features; block-wise
// FP8 checkpoints: 128 x 128. scale_block_cols is a multiple of 16 or at least in_features.
struct MatmulParams {
  int64_t rows;                  // activation rows (tokens); 1 for decode, gamma + 1 to verify
  int64_t in_features;           // reduction length
  int64_t out_features;          // weight rows
  DType weight_dtype;            // storage dtype of the weight
  DType bias_dtype;              // storage dtype of the bias; ignored when bias is null
  int64_t scale_block_rows = 0;  // quantized weights: output rows sharing a scale
  int64_t scale_block_cols = 0;  // quantized weights: input columns sharing a scale
  // How the weight's elements lie (kernels/core/weight_layout.h); a backend takes its own
  // matmul_weight_layout(weight_dtype) and kRows.
  WeightLayout weight_layout = WeightLayout::kRows;

  int64_t scale_grid_columns() const {
    return (in_features + scale_block_cols - 1) / scale_block_cols;
  }
};

// One linear layer of a group that reads the same activations (q, k and v; gate and up).
struct MatmulTarget {
  MatmulParams params;         // rows and in_features are the group's, the same for every target
  const void* weight;          // [out_features, in_features] weight_dtype
  const float* weight_scales;  // the scale grid of a quantized weight, or null
  const void* bias;            // [out_features] bias_dtype, or null
  float* out;                  // [rows, out_features]; must not alias x
};

// The most targets one matmul_group call takes.
inline constexpr size_t kMaxMatmulGroup = 3;

// kInvalidArgument unless the group has 1..kMaxMatmulGroup targets of valid shape sharing rows and
// in_features, each quantized weight with scales in blocks of whole 16-column groups (or one
// block across the row): what every backend's matmul and matmul_group accept.
// Out of line, in a file compiled for the build's baseline: every copy of the CPU matmul calls it
// (kernels/core/isa_namespace.h).
Status check_matmul_group(const MatmulTarget* targets, size_t count);

// Which pairs of channels a rotation mixes.
enum class RopeStyle : uint8_t {
  kRotateHalf,   // (i, i + head_dim/2): Hugging Face checkpoints
  kInterleaved,  // (2i, 2i + 1): Meta's original and GGUF checkpoints
};

struct RopeParams {
  int64_t num_tokens;    // rows of q and k
  int64_t num_heads;     // query heads per row
  int64_t num_kv_heads;  // key heads per row
  int64_t head_dim;      // channels per head, even
  RopeStyle style;       // channel pairing
};

// The dtypes a KV cache is stored in: kBF16 (half the memory and the bytes attention reads; each
// key and value rounded to nearest even as it is written) or kF32 (exact, for the reference
// comparisons). Anything else is kInvalidArgument.
inline bool is_kv_cache_dtype(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF32;
}

struct KvWriteParams {
  int64_t num_tokens;    // rows of k and v to store
  int64_t num_kv_heads;  // heads per row
  int64_t head_dim;      // channels per head
  int64_t num_slots;     // capacity of the cache in tokens (num_blocks * block_size)
  DType cache_dtype;     // storage dtype of the cache (is_kv_cache_dtype)
};

struct AttentionParams {
  int64_t num_seqs;            // sequences in the batch
  int64_t num_tokens;          // query tokens over all sequences
  int64_t num_heads;           // query heads
  int64_t num_kv_heads;        // key/value heads; num_heads is a multiple (grouped-query)
  int64_t head_dim;            // channels per head
  int64_t block_size;          // tokens per KV block
  int64_t max_blocks_per_seq;  // row stride of the block tables
  float scale;                 // softmax scale, usually 1/sqrt(head_dim)
  int64_t sliding_window;      // attend to at most this many latest positions; 0: no limit
  DType cache_dtype;           // storage dtype of the cache (is_kv_cache_dtype); keys and values
                               // are widened to f32 exactly before any arithmetic
};

// Token ids moved from where one op wrote them to where the next reads them (gather).
struct GatherParams {
  int64_t count;         // entries of index and out
  int64_t source_count;  // entries of source; an index outside [-1, source_count) is kOutOfRange
};

// Rows of floats moved the same way, widened through a column map (gather_rows).
struct RowGatherParams {
  int64_t rows;         // rows of index and out
  int64_t width;        // entries of a source row
  int64_t source_rows;  // rows of source; an index outside [-1, source_rows) is kOutOfRange
  int64_t out_width;    // entries of an out row: at least width; a column outside [0, out_width)
                        // is kOutOfRange
};

// out[i] = low + (high - low) * uniform_at(seed, i) (kernels/core/uniform_hash.h), rounded to
// the dtype (8-bit codes: FP8 saturating at 448, INT8 at [-128, 127]): synthetic weights, bit for
// bit the same on every backend.
struct FillParams {
  int64_t count;  // elements to write
  DType dtype;    // storage dtype of out
  uint64_t seed;  // the stream; element i depends on (seed, i) alone
  float low;      // range, finite, low <= high (equal: a constant)
  float high;
};

// The activation of a gated MLP's gate: out = act(gate) * up.
enum class GateActivation {
  kSilu,      // SwiGLU: g / (1 + exp(-g))
  kGeluTanh,  // GeGLU, tanh's approximation: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))
};

struct GatedActivationParams {
  int64_t rows;                                       // tokens
  int64_t dim;                                        // intermediate width
  GateActivation activation = GateActivation::kSilu;  // what the gate goes through
};

// ---- Sampling and verification --------------------------------------------------------------
// A speculative step's logits never need to leave the backend: they are processed into
// distributions, drafts are verified against them and tokens drawn from them here, and only the
// tokens (a few bytes a row) are copied back.

// One row's logits processing (the runtime's SamplingParams less what only the host reads).
struct LogitsSettings {
  float temperature;  // 0: a point mass on the argmax; otherwise logits are divided by it
  int32_t top_k;      // keep the k most probable tokens; 0 (or >= vocab): off
  float top_p;        // keep the fewest most probable tokens whose mass reaches it; 1: off
  float min_p;        // drop tokens below min_p times the most probable; 0: off
};

// What process_logits reports per row. A row that is not kOk is all zeros (no mass): the caller
// decides what a failed row means (the runtime throws, naming it).
enum class RowStatus : int32_t {
  kOk = 0,
  kBadSettings = 1,    // temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], min_p
                       // outside [0, 1]
  kCorruptLogits = 2,  // NaN or +infinity among the logits
  kAllBanned = 3,      // every logit is -infinity
};

// "the logits hold NaN or +infinity", for an error naming what failed.
const char* row_status_message(RowStatus status);

struct LogitsParams {
  int64_t rows;   // independent rows (sequences, or a verification's positions)
  int64_t vocab;  // row width
};

// One change to one logit of a row (edit_logits), what a request's penalties and logit bias make
// of it: the repetition penalty's scaling, then an addition.
struct LogitEdit {
  int32_t token;     // the column; at most once among a row's edits
  float repetition;  // x > 0 ? x / repetition : x * repetition (1: unchanged)
  float add;         // then + add (frequency and presence penalties, logit bias)
};

struct LogitEditParams {
  int64_t rows;        // rows of logits
  int64_t vocab;       // row width
  int64_t mask_words;  // 32-bit words per row of the masks, (vocab + 31) / 32; 0: no masks
};

// The most likely tokens token_logprobs reports per row, at most (OpenAI's top_logprobs bound).
inline constexpr int64_t kMaxTopLogprobs = 20;

struct LogprobParams {
  int64_t rows;   // rows of logits
  int64_t vocab;  // row width
  int64_t top;    // most likely tokens reported per row, in [0, kMaxTopLogprobs]
};

// The rule a verified row follows (verify/verifier.h describes each).
enum class VerifyRule : int32_t {
  kGreedy = 0,       // accept while the draft is the argmax; the new token is the argmax
  kRejection = 1,    // accept with probability min(1, p/q); recover from max(0, p - q)
  kSharedNoise = 2,  // accept while the draft is the target's Gumbel-max token under the shared
                     // noise of its position; the new token is the target's own
};

// One row of a verification: what the host knows of it, a few words.
struct VerifyRow {
  uint64_t seed;     // the row's random stream (kernels/core/random_stream.h)
  int64_t position;  // the output position p_0 decides; p_i decides position + i
  int64_t p_row;     // the row of p holding p_0; p_i is row p_row + i
  int32_t count;     // drafts d_1..d_count, count <= gamma
  VerifyRule rule;   // how the row is decided
};

struct VerifyParams {
  int64_t batch;             // rows
  int64_t gamma;             // the most drafts a row holds: the row stride of drafts, q, alternates
  int64_t p_rows;            // rows of p
  int64_t vocab;             // width of p's rows
  int64_t vocab_q;           // width of q's rows (0 without q); q is zero past it, p past vocab
  int64_t alternates_width;  // other guesses per draft position (0: none)
};

// The most alternates a draft position may have.
inline constexpr int64_t kMaxAlternates = 16;

// How sample() picks a row's token, and ranks the others after it.
enum class SampleRule : int32_t {
  kArgmax = 0,       // the argmax of the logits (temperature 0); ranked by logit
  kInverseCdf = 1,   // inverse CDF over q with the uniform of (position, draw); ranked by q
  kSharedNoise = 2,  // Gumbel-max over q with the noise of position; ranked in the order the
                     // noise's draw would pick them were the ones before removed
};

// The most tokens sample() ranks in a row.
inline constexpr int64_t kMaxRanked = 16;

// One row of a sample call: a draft model's draw and what the host decides from it.
struct SampleRow {
  LogitsSettings settings;  // how q is processed from the row's logits
  uint64_t seed;            // the row's random stream (kernels/core/random_stream.h)
  int64_t position;         // the output position the token is drawn for
  SampleRule rule;          // how the token is drawn
  Draw draw;                // what kInverseCdf's uniform is drawn for
  int32_t ranked;           // tokens to rank, 0 to kMaxRanked
  int32_t probe;            // a token whose weight is wanted beside the drawn one's; -1: none
  int32_t weigh;            // nonzero: the model's confidence and the weights are reported (one
                            // more pass over the logits); zero: they are left 0
};

struct SampleParams {
  int64_t rows;   // independent rows
  int64_t width;  // entries per row of logits and q
  int64_t vocab;  // token ids lie in [0, vocab): width without a token map, else at least it
};

// What the host reads back of a sampled row: a few dozen bytes in place of the vocabulary's
// row. A token's weight is exp(logit - max logit), its probability under softmax(logits) as they
// are (no temperature, no filters) over the top token's: 1 for a top token, 0 for a token the
// row does not score.
struct SampledRow {
  double top_probability;           // the largest probability of softmax(logits) (weigh)
  int32_t token;                    // the drawn token; -1 where the row failed
  int32_t status;                   // RowStatus of the row's processing
  float token_weight;               // the drawn token's weight (weigh)
  float probe_weight;               // the probe's weight (weigh; 0 without a probe)
  int32_t ranked[kMaxRanked];       // the row's ranking, best first, the drawn token included;
                                    // -1 past the tokens that can rank (and past `ranked`)
  float ranked_weight[kMaxRanked];  // their weights (weigh)
};

// kInvalidArgument unless the shapes are ones process_logits and argmax accept: rows >= 0, vocab in
// [1, 2^31 - 1].
Status check_logits(const LogitsParams& params);
// kInvalidArgument unless edit_logits accepts the shape: check_logits' rows and vocab, and
// mask_words 0 or (vocab + 31) / 32 with masks given exactly when it is not 0.
Status check_logit_edits(const LogitEditParams& params, const uint32_t* masks);
// kInvalidArgument unless token_logprobs accepts the shape: check_logits' rows and vocab, top in
// [0, kMaxTopLogprobs].
Status check_logprobs(const LogprobParams& params);
// kInvalidArgument unless the shapes and pointers are ones verify accepts: every count and width
// in range, q's width given with q, alternate rows with alternates.
Status check_verify(const VerifyParams& params, const float* q, const int32_t* alternates,
                    const int64_t* alternate_rows);

// kInvalidArgument unless the shape is one sample accepts: rows >= 0, width in [1, 2^31 - 1],
// vocab in [width, 2^31 - 1] (equal to width without a token map). A row out of range (an unknown
// rule, ranked outside [0, kMaxRanked], bad settings) is not a failed call: its status is
// kBadSettings.
Status check_sample(const SampleParams& params, const int32_t* tokens);

// The forward's ops' shape checks, kInvalidArgument naming the op where a count is negative, a
// width not positive, a head_dim odd, a KV cache's dtype not one it is stored in, a fill's range
// not finite: what Backend checks before any backend runs one.
Status check_embedding(const EmbeddingParams& params);
Status check_rmsnorm(const RmsNormParams& params, const char* op);  // "rmsnorm", "add_rmsnorm"
Status check_matmul(const MatmulParams& params, const float* weight_scales);
Status check_rope(const RopeParams& params);
Status check_kv_write(const KvWriteParams& params);
// rope's and kv_write's, and that the two describe the same tokens and heads.
Status check_rope_kv_write(const RopeParams& rope, const KvWriteParams& cache);
// The parameters; the index data (query_start, context lengths, key gaps) is each backend's to
// check, where it can read it.
Status check_attention(const AttentionParams& params);
Status check_gated_activation(const GatedActivationParams& params);
Status check_fill(const FillParams& params);
Status check_add(int64_t count);
Status check_gather(const GatherParams& params);
Status check_gather_rows(const RowGatherParams& params);

// A model's forwards at their largest, for Backend::scratch_bytes_bound: what a backend's ops may
// ask of memory beyond the buffers the model passes them.
struct ForwardShape {
  std::vector<MatmulParams> matmuls;  // each linear layer, rows the most one forward feeds it
  AttentionParams attention;          // num_tokens the most one forward feeds, one sequence of the
                                      // longest context (max_blocks_per_seq)
  LogitsParams logits{0, 1};          // the rows of logits processed or sampled at once (rows 0:
                                      // none), as wide as the head scores
};

// What has crossed from a backend to the host since it was made: what a step costs beyond its
// ops on a device, where each wait drains the stream and each byte crosses the bus. Counted on
// every backend alike (a CPU's copy is a memcpy), so a test on the CPU pins down the step's shape.
struct TransferCounts {
  int64_t host_waits = 0;      // synchronize() calls and copies to the host (each waits)
  uint64_t bytes_to_host = 0;  // bytes copied to the host
};

// A point in one stream's work (Backend::record), for another stream to wait for
// (Backend::wait). Made by the backend whose streams use it (Backend::create_event).
class Event {
 public:
  virtual ~Event() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu", "cuda:0".
  virtual std::string_view name() const = 0;
  // True when device pointers are host pointers, so weights can be used in place.
  virtual bool uses_host_memory() const = 0;
  // For reports: which copy of the matmul kernels runs ("native", "x86-64-v4+bf16", ...) and what
  // the activations meet the weights as ("f32", "bf16", "int8"); empty where the backend has no
  // such choice.
  virtual std::string_view matmul_kernels() const { return {}; }
  virtual std::string_view matmul_activations() const { return {}; }
  // Whether work on two streams of this backend's device (the draft's and the target's) runs at
  // the same time, so that drafting ahead hides behind a verification (OverlapDrafting::kAuto):
  // a GPU's streams do; the CPU runs each op inline, on one pool of threads.
  virtual bool runs_models_concurrently() const { return false; }

  // ---- Streams and events ----
  // A backend on the same device whose ops run on a stream of their own, with a workspace of its
  // own: the draft model's, beside the target's. Memory is shared: a pointer allocated by either is
  // valid on both and may be freed by either (deallocate waits for the device first). Must not
  // outlive this backend. Throws nothing; null when the stream cannot be made.
  virtual std::unique_ptr<Backend> create_stream() = 0;
  // An event for record() and wait() on this backend and its streams.
  virtual std::unique_ptr<Event> create_event() = 0;
  // Marks the point after every op enqueued on this stream so far (recording again moves it).
  virtual Status record(Event& event) = 0;
  // The ops this stream enqueues from now on run after the event's point, whichever stream of the
  // device recorded it; an event never recorded is a point already passed. The host does not wait.
  virtual Status wait(const Event& event) = 0;
  // Whether attention() takes key gaps (a token tree's branches in one forward).
  virtual bool attends_with_key_gaps() const { return false; }
  // The layout this backend's matmul reads weights of `weight_dtype` in fastest; the model lays
  // its matmul weights (and a table a tied head shares) out this way at load. Every backend also
  // reads kRows.
  virtual WeightLayout matmul_weight_layout(DType /*weight_dtype*/) const {
    return WeightLayout::kRows;
  }

  // Returns null when the allocation fails. Memory is aligned for any dtype and for vector loads.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* pointer) noexcept = 0;
  virtual Status copy_to_device(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual Status copy_to_host(void* host_dst, const void* device_src, size_t bytes) = 0;
  virtual Status copy_on_device(void* device_dst, const void* device_src, size_t bytes) = 0;
  // Waits until every enqueued op has finished.
  virtual Status synchronize() = 0;
  // The backend's transfers so far (a backend that forwards to another reports the other's).
  virtual TransferCounts transfer_counts() const {
    return {host_waits_.load(std::memory_order_relaxed),
            bytes_to_host_.load(std::memory_order_relaxed)};
  }
  // Runs `work` (which enqueues ops) and reports the time the device spent on them, by the
  // device's own clock: events around the work on a GPU's stream, so launch gaps before the first
  // op and the host's wait afterwards stay out; a host clock on a backend whose ops run inline.
  virtual Status time_ms(const std::function<Status()>& work, double* milliseconds) = 0;

  // Runs body(i) for every i in [0, count), on the host: on the backend's own threads where its
  // ops run on host threads (the CPU's pool, idle between two forwards while one thread processes
  // a forward's rows of logits), one after another elsewhere. The calls may run in any order and
  // at once; the first exception a call throws reaches the caller once every call has ended.
  virtual void for_each_on_host(int64_t count, const std::function<void(int64_t)>& body);

  // Memory that allocations on this backend can still take: the device's free memory, or the
  // host's available memory (MemAvailable) for a backend in host memory. kUnsupported where it
  // cannot be known.
  virtual Status available_memory(uint64_t* bytes) = 0;
  // The most memory this backend's ops take for themselves (scratch, a library's workspace) while
  // running forwards of these shapes, all models on it together: the memory plan counts it. 0 for
  // a backend whose ops take nothing beyond what the caller passes.
  virtual uint64_t scratch_bytes_bound(const std::vector<ForwardShape>& /*shapes*/) const {
    return 0;
  }

  // Where a backend's one-time notes go (a slower path taken, say): the runtime sends them to its
  // log. Without a handler they are dropped.
  void set_notice_handler(std::function<void(std::string_view)> handler) {
    notice_handler_ = std::move(handler);
  }

  // ---- Ops --------------------------------------------------------------------------------
  // Each op checks its shapes once, here, for every backend (the check_* functions above), and
  // only then dispatches to the backend's run_* implementation: an implementation may assume the
  // shapes valid, and checks only what it alone can (what the data says, its own resources).

  // out[t, :] = table[token_ids[t], :]
  Status embedding(const EmbeddingParams& params,
                   const int32_t* token_ids,  // [num_tokens]
                   const void* table,         // [vocab_size, dim] table_dtype
                   float* out);
  // [num_tokens, dim]

  // out = x / sqrt(mean(x^2) + eps) * weight, per row; out may alias x.
  Status rmsnorm(const RmsNormParams& params,
                 const float* x,      // [rows, dim]
                 const void* weight,  // [dim] weight_dtype
                 float* out);
  // [rows, dim]

  Status matmul(const MatmulParams& params,
                const float* x,              // [rows, in_features]
                const void* weight,          // [out_features, in_features] weight_dtype
                const float* weight_scales,  // the scale grid of a quantized weight, or
                                             // null for the others
                const void* bias,            // [out_features] bias_dtype, or null
                float* out);
  // [rows, out_features]; must not alias x

  // Every target's out exactly as matmul() computes it, bit for bit, in as few launches as the
  // backend can (a device launches one kernel for the group where its kernels allow: every weight
  // read in one pass instead of one kernel's ramp and tail each). Up to kMaxMatmulGroup targets
  // with the same rows and in_features; this default runs them one by one.
  Status matmul_group(const float* x,               // [rows, in_features]
                      const MatmulTarget* targets,  // [count]
                      size_t count);

  // Rotates q and k in place by position * inv_freq.
  Status rope(const RopeParams& params,
              const int32_t* positions,  // [num_tokens]
              const float* inv_freq,     // [head_dim / 2]
              float* q,                  // [num_tokens, num_heads, head_dim]
              float* k);
  // [num_tokens, num_kv_heads, head_dim]

  // rope() on q and k, then kv_write() of the rotated k and of v: bitwise the two calls, in as few
  // launches as the backend can (a device rotates and stores in one pass over k and v); this
  // default makes the two calls. rope and cache describe the same tokens, KV heads and head_dim.
  Status rope_kv_write(const RopeParams& rope, const KvWriteParams& cache,
                       const int32_t* positions,  // [num_tokens]
                       const float* inv_freq,     // [head_dim / 2]
                       const int32_t* slots,      // [num_tokens]
                       float* q,                  // [num_tokens, num_heads, head_dim]
                       float* k,                  // [num_tokens, num_kv_heads, head_dim]
                       const float* v,            // [num_tokens, num_kv_heads, head_dim]
                       void* k_cache,             // [num_slots, num_kv_heads, head_dim] cache_dtype
                       void* v_cache);

  // Stores each token's k and v at its cache slot (block * block_size + offset), rounded to the
  // cache's dtype.
  Status kv_write(const KvWriteParams& params,
                  const float* k,        // [num_tokens, num_kv_heads, head_dim]
                  const float* v,        // [num_tokens, num_kv_heads, head_dim]
                  const int32_t* slots,  // [num_tokens]
                  void* k_cache,         // [num_slots, num_kv_heads, head_dim] cache_dtype
                  void* v_cache);
  // [num_slots, num_kv_heads, head_dim] cache_dtype

  // Causal attention of each sequence's new tokens over its paged cache, which already holds
  // them. Sequence s owns query rows [query_start[s], query_start[s+1]); its cache holds
  // context_lengths[s] positions, the last of them the new tokens, so query row i of n attends
  // to positions [0, context_length - n + i].
  //
  // Key gaps (null: none; only where attends_with_key_gaps()): query row t skips the positions
  // [key_gaps[2t], key_gaps[2t + 1]) of its sequence (an empty range skips nothing). A token tree
  // in one forward: a branch forking from the chain of new tokens sits after it in the cache and
  // skips the chain past its fork. The sliding window counts from the row's position less the
  // gap's length, which is the row's position in its own branch.
  Status attention(const AttentionParams& params,
                   const float* q,                  // [num_tokens, num_heads, head_dim]
                   const void* k_cache,             // [slots, num_kv_heads, head_dim] cache_dtype
                   const void* v_cache,             // [slots, num_kv_heads, head_dim] cache_dtype
                   const int32_t* query_start,      // [num_seqs + 1]
                   const int32_t* context_lengths,  // [num_seqs]
                   const int32_t* block_tables,     // [num_seqs, max_blocks_per_seq]
                   const int32_t* key_gaps,         // [num_tokens, 2] or null
                   float* out);
  // [num_tokens, num_heads, head_dim]

  // out = silu(gate) * up; out may alias gate.
  Status gated_activation(const GatedActivationParams& params,
                          const float* gate,  // [rows, dim]
                          const float* up,    // [rows, dim]
                          float* out);
  // [rows, dim]

  Status fill_uniform(const FillParams& params, void* out);
  // [count] dtype

  // out[i] = source[index[i]] where index[i] >= 0; out[i] keeps its value where index[i] is -1.
  // Moves ids one op wrote on the backend (a draft's draws, round after round) to where later ops
  // read them (the target's forward and its verification), with no host read between. An index
  // outside [-1, source_count) is kOutOfRange (a device reports it at its next host wait) and its
  // entry is left as it was. out must not overlap source.
  Status gather(const GatherParams& params,
                const int32_t* source,  // [source_count]
                const int32_t* index,   // [count]
                int32_t* out);
  // [count]

  // out[r, :] = 0, then out[r, columns[c]] = source[index[r], c] for each c < width (columns null:
  // column c): rows one op wrote (a draft's q, round after round, over a reduced head's columns)
  // laid out as the next reads them (verify's [batch, gamma, vocab] q). A row whose index is -1 is
  // all zeros. A bad index or column is kOutOfRange (a device reports it at its next host wait);
  // the rest of the rows are still written. out must not overlap source.
  Status gather_rows(const RowGatherParams& params,
                     const float* source,     // [source_rows, width]
                     const int32_t* index,    // [rows]
                     const int32_t* columns,  // [width], or null
                     float* out);
  // [rows, out_width]

  // probs[r] = the processed distribution of logits[r] under settings[r]: temperature, top-k,
  // top-p, min-p in that order, ties ranked by lower token id, the kept weights renormalised; a
  // point mass on the argmax at temperature 0. row_status[r] says whether row r could be processed;
  // a row that could not is all zeros.
  Status process_logits(const LogitsParams& params,
                        const float* logits,             // [rows, vocab]
                        const LogitsSettings* settings,  // [rows]
                        float* probs,                    // [rows, vocab]
                        int32_t* row_status);
  // [rows] RowStatus

  // out[r] = the index of the highest value of row r, the lowest among equals.
  Status argmax(const LogitsParams& params,
                const float* values,  // [rows, vocab]
                int32_t* out);
  // [rows]

  // A request's logits processors, applied to its rows in place before process_logits: row r's
  // edits (entries [edit_begin[r], edit_begin[r + 1]) of `edits`) set logits[r, token] to
  // (x > 0 ? x / repetition : x * repetition) + add, skipping a token outside [0, vocab); then,
  // with masks, every token whose bit is clear in row r's mask (bit t % 32 of word t / 32) is
  // -infinity: a grammar's allowed tokens. kernels/cpu/logit_edits.h is the reference.
  Status edit_logits(const LogitEditParams& params,
                     const int64_t* edit_begin,  // [rows + 1]
                     const LogitEdit* edits,     // [edit_begin[rows]]
                     const uint32_t* masks,      // [rows, mask_words], or null (mask_words 0)
                     float* logits);
  // [rows, vocab] in place

  // The log-softmax of each row, log p(t) = x_t - log sum_j exp x_j, where a client reads it
  // (OpenAI's logprobs): at row r's chosen token, tokens[token_slots[r]], into chosen[r] (0 where
  // the slot is -1 or the token outside the row), and at its `top` most likely tokens, highest
  // first and the lower id among equals, into top_tokens[r, :] and top_logprobs[r, :]. The chosen
  // token is read through a slot so that it may be what another op wrote on the backend (a
  // verdict's tokens) without the host reading it first. kernels/cpu/logprobs.h is the reference.
  Status token_logprobs(const LogprobParams& params,
                        const float* logits,         // [rows, vocab]
                        const int32_t* token_slots,  // [rows] index into tokens, or -1
                        const int32_t* tokens,       // what token_slots index
                        float* chosen,               // [rows]
                        int32_t* top_tokens,         // [rows, top]
                        float* top_logprobs);
  // [rows, top]

  // Decides each row's drafts against the target's processed distributions by the row's rule,
  // with the random numbers of its stream at the positions it decides (kernels/cpu/verify.h is the
  // reference). Row b writes d_1..d_k, then the new token, then -1 into tokens[b] and k into
  // accepted[b]. Alternates (greedy and shared noise only): where the first token the target
  // disagrees with is one of that position's alternates, it is accepted too and the target's token
  // after it, drawn from the row of p that alternate_rows names, is the new one;
  // alternate_taken[b] is then its entry (i * alternates_width + k for alternate k of draft i,
  // from 0), else -1. A row that cannot be decided (a count outside [0, gamma], a row of p outside
  // p_rows, a row of p it reads whose p_status is not kOk, a draw from a distribution with no mass)
  // gets accepted[b] = -1 and a row of -1.
  Status verify(const VerifyParams& params,
                const VerifyRow* rows,          // [batch]
                const float* p,                 // [p rows, vocab]
                const int32_t* p_status,        // [p rows] RowStatus, or null: all kOk
                const float* q,                 // [batch, gamma, vocab_q], or null: each
                                                // draft a point mass
                const int32_t* drafts,          // [batch, gamma], -1 past a row's count
                const int32_t* alternates,      // [batch, gamma, width] -1: none; or null
                const int64_t* alternate_rows,  // [batch, gamma, width] row of p after
                                                // each alternate; null with alternates
                int32_t* tokens,                // [batch, gamma + 1]
                int32_t* accepted,              // [batch]
                int32_t* alternate_taken);
  // [batch]

  // A draft model's step of sampling, for each row r: q[r] = the processed distribution of
  // logits[r] under rows[r].settings (process_logits), the token drawn from it by the row's rule,
  // the ranking of the row's tokens by that rule, and (where asked) the model's confidence and the
  // weights of the tokens reported, into out[r]. A row whose logits cannot be processed gets its
  // status, token -1 and no ranking. With a token map, entry i of a row stands for token
  // tokens[i] (a reduced head's rows), and every token reported is an id: the draws, ranking and
  // weights are those the full row (-infinity past the map) would give. Where `drawn` is given,
  // each row's token is written there too, contiguous and 0 where the row failed: what the
  // model's next forward reads straight from the backend's memory (SequenceInput::device_tokens)
  // without the host waiting for it. kernels/cpu/sampling.h's sample_row is the reference.
  Status sample(const SampleParams& params,
                const SampleRow* rows,  // [rows]
                const float* logits,    // [rows, width]
                const int32_t* tokens,  // [width], strictly increasing; or null
                float* q,               // [rows, width]
                SampledRow* out,        // [rows]
                int32_t* drawn);
  // [rows] or null

  // accumulator += addend, elementwise (the residual connection).
  Status add(int64_t count,
             const float* addend,  // [count]
             float* accumulator);
  // [count]

  // add() of the rows, then rmsnorm() of the sums into out (a residual connection and the norm
  // after it): bitwise the two calls, in one launch where the backend can; this default makes the
  // two calls. out must not alias accumulator or addend.
  Status add_rmsnorm(const RmsNormParams& params,
                     const float* addend,  // [rows, dim]
                     float* accumulator,   // [rows, dim]
                     const void* weight,   // [dim] weight_dtype
                     float* out);

 protected:
  // The ops' implementations, called with shapes already checked (the public op of the same name).
  // matmul_group, rope_kv_write and add_rmsnorm default to the ops they fuse, one after another.
  virtual Status run_embedding(const EmbeddingParams& params,
                               const int32_t* token_ids,  // [num_tokens]
                               const void* table,         // [vocab_size, dim] table_dtype
                               float* out) = 0;
  virtual Status run_rmsnorm(const RmsNormParams& params,
                             const float* x,      // [rows, dim]
                             const void* weight,  // [dim] weight_dtype
                             float* out) = 0;
  virtual Status run_matmul(const MatmulParams& params,
                            const float* x,              // [rows, in_features]
                            const void* weight,          // [out_features, in_features] weight_dtype
                            const float* weight_scales,  // the scale grid of a quantized weight, or
                                                         // null for the others
                            const void* bias,            // [out_features] bias_dtype, or null
                            float* out) = 0;
  virtual Status run_matmul_group(const float* x,               // [rows, in_features]
                                  const MatmulTarget* targets,  // [count]
                                  size_t count);
  virtual Status run_rope(const RopeParams& params,
                          const int32_t* positions,  // [num_tokens]
                          const float* inv_freq,     // [head_dim / 2]
                          float* q,                  // [num_tokens, num_heads, head_dim]
                          float* k) = 0;
  virtual Status run_rope_kv_write(
      const RopeParams& rope, const KvWriteParams& cache,
      const int32_t* positions,  // [num_tokens]
      const float* inv_freq,     // [head_dim / 2]
      const int32_t* slots,      // [num_tokens]
      float* q,                  // [num_tokens, num_heads, head_dim]
      float* k,                  // [num_tokens, num_kv_heads, head_dim]
      const float* v,            // [num_tokens, num_kv_heads, head_dim]
      void* k_cache,             // [num_slots, num_kv_heads, head_dim] cache_dtype
      void* v_cache);
  virtual Status run_kv_write(const KvWriteParams& params,
                              const float* k,        // [num_tokens, num_kv_heads, head_dim]
                              const float* v,        // [num_tokens, num_kv_heads, head_dim]
                              const int32_t* slots,  // [num_tokens]
                              void* k_cache,  // [num_slots, num_kv_heads, head_dim] cache_dtype
                              void* v_cache) = 0;
  virtual Status run_attention(const AttentionParams& params,
                               const float* q,       // [num_tokens, num_heads, head_dim]
                               const void* k_cache,  // [slots, num_kv_heads, head_dim] cache_dtype
                               const void* v_cache,  // [slots, num_kv_heads, head_dim] cache_dtype
                               const int32_t* query_start,      // [num_seqs + 1]
                               const int32_t* context_lengths,  // [num_seqs]
                               const int32_t* block_tables,     // [num_seqs, max_blocks_per_seq]
                               const int32_t* key_gaps,         // [num_tokens, 2] or null
                               float* out) = 0;
  virtual Status run_gated_activation(const GatedActivationParams& params,
                                      const float* gate,  // [rows, dim]
                                      const float* up,    // [rows, dim]
                                      float* out) = 0;
  virtual Status run_fill_uniform(const FillParams& params, void* out) = 0;
  virtual Status run_gather(const GatherParams& params,
                            const int32_t* source,  // [source_count]
                            const int32_t* index,   // [count]
                            int32_t* out) = 0;      // [count]
  virtual Status run_gather_rows(const RowGatherParams& params,
                                 const float* source,     // [source_rows, width]
                                 const int32_t* index,    // [rows]
                                 const int32_t* columns,  // [width], or null
                                 float* out) = 0;         // [rows, out_width]
  virtual Status run_process_logits(const LogitsParams& params,
                                    const float* logits,             // [rows, vocab]
                                    const LogitsSettings* settings,  // [rows]
                                    float* probs,                    // [rows, vocab]
                                    int32_t* row_status) = 0;
  virtual Status run_argmax(const LogitsParams& params,
                            const float* values,  // [rows, vocab]
                            int32_t* out) = 0;
  virtual Status run_edit_logits(const LogitEditParams& params,
                                 const int64_t* edit_begin,  // [rows + 1]
                                 const LogitEdit* edits,     // [edit_begin[rows]]
                                 const uint32_t* masks,      // [rows, mask_words] or null
                                 float* logits) = 0;         // [rows, vocab]
  virtual Status run_token_logprobs(const LogprobParams& params,
                                    const float* logits,         // [rows, vocab]
                                    const int32_t* token_slots,  // [rows]
                                    const int32_t* tokens,
                                    float* chosen,             // [rows]
                                    int32_t* top_tokens,       // [rows, top]
                                    float* top_logprobs) = 0;  // [rows, top]
  virtual Status run_verify(const VerifyParams& params,
                            const VerifyRow* rows,      // [batch]
                            const float* p,             // [p rows, vocab]
                            const int32_t* p_status,    // [p rows] RowStatus, or null: all kOk
                            const float* q,             // [batch, gamma, vocab_q], or null: each
                                                        // draft a point mass
                            const int32_t* drafts,      // [batch, gamma], -1 past a row's count
                            const int32_t* alternates,  // [batch, gamma, width] -1: none; or null
                            const int64_t* alternate_rows,  // [batch, gamma, width] row of p after
                                                            // each alternate; null with alternates
                            int32_t* tokens,                // [batch, gamma + 1]
                            int32_t* accepted,              // [batch]
                            int32_t* alternate_taken) = 0;
  virtual Status run_sample(const SampleParams& params,
                            const SampleRow* rows,  // [rows]
                            const float* logits,    // [rows, width]
                            const int32_t* tokens,  // [width], strictly increasing; or null
                            float* q,               // [rows, width]
                            SampledRow* out,        // [rows]
                            int32_t* drawn) = 0;
  virtual Status run_add(int64_t count,
                         const float* addend,  // [count]
                         float* accumulator) = 0;
  virtual Status run_add_rmsnorm(const RmsNormParams& params,
                                 const float* addend,  // [rows, dim]
                                 float* accumulator,   // [rows, dim]
                                 const void* weight,   // [dim] weight_dtype
                                 float* out);

  void notice(std::string_view message) const {
    if (notice_handler_) notice_handler_(message);
  }
  // For a stream made by create_stream, which sends its notices where this backend's go.
  const std::function<void(std::string_view)>& notice_handler() const { return notice_handler_; }
  // Every implementation of copy_to_host and synchronize counts itself here.
  void count_copy_to_host(size_t bytes) {
    host_waits_.fetch_add(1, std::memory_order_relaxed);
    bytes_to_host_.fetch_add(bytes, std::memory_order_relaxed);
  }
  void count_synchronize() { host_waits_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::function<void(std::string_view)> notice_handler_;
  std::atomic<int64_t> host_waits_{0};
  std::atomic<uint64_t> bytes_to_host_{0};
};

}  // namespace specrun::kernels
