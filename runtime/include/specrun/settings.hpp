// specrun's settings vocabulary: the choices (their names as every front end spells them), the
// settings a request carries (SamplingSettings, SpeculationSettings), and one table of each
// settings struct (every key, its type, its range and what it means) that the TOML reader, the
// command line, the server and validation all walk, so that a new setting is one row and appears
// everywhere, with the same checks and the same words in every error. Value types and tables
// only, no engine: what the layers below the API and an embedder's own front end include.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace specrun {

// Who proposes the drafts.
enum class SpeculationMethod {
  kDraftModel,    // the engine's draft model (plain decoding when the engine has none)
  kPromptLookup,  // n-grams of the prompt and the text so far
  kNone,          // plain decoding
};
const char* to_string(SpeculationMethod method);  // "draft", "prompt_lookup", "none"

// How the number of drafts per step (gamma) adapts. Under each, `gamma` is the depth of a
// request's first drafting step.
enum class GammaControl {
  kGoodput,    // from measured acceptance and step costs, for the whole batch; may decode plainly
               // (and calibrate its cost model) before the first drafting step
  kHeuristic,  // +2 after a step that accepted every draft, -1 otherwise
  kFixed,      // always `gamma`
};
const char* to_string(GammaControl control);  // "goodput", "heuristic", "fixed"

// How a sampled request's drafts are verified, and so how its tokens are drawn at all: a step
// without drafts is verified by the same rule, so turning speculation off changes nothing but
// speed. Both keep the output distributed exactly as the target's; greedy requests (temperature
// 0) accept drafts while they are the argmax under either. Every random number is keyed by the
// request's seed and the output position it decides, never by batch mates or timing.
enum class Verification {
  kSharedNoise,  // the default: draft and target draw each position's token by Gumbel-max with the
                 // same noise, and a draft is accepted when they agree. A seed reproduces the
                 // output token for token with or without speculation, for every gamma, controller,
                 // batch and timing; drafts are accepted slightly less often than by rejection
                 // sampling.
  kRejection,    // rejection sampling: the most drafts accepted. A seed reproduces the output only
                 // when the steps draft alike (the fixed or heuristic controller), not under
                 // goodput, whose gamma follows measured timings.
};
const char* to_string(Verification verification);  // "shared_noise", "rejection"

// Quantization of a model's linear layers at load: 8-bit codes with one symmetric scale per output
// channel, computed from f32, f16 or bf16 weights (a checkpoint published pre-quantized in FP8 is
// read as it is, whatever this says). Embeddings stay bf16, and the output projection too unless
// EngineConfig::quantize_lm_head.
enum class Quantization {
  kNone,  // weights as stored
  kFP8,   // FP8 E4M3, scale = max |w| / 448 per output channel
  kINT8,  // int8 in [-127, 127], scale = max |w| / 127 per output channel
};
const char* to_string(Quantization quantization);  // "none", "fp8", "int8"

// How both models' KV caches store keys and values.
enum class KvCacheDtype {
  kBF16,  // bfloat16, rounded to nearest even as written: half the memory and the bytes
          // attention reads of f32
  kF32,   // exact: the reference comparisons
};
const char* to_string(KvCacheDtype dtype);  // "bf16", "f32"

// Overlapped drafting: while the target verifies a step's drafts, the draft model goes on
// proposing past them as if all were accepted. When they all are and the token verification adds
// is the draft's own next one, those drafts (with their q) are the next step's proposals, so that
// step starts with its drafting done; otherwise they are dropped. Output is the same either way.
enum class OverlapDrafting {
  kAuto,  // where it pays: only a backend that runs the draft beside the target's verification
          // hides the time it costs, and there each row's gamma policy decides (goodput from the
          // measured costs and acceptance): on CUDA, where the draft has a stream of its own;
          // off on the CPU, which runs one op at a time on the same cores
  kOn,    // always, also where the drafts ahead cost time of their own (tests, measurements)
  kOff,   // never
};
const char* to_string(OverlapDrafting overlap);  // "auto", "on", "off"

// How the CPU backend's matmuls with bf16 weights (and INT8 or FP8 weights with one scale per
// row, whose codes are exact in bf16) treat their activations. bf16 is how llama.cpp and the
// GPUs' bf16 GEMMs run them: each activation rounded to bf16, products of bf16 pairs (exact in
// f32) summed in f32, logits within bf16 rounding of exact; f32 multiplies every f32 activation by
// the widened weight, the reference that the NumPy and transformers comparisons use. int8 goes
// further for INT8 weights with one scale per row (--quantize int8), as W8A8 deployments do: each
// activation row quantized to int8 codes with one scale (max |x| / 127), multiplied by the weight
// codes in exact integer sums (vpdpbusd where the CPU has AVX512-VNNI), and scaled once: about
// twice the speed of bf16 in prefill and verification, and an error of up to half a step
// (max |x| / 254) per activation. GGUF's Q4_0, Q4_1 and Q8_0 matrices, multiplied as stored,
// meet activations quantized to int8 per block of 32 columns under every choice but kF32, which
// widens their blocks to f32 values (exact, several times slower). Other weights (and the CUDA
// backend, which multiplies bf16 by bf16) ignore this.
enum class ActivationPrecision {
  kAuto,  // bf16 where the matmul in use multiplies bf16 pairs in hardware (AMX tiles, or
          // vdpbf16ps with AVX512-BF16), which makes prefill and verification faster; f32 on
          // other CPUs, where rounding would cost precision and save no time (GGUF blocks: int8
          // per block either way)
  kF32,   // always f32: exact, GGUF blocks included
  kBF16,  // always bf16 (widened to f32 on CPUs without bf16 dot products)
  kInt8,  // bf16, and int8 codes per token for INT8 weights with one scale per row; never auto's
          // choice: it changes the numbers more than rounding to bf16 does
};
const char* to_string(ActivationPrecision precision);  // "auto", "f32", "bf16", "int8"

// The most drafts any step may verify (gamma_max's bound).
inline constexpr int64_t kMaxGamma = 64;

struct SamplingSettings {
  float temperature = 1.0f;  // 0 is greedy
  int32_t top_k = 0;         // keep the k most probable tokens; 0 disables
  float top_p = 1.0f;        // keep the fewest tokens whose probability reaches p; 1 disables
  float min_p = 0.0f;        // drop tokens below min_p times the top probability; 0 disables
  uint64_t seed = 0;         // keys the request's random numbers (see Verification)
  int64_t max_tokens = 256;  // new tokens at most
  bool stop_at_eos = true;   // end at the model's end-of-sequence tokens (not emitted)
  // Penalties on tokens already in the text, applied to the logits of every position the target
  // decides (drafted tokens before it counted) before temperature and the filters, as vLLM and
  // OpenAI define them: a token's logit less frequency_penalty times its count in the output so
  // far and presence_penalty if it occurs there; the repetition penalty (Keskar et al., as
  // transformers applies it) divides a positive logit of a token in the prompt or the output by
  // it and multiplies a negative one.
  float frequency_penalty = 0.0f;   // in [-2, 2]; 0 disables
  float presence_penalty = 0.0f;    // in [-2, 2]; 0 disables
  float repetition_penalty = 1.0f;  // > 0; 1 disables
};

// The most alternates per draft (SpeculationSettings::draft_alternates).
inline constexpr int64_t kMaxDraftAlternates = 8;

struct SpeculationSettings {
  SpeculationMethod method = SpeculationMethod::kDraftModel;  // who proposes
  GammaControl controller = GammaControl::kGoodput;           // how gamma adapts
  Verification verification = Verification::kSharedNoise;     // how drafts are verified
  int64_t gamma = 4;             // drafts in the first drafting step (every step, with kFixed);
                                 // with kGoodput, 0 leaves that depth to the controller
  int64_t gamma_min = 0;         // never fewer (0 allows plain decoding)
  int64_t gamma_max = 8;         // never more (at most kMaxGamma)
  float draft_p_min = 0.0f;      // stop drafting when the draft's top probability falls below this
  int64_t lookup_min_ngram = 1;  // prompt lookup: shortest suffix matched
  int64_t lookup_max_ngram = 3;  // prompt lookup: longest suffix matched
  // With the draft model: where the text so far ends in an n-gram of at least this many tokens
  // (at most lookup_max_ngram) that occurred before and the draft's top probability is below
  // draft_lookup_below, prompt lookup offers what followed it, proposed in the draft's place
  // while it has won at least as many of their contests as the draft (README, "Prompt lookup
  // beside the draft"); 0 never.
  int64_t draft_lookup_ngram = 2;
  float draft_lookup_below = 0.8f;  // in (0, 1]; 1 looks up wherever the text repeats itself
  // With the draft model, greedy or shared-noise verification and a backend that takes token
  // trees (the CPU): up to this many other guesses per draft (the model's next most likely tokens,
  // or lookup's where the two differed) that the target scores beside the drafts; where the
  // target's token is one of them it is accepted, and the token after it too (README, "Alternates:
  // a token tree"). At most kMaxDraftAlternates; 0 never.
  int64_t draft_alternates = 2;
};

enum class FinishReason {
  kEndOfSequence,  // the model produced an end-of-sequence token
  kMaxTokens,      // max_tokens were produced
  kContextLimit,   // the sequence filled the model's context
  kCancelled,      // cancel() was called
  kShutdown,       // the engine shut down first
  kFailed,         // an error stopped it (Result::error says which)
};
const char* to_string(FinishReason reason);  // "end_of_sequence", "max_tokens", ...

// The names of the choices, as every setting spells them ("draft", "goodput", ...); nullopt for
// any other name.
std::optional<SpeculationMethod> parse_speculation_method(std::string_view name);
std::optional<GammaControl> parse_gamma_control(std::string_view name);
std::optional<Verification> parse_verification(std::string_view name);
std::optional<Quantization> parse_quantization(std::string_view name);
std::optional<KvCacheDtype> parse_kv_cache_dtype(std::string_view name);
std::optional<OverlapDrafting> parse_overlap_drafting(std::string_view name);
std::optional<ActivationPrecision> parse_activation_precision(std::string_view name);
// Every value of each choice, the default's first.
std::span<const SpeculationMethod> speculation_methods();
std::span<const GammaControl> gamma_controls();
std::span<const Verification> verifications();
std::span<const Quantization> quantizations();
std::span<const KvCacheDtype> kv_cache_dtypes();
std::span<const OverlapDrafting> overlap_draftings();
std::span<const ActivationPrecision> activation_precisions();

// ---- the setting tables ---------------------------------------------------------------------

enum class SettingKind {
  kInteger,  // an int64 in [integer_minimum, integer_maximum]
  kNumber,   // a float in [number_minimum, number_maximum], (number_minimum, ...] when exclusive
  kChoice,   // one of `choices`
};

// A setting's value as the front ends read it: kInteger's int64, kNumber's double, kChoice's name.
using SettingValue = std::variant<int64_t, double, std::string>;

// The values a setting takes.
struct SettingRange {
  SettingKind kind;
  int64_t integer_minimum = 0;         // kInteger
  int64_t integer_maximum = 0;         // kInteger
  double number_minimum = 0.0;         // kNumber
  double number_maximum = 0.0;         // kNumber; infinity: no bound but finiteness
  bool exclusive_minimum = false;      // kNumber: number_minimum itself is out of range
  std::vector<std::string> choices{};  // kChoice: every name, the default's first
};

template <typename Settings>
struct Setting {
  const char* key;  // "draft_lookup_below": TOML key, JSON field; the flag is --draft-lookup-below
  SettingRange range;
  SettingValue (*get)(const Settings&) = nullptr;         // the field's value
  void (*set)(Settings&, const SettingValue&) = nullptr;  // a value in range, stored
  const char* help = "";                                  // one line for --help and the docs
};

// Every setting of the request's sampling and of its speculation, in the order the docs list them.
std::span<const Setting<SamplingSettings>> sampling_settings();
std::span<const Setting<SpeculationSettings>> speculation_settings();

// The row named `key`, or null.
template <typename Settings>
const Setting<Settings>* find_setting(std::span<const Setting<Settings>> table,
                                      std::string_view key) {
  for (const Setting<Settings>& row : table) {
    if (key == row.key) return &row;
  }
  return nullptr;
}

// The keys of a table, comma-separated, for "is not a known key" errors.
template <typename Settings>
std::string setting_keys(std::span<const Setting<Settings>> table) {
  std::string keys;
  for (const Setting<Settings>& row : table)
    keys += (keys.empty() ? "" : ", ") + std::string(row.key);
  return keys;
}

// What a value must be: "in [0, 64]", "in (0, 1]", "finite and >= 0", "one of draft, none".
std::string describe_range(const SettingRange& range);

// Why `value` is out of `range` ("must be in (0, 1], got 0"), or nullopt when it is in it. A
// number is checked as the float the settings store: 1e-50 is above 0 as a double, not as a float.
std::optional<std::string> setting_problem(const SettingRange& range, const SettingValue& value);

// Command-line text as the row's type: "7" for an integer, "0.9" for a number, a name for a
// choice; nullopt when the text is not of that type (the range is setting_problem's).
std::optional<SettingValue> parse_setting_text(SettingKind kind, std::string_view text);

// A value as text: "4", "0.8", "goodput".
std::string setting_text(const SettingValue& value);

// Throws Error naming the key and its value where a speculation setting is out of its row's
// range, or where keys disagree (gamma outside [gamma_min, gamma_max], lookup_min_ngram past
// lookup_max_ngram, draft_lookup_ngram past lookup_max_ngram). Every front end's settings pass it
// before a request runs.
void validate(const SpeculationSettings& speculation);

// Sets gamma as the command line's --gamma and the server's speculative.gamma do, after the
// other settings given with it: the range [gamma_min, gamma_max] moves to take it (a file's gamma
// must lie in its range instead).
void set_gamma_moving_range(SpeculationSettings& settings, int64_t gamma);

}  // namespace specrun
