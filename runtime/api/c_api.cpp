// The C ABI (specrun/specrun.h) over specrun::Engine. Each entry point runs its body inside one
// guard that turns every exception into a status and the calling thread's last-error message, so
// nothing thrown ever unwinds into C. What the library hands out is allocated with malloc and
// released by the matching free function, so a caller in any language can own it.
#include "specrun/specrun.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/base/member_pointer.h"
#include "runtime/sampling/logit_processor.h"
#include "specrun/logprobs.hpp"
#include "specrun/specrun.hpp"

namespace {

// What a handle the library made holds in `magic` while it lives, and once it is destroyed or
// freed. In debug builds every entry point checks it (require), so that a handle used after
// specrun_engine_destroy or specrun_request_free, or one the library never made, is
// SPECRUN_ERROR_INVALID_ARGUMENT rather than a crash later. Best effort, as SQLite's handle checks
// are: a freed handle's memory may be reused. The word sits past the first 16 bytes, which an
// allocator may overwrite with its own list pointers when the block is freed.
constexpr uint64_t kLiveHandle = 0x5350454352554e31;  // "SPECRUN1"
constexpr uint64_t kDeadHandle = 0xdeadbeefdeadbeef;

}  // namespace

struct specrun_engine {
  std::unique_ptr<specrun::Engine> engine;  // the C++ engine this handle owns
  std::atomic<bool> shut_down{false};       // specrun_engine_shutdown ran: submit says SHUT_DOWN
  uint64_t magic = kLiveHandle;             // kDeadHandle once destroyed
};

struct specrun_request {
  specrun::RequestHandle handle;  // shares the request's state; outlives the engine if need be
  uint64_t magic = kLiveHandle;   // kDeadHandle once freed
};

static_assert(offsetof(specrun_engine, magic) >= 16 && offsetof(specrun_request, magic) >= 16);

namespace {

// The message specrun_last_error() returns: per thread, so concurrent callers never see each
// other's errors. The one piece of file-level mutable state, and the point of the C ABI's error
// reporting.
thread_local std::string last_error;

// A caller's mistake the C layer itself detects (a NULL pointer, an enum value out of range).
class InvalidArgument : public std::exception {
 public:
  explicit InvalidArgument(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// An engine that was shut down refused a call.
class ShutDown : public std::exception {
 public:
  const char* what() const noexcept override { return "the engine was shut down"; }
};

// A status other than OK from inside a body (timeouts and the end of a stream).
class StatusError : public std::exception {
 public:
  StatusError(specrun_status status, std::string message)
      : status_(status), message_(std::move(message)) {}
  specrun_status status() const { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  specrun_status status_;
  std::string message_;
};

specrun_status fail(specrun_status status, const char* function, const char* message) noexcept {
  try {
    last_error = std::string(function) + ": " + message;
  } catch (...) {
    // No memory for the message: keep the previous one rather than throw into C.
  }
  return status;
}

// Runs `body`; every exception becomes a status and the last error, prefixed with `function`.
template <typename Body>
specrun_status guarded(const char* function, Body&& body) noexcept {
  try {
    body();
    return SPECRUN_OK;
  } catch (const InvalidArgument& error) {
    return fail(SPECRUN_ERROR_INVALID_ARGUMENT, function, error.what());
  } catch (const ShutDown& error) {
    return fail(SPECRUN_ERROR_SHUT_DOWN, function, error.what());
  } catch (const StatusError& error) {
    return fail(error.status(), function, error.what());
  } catch (const specrun::Error& error) {
    return fail(SPECRUN_ERROR_FAILED, function, error.what());
  } catch (const std::bad_alloc&) {
    return fail(SPECRUN_ERROR_OUT_OF_MEMORY, function, "out of memory");
  } catch (const std::exception& error) {
    return fail(SPECRUN_ERROR_INTERNAL, function, error.what());
  } catch (...) {
    return fail(SPECRUN_ERROR_INTERNAL, function, "an unknown exception");
  }
}

// The integer a caller stored in an enum-typed field or argument. C may store any int there, but
// C++ may not even load a value outside the enumerators' range as the enum type, so the bytes are
// read as the underlying integer and checked as such.
template <typename Enum>
int64_t enum_value(const Enum& stored) {
  std::make_signed_t<std::underlying_type_t<Enum>> value;  // C stores a signed int
  static_assert(sizeof(value) == sizeof(stored));
  std::memcpy(&value, &stored, sizeof(value));
  return static_cast<int64_t>(value);
}

// Whether a handle is live (debug builds; always true with NDEBUG).
template <typename Handle>
bool live(const Handle* handle) {
#ifdef NDEBUG
  static_cast<void>(handle);
  return true;
#else
  return handle->magic == kLiveHandle;
#endif
}

// `pointer` itself, or InvalidArgument naming it when it is NULL, or (in debug builds) a handle
// that is not live.
template <typename Pointer>
Pointer& require(Pointer& pointer, const char* name) {
  if (pointer == nullptr) throw InvalidArgument(std::string(name) + " is NULL");
  if constexpr (requires { pointer->magic; }) {
    if (!live(pointer)) {
      throw InvalidArgument(std::string(name) +
                            " is not a live handle: destroyed or freed already, or not made by "
                            "the library");
    }
  }
  return pointer;
}

// ---- settings ---------------------------------------------------------------------------------

// A C enum (`type`) as the C++ enum numbered the same way, whose every value All() lists (the
// static_asserts below hold the numbering); InvalidArgument naming `name` for a number C does not
// name. By reference: the bytes are read by enum_value, never loaded as the enum type.
template <auto All, typename CEnum>
auto enum_from_c(const CEnum& stored, const std::string& name, const char* type) {
  const int64_t value = enum_value(stored);
  for (const auto option : All()) {
    if (static_cast<int64_t>(option) == value) return option;
  }
  throw InvalidArgument(name + " " + std::to_string(value) + " is not a " + type);
}

// The C structs of settings are one more front end of the setting tables (specrun/settings.hpp):
// each row of a table has its field in the C struct, and the conversions walk the table, so a
// value out of range is refused here, naming the C field, by the same range every front end uses.
template <typename CStruct>
struct CField {
  const char* key;  // the table row's
  // The C field as the row's value; throws InvalidArgument naming `where` for a value no row
  // could take (an enum number C does not name, an unsigned integer past int64).
  specrun::SettingValue (*read)(const CStruct& c, const std::string& where, const char* type);
  void (*write)(CStruct& c, const specrun::SettingValue& value);  // a value of the row's
  const char* type = "";  // a C enum's name ("specrun_method")
};

template <auto Member>
CField<specrun::OwnerOf<Member>> c_integer(const char* key) {
  return {key,
          [](const specrun::OwnerOf<Member>& c, const std::string& where,
             const char*) -> specrun::SettingValue {
            const specrun::FieldOf<Member> value = c.*Member;
            if constexpr (std::is_unsigned_v<specrun::FieldOf<Member>>) {
              if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                throw InvalidArgument(where + " must be in [0, " +
                                      std::to_string(std::numeric_limits<int64_t>::max()) +
                                      "], got " + std::to_string(value));
              }
            }
            return static_cast<int64_t>(value);
          },
          [](specrun::OwnerOf<Member>& c, const specrun::SettingValue& value) {
            c.*Member = static_cast<specrun::FieldOf<Member>>(std::get<int64_t>(value));
          }};
}

template <auto Member>
CField<specrun::OwnerOf<Member>> c_number(const char* key) {
  return {key,
          [](const specrun::OwnerOf<Member>& c, const std::string&,
             const char*) -> specrun::SettingValue { return static_cast<double>(c.*Member); },
          [](specrun::OwnerOf<Member>& c, const specrun::SettingValue& value) {
            c.*Member = static_cast<specrun::FieldOf<Member>>(std::get<double>(value));
          }};
}

// A C enum field (`type`), numbered as the C++ enum whose every value All() lists (the
// static_asserts below).
template <auto Member, auto All>
CField<specrun::OwnerOf<Member>> c_choice(const char* key, const char* type) {
  return {key,
          [](const specrun::OwnerOf<Member>& c, const std::string& where,
             const char* c_type) -> specrun::SettingValue {
            return std::string(to_string(enum_from_c<All>(c.*Member, where, c_type)));
          },
          [](specrun::OwnerOf<Member>& c, const specrun::SettingValue& value) {
            for (const auto option : All()) {
              if (std::get<std::string>(value) == to_string(option)) {
                c.*Member = static_cast<specrun::FieldOf<Member>>(option);
              }
            }
          },
          type};
}

std::span<const CField<specrun_sampling>> sampling_fields() {
  static const CField<specrun_sampling> fields[] = {
      c_number<&specrun_sampling::temperature>("temperature"),
      c_integer<&specrun_sampling::top_k>("top_k"),
      c_number<&specrun_sampling::top_p>("top_p"),
      c_number<&specrun_sampling::min_p>("min_p"),
      c_integer<&specrun_sampling::seed>("seed"),
      c_integer<&specrun_sampling::max_tokens>("max_tokens"),
      c_number<&specrun_sampling::frequency_penalty>("frequency_penalty"),
      c_number<&specrun_sampling::presence_penalty>("presence_penalty"),
      c_number<&specrun_sampling::repetition_penalty>("repetition_penalty"),
  };
  return fields;
}

std::span<const CField<specrun_speculation>> speculation_fields() {
  static const CField<specrun_speculation> fields[] = {
      c_choice<&specrun_speculation::method, specrun::speculation_methods>("method",
                                                                           "specrun_method"),
      c_choice<&specrun_speculation::controller, specrun::gamma_controls>("controller",
                                                                          "specrun_controller"),
      c_integer<&specrun_speculation::gamma>("gamma"),
      c_integer<&specrun_speculation::gamma_min>("gamma_min"),
      c_integer<&specrun_speculation::gamma_max>("gamma_max"),
      c_number<&specrun_speculation::draft_p_min>("draft_p_min"),
      c_integer<&specrun_speculation::lookup_min_ngram>("lookup_min_ngram"),
      c_integer<&specrun_speculation::lookup_max_ngram>("lookup_max_ngram"),
      c_choice<&specrun_speculation::verification, specrun::verifications>("verification",
                                                                           "specrun_verification"),
      c_integer<&specrun_speculation::draft_lookup_ngram>("draft_lookup_ngram"),
      c_number<&specrun_speculation::draft_lookup_below>("draft_lookup_below"),
      c_integer<&specrun_speculation::draft_alternates>("draft_alternates"),
  };
  return fields;
}

template <typename CStruct>
const CField<CStruct>& field_of(std::span<const CField<CStruct>> fields, const char* key) {
  for (const CField<CStruct>& field : fields) {
    if (std::strcmp(field.key, key) == 0) return field;
  }
  throw std::logic_error(std::string("the C struct has no field for setting ") + key);
}

// `c`'s fields, row by row, each checked against its row's range; `name` is how the caller
// spells the struct ("params->speculation").
template <typename Settings, typename CStruct>
Settings settings_from_c(const CStruct& c, std::span<const specrun::Setting<Settings>> table,
                         std::span<const CField<CStruct>> fields, const std::string& name) {
  Settings settings;
  for (const specrun::Setting<Settings>& row : table) {
    const std::string where = name + "." + row.key;
    const CField<CStruct>& field = field_of(fields, row.key);
    const specrun::SettingValue value = field.read(c, where, field.type);
    if (const auto problem = specrun::setting_problem(row.range, value)) {
      throw InvalidArgument(where + " " + *problem);
    }
    row.set(settings, value);
  }
  return settings;
}

template <typename CStruct, typename Settings>
CStruct settings_to_c(const Settings& settings, std::span<const specrun::Setting<Settings>> table,
                      std::span<const CField<CStruct>> fields) {
  CStruct c{};
  for (const specrun::Setting<Settings>& row : table) {
    field_of(fields, row.key).write(c, row.get(settings));
  }
  return c;
}

specrun_sampling to_c(const specrun::SamplingSettings& settings) {
  specrun_sampling sampling =
      settings_to_c<specrun_sampling>(settings, specrun::sampling_settings(), sampling_fields());
  sampling.stop_at_eos = settings.stop_at_eos ? 1 : 0;  // a flag, not a row of the table
  return sampling;
}

specrun::SamplingSettings from_c(const specrun_sampling& sampling, const std::string& name) {
  specrun::SamplingSettings settings =
      settings_from_c(sampling, specrun::sampling_settings(), sampling_fields(), name);
  settings.stop_at_eos = sampling.stop_at_eos != 0;
  return settings;
}

specrun_speculation to_c(const specrun::SpeculationSettings& settings) {
  return settings_to_c<specrun_speculation>(settings, specrun::speculation_settings(),
                                            speculation_fields());
}

specrun::SpeculationSettings from_c(const specrun_speculation& speculation,
                                    const std::string& name) {
  return settings_from_c(speculation, specrun::speculation_settings(), speculation_fields(), name);
}

// The C enums number their values as the C++ ones do, so values convert by cast (and back by
// enum_from_c, which checks the number).
static_assert(static_cast<int>(specrun::SpeculationMethod::kDraftModel) == SPECRUN_METHOD_DRAFT &&
              static_cast<int>(specrun::SpeculationMethod::kNone) == SPECRUN_METHOD_NONE &&
              static_cast<int>(specrun::SpeculationMethod::kPromptLookup) ==
                  SPECRUN_METHOD_PROMPT_LOOKUP);
static_assert(static_cast<int>(specrun::GammaControl::kGoodput) == SPECRUN_CONTROLLER_GOODPUT &&
              static_cast<int>(specrun::GammaControl::kFixed) == SPECRUN_CONTROLLER_FIXED &&
              static_cast<int>(specrun::GammaControl::kHeuristic) == SPECRUN_CONTROLLER_HEURISTIC);
static_assert(static_cast<int>(specrun::Quantization::kNone) == SPECRUN_QUANTIZATION_NONE &&
              static_cast<int>(specrun::Quantization::kFP8) == SPECRUN_QUANTIZATION_FP8 &&
              static_cast<int>(specrun::Quantization::kINT8) == SPECRUN_QUANTIZATION_INT8);
static_assert(static_cast<int>(specrun::KvCacheDtype::kBF16) == SPECRUN_KV_CACHE_BF16 &&
              static_cast<int>(specrun::KvCacheDtype::kF32) == SPECRUN_KV_CACHE_F32);
static_assert(static_cast<int>(specrun::OverlapDrafting::kAuto) == SPECRUN_OVERLAP_AUTO &&
              static_cast<int>(specrun::OverlapDrafting::kOn) == SPECRUN_OVERLAP_ON &&
              static_cast<int>(specrun::OverlapDrafting::kOff) == SPECRUN_OVERLAP_OFF);
static_assert(static_cast<int>(specrun::ActivationPrecision::kAuto) == SPECRUN_ACTIVATIONS_AUTO &&
              static_cast<int>(specrun::ActivationPrecision::kF32) == SPECRUN_ACTIVATIONS_F32 &&
              static_cast<int>(specrun::ActivationPrecision::kBF16) == SPECRUN_ACTIVATIONS_BF16 &&
              static_cast<int>(specrun::ActivationPrecision::kInt8) == SPECRUN_ACTIVATIONS_INT8);
static_assert(static_cast<int>(specrun::Verification::kRejection) ==
                  SPECRUN_VERIFICATION_REJECTION &&
              static_cast<int>(specrun::Verification::kSharedNoise) ==
                  SPECRUN_VERIFICATION_SHARED_NOISE);
static_assert(static_cast<int>(specrun::FinishReason::kEndOfSequence) ==
                  SPECRUN_FINISH_END_OF_SEQUENCE &&
              static_cast<int>(specrun::FinishReason::kMaxTokens) == SPECRUN_FINISH_MAX_TOKENS &&
              static_cast<int>(specrun::FinishReason::kContextLimit) ==
                  SPECRUN_FINISH_CONTEXT_LIMIT &&
              static_cast<int>(specrun::FinishReason::kCancelled) == SPECRUN_FINISH_CANCELLED &&
              static_cast<int>(specrun::FinishReason::kShutdown) == SPECRUN_FINISH_SHUTDOWN &&
              static_cast<int>(specrun::FinishReason::kFailed) == SPECRUN_FINISH_FAILED);

specrun_finish_reason to_c(specrun::FinishReason reason) {
  return static_cast<specrun_finish_reason>(reason);
}

// ---- what the library allocates ---------------------------------------------------------------

template <typename T>
T* allocate_array(size_t count) {
  if (count == 0) return nullptr;
  void* memory = std::calloc(count, sizeof(T));
  if (memory == nullptr) throw std::bad_alloc();
  return static_cast<T*>(memory);
}

char* copy_string(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  if (copy == nullptr) throw std::bad_alloc();
  std::memcpy(copy, text.data(), text.size());
  copy[text.size()] = '\0';
  return copy;
}

int32_t* copy_tokens(const std::vector<int32_t>& tokens) {
  int32_t* copy = allocate_array<int32_t>(tokens.size());
  if (!tokens.empty()) std::memcpy(copy, tokens.data(), tokens.size() * sizeof(int32_t));
  return copy;
}

// The C bounds are the C++ ones, spelled for C.
static_assert(SPECRUN_MAX_TOP_LOGPROBS == specrun::kMaxTopLogprobs);
static_assert(SPECRUN_MAX_LOGIT_BIAS == specrun::kMaxLogitBias);

void to_c(const std::vector<specrun::TokenLogprob>& logprobs, specrun_token_logprob* c) {
  for (const specrun::TokenLogprob& entry : logprobs) {
    *c = specrun_token_logprob{};
    c->token = entry.token;
    c->logprob = entry.logprob;
    // The engine gives at most the request's logprobs, which submit held to the C bound.
    const size_t top = std::min<size_t>(entry.top.size(), SPECRUN_MAX_TOP_LOGPROBS);
    c->top_count = static_cast<int32_t>(top);
    for (size_t i = 0; i < top; ++i) {
      c->top_tokens[i] = entry.top[i].token;
      c->top_logprobs[i] = entry.top[i].logprob;
    }
    ++c;
  }
}

// A malloc'd copy (NULL when empty), freed with the event or result that holds it.
specrun_token_logprob* copy_logprobs(const std::vector<specrun::TokenLogprob>& logprobs) {
  specrun_token_logprob* copy = allocate_array<specrun_token_logprob>(logprobs.size());
  to_c(logprobs, copy);
  return copy;
}

void free_event(specrun_event* event) noexcept {
  if (event == nullptr) return;
  std::free(const_cast<specrun_token_logprob*>(event->logprobs));
  std::free(const_cast<int32_t*>(event->tokens));
  std::free(const_cast<char*>(event->text));
  std::free(const_cast<char*>(event->error));
  std::free(event);
}

void free_result(specrun_result* result) noexcept {
  if (result == nullptr) return;
  std::free(result->logprobs);
  std::free(result->tokens);
  std::free(result->text);
  std::free(result->error);
  std::free(result);
}

// An event that borrows the C++ event's storage, for a callback; its logprobs are converted into
// `logprobs`, which must outlive the view.
specrun_event borrowed(const specrun::Event& event, std::vector<specrun_token_logprob>& logprobs) {
  logprobs.resize(event.logprobs.size());
  to_c(event.logprobs, logprobs.data());
  specrun_event view;
  view.request = event.request;
  view.tokens = event.tokens.data();
  view.token_count = event.tokens.size();
  view.text = event.text.c_str();
  view.text_length = event.text.size();
  view.finished = event.finished ? 1 : 0;
  view.reason = to_c(event.reason);
  view.error = event.error.c_str();
  view.drafted = event.drafted;
  view.accepted_drafts = event.accepted_drafts;
  view.accepted_text = event.accepted_text;
  view.logprobs = logprobs.empty() ? nullptr : logprobs.data();
  view.logprob_count = logprobs.size();
  return view;
}

// An event of its own (for specrun_request_next), freed with free_event.
specrun_event* owned(const specrun::Event& event) {
  auto* copy = static_cast<specrun_event*>(std::calloc(1, sizeof(specrun_event)));
  if (copy == nullptr) throw std::bad_alloc();
  try {
    std::vector<specrun_token_logprob> logprobs;
    *copy = borrowed(event, logprobs);
    copy->tokens = nullptr;
    copy->text = nullptr;
    copy->error = nullptr;
    copy->logprobs = nullptr;
    copy->logprobs = copy_logprobs(event.logprobs);
    copy->tokens = copy_tokens(event.tokens);
    copy->text = copy_string(event.text);
    copy->error = copy_string(event.error);
  } catch (...) {
    free_event(copy);
    throw;
  }
  return copy;
}

specrun_request_stats to_c(const specrun::RequestStats& stats) {
  specrun_request_stats c{};
  c.prompt_tokens = stats.prompt_tokens;
  c.tokens_generated = stats.tokens_generated;
  c.queue_ms = stats.queue_ms;
  c.ttft_ms = stats.ttft_ms;
  c.itl_ms_mean = stats.itl_ms_mean;
  c.itl_ms_p50 = stats.itl_ms_p50;
  c.itl_ms_p99 = stats.itl_ms_p99;
  c.tokens_per_second = stats.tokens_per_second;
  c.total_ms = stats.total_ms;
  c.steps = stats.steps;
  c.drafted = stats.drafted;
  c.accepted = stats.accepted;
  c.rejections = stats.rejections;
  c.looked_up = stats.looked_up;
  c.looked_up_accepted = stats.looked_up_accepted;
  c.alternates = stats.alternates;
  c.alternates_accepted = stats.alternates_accepted;
  c.host_waits = stats.host_waits;
  c.bytes_to_host = stats.bytes_to_host;
  c.acceptance_rate = stats.acceptance_rate;
  c.mean_accepted_length = stats.mean_accepted_length;
  // Gamma never exceeds SPECRUN_MAX_GAMMA, the C spelling of specrun::kMaxGamma.
  static_assert(SPECRUN_MAX_GAMMA == specrun::kMaxGamma);
  for (const auto& [gamma, steps] : stats.gamma_histogram) {
    if (gamma >= 0 && gamma <= SPECRUN_MAX_GAMMA) c.gamma_histogram[gamma] = steps;
  }
  c.draft_ms = stats.draft_ms;
  c.target_ms = stats.target_ms;
  c.cached_prompt_tokens = stats.cached_prompt_tokens;
  return c;
}

specrun_result* owned(const specrun::Result& result) {
  auto* copy = static_cast<specrun_result*>(std::calloc(1, sizeof(specrun_result)));
  if (copy == nullptr) throw std::bad_alloc();
  try {
    copy->request = result.request;
    copy->token_count = result.tokens.size();
    copy->tokens = copy_tokens(result.tokens);
    copy->text_length = result.text.size();
    copy->text = copy_string(result.text);
    copy->reason = to_c(result.reason);
    copy->error = copy_string(result.error);
    copy->stats = to_c(result.stats);
    copy->logprob_count = result.logprobs.size();
    copy->logprobs = copy_logprobs(result.logprobs);
  } catch (...) {
    free_result(copy);
    throw;
  }
  return copy;
}

// The C settings as specrun::EngineConfig; throws naming the field that is wrong.
specrun::EngineConfig from_c(const specrun_engine_config& config) {
  require(config.target, "config->target");
  specrun::EngineConfig settings;
  settings.target = config.target;
  if (config.draft != nullptr) settings.draft = config.draft;
  if (config.device != nullptr && config.device[0] != '\0') settings.device = config.device;
  settings.threads = config.threads;
  settings.kv_cache_tokens = config.kv_cache_tokens;
  settings.kv_block_size = config.kv_block_size;
  settings.max_batch = config.max_batch;
  if (config.rope_style != nullptr && config.rope_style[0] != '\0') {
    settings.rope_style = config.rope_style;
  }
  settings.deterministic = config.deterministic != 0;
  settings.activations = enum_from_c<specrun::activation_precisions>(
      config.activations, "config->activations", "specrun_activations");
  settings.sampling = from_c(config.sampling, "config->sampling");
  settings.speculation = from_c(config.speculation, "config->speculation");
  settings.prefix_cache = config.prefix_cache != 0;
  settings.quantize = enum_from_c<specrun::quantizations>(config.quantize, "config->quantize",
                                                          "specrun_quantization");
  settings.draft_quantize = enum_from_c<specrun::quantizations>(
      config.draft_quantize, "config->draft_quantize", "specrun_quantization");
  settings.quantize_lm_head = config.quantize_lm_head != 0;
  settings.kv_cache_dtype = enum_from_c<specrun::kv_cache_dtypes>(
      config.kv_cache_dtype, "config->kv_cache_dtype", "specrun_kv_cache_dtype");
  settings.overlap_drafting = enum_from_c<specrun::overlap_draftings>(
      config.overlap_drafting, "config->overlap_drafting", "specrun_overlap_drafting");
  return settings;
}

// The bias of a request's params as specrun::Request's map, refusing a count without its arrays,
// one past SPECRUN_MAX_LOGIT_BIAS (before any entry is read) and a token named twice. The values'
// range and the tokens' vocabulary are the engine's to check.
std::map<int32_t, float> logit_bias_from_c(const specrun_request_params& params) {
  std::map<int32_t, float> bias;
  const size_t count = params.logit_bias_count;
  if (count == 0) return bias;
  if (params.logit_bias_tokens == nullptr) {
    throw InvalidArgument("params->logit_bias_tokens is NULL with logit_bias_count " +
                          std::to_string(count));
  }
  if (params.logit_bias_values == nullptr) {
    throw InvalidArgument("params->logit_bias_values is NULL with logit_bias_count " +
                          std::to_string(count));
  }
  if (count > SPECRUN_MAX_LOGIT_BIAS) {
    throw InvalidArgument("params->logit_bias_count must be at most " +
                          std::to_string(SPECRUN_MAX_LOGIT_BIAS) + ", got " +
                          std::to_string(count));
  }
  std::map<int32_t, size_t> index_of;  // each token's first index, to name a repeat
  for (size_t i = 0; i < count; ++i) {
    const int32_t token = params.logit_bias_tokens[i];
    if (const auto [first, inserted] = index_of.emplace(token, i); !inserted) {
      throw InvalidArgument("params->logit_bias_tokens[" + std::to_string(i) +
                            "] must not repeat logit_bias_tokens[" + std::to_string(first->second) +
                            "], token " + std::to_string(token));
    }
    bias[token] = params.logit_bias_values[i];
  }
  return bias;
}

// The constraint of a request's params, refusing an unknown kind, a kind without the text it needs
// and text for a kind that takes none. Whether the schema or grammar compiles is the engine's.
specrun::OutputConstraint constraint_from_c(const specrun_request_params& params) {
  const int64_t kind = enum_value(params.constraint_kind);
  const char* text = params.constraint_text;
  const bool has_text = text != nullptr && text[0] != '\0';
  specrun::OutputConstraint constraint;
  switch (kind) {
    case SPECRUN_CONSTRAINT_NONE:
    case SPECRUN_CONSTRAINT_JSON_OBJECT:
      if (has_text) {
        throw InvalidArgument(std::string("params->constraint_text must be NULL or \"\" with ") +
                              (kind == SPECRUN_CONSTRAINT_NONE ? "SPECRUN_CONSTRAINT_NONE"
                                                               : "SPECRUN_CONSTRAINT_JSON_OBJECT"));
      }
      constraint.kind = kind == SPECRUN_CONSTRAINT_NONE ? specrun::ConstraintKind::kNone
                                                        : specrun::ConstraintKind::kJsonObject;
      return constraint;
    case SPECRUN_CONSTRAINT_JSON_SCHEMA:
    case SPECRUN_CONSTRAINT_GBNF:
      if (!has_text) {
        throw InvalidArgument(std::string("params->constraint_text must hold ") +
                              (kind == SPECRUN_CONSTRAINT_GBNF
                                   ? "the grammar with SPECRUN_CONSTRAINT_GBNF"
                                   : "the schema with SPECRUN_CONSTRAINT_JSON_SCHEMA") +
                              ", got " + (text == nullptr ? "NULL" : "\"\""));
      }
      constraint.kind = kind == SPECRUN_CONSTRAINT_GBNF ? specrun::ConstraintKind::kGbnf
                                                        : specrun::ConstraintKind::kJsonSchema;
      constraint.text = text;
      return constraint;
  }
  throw InvalidArgument("params->constraint_kind " + std::to_string(kind) +
                        " is not a specrun_constraint_kind");
}

specrun_model_memory to_c(const specrun::ModelMemory& memory) {
  return {memory.weight_bytes, memory.kv_bytes_per_token, memory.kv_tokens, memory.kv_bytes,
          memory.workspace_bytes};
}

specrun_memory_plan to_c(const specrun::MemoryPlan& plan) {
  return {to_c(plan.target), to_c(plan.draft), plan.total_bytes, plan.available_bytes};
}

}  // namespace

extern "C" {

const char* specrun_last_error(void) {
  return last_error.c_str();
}

const char* specrun_status_name(specrun_status status) {
  switch (enum_value(status)) {
    case SPECRUN_OK:
      return "ok";
    case SPECRUN_ERROR_INVALID_ARGUMENT:
      return "invalid_argument";
    case SPECRUN_ERROR_FAILED:
      return "failed";
    case SPECRUN_ERROR_SHUT_DOWN:
      return "shut_down";
    case SPECRUN_ERROR_TIMEOUT:
      return "timeout";
    case SPECRUN_ERROR_END_OF_STREAM:
      return "end_of_stream";
    case SPECRUN_ERROR_OUT_OF_MEMORY:
      return "out_of_memory";
    case SPECRUN_ERROR_INTERNAL:
      return "internal";
  }
  return "unknown";
}

const char* specrun_version(void) {
  return SPECRUN_VERSION_STRING;
}

const char* specrun_finish_reason_name(specrun_finish_reason reason) {
  const int64_t value = enum_value(reason);
  switch (value) {
    case SPECRUN_FINISH_END_OF_SEQUENCE:
    case SPECRUN_FINISH_MAX_TOKENS:
    case SPECRUN_FINISH_CONTEXT_LIMIT:
    case SPECRUN_FINISH_CANCELLED:
    case SPECRUN_FINISH_SHUTDOWN:
    case SPECRUN_FINISH_FAILED:
      return specrun::to_string(static_cast<specrun::FinishReason>(value));
  }
  return "unknown";
}

specrun_status specrun_sampling_init(specrun_sampling* sampling) {
  return guarded("specrun_sampling_init",
                 [&] { *require(sampling, "sampling") = to_c(specrun::SamplingSettings{}); });
}

specrun_status specrun_speculation_init(specrun_speculation* speculation) {
  return guarded("specrun_speculation_init", [&] {
    *require(speculation, "speculation") = to_c(specrun::SpeculationSettings{});
  });
}

specrun_status specrun_engine_config_init(specrun_engine_config* config) {
  return guarded("specrun_engine_config_init", [&] {
    require(config, "config");
    const specrun::EngineConfig defaults;
    config->target = nullptr;
    config->draft = nullptr;
    config->device = nullptr;
    config->threads = defaults.threads;
    config->kv_cache_tokens = defaults.kv_cache_tokens;
    config->kv_block_size = defaults.kv_block_size;
    config->max_batch = defaults.max_batch;
    config->rope_style = nullptr;
    config->deterministic = defaults.deterministic ? 1 : 0;
    config->activations = static_cast<specrun_activations>(defaults.activations);
    config->sampling = to_c(defaults.sampling);
    config->speculation = to_c(defaults.speculation);
    config->prefix_cache = defaults.prefix_cache ? 1 : 0;
    config->quantize = static_cast<specrun_quantization>(defaults.quantize);
    config->draft_quantize = static_cast<specrun_quantization>(defaults.draft_quantize);
    config->quantize_lm_head = defaults.quantize_lm_head ? 1 : 0;
    config->kv_cache_dtype = static_cast<specrun_kv_cache_dtype>(defaults.kv_cache_dtype);
    config->overlap_drafting = static_cast<specrun_overlap_drafting>(defaults.overlap_drafting);
  });
}

specrun_status specrun_engine_create(const specrun_engine_config* config, specrun_engine** engine) {
  return guarded("specrun_engine_create", [&] {
    require(config, "config");
    require(engine, "engine");
    *engine = nullptr;
    const specrun::EngineConfig settings = from_c(*config);
    auto handle = std::make_unique<specrun_engine>();
    handle->engine = specrun::Engine::create(settings);
    *engine = handle.release();
  });
}

specrun_status specrun_plan_memory(const specrun_engine_config* config, specrun_memory_plan* plan) {
  return guarded("specrun_plan_memory", [&] {
    require(config, "config");
    require(plan, "plan");
    *plan = to_c(specrun::plan_memory(from_c(*config)));
  });
}

specrun_status specrun_engine_memory_get(const specrun_engine* engine, specrun_memory_plan* plan) {
  return guarded("specrun_engine_memory_get", [&] {
    require(engine, "engine");
    require(plan, "plan");
    *plan = to_c(engine->engine->info().memory);
  });
}

specrun_status specrun_engine_create_from_toml(const char* path, specrun_engine** engine) {
  return guarded("specrun_engine_create_from_toml", [&] {
    require(path, "path");
    require(engine, "engine");
    *engine = nullptr;
    auto handle = std::make_unique<specrun_engine>();
    handle->engine = specrun::Engine::create(specrun::EngineConfig::from_toml(path));
    *engine = handle.release();
  });
}

specrun_status specrun_engine_create_from_toml_within(const char* path, const char* model_root,
                                                      specrun_engine** engine) {
  return guarded("specrun_engine_create_from_toml_within", [&] {
    require(path, "path");
    require(model_root, "model_root");
    require(engine, "engine");
    *engine = nullptr;
    if (*model_root == '\0') throw specrun::Error("model_root must not be empty");
    auto handle = std::make_unique<specrun_engine>();
    handle->engine = specrun::Engine::create(specrun::EngineConfig::from_toml(path, model_root));
    *engine = handle.release();
  });
}

specrun_status specrun_engine_shutdown(specrun_engine* engine) {
  return guarded("specrun_engine_shutdown", [&] {
    require(engine, "engine");
    engine->shut_down = true;
    engine->engine->shutdown();
  });
}

void specrun_engine_destroy(specrun_engine* engine) {
  if (engine == nullptr) return;
  // A handle that is not live (debug builds) is left alone, its error the last error.
  if (guarded("specrun_engine_destroy", [&] { require(engine, "engine"); }) != SPECRUN_OK) return;
  // Shutting down joins the scheduler; it has no failure to report, and nothing may escape.
  guarded("specrun_engine_destroy", [&] {
    engine->shut_down = true;
    engine->engine->shutdown();
  });
  engine->magic = kDeadHandle;
  delete engine;
}

specrun_status specrun_request_params_init(specrun_request_params* params) {
  return guarded("specrun_request_params_init", [&] {
    require(params, "params");
    params->prompt = nullptr;
    params->prompt_ids = nullptr;
    params->prompt_id_count = 0;
    params->sampling = nullptr;
    params->speculation = nullptr;
    params->on_event = nullptr;
    params->user_data = nullptr;
    params->logit_bias_tokens = nullptr;
    params->logit_bias_values = nullptr;
    params->logit_bias_count = 0;
    params->logprobs = specrun::Request{}.logprobs;
    params->constraint_kind = SPECRUN_CONSTRAINT_NONE;
    params->constraint_text = nullptr;
  });
}

specrun_status specrun_submit(specrun_engine* engine, const specrun_request_params* params,
                              specrun_request** request) {
  return guarded("specrun_submit", [&] {
    require(engine, "engine");
    require(params, "params");
    require(request, "request");
    *request = nullptr;
    if (params->prompt_ids == nullptr && params->prompt_id_count > 0) {
      throw InvalidArgument("params->prompt_ids is NULL with prompt_id_count " +
                            std::to_string(params->prompt_id_count));
    }
    // Counted before any id is read: a count past the context (SIZE_MAX, a negative length cast)
    // names itself rather than overflowing the copy.
    const auto context = static_cast<size_t>(engine->engine->info().context_limit);
    if (params->prompt_id_count > context) {
      throw InvalidArgument("params->prompt_id_count " + std::to_string(params->prompt_id_count) +
                            " is more than the context limit of " + std::to_string(context) +
                            " tokens");
    }
    if (engine->shut_down) throw ShutDown();
    specrun::Request settings;
    if (params->prompt != nullptr) settings.prompt = params->prompt;
    if (params->prompt_ids != nullptr) {
      settings.prompt_ids.assign(params->prompt_ids, params->prompt_ids + params->prompt_id_count);
    }
    if (params->sampling != nullptr) {
      settings.sampling = from_c(*params->sampling, "params->sampling");
    }
    if (params->speculation != nullptr) {
      settings.speculation = from_c(*params->speculation, "params->speculation");
    }
    settings.logit_bias = logit_bias_from_c(*params);
    // Checked here, not only by the engine: the bound sizes specrun_token_logprob's arrays.
    if (params->logprobs < -1 || params->logprobs > SPECRUN_MAX_TOP_LOGPROBS) {
      throw InvalidArgument("params->logprobs must be -1 (none) or in [0, " +
                            std::to_string(SPECRUN_MAX_TOP_LOGPROBS) + "], got " +
                            std::to_string(params->logprobs));
    }
    settings.logprobs = params->logprobs;
    settings.constraint = constraint_from_c(*params);
    specrun::StreamCallback callback;
    if (params->on_event != nullptr) {
      callback = [on_event = params->on_event,
                  user_data = params->user_data](const specrun::Event& event) {
        std::vector<specrun_token_logprob> logprobs;
        const specrun_event view = borrowed(event, logprobs);
        on_event(&view, user_data);
      };
    }
    auto handle = std::make_unique<specrun_request>();
    try {
      handle->handle = engine->engine->submit(settings, std::move(callback));
    } catch (const specrun::Error&) {
      if (engine->shut_down) throw ShutDown();  // shut down while this call ran
      throw;
    }
    *request = handle.release();
  });
}

specrun_status specrun_request_next(specrun_request* request, int64_t timeout_ms,
                                    specrun_event** event) {
  return guarded("specrun_request_next", [&] {
    require(request, "request");
    require(event, "event");
    *event = nullptr;
    specrun::RequestHandle& handle = request->handle;
    std::optional<specrun::Event> next;
    if (timeout_ms < 0) {
      // Without limit: a day at a time, so no deadline arithmetic can overflow.
      while (!(next = handle.next(std::chrono::hours(24))) && !handle.finished()) {
      }
    } else {
      next = handle.next(std::chrono::milliseconds(timeout_ms));
    }
    // The request may have finished between the wait and now: once finished nothing more is
    // queued, so one more look tells a late final event from the end of the stream.
    if (!next && handle.finished()) next = handle.next(std::chrono::milliseconds(0));
    if (!next) {
      if (handle.finished()) {
        throw StatusError(SPECRUN_ERROR_END_OF_STREAM,
                          "request " + std::to_string(handle.id()) + " has no more events");
      }
      throw StatusError(SPECRUN_ERROR_TIMEOUT, "no event within " + std::to_string(timeout_ms) +
                                                   " ms for request " +
                                                   std::to_string(handle.id()));
    }
    *event = owned(*next);
  });
}

void specrun_event_free(specrun_event* event) {
  free_event(event);
}

specrun_status specrun_request_wait(specrun_request* request, specrun_result** result) {
  return guarded("specrun_request_wait", [&] {
    require(request, "request");
    require(result, "result");
    *result = nullptr;
    *result = owned(request->handle.wait());
  });
}

void specrun_result_free(specrun_result* result) {
  free_result(result);
}

specrun_status specrun_request_id(const specrun_request* request, uint64_t* id) {
  return guarded("specrun_request_id", [&] {
    require(request, "request");
    *require(id, "id") = request->handle.id();
  });
}

specrun_status specrun_request_finished(const specrun_request* request, int* finished) {
  return guarded("specrun_request_finished", [&] {
    require(request, "request");
    *require(finished, "finished") = request->handle.finished() ? 1 : 0;
  });
}

specrun_status specrun_request_cancel(specrun_request* request) {
  return guarded("specrun_request_cancel", [&] { require(request, "request")->handle.cancel(); });
}

void specrun_request_free(specrun_request* request) {
  if (request == nullptr) return;
  if (guarded("specrun_request_free", [&] { require(request, "request"); }) != SPECRUN_OK) return;
  request->magic = kDeadHandle;
  delete request;
}

specrun_status specrun_engine_cancel(specrun_engine* engine, uint64_t request, int* cancelled) {
  return guarded("specrun_engine_cancel", [&] {
    const bool stopped = require(engine, "engine")->engine->cancel(request);
    if (cancelled != nullptr) *cancelled = stopped ? 1 : 0;
  });
}

specrun_status specrun_engine_stats_get(const specrun_engine* engine, specrun_engine_stats* stats) {
  return guarded("specrun_engine_stats_get", [&] {
    require(engine, "engine");
    require(stats, "stats");
    const specrun::EngineStats s = engine->engine->stats();
    stats->submitted = s.submitted;
    stats->finished = s.finished;
    stats->running = s.running;
    stats->waiting = s.waiting;
    stats->tokens_generated = s.tokens_generated;
    stats->steps = s.steps;
    stats->mean_batch = s.mean_batch;
    stats->drafted = s.drafted;
    stats->accepted = s.accepted;
    stats->acceptance_rate = s.acceptance_rate;
    stats->draft_ms = s.draft_ms;
    stats->target_ms = s.target_ms;
    stats->uptime_ms = s.uptime_ms;
    stats->tokens_per_second = s.tokens_per_second;
    stats->kv_tokens_capacity = s.kv_tokens_capacity;
    stats->kv_tokens_free = s.kv_tokens_free;
    stats->kv_tokens_cached = s.kv_tokens_cached;
    stats->prompt_tokens = s.prompt_tokens;
    stats->cached_prompt_tokens = s.cached_prompt_tokens;
    stats->prefix_cache_hit_rate = s.prefix_cache_hit_rate;
    stats->drafted_ahead = s.drafted_ahead;
    stats->ahead_taken = s.ahead_taken;
    stats->host_waits = s.host_waits;
    stats->bytes_to_host = s.bytes_to_host;
    for (size_t i = 0; i < SPECRUN_MAX_GAMMA; ++i) {
      stats->drafted_at[i] = i < s.drafted_at.size() ? s.drafted_at[i] : 0;
      stats->accepted_at[i] = i < s.accepted_at.size() ? s.accepted_at[i] : 0;
    }
  });
}

specrun_status specrun_engine_info_get(const specrun_engine* engine, specrun_engine_info* info) {
  return guarded("specrun_engine_info_get", [&] {
    require(engine, "engine");
    require(info, "info");
    const specrun::EngineInfo& i = engine->engine->info();
    info->target = i.target.c_str();
    info->draft = i.draft.c_str();
    info->target_parameters = i.target_parameters;
    info->draft_parameters = i.draft_parameters;
    info->vocab_size = i.vocab_size;
    info->bos_token_id = i.bos_token_id;
    info->context_limit = i.context_limit;
    info->has_tokenizer = i.has_tokenizer ? 1 : 0;
    info->device = i.device.c_str();
    info->threads = i.threads;
    info->cpu_kernels = i.cpu_kernels.c_str();
    info->activations = i.activations.c_str();
  });
}

specrun_status specrun_tokenize(const specrun_engine* engine, const char* text,
                                int add_special_tokens, int32_t** tokens, size_t* count) {
  return guarded("specrun_tokenize", [&] {
    require(engine, "engine");
    require(text, "text");
    require(tokens, "tokens");
    require(count, "count");
    *tokens = nullptr;
    *count = 0;
    const std::vector<int32_t> ids = engine->engine->tokenize(text, add_special_tokens != 0);
    *tokens = copy_tokens(ids);
    *count = ids.size();
  });
}

specrun_status specrun_detokenize(const specrun_engine* engine, const int32_t* tokens, size_t count,
                                  char** text) {
  return guarded("specrun_detokenize", [&] {
    require(engine, "engine");
    require(text, "text");
    *text = nullptr;
    if (tokens == nullptr && count > 0) {
      throw InvalidArgument("tokens is NULL with count " + std::to_string(count));
    }
    const std::vector<int32_t> ids(tokens, tokens + count);
    *text = copy_string(engine->engine->detokenize(ids));
  });
}

void specrun_tokens_free(int32_t* tokens) {
  std::free(tokens);
}

void specrun_string_free(char* text) {
  std::free(text);
}

}  // extern "C"
