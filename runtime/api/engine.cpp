// specrun::Engine (specrun/specrun.hpp) over the batch engine: loads the models on the configured
// backend, turns public settings into the engine's, text into token ids and token ids back into
// whole characters, and keeps each request's shared state (event queue, result, stats) for its
// handles.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <utility>

#include <spdlog/spdlog.h>

#include "runtime/api/config.h"
#include "runtime/engine/batch_engine.h"
#include "runtime/engine/checkpoint_tokenizer.h"
#include "runtime/engine/device.h"
#include "runtime/engine/pairing.h"
#include "runtime/engine/settings.h"
#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/model.h"
#include "runtime/text/tokenizer.h"
#include "specrun/specrun.hpp"

namespace specrun {

using Clock = std::chrono::steady_clock;

namespace detail {

// What one engine owns, shared with the handles of its requests only weakly (a handle may outlive
// its engine; cancel() then does nothing). Members are destroyed in reverse order: the batch
// engine (which joins the scheduler) before the models it runs on.
struct EngineCore {
  EngineConfig config;                 // as created: the defaults of requests that give no settings
  EngineInfo info;                     // what info() returns
  Clock::time_point started;           // create(), for uptime
  std::atomic<bool> shut_down{false};  // shutdown() was called: submit() refuses at once
  std::shared_ptr<kernels::cpu::ThreadPool> pool;  // the CPU backend's threads
  std::unique_ptr<kernels::Backend> backend;       // the target runs here
  std::unique_ptr<kernels::Backend> draft_stream;  // the draft's stream of the same device
  std::unique_ptr<Model> target;                   // the model whose distribution is output
  std::unique_ptr<Model> draft;                    // null without a draft
  std::unique_ptr<text::Tokenizer> tokenizer;      // null without the target's tokenizer.json
  std::unique_ptr<BatchEngine> batch;              // the scheduler over both models
  // The target's vocabulary as grammars spell it, made on the first constrained request.
  std::mutex vocabulary_mutex;
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary;
};

// What a RequestHandle shares with the update callback running on the scheduler thread. The
// fields above `mutex` are written before the request is queued or only by the scheduler
// thread (updates of one request arrive in order, never concurrently); the fields below it are
// read by the handle's threads and guarded by it.
struct RequestState {
  Clock::time_point submitted;                    // times in RequestStats count from here
  std::weak_ptr<EngineCore> engine;               // cancel() through it while the engine lives
  StreamCallback on_event;                        // empty: events are queued for next()
  int64_t prompt_tokens = 0;                      // prefilled tokens, for the stats
  std::optional<text::StreamingDecoder> decoder;  // with a tokenizer: ids to whole characters
  std::vector<double> token_ms;                   // each token's arrival, ms after `submitted`
  std::string callback_error;                     // what on_event threw; "" while it has not thrown

  std::mutex mutex;                 // guards everything below
  std::condition_variable changed;  // an event was queued or the request finished
  uint64_t id = 0;                  // the batch engine's id for the request
  std::deque<Event> events;         // pull interface: delivered, not yet taken by next()
  bool finished = false;            // the last update arrived and `result` is complete
  Result result;                    // tokens and text so far; reason and stats once finished
};

}  // namespace detail

namespace {

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Settings checked where they came from: `context` ("request", "EngineConfig sampling") starts
// the message of the Error naming a bad value.
template <typename Settings>
const Settings& checked(const Settings& settings, const std::string& context) {
  try {
    validate(settings);
  } catch (const Error& error) {
    throw Error(context + ": " + error.what());
  }
  return settings;
}

// The request's prompt as token ids: given ids as they are, text through the tokenizer with its
// special tokens (BOS). Throws Error when there is no prompt, both forms, or text without a
// tokenizer.
std::vector<int32_t> prompt_tokens(const detail::EngineCore& core, const Request& request) {
  if (!request.prompt.empty() && !request.prompt_ids.empty()) {
    throw Error("request: give the prompt as text or as prompt_ids, not both");
  }
  if (request.prompt_ids.empty() && request.prompt.empty()) {
    throw Error("request: the prompt is empty: give prompt text or prompt_ids");
  }
  if (!request.prompt_ids.empty()) return request.prompt_ids;
  if (!core.tokenizer) {
    throw Error("request: " + core.info.target +
                " has no tokenizer.json: give the prompt as prompt_ids");
  }
  std::vector<int32_t> ids = core.tokenizer->encode(request.prompt, /*add_special_tokens=*/true);
  if (ids.empty()) throw Error("request: the prompt text encodes to no tokens");
  return ids;
}

// The final figures of a request: the batch engine's (null when it never reached it), with the
// timeline as this API's caller saw it, from its submit() (tokenizing included) to each event.
RequestStats request_stats(const detail::RequestState& state, const RequestStats* engine,
                           double total_ms) {
  RequestStats stats = engine != nullptr ? *engine : RequestStats{};
  stats.prompt_tokens = state.prompt_tokens;
  record_timeline(stats, state.token_ms, total_ms);
  return stats;
}

// The grammar of a request's constraint (Error naming what is wrong with it).
std::shared_ptr<const grammar::Grammar> compile_constraint(const OutputConstraint& constraint) {
  switch (constraint.kind) {
    case ConstraintKind::kJsonObject:
      return grammar::any_json_grammar(/*object_only=*/true);
    case ConstraintKind::kJsonSchema:
      return grammar::json_schema_grammar(std::string_view(constraint.text));
    case ConstraintKind::kGbnf:
      return grammar::parse_gbnf(constraint.text, "the request's grammar");
    case ConstraintKind::kNone:
      break;
  }
  throw Error("constraint: an unknown kind " + std::to_string(static_cast<int>(constraint.kind)));
}

// The target's vocabulary as grammars spell it (its tokenizer's bytes, its end-of-sequence ids),
// made once.
std::shared_ptr<const grammar::TokenVocabulary> grammar_vocabulary(detail::EngineCore& core) {
  if (!core.tokenizer) throw Error("constraint: a grammar needs the target's tokenizer");
  std::lock_guard lock(core.vocabulary_mutex);
  if (!core.vocabulary) {
    core.vocabulary = grammar::TokenVocabulary::from_tokenizer(*core.tokenizer,
                                                               core.target->config().eos_token_ids);
  }
  return core.vocabulary;
}

// One update of the batch engine for one request, on the scheduler thread: becomes an Event
// (text decoded to whole characters), goes to the stream callback or the queue, and extends the
// result. Never throws into the scheduler.
void deliver(detail::RequestState& state, BatchEngine& batch, const RequestUpdate& update) {
  const Clock::time_point now = Clock::now();
  Event event;
  std::string failure;  // why this request cannot go on, "" when it can
  try {
    event.request = update.id;
    event.tokens.assign(update.tokens.begin(), update.tokens.end());
    event.drafted = update.drafted;
    event.accepted_drafts = update.accepted_drafts;
    event.logprobs.assign(update.logprobs.begin(), update.logprobs.end());
    event.prompt_logprobs.assign(update.prompt_logprobs.begin(), update.prompt_logprobs.end());
    for (size_t i = 0; i < event.tokens.size(); ++i) {
      state.token_ms.push_back(ms_between(state.submitted, now));
    }
    if (state.decoder) {
      // The accepted drafts come first: the text they complete is the start of the event's.
      const auto accepted =
          std::min(static_cast<size_t>(update.accepted_drafts), event.tokens.size());
      for (size_t i = 0; i < event.tokens.size(); ++i) {
        if (i == accepted) event.accepted_text = event.text.size();
        event.text += state.decoder->step(event.tokens[i]);
      }
      if (accepted == event.tokens.size()) event.accepted_text = event.text.size();
      if (update.finished) event.text += state.decoder->flush();
    }
    event.finished = update.finished;
    if (update.finished) {
      event.reason = update.reason;
      event.error = update.error;
    }
  } catch (const std::exception& error) {
    failure = std::string("delivering the request's tokens failed: ") + error.what();
  }
  // The callback runs with no lock held, so it may take its time and cancel requests; a callback
  // that throws gets no further events and fails its request.
  if (failure.empty() && state.on_event && state.callback_error.empty()) {
    try {
      state.on_event(event);
    } catch (const std::exception& error) {
      state.callback_error = std::string("the stream callback threw: ") + error.what();
    } catch (...) {
      state.callback_error = "the stream callback threw a non-standard exception";
    }
  }
  if (!state.callback_error.empty() && failure.empty()) failure = state.callback_error;
  if (!failure.empty() && !update.finished) {
    batch.cancel(update.id);  // the last update follows, with the failure as its reason
  }

  std::lock_guard lock(state.mutex);
  state.id = update.id;
  Result& result = state.result;
  result.request = update.id;
  result.tokens.insert(result.tokens.end(), update.tokens.begin(), update.tokens.end());
  result.logprobs.insert(result.logprobs.end(), update.logprobs.begin(), update.logprobs.end());
  result.prompt_logprobs.insert(result.prompt_logprobs.end(), update.prompt_logprobs.begin(),
                                update.prompt_logprobs.end());
  result.text += event.text;
  if (update.finished) {
    result.reason = failure.empty() ? update.reason : FinishReason::kFailed;
    result.error = failure.empty() ? update.error : failure;
    result.stats = request_stats(state, update.stats, ms_between(state.submitted, now));
    state.decoder.reset();  // the tokenizer it reads may go with the engine
  }
  if (!state.on_event) {
    if (update.finished && !failure.empty()) {
      event.finished = true;
      event.reason = FinishReason::kFailed;
      event.error = failure;
    }
    if (failure.empty() || update.finished) state.events.push_back(std::move(event));
  }
  state.finished = update.finished;
  state.changed.notify_all();
}

}  // namespace

// ---- RequestHandle ----------------------------------------------------------------------------

RequestHandle::RequestHandle(std::shared_ptr<detail::RequestState> state)
    : state_(std::move(state)) {}

namespace {

detail::RequestState& checked(const std::shared_ptr<detail::RequestState>& state) {
  if (!state) throw Error("RequestHandle: empty handle (not returned by Engine::submit)");
  return *state;
}

}  // namespace

uint64_t RequestHandle::id() const {
  if (!state_) return 0;
  std::lock_guard lock(state_->mutex);
  return state_->id;
}

std::optional<Event> RequestHandle::next(std::chrono::milliseconds timeout) {
  detail::RequestState& state = checked(state_);
  std::unique_lock lock(state.mutex);
  // Finished with an empty queue: the last event was taken (or went to a callback).
  const auto ready = [&] { return !state.events.empty() || state.finished; };
  // now() + timeout overflows the clock for a huge timeout (milliseconds::max()), and an
  // overflowed deadline is already past; a wait that long is a wait without one.
  if (timeout >= std::chrono::hours(24 * 365 * 100)) {
    state.changed.wait(lock, ready);
  } else {
    state.changed.wait_for(lock, timeout, ready);
  }
  if (state.events.empty()) return std::nullopt;
  Event event = std::move(state.events.front());
  state.events.pop_front();
  return event;
}

Result RequestHandle::wait() {
  detail::RequestState& state = checked(state_);
  std::unique_lock lock(state.mutex);
  state.changed.wait(lock, [&] { return state.finished; });
  return state.result;
}

bool RequestHandle::finished() const {
  detail::RequestState& state = checked(state_);
  std::lock_guard lock(state.mutex);
  return state.finished;
}

void RequestHandle::cancel() {
  detail::RequestState& state = checked(state_);
  uint64_t id = 0;
  {
    std::lock_guard lock(state.mutex);
    if (state.finished) return;
    id = state.id;
  }
  if (const std::shared_ptr<detail::EngineCore> core = state.engine.lock()) core->batch->cancel(id);
}

// ---- Memory plan -------------------------------------------------------------------------------

namespace {

ModelOptions model_options_for(const EngineConfig& config, Quantization quantization) {
  ModelOptions options;
  options.kv_cache_tokens = config.kv_cache_tokens;
  options.kv_block_size = config.kv_block_size;
  options.kv_cache_dtype = kernel_dtype(config.kv_cache_dtype);
  options.prefix_cache = config.prefix_cache;
  options.rope_style = parse_rope_style(config.rope_style);
  options.quantize_output = config.quantize_lm_head;
  options.quantize = quantization == Quantization::kFP8    ? WeightQuantize::kFP8
                     : quantization == Quantization::kINT8 ? WeightQuantize::kINT8
                                                           : WeightQuantize::kNone;
  return options;
}

BackendOptions backend_options(const EngineConfig& config) {
  return {config.deterministic, config.activations};
}

MemoryNeeds model_needs(const Checkpoint& checkpoint, const ModelOptions& options,
                        const kernels::Backend& backend, int64_t max_logit_rows) {
  return Model::plan_memory(
      checkpoint, options, backend.uses_host_memory(),
      [&backend](DType dtype) { return backend.matmul_weight_layout(dtype); }, max_logit_rows);
}

ModelMemory model_memory(const MemoryNeeds& needs) {
  return {needs.weight_bytes, needs.weight_bytes_by_type, needs.kv_bytes_per_token, needs.kv_tokens,
          needs.kv_bytes,     needs.workspace_bytes};
}

uint64_t model_total(const ModelMemory& m) {
  return m.weight_bytes + m.kv_bytes + m.workspace_bytes;
}

MemoryPlan plan_on(const EngineConfig& config, kernels::Backend& backend, const Checkpoint& target,
                   const Checkpoint* draft) {
  MemoryPlan plan;
  plan.device = std::string(backend.name());
  // Verification scores gamma_max + 1 rows of every running sequence at once.
  const int64_t logit_rows = config.max_batch * (config.speculation.gamma_max + 1);
  const MemoryNeeds target_needs =
      model_needs(target, model_options_for(config, config.quantize), backend, logit_rows);
  plan.target = model_memory(target_needs);
  plan.scratch_bytes = backend.scratch_bytes_bound({target_needs.forward});
  if (draft != nullptr) {
    const MemoryNeeds draft_needs =
        model_needs(*draft, model_options_for(config, config.draft_quantize), backend, logit_rows);
    plan.draft = model_memory(draft_needs);
    // The draft runs on a stream of its own, with scratch of its own.
    plan.scratch_bytes += backend.scratch_bytes_bound({draft_needs.forward});
  }
  plan.total_bytes = model_total(plan.target) + model_total(plan.draft) + plan.scratch_bytes;
  uint64_t available = 0;
  if (backend.available_memory(&available).is_ok()) plan.available_bytes = available;
  return plan;
}

std::string gib(uint64_t bytes) {
  char text[32];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / double(1ull << 30));
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / double(1 << 20));
  }
  return text;
}

std::string model_line(const char* role, const ModelMemory& m) {
  // The types the weights are held in, by bytes, largest first: " [Q4_1 78.2 MiB, Q8_0 16.1
  // MiB, F32 0.3 MiB]", or " BF16" alone.
  std::vector<std::pair<std::string, uint64_t>> types(m.weight_types.begin(), m.weight_types.end());
  std::stable_sort(types.begin(), types.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string typed;
  for (const auto& [type, bytes] : types) {
    typed += (typed.empty() ? "" : ", ") + type + (types.size() > 1 ? " " + gib(bytes) : "");
  }
  if (types.size() > 1) typed = "[" + typed + "]";
  return std::string(role) + " " + gib(model_total(m)) + " (weights " + gib(m.weight_bytes) +
         (typed.empty() ? "" : " " + typed) + ", KV " + gib(m.kv_bytes) + " = " +
         (m.kv_bytes_per_token >= 1024 ? std::to_string(m.kv_bytes_per_token / 1024) + " KiB"
                                       : std::to_string(m.kv_bytes_per_token) + " B") +
         " x " + std::to_string(m.kv_tokens) + " tokens, workspace " + gib(m.workspace_bytes) + ")";
}

}  // namespace

std::string to_string(const MemoryPlan& plan) {
  std::string line = "memory plan on " + plan.device + ": " + model_line("target", plan.target);
  if (plan.draft.weight_bytes > 0) line += " + " + model_line("draft", plan.draft);
  if (plan.scratch_bytes > 0) line += " + scratch " + gib(plan.scratch_bytes);
  line += " = " + gib(plan.total_bytes);
  line += plan.available_bytes > 0 ? " of " + gib(plan.available_bytes) + " available"
                                   : " (available memory unknown)";
  return line;
}

MemoryPlan plan_memory(const EngineConfig& config) {
  checked(config, "EngineConfig");
  auto pool = make_thread_pool(1);
  const std::unique_ptr<kernels::Backend> backend =
      make_backend(config.device, pool, backend_options(config));
  const Checkpoint target = open_checkpoint(config.target);
  std::optional<Checkpoint> draft;
  if (!config.draft.empty()) draft = open_checkpoint(config.draft);
  return plan_on(config, *backend, target, draft ? &*draft : nullptr);
}

// ---- Engine -----------------------------------------------------------------------------------

class Engine::Impl {
 public:
  explicit Impl(std::shared_ptr<detail::EngineCore> engine_core) : core(std::move(engine_core)) {}
  std::shared_ptr<detail::EngineCore> core;  // shared weakly with the request handles
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  shutdown();
}

std::unique_ptr<Engine> Engine::create(const EngineConfig& config) {
  checked(config, "EngineConfig");
  auto core = std::make_shared<detail::EngineCore>();
  core->config = config;
  core->started = Clock::now();
  core->pool = make_thread_pool(config.threads);
  core->backend = make_backend(config.device, core->pool, backend_options(config));
  // Refused before a weight is read when it cannot fit. The checkpoints are opened once (headers,
  // and a GGUF file's dequantisation) for the plan and the models.
  Checkpoint target_checkpoint = open_checkpoint(config.target);
  std::optional<Checkpoint> draft_checkpoint;
  if (!config.draft.empty()) draft_checkpoint = open_checkpoint(config.draft);
  const MemoryPlan plan = plan_on(config, *core->backend, target_checkpoint,
                                  draft_checkpoint ? &*draft_checkpoint : nullptr);
  spdlog::debug("{}", to_string(plan));
  if (plan.available_bytes > 0 && plan.total_bytes > plan.available_bytes) {
    throw Error(to_string(plan) +
                ": it does not fit; quantize (--quantize fp8 or int8, "
                "--draft-quantize), shorten the context (--kv-cache-tokens) or lower max_batch");
  }
  core->target = std::make_unique<Model>(std::move(target_checkpoint), *core->backend,
                                         model_options_for(config, config.quantize));
  if (draft_checkpoint) {
    // A stream of its own, so that the draft's work can run beside the target's where the device
    // runs streams concurrently (Backend::runs_models_concurrently).
    core->draft_stream = core->backend->create_stream();
    if (core->draft_stream == nullptr) {
      throw Error("device '" + config.device + "': cannot make a stream for the draft model");
    }
    core->draft = std::make_unique<Model>(std::move(*draft_checkpoint), *core->draft_stream,
                                          model_options_for(config, config.draft_quantize));
    check_pairing(*core->target, *core->draft);
  }
  core->tokenizer = load_tokenizer(core->target->paths());  // tokenizer.json or GGUF metadata

  EngineInfo& info = core->info;
  info.memory = plan;
  info.target = core->target->paths().directory.string();
  info.target_parameters = core->target->parameter_count();
  if (core->draft) {
    info.draft = core->draft->paths().directory.string();
    info.draft_parameters = core->draft->parameter_count();
  }
  info.vocab_size = core->target->config().vocab_size;
  const std::vector<int32_t>& bos = core->target->config().bos_token_ids;
  info.bos_token_id = bos.empty() ? -1 : bos.front();
  info.context_limit = core->target->context_limit();
  info.has_tokenizer = core->tokenizer != nullptr;
  if (core->tokenizer) {
    const text::Tokenizer& tokenizer = *core->tokenizer;
    // The tokenizer's comes from tokenizer_config.json beside tokenizer.json; a GGUF file's
    // from its metadata.
    const CheckpointPaths& paths = core->target->paths();
    if (!tokenizer.chat_template().empty()) {
      info.chat_template = tokenizer.chat_template();
      info.chat_template_origin =
          (paths.tokenizer->parent_path() / "tokenizer_config.json").string();
    } else if (!core->target->config().chat_template.empty()) {
      info.chat_template = core->target->config().chat_template;
      info.chat_template_origin = paths.weights.string() + " (tokenizer.chat_template)";
    }
    // The tokenizer's own bos and eos when tokenizer_config.json names them, else the model's.
    const std::vector<int32_t>& eos = core->target->config().eos_token_ids;
    const std::optional<int32_t> bos_id =
        tokenizer.bos_id() ? tokenizer.bos_id()
                           : (bos.empty() ? std::nullopt : std::optional<int32_t>(bos.front()));
    const std::optional<int32_t> eos_id =
        tokenizer.eos_id() ? tokenizer.eos_id()
                           : (eos.empty() ? std::nullopt : std::optional<int32_t>(eos.front()));
    if (bos_id) info.bos_token = tokenizer.id_to_token(*bos_id).value_or("");
    if (eos_id) info.eos_token = tokenizer.id_to_token(*eos_id).value_or("");
  }
  info.device = std::string(core->backend->name());
  info.threads = thread_count(*core->pool);
  info.cpu_kernels = std::string(core->backend->matmul_kernels());
  info.activations = std::string(core->backend->matmul_activations());

  BatchEngineOptions batch_options;
  batch_options.max_batch = config.max_batch;
  batch_options.overlap = config.overlap_drafting;
  core->batch = std::make_unique<BatchEngine>(*core->target, core->draft.get(), batch_options);
  return std::unique_ptr<Engine>(new Engine(std::make_unique<Impl>(std::move(core))));
}

RequestHandle Engine::submit(const Request& request, StreamCallback on_event) {
  detail::EngineCore& core = *impl_->core;
  if (core.shut_down) throw Error("submit: the engine was shut down");
  EngineRequest internal;
  internal.sampling = checked(request.sampling.value_or(core.config.sampling), "request");
  internal.speculation = checked(request.speculation.value_or(core.config.speculation), "request");
  internal.prompt = prompt_tokens(core, request);
  internal.logit_bias = request.logit_bias;
  internal.logprobs = request.logprobs;
  internal.prompt_logprobs = request.prompt_logprobs;
  try {
    validate_prompt(*core.target, internal.prompt);
    if (request.constraint.kind != ConstraintKind::kNone) {
      internal.grammar = compile_constraint(request.constraint);
      internal.vocabulary = grammar_vocabulary(core);
    }
  } catch (const Error& error) {
    throw Error(std::string("request: ") + error.what());
  }

  auto state = std::make_shared<detail::RequestState>();
  state->engine = impl_->core;
  state->on_event = std::move(on_event);
  state->prompt_tokens = static_cast<int64_t>(internal.prompt.size());
  if (core.tokenizer) state->decoder.emplace(*core.tokenizer, /*skip_special_tokens=*/true);
  BatchEngine& batch = *core.batch;
  state->submitted = Clock::now();
  // The callback holds the state (not the engine): the batch engine owns the callback, and a
  // handle may outlive both.
  const RequestId id = batch.submit(
      std::move(internal),
      [state, &batch](const RequestUpdate& update) { deliver(*state, batch, update); });
  {
    std::lock_guard lock(state->mutex);
    state->id = id;
    state->result.request = id;
  }
  return RequestHandle(state);
}

bool Engine::cancel(uint64_t request) {
  return impl_->core->batch->cancel(request);
}

EngineStats Engine::stats() const {
  const detail::EngineCore& core = *impl_->core;
  const BatchEngineStats batch = core.batch->stats();
  EngineStats stats;
  stats.submitted = batch.submitted;
  stats.finished = batch.finished;
  stats.running = batch.running;
  stats.waiting = batch.waiting;
  stats.tokens_generated = batch.tokens_generated;
  stats.steps = batch.steps;
  stats.mean_batch =
      batch.steps > 0 ? static_cast<double>(batch.sequence_steps) / static_cast<double>(batch.steps)
                      : 0.0;
  stats.drafted = batch.drafted;
  stats.accepted = batch.accepted;
  stats.acceptance_rate =
      batch.drafted > 0 ? static_cast<double>(batch.accepted) / static_cast<double>(batch.drafted)
                        : 0.0;
  stats.draft_ms = batch.draft_ms;
  stats.target_ms = batch.target_ms;
  stats.uptime_ms = ms_between(core.started, Clock::now());
  stats.tokens_per_second =
      stats.uptime_ms > 0 ? 1e3 * static_cast<double>(batch.tokens_generated) / stats.uptime_ms
                          : 0.0;
  stats.kv_tokens_capacity = batch.kv_tokens_capacity;
  stats.kv_tokens_free = batch.kv_tokens_free;
  stats.kv_tokens_cached = batch.kv_tokens_cached;
  stats.prompt_tokens = batch.prompt_tokens;
  stats.cached_prompt_tokens = batch.cached_prompt_tokens;
  stats.drafted_ahead = batch.drafted_ahead;
  stats.ahead_taken = batch.ahead_taken;
  stats.host_waits = batch.host_waits;
  stats.bytes_to_host = batch.bytes_to_host;
  stats.drafted_at = batch.drafted_at;
  stats.accepted_at = batch.accepted_at;
  stats.prefix_cache_hit_rate = batch.prompt_tokens > 0
                                    ? static_cast<double>(batch.cached_prompt_tokens) /
                                          static_cast<double>(batch.prompt_tokens)
                                    : 0.0;
  return stats;
}

const EngineInfo& Engine::info() const {
  return impl_->core->info;
}

void Engine::shutdown() {
  detail::EngineCore& core = *impl_->core;
  core.shut_down = true;
  core.batch->shutdown();
}

std::vector<int32_t> Engine::tokenize(const std::string& text, bool add_special_tokens) const {
  const detail::EngineCore& core = *impl_->core;
  if (!core.tokenizer) throw Error("tokenize: " + core.info.target + " has no tokenizer.json");
  return core.tokenizer->encode(text, add_special_tokens);
}

std::string Engine::detokenize(const std::vector<int32_t>& tokens) const {
  const detail::EngineCore& core = *impl_->core;
  if (!core.tokenizer) throw Error("detokenize: " + core.info.target + " has no tokenizer.json");
  return core.tokenizer->decode(tokens, /*skip_special_tokens=*/true);
}

TokenPiece Engine::token_piece(int32_t token) const {
  const detail::EngineCore& core = *impl_->core;
  if (!core.tokenizer) throw Error("token_piece: " + core.info.target + " has no tokenizer.json");
  const text::Tokenizer& tokenizer = *core.tokenizer;
  if (tokenizer.is_special(token)) return {tokenizer.id_to_token(token).value_or(""), true};
  return {tokenizer.token_bytes(token), false};
}

void check_constraint(const OutputConstraint& constraint) {
  if (constraint.kind != ConstraintKind::kNone) compile_constraint(constraint);
}

std::string json_schema_gbnf(const std::string& schema, const std::string& root_rule) {
  nlohmann::ordered_json document;
  try {
    document = nlohmann::ordered_json::parse(schema);
  } catch (const nlohmann::ordered_json::parse_error& error) {
    throw Error("JSON schema: not JSON: byte " + std::to_string(error.byte) + ": " +
                std::string(error.what()));
  }
  grammar::JsonSchemaOptions options;
  options.root_rule = root_rule;
  return grammar::json_schema_to_gbnf(document, options);
}

}  // namespace specrun
