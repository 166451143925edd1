// specrun's public C++ API: an engine that holds a target model (and optionally a draft model),
// runs many requests at once with continuous batching under speculative decoding, and streams
// their tokens and text back. Thread-safe: any thread may submit, cancel, read stats or shut down.
//
//   auto engine = specrun::Engine::create({.target = "models/pycode-target",
//                                          .draft = "models/pycode-draft"});
//   specrun::Request request;
//   request.prompt = "def fib(n):\n";
//   specrun::Result result = engine->submit(request).wait();
//
// The C ABI over this API is specrun.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "specrun/error.hpp"
#include "specrun/logprobs.hpp"
#include "specrun/settings.hpp"
#include "specrun/stats.hpp"

namespace specrun {

// Every field has a default member initializer, so designated initializers may name any subset
// without -Wmissing-field-initializers warnings.
struct EngineConfig {
  std::string target{};         // checkpoint: a directory, .safetensors, index or .gguf file
  std::string draft{};          // draft checkpoint sharing the target's tokenizer; "" none
  std::string device = "cpu";   // where the models run: "cpu", "cuda" or "cuda:N"
  int threads = 0;              // CPU threads; 0 uses every core
  int64_t kv_cache_tokens = 0;  // KV capacity per model; 0: the context, at most 8192
  int64_t kv_block_size = 16;   // tokens per KV-cache block
  // Storage of both models' keys and values.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kBF16;
  int64_t max_batch = 64;           // sequences decoded together in one step, at most
  std::string rope_style = "auto";  // RoPE pairing: "auto" (rotate-half, as Hugging Face
                                    // checkpoints), "rotate-half" or "interleaved" (Meta/GGUF)
  bool deterministic = false;       // batch-invariant kernels on every backend (CUDA: slower
                                    // prefill), so output does not depend on batch mates
  // CPU: how matmuls with bf16 (or 8-bit) weights treat their activations (ActivationPrecision).
  ActivationPrecision activations = ActivationPrecision::kAuto;
  Quantization quantize = Quantization::kNone;        // the target's linear layers, at load
  Quantization draft_quantize = Quantization::kNone;  // the draft's
  bool quantize_lm_head = false;  // the quantized models' output projections too (else bf16)
  bool prefix_cache = true;       // a prompt starts from the cached KV blocks of an earlier
                                  // sequence with the same prefix (both models); output is
                                  // the same either way
  // Drafting ahead while the target verifies; output is the same either way.
  OverlapDrafting overlap_drafting = OverlapDrafting::kAuto;
  SamplingSettings sampling{};        // defaults of requests that give none
  SpeculationSettings speculation{};  // defaults of requests that give none

  // Reads a TOML file (configs/default.toml documents every key): [model] target and draft
  // (relative paths are relative to the file), [sampling], [speculative], [runtime]. Throws
  // Error naming the file, line and key of anything unknown, mistyped or out of range.
  //
  // Settings files are trusted input: they name any file the process may read, and errors quote
  // their lines. An embedder taking settings from others passes `model_root`: then every model
  // path, symbolic links and ".." resolved, must lie under that directory.
  static EngineConfig from_toml(const std::string& path, const std::string& model_root = "");
};

// The [server] table of a settings file: how `specrun serve` serves an engine over HTTP (the
// engine itself ignores the table). Every field has a default member initializer.
struct ServerConfig {
  std::string host = "127.0.0.1";        // address to listen on ("0.0.0.0": every interface)
  int port = 8000;                       // TCP port; 0 lets the system pick a free one
  std::string model_name{};              // the model id requests name and /v1/models lists; "": the
                                         // target checkpoint's file or directory name
  std::string chat_template{};           // a Jinja file replacing the checkpoint's chat template
                                         // (relative to the settings file); "": the checkpoint's
  int64_t max_requests = 256;            // requests queued or running at once; more get 429
  int64_t max_body_bytes = 4 << 20;      // larger request bodies get 413
  double shutdown_grace_seconds = 30.0;  // on SIGINT or SIGTERM, in-flight requests may finish
                                         // within this, then are stopped

  // Reads the [server] table of a TOML settings file (other tables are EngineConfig's); errors
  // name the file, line and key, as EngineConfig::from_toml's do.
  static ServerConfig from_toml(const std::string& path);
};

// Structured output: what the generated text must be (docs/structured-output.md). The target's
// distribution at every position is masked to the tokens that keep the text a prefix of a
// sentence of the grammar, and its end-of-sequence tokens are allowed exactly where the text is
// one: the output is exactly the constrained target's, with or without speculation.
enum class ConstraintKind {
  kNone,        // free text
  kJsonObject,  // any JSON object (OpenAI's response_format json_object)
  kJsonSchema,  // JSON valid against the JSON Schema in `text`
  kGbnf,        // a sentence of the GBNF grammar in `text` (llama.cpp's format; its rule root)
};

struct OutputConstraint {
  ConstraintKind kind = ConstraintKind::kNone;
  std::string text{};  // kJsonSchema: the schema as JSON; kGbnf: the grammar; else ""
};

// Checks `constraint` as submit() would (its schema or grammar compiled), without a model, so
// that a front end can refuse a bad one before it has anything to submit. Throws Error naming
// what is wrong (the keyword and its JSON path, the grammar's line and column).
void check_constraint(const OutputConstraint& constraint);

// The GBNF text of the JSON Schema `schema` (JSON text; properties in the order it writes them),
// whose top rule is named `root_rule` rather than `root`: a GBNF grammar that defines `root` and
// the other rules may then embed it (a tool call inside its tags). Its other rule names begin
// "s-" or "json-", or are "ws". Throws Error as a kJsonSchema constraint's would.
std::string json_schema_gbnf(const std::string& schema, const std::string& root_rule = "root");

struct Request {
  std::string prompt{};                              // text; BOS is added as the tokenizer says
  std::vector<int32_t> prompt_ids{};                 // or token ids (then `prompt` must be empty)
  std::optional<SamplingSettings> sampling{};        // default: the engine's
  std::optional<SpeculationSettings> speculation{};  // default: the engine's
  // Added to these tokens' logits at every position (OpenAI's logit_bias: each in [-100, 100], at
  // most 300 tokens), before temperature and the filters.
  std::map<int32_t, float> logit_bias{};
  // The log-probability of every generated token with this many most likely tokens beside it
  // (Event::logprobs, Result::logprobs), at most kMaxTopLogprobs; -1: none.
  int64_t logprobs = -1;
  // The prompt's log-probabilities (each token's after the first, from the target's logits as
  // they are; OpenAI's echo with logprobs, vLLM's prompt_logprobs) with this many top tokens
  // beside each, in the first event (Event::prompt_logprobs, Result::prompt_logprobs), at most
  // kMaxTopLogprobs; -1: none. The prompt is then computed whole, not taken from the prefix cache.
  int64_t prompt_logprobs = -1;
  OutputConstraint constraint{};  // structured output; kNone: free text (needs a tokenizer)
};

// One delivery on a request's stream.
struct Event {
  uint64_t request = 0;         // the request's id
  std::vector<int32_t> tokens;  // tokens committed since the last event (may be empty)
  std::string text;             // their text, whole characters only ("" without a tokenizer)
  bool finished = false;        // the last event of the request
  FinishReason reason = FinishReason::kMaxTokens;  // why it finished (when finished)
  std::string error;                               // what failed (reason kFailed)
  // How speculation made the tokens (an event is one engine step of the request): the target
  // verified `drafted` drafts, and the first `accepted_drafts` of `tokens` are drafts it
  // accepted; the rest (one, unless the request stopped first) it chose itself. Both 0 in a step
  // without drafts, and in a final event that no step sent (cancelled, shut down, failed).
  int64_t drafted = 0;
  int64_t accepted_drafts = 0;
  // Bytes at the start of `text` that those drafts completed; a character that a draft began and
  // the target's token completed is the target's.
  size_t accepted_text = 0;
  std::vector<TokenLogprob> logprobs;  // one per token of `tokens`, where the request asked
  // The prompt's, one per token after its first, in the first event (where the request asked).
  std::vector<TokenLogprob> prompt_logprobs;
};

struct Result {
  uint64_t request = 0;                            // the request's id
  std::vector<int32_t> tokens;                     // every generated token
  std::string text;                                // their text ("" without a tokenizer)
  FinishReason reason = FinishReason::kMaxTokens;  // why it finished
  std::string error;                               // what failed (reason kFailed)
  RequestStats stats;                              // its figures
  std::vector<TokenLogprob> logprobs;              // one per token, where the request asked
  std::vector<TokenLogprob> prompt_logprobs;       // the prompt's, where the request asked
};

// Called on the engine's thread for every event of the request, in order; keep it short. It may
// call cancel() (of any request) but not submit(), wait() or shutdown(), which would deadlock. If
// it throws, its request stops: no more events, and the Result says kFailed with the exception's
// message.
using StreamCallback = std::function<void(const Event&)>;

namespace detail {
struct RequestState;
}

// A submitted request. Copies share the request; it stays valid after the engine is gone.
class RequestHandle {
 public:
  RequestHandle() = default;
  explicit RequestHandle(std::shared_ptr<detail::RequestState> state);

  uint64_t id() const;
  // The pull interface (requests submitted without a callback): the next event, waiting up to
  // `timeout`; nullopt when none came in time or the last one was already taken (at once for a
  // request submitted with a callback, whose events go to the callback only).
  std::optional<Event> next(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365));
  // Blocks until the request finishes; its tokens, text, reason and stats.
  Result wait();
  bool finished() const;
  // Asks the engine to stop the request at its next step; it finishes with kCancelled and its KV
  // blocks are freed. No effect once it finished.
  void cancel();

 private:
  std::shared_ptr<detail::RequestState> state_;
};

// Engine-wide figures since the engine started.
struct EngineStats {
  int64_t submitted = 0;               // requests accepted by submit()
  int64_t finished = 0;                // requests that finished, for any reason
  int64_t running = 0;                 // in the batch now
  int64_t waiting = 0;                 // queued for room now
  int64_t tokens_generated = 0;        // over every request
  int64_t steps = 0;                   // batched steps run
  double mean_batch = 0.0;             // sequences per step, on average
  int64_t drafted = 0;                 // drafts verified
  int64_t accepted = 0;                // drafts accepted
  double acceptance_rate = 0.0;        // accepted / drafted
  double draft_ms = 0.0;               // time drafting
  double target_ms = 0.0;              // time in target passes (prefill, verification)
  double uptime_ms = 0.0;              // since create()
  double tokens_per_second = 0.0;      // tokens_generated over uptime
  int64_t kv_tokens_capacity = 0;      // the target's KV cache, in tokens
  int64_t kv_tokens_free = 0;          // positions new tokens may take now (cached ones included)
  int64_t kv_tokens_cached = 0;        // positions in reusable prefix blocks now
  int64_t prompt_tokens = 0;           // prompt tokens of the requests started
  int64_t cached_prompt_tokens = 0;    // of those, taken from the prefix cache
  double prefix_cache_hit_rate = 0.0;  // cached_prompt_tokens / prompt_tokens
  int64_t drafted_ahead = 0;   // sequence steps that drafted ahead of verification (overlap)
  int64_t ahead_taken = 0;     // of those, the ones whose drafts ahead the next step proposed
  int64_t host_waits = 0;      // times the steps waited for the device (RequestStats's)
  uint64_t bytes_to_host = 0;  // bytes the steps copied back from the device
  // [draft position, from 0] drafts verified at that position of their step, and of those the
  // drafts accepted: where along the drafts acceptance falls off (their sums are drafted and
  // accepted).
  std::vector<int64_t> drafted_at;
  std::vector<int64_t> accepted_at;
};

// What the engine runs on.
// What one model will hold on the engine's device, planned before anything loads.
struct ModelMemory {
  uint64_t weight_bytes = 0;  // weights as loaded: stored dtype on the CPU, bf16 on a GPU,
                              // 8-bit codes plus f32 scales where quantized
  // weight_bytes by the type they are loaded in: {"Q4_1", bytes}, {"F32", bytes}...
  std::map<std::string, uint64_t> weight_types;
  uint64_t kv_bytes_per_token = 0;  // K and V of every layer (f32)
  int64_t kv_tokens = 0;            // KV capacity, whole blocks
  uint64_t kv_bytes = 0;            // the KV cache
  uint64_t workspace_bytes = 0;     // activations of a forward filling the cache, the logits
                                    // of every sequence verifying gamma_max drafts at once, and
                                    // the distributions processed from them
};

// The memory plan: both models (the draft's always counted), their total and what the device has.
struct MemoryPlan {
  std::string device;            // "cpu", "cuda:0"
  ModelMemory target;            // the target's needs
  ModelMemory draft;             // the draft's; zero without a draft
  uint64_t scratch_bytes = 0;    // what the backend's ops take for themselves, each model's
                                 // stream its own (a GPU's scratch and cuBLAS's workspace)
  uint64_t total_bytes = 0;      // everything above
  uint64_t available_bytes = 0;  // free device memory (the host's MemAvailable on the CPU) when
                                 // planned; 0 when unknown
};
// One line: "memory plan on cuda:0: target 16.1 GiB (weights 15.0 GiB, KV 1.0 GiB = 128 KiB x
// 8192 tokens, workspace 0.1 GiB) + draft ... + scratch 96.0 MiB = 17.5 GiB of 78.2 GiB free".
std::string to_string(const MemoryPlan& plan);

// Plans `config`'s memory from the checkpoints' configs and tensor headers, reading no weight.
// Engine::create does the same and refuses, before loading anything, a config whose plan exceeds
// the available memory. Throws Error as Engine::create would for a bad config or checkpoint.
MemoryPlan plan_memory(const EngineConfig& config);

struct EngineInfo {
  std::string target;                // resolved checkpoint directory
  std::string draft;                 // "" without a draft
  int64_t target_parameters = 0;     // parameters of the target
  int64_t draft_parameters = 0;      // of the draft; 0 without one
  int64_t vocab_size = 0;            // rows of the target's embedding: token ids are below this
  int32_t bos_token_id = -1;         // the model's (first) beginning-of-sequence id; -1 when none
  int64_t context_limit = 0;         // positions one sequence may hold
  bool has_tokenizer = false;        // text in and out (else token ids only)
  std::string chat_template;         // the checkpoint's Jinja chat template ("" when none)
  std::string chat_template_origin;  // the file it came from: tokenizer_config.json, or the .gguf
  std::string bos_token;             // the text of the beginning-of-sequence token ("" when none)
  std::string eos_token;             // the text of the (first) end-of-sequence token
  std::string device;                // "cpu", "cuda:0"
  int threads = 0;                   // CPU threads
  // The CPU's matmul: the copy of its kernels that runs ("native", "x86-64-v4+bf16", ...) and
  // what activations meet the weights as, runtime.activations resolved ("f32", "bf16", "int8",
  // or auto's "f32 (int8 for GGUF blocks)" on CPUs without bf16 pairs); both "" on a GPU.
  std::string cpu_kernels;
  std::string activations;
  MemoryPlan memory;  // the plan the engine was checked against
};

class Engine {
 public:
  // Loads the models (the draft must pair with the target) and starts the scheduler. Throws
  // Error naming what is wrong with the config or the checkpoints.
  static std::unique_ptr<Engine> create(const EngineConfig& config);
  ~Engine();  // shutdown()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. Throws Error for an empty prompt, ids outside the
  // vocabulary, text without a tokenizer, settings out of range, a request that can never fit
  // the KV cache, or an engine that was shut down.
  RequestHandle submit(const Request& request, StreamCallback on_event = {});
  // Cancels a request by id; false when it is unknown or already finished.
  bool cancel(uint64_t request);
  EngineStats stats() const;
  const EngineInfo& info() const;
  // Stops taking requests; every queued or running request finishes with kShutdown; returns when
  // the scheduler has stopped. Idempotent.
  void shutdown();

  // The target's tokenizer (Error without one). detokenize() skips special tokens, as the streamed
  // text does.
  std::vector<int32_t> tokenize(const std::string& text, bool add_special_tokens = true) const;
  std::string detokenize(const std::vector<int32_t>& tokens) const;
  // A token as log-probabilities show it (OpenAI's "token" and "bytes"); Error without a tokenizer.
  TokenPiece token_piece(int32_t token) const;

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specrun
