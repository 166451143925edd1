/* specrun's C ABI: the engine of specrun.hpp (continuous batching under speculative decoding)
 * for C and any language with a C foreign-function interface. C99.
 *
 *   specrun_engine_config config;
 *   specrun_engine_config_init(&config);
 *   config.target = "models/pycode-target";
 *   config.draft = "models/pycode-draft";
 *   specrun_engine* engine = NULL;
 *   if (specrun_engine_create(&config, &engine) != SPECRUN_OK) {
 *     fprintf(stderr, "%s\n", specrun_last_error());
 *   }
 *   specrun_request_params params;
 *   specrun_request_params_init(&params);
 *   params.prompt = "def fib(n):\n";
 *   specrun_request* request = NULL;
 *   specrun_submit(engine, &params, &request);
 *   specrun_result* result = NULL;
 *   specrun_request_wait(request, &result);  // result->text, result->stats ...
 *   specrun_result_free(result);
 *   specrun_request_free(request);
 *   specrun_engine_destroy(engine);
 *
 * Errors. Every function that can fail returns a specrun_status; anything but SPECRUN_OK leaves
 * its outputs untouched (NULL where they are pointers) and sets the calling thread's last error,
 * a one-line message that specrun_last_error() returns. No C++ exception ever crosses this
 * interface, and a NULL pointer where one is required is SPECRUN_ERROR_INVALID_ARGUMENT.
 *
 * Ownership. Strings and arrays passed in are copied before the call returns (the caller keeps
 * them). What the library returns through an out-pointer is the caller's, to release with the
 * matching function: specrun_engine_destroy, specrun_request_free, specrun_event_free,
 * specrun_result_free, specrun_tokens_free, specrun_string_free. Pointers inside an event handed
 * to a callback are valid only during that call. Pointers in specrun_engine_info are the
 * engine's and valid until specrun_engine_destroy. Using an engine after specrun_engine_destroy,
 * or a request after specrun_request_free (destroying or freeing it twice included), is undefined
 * in release builds; a debug build (without NDEBUG) checks every handle on entry and refuses one
 * that is not live with SPECRUN_ERROR_INVALID_ARGUMENT ("engine is not a live handle"), and
 * specrun_engine_destroy and specrun_request_free then do nothing but set the last error. The
 * check is best effort: a freed handle's memory may have been reused.
 *
 * Threads. An engine is thread-safe: any thread may submit, cancel, read stats or shut it down.
 * A request handle may be used from any thread, but specrun_request_free must not run while
 * another call uses the same handle. Callbacks run on the engine's scheduler thread, one request's
 * events in order; they should return quickly, may call specrun_request_cancel and
 * specrun_engine_cancel, and must not submit, wait, shut down or destroy (that would deadlock). A
 * request handle stays valid after its engine is destroyed (it then reports the request's final
 * state).
 */
#ifndef SPECRUN_SPECRUN_H
#define SPECRUN_SPECRUN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a call did. */
typedef enum specrun_status {
  SPECRUN_OK = 0,                     /* success */
  SPECRUN_ERROR_INVALID_ARGUMENT = 1, /* a NULL pointer, an unknown enum value */
  SPECRUN_ERROR_FAILED = 2,           /* specrun refused: a bad config, checkpoint, request or
                                         setting; the message names it */
  SPECRUN_ERROR_SHUT_DOWN = 3,        /* the engine was shut down */
  SPECRUN_ERROR_TIMEOUT = 4,          /* specrun_request_next: no event within the timeout */
  SPECRUN_ERROR_END_OF_STREAM = 5,    /* specrun_request_next: the last event was already taken */
  SPECRUN_ERROR_OUT_OF_MEMORY = 6,    /* an allocation failed */
  SPECRUN_ERROR_INTERNAL = 7          /* anything else (a bug in specrun: please report it) */
} specrun_status;

/* The message of the last call on this thread that did not return SPECRUN_OK ("" when none).
 * Valid until the next failing call on this thread. */
const char* specrun_last_error(void);
/* "ok", "invalid_argument", "failed", ...; "unknown" for a value not listed. */
const char* specrun_status_name(specrun_status status);
/* The library's version, "MAJOR.MINOR.PATCH". */
const char* specrun_version(void);

/* Who proposes the drafts. */
typedef enum specrun_method {
  SPECRUN_METHOD_DRAFT = 0,         /* the engine's draft model (plain decoding without one) */
  SPECRUN_METHOD_PROMPT_LOOKUP = 1, /* n-grams of the prompt and the text so far */
  SPECRUN_METHOD_NONE = 2           /* plain decoding */
} specrun_method;

/* How the number of drafts per step (gamma) adapts. */
typedef enum specrun_controller {
  SPECRUN_CONTROLLER_GOODPUT = 0,   /* measured acceptance and step costs, for the whole batch */
  SPECRUN_CONTROLLER_HEURISTIC = 1, /* +2 after a step that accepted every draft, -1 otherwise */
  SPECRUN_CONTROLLER_FIXED = 2      /* always `gamma` */
} specrun_controller;

/* How a sampled request's drafts are verified, and so how its tokens are drawn (specrun.hpp's
 * specrun::Verification says what each guarantees). */
typedef enum specrun_verification {
  SPECRUN_VERIFICATION_SHARED_NOISE = 0, /* shared Gumbel noise (default): with a seed, the same
                                            output with or without speculation, for every gamma,
                                            controller and batch */
  SPECRUN_VERIFICATION_REJECTION = 1     /* rejection sampling: the most drafts accepted */
} specrun_verification;

/* Quantization of a model's linear layers at load (specrun.hpp's specrun::Quantization). */
typedef enum specrun_quantization {
  SPECRUN_QUANTIZATION_NONE = 0, /* weights as stored (default) */
  SPECRUN_QUANTIZATION_FP8 = 1,  /* FP8 E4M3 with one scale per output channel */
  SPECRUN_QUANTIZATION_INT8 = 2  /* int8 with one scale per output channel */
} specrun_quantization;

/* How both models' KV caches store keys and values (specrun.hpp's specrun::KvCacheDtype). */
typedef enum specrun_kv_cache_dtype {
  SPECRUN_KV_CACHE_BF16 = 0, /* bfloat16 (default): half the memory and attention's reads of f32 */
  SPECRUN_KV_CACHE_F32 = 1   /* f32: exact */
} specrun_kv_cache_dtype;

/* Drafting ahead while the target verifies (specrun.hpp's specrun::OverlapDrafting); output is
 * the same either way. */
typedef enum specrun_overlap_drafting {
  SPECRUN_OVERLAP_AUTO = 0, /* where it pays (default): off on both backends today, which run the
                             * draft and the target one after the other */
  SPECRUN_OVERLAP_ON = 1,   /* always */
  SPECRUN_OVERLAP_OFF = 2   /* never */
} specrun_overlap_drafting;

/* How the CPU backend's matmuls with bf16 weights (and 8-bit weights with one scale per row)
 * treat their activations (specrun.hpp's specrun::ActivationPrecision). */
typedef enum specrun_activations {
  SPECRUN_ACTIVATIONS_AUTO = 0, /* bf16 where the CPU multiplies bf16 pairs in hardware (AMX,
                                 * AVX512-BF16), else f32 (default); GGUF's Q4_0, Q4_1 and Q8_0
                                 * blocks meet int8 per block under every choice but f32 */
  SPECRUN_ACTIVATIONS_F32 = 1,  /* f32: exact, the reference (GGUF blocks widened) */
  SPECRUN_ACTIVATIONS_BF16 = 2, /* rounded to bf16, as llama.cpp and GPU bf16 GEMMs do */
  SPECRUN_ACTIVATIONS_INT8 = 3  /* bf16, and int8 codes per token for INT8 weights with one
                                 * scale per row (W8A8, integer sums) */
} specrun_activations;

/* Why a request finished. */
typedef enum specrun_finish_reason {
  SPECRUN_FINISH_END_OF_SEQUENCE = 0, /* the model produced an end-of-sequence token */
  SPECRUN_FINISH_MAX_TOKENS = 1,      /* max_tokens were produced */
  SPECRUN_FINISH_CONTEXT_LIMIT = 2,   /* the sequence filled the model's context */
  SPECRUN_FINISH_CANCELLED = 3,       /* it was cancelled */
  SPECRUN_FINISH_SHUTDOWN = 4,        /* the engine shut down first */
  SPECRUN_FINISH_FAILED = 5           /* an error stopped it (the result's `error` says which) */
} specrun_finish_reason;
/* "end_of_sequence", "max_tokens", ...; "unknown" for a value not listed. */
const char* specrun_finish_reason_name(specrun_finish_reason reason);

/* How tokens are chosen. specrun_sampling_init sets the defaults. Each field takes the range its
 * setting has everywhere (the TOML key, the command-line flag and the server's field of the same
 * name); a value out of it is refused with SPECRUN_ERROR_INVALID_ARGUMENT naming the field
 * ("params->sampling.top_p must be in (0, 1], got 0"). */
typedef struct specrun_sampling {
  float temperature;  /* 0 is greedy; default 1 */
  int32_t top_k;      /* keep the k most probable tokens; 0 (default) disables */
  float top_p;        /* keep the fewest tokens whose probability reaches p; 1 (default) disables */
  float min_p;        /* drop tokens below min_p times the top probability; 0 (default) disables */
  uint64_t seed;      /* keys the request's random numbers, in [0, INT64_MAX]; default 0 */
  int64_t max_tokens; /* new tokens at most; default 256 */
  int stop_at_eos;    /* nonzero (default): end at the model's end-of-sequence tokens */
  float frequency_penalty;  /* minus this times a token's count in the output; 0 (default) off */
  float presence_penalty;   /* minus this for a token in the output; 0 (default) disables */
  float repetition_penalty; /* divides positive logits of tokens seen; 1 (default) disables */
} specrun_sampling;

/* The most drafts any step may verify (gamma_max's bound). */
#define SPECRUN_MAX_GAMMA 64

/* How drafts are proposed. specrun_speculation_init sets the defaults; ranges are checked as for
 * specrun_sampling. */
typedef struct specrun_speculation {
  specrun_method method;         /* who proposes; default SPECRUN_METHOD_DRAFT */
  specrun_controller controller; /* how gamma adapts; default SPECRUN_CONTROLLER_GOODPUT */
  int64_t gamma;     /* drafts in the first drafting step (every step, when fixed; 0 with goodput
                        leaves that depth to the controller); default 4 */
  int64_t gamma_min; /* never fewer (0, the default, allows plain decoding) */
  int64_t gamma_max; /* never more, at most SPECRUN_MAX_GAMMA; default 8 */
  float draft_p_min; /* stop drafting below this draft top probability; default 0 (never) */
  int64_t lookup_min_ngram;          /* prompt lookup: shortest suffix matched; default 1 */
  int64_t lookup_max_ngram;          /* prompt lookup: longest suffix matched; default 3 */
  specrun_verification verification; /* default SPECRUN_VERIFICATION_SHARED_NOISE */
  int64_t draft_lookup_ngram;        /* with the draft model, where the text ends in an n-gram of at
                                        least this many tokens (at most lookup_max_ngram) seen before,
                                        and the draft's top probability is below draft_lookup_below,
                                        lookup offers what followed it, proposed in the draft's
                                        place while it wins as many contests
                                        (docs/speculation.md); 0 never;
                                        default 2 */
  float draft_lookup_below; /* in (0, 1]; 1 looks up wherever the text repeats; default 0.8 */
  int64_t draft_alternates; /* other guesses per draft the target scores beside it, a token tree
                               (greedy and shared-noise verification, CPU), at most 8; default 2 */
} specrun_speculation;

/* An engine's settings, as specrun::EngineConfig. specrun_engine_config_init sets the defaults;
 * strings are read (and copied) by specrun_engine_create only. */
typedef struct specrun_engine_config {
  const char* target;        /* checkpoint: directory, .safetensors, index or .gguf (required) */
  const char* draft;         /* draft checkpoint sharing the target's tokenizer; NULL or "": none */
  const char* device;        /* "cpu", "cuda" or "cuda:N"; NULL or "" is "cpu" */
  int threads;               /* CPU threads; 0 (default) uses every core */
  int64_t kv_cache_tokens;   /* KV capacity per model; 0 (default): the context, at most 8192 */
  int64_t kv_block_size;     /* tokens per KV-cache block; default 16 */
  int64_t max_batch;         /* sequences decoded together in one step, at most; default 64 */
  const char* rope_style;    /* "auto" (NULL, ""), "rotate-half" or "interleaved" (Meta/GGUF) */
  int deterministic;         /* nonzero: batch-invariant kernels on every backend; default 0 */
  specrun_sampling sampling; /* defaults of requests that give none */
  specrun_speculation speculation; /* defaults of requests that give none */
  int prefix_cache; /* nonzero (default): prompts start from cached KV blocks of the same prefix */
  specrun_quantization quantize;       /* the target's linear layers, at load; default none */
  specrun_quantization draft_quantize; /* the draft's; default none */
  int quantize_lm_head; /* nonzero: the quantized models' output projections too; default 0 */
  specrun_activations activations;           /* CPU matmuls: activations in bf16, f32 or int8 (INT8
                                              * weights); default auto (bf16 where the CPU multiplies
                                              * bf16, else f32) */
  specrun_kv_cache_dtype kv_cache_dtype;     /* both models' KV caches; default bf16 */
  specrun_overlap_drafting overlap_drafting; /* drafting ahead while verifying; default auto */
} specrun_engine_config;

specrun_status specrun_sampling_init(specrun_sampling* sampling);
specrun_status specrun_speculation_init(specrun_speculation* speculation);
specrun_status specrun_engine_config_init(specrun_engine_config* config);

/* An engine: the models, their KV caches and the scheduler thread. */
typedef struct specrun_engine specrun_engine;
/* A submitted request. */
typedef struct specrun_request specrun_request;

/* Loads the models (the draft must pair with the target) and starts the scheduler. */
specrun_status specrun_engine_create(const specrun_engine_config* config, specrun_engine** engine);
/* The same from a TOML file (configs/default.toml documents every key; [model] target and draft
 * are relative to the file); errors name the file, line and key. Settings files are trusted
 * input (they may name any readable file): for settings from others, use the _within form. */
specrun_status specrun_engine_create_from_toml(const char* path, specrun_engine** engine);
/* The same, refusing model paths (symbolic links and ".." resolved) outside `model_root`. */
specrun_status specrun_engine_create_from_toml_within(const char* path, const char* model_root,
                                                      specrun_engine** engine);
/* Stops taking requests; every queued or running request finishes with
 * SPECRUN_FINISH_SHUTDOWN; returns when the scheduler has stopped. Idempotent. */
specrun_status specrun_engine_shutdown(specrun_engine* engine);
/* Shuts down (if needed) and frees the engine. NULL is ignored. */
void specrun_engine_destroy(specrun_engine* engine);

/* The most alternatives a request may ask for at each token (specrun::kMaxTopLogprobs). */
#define SPECRUN_MAX_TOP_LOGPROBS 20

/* A generated token's log-probability (as specrun::TokenLogprob): the target's own, after the
 * request's penalties and logit bias and before temperature and the filters. Fixed-size arrays,
 * so that an array of these is one allocation with nothing inside to free. */
typedef struct specrun_token_logprob {
  int32_t token;     /* the generated token */
  float logprob;     /* its natural log-probability */
  int32_t top_count; /* entries of top_tokens and top_logprobs in use: the request's logprobs */
  int32_t top_tokens[SPECRUN_MAX_TOP_LOGPROBS]; /* the most likely tokens at its position, highest
                                                   first (the lower id among equals) */
  float top_logprobs[SPECRUN_MAX_TOP_LOGPROBS]; /* their natural log-probabilities */
} specrun_token_logprob;

/* One delivery on a request's stream. */
typedef struct specrun_event {
  uint64_t request;             /* the request's id */
  const int32_t* tokens;        /* [token_count] tokens committed since the last event */
  size_t token_count;           /* may be 0 */
  const char* text;             /* their text, whole UTF-8 characters, NUL-terminated ("" without
                                   a tokenizer) */
  size_t text_length;           /* bytes of text, without the NUL */
  int finished;                 /* nonzero on the request's last event */
  specrun_finish_reason reason; /* why it finished (when finished) */
  const char* error;            /* what failed (reason SPECRUN_FINISH_FAILED), else "" */
  /* How speculation made the tokens (an event is one engine step of the request): the target
   * verified `drafted` drafts, and the first `accepted_drafts` of `tokens` are drafts it accepted;
   * the rest (one, unless the request stopped first) it chose itself. Both 0 in a step without
   * drafts, and in a final event that no step sent (cancelled, shut down, failed). */
  int64_t drafted;         /* drafts the target verified in this step */
  int64_t accepted_drafts; /* of those, accepted: the first ones of `tokens` */
  size_t accepted_text;    /* bytes at the start of `text` those drafts completed (a character a
                              draft began and the target's token completed is the target's) */
  const specrun_token_logprob* logprobs; /* [logprob_count], one per token of `tokens`, where
                                            the request asked (params->logprobs >= 0); else
                                            NULL */
  size_t logprob_count;                  /* token_count or 0 */
} specrun_event;

/* Called on the engine's thread for every event of a request, in order (see Threads above). */
typedef void (*specrun_stream_callback)(const specrun_event* event, void* user_data);

/* Structured output (as specrun::ConstraintKind, docs/structured-output.md): what the generated
 * text must be. Any kind but NONE needs the target's tokenizer. */
typedef enum specrun_constraint_kind {
  SPECRUN_CONSTRAINT_NONE = 0,        /* free text (default) */
  SPECRUN_CONSTRAINT_JSON_OBJECT = 1, /* any JSON object (OpenAI's response_format json_object) */
  SPECRUN_CONSTRAINT_JSON_SCHEMA = 2, /* JSON valid against the JSON Schema in constraint_text */
  SPECRUN_CONSTRAINT_GBNF = 3         /* a sentence of the GBNF grammar in constraint_text
                                         (llama.cpp's format; its rule root) */
} specrun_constraint_kind;

/* The most tokens a request's logit bias may name (OpenAI's bound). */
#define SPECRUN_MAX_LOGIT_BIAS 300

/* One request: the prompt as text or as token ids, optional settings and an optional callback.
 * specrun_request_params_init clears it (logprobs -1, no bias, no constraint). Inconsistent
 * fields (a count without its arrays, a token repeated in the bias, a kind without the text it
 * needs, text for a kind that takes none, an unknown kind, logprobs out of range) are refused
 * with SPECRUN_ERROR_INVALID_ARGUMENT naming the field; what the engine refuses (a bias out of
 * [-100, 100] or naming a token outside the vocabulary, a schema or grammar that does not
 * compile, a constraint without a tokenizer) is SPECRUN_ERROR_FAILED. */
typedef struct specrun_request_params {
  const char* prompt;                     /* text (BOS added as the tokenizer says), or NULL */
  const int32_t* prompt_ids;              /* [prompt_id_count] token ids, or NULL */
  size_t prompt_id_count;                 /* with prompt_ids */
  const specrun_sampling* sampling;       /* NULL: the engine's defaults */
  const specrun_speculation* speculation; /* NULL: the engine's defaults */
  specrun_stream_callback on_event;       /* NULL: take events with specrun_request_next */
  void* user_data;                        /* passed to on_event as it is */
  /* Added to these tokens' logits at every position, before temperature and the filters
   * (OpenAI's logit_bias): logit_bias_values[i] to token logit_bias_tokens[i]. */
  const int32_t* logit_bias_tokens; /* [logit_bias_count] distinct token ids, or NULL */
  const float* logit_bias_values;   /* [logit_bias_count] biases, each in [-100, 100], or NULL */
  size_t logit_bias_count;          /* at most SPECRUN_MAX_LOGIT_BIAS; 0 (default): no bias */
  int64_t logprobs; /* report every generated token's log-probability with this many most likely
                       tokens beside it (specrun_event's and specrun_result's logprobs), at most
                       SPECRUN_MAX_TOP_LOGPROBS; -1 (default): none */
  specrun_constraint_kind constraint_kind; /* default SPECRUN_CONSTRAINT_NONE */
  const char* constraint_text; /* JSON_SCHEMA: the schema as JSON; GBNF: the grammar; NULL (or
                                  "") for the other kinds */
} specrun_request_params;

specrun_status specrun_request_params_init(specrun_request_params* params);

/* Validates and queues a request. SPECRUN_ERROR_FAILED for an empty prompt, ids outside the
 * vocabulary, text without a tokenizer, settings out of range or a request that can never fit the
 * KV cache; SPECRUN_ERROR_SHUT_DOWN after specrun_engine_shutdown. */
specrun_status specrun_submit(specrun_engine* engine, const specrun_request_params* params,
                              specrun_request** request);

/* The pull interface (requests submitted without a callback): the next event, waiting up to
 * timeout_ms (negative: without limit). SPECRUN_ERROR_TIMEOUT when none came in time,
 * SPECRUN_ERROR_END_OF_STREAM when the last event was already taken (at once for a request with
 * a callback). Free the event with specrun_event_free. */
specrun_status specrun_request_next(specrun_request* request, int64_t timeout_ms,
                                    specrun_event** event);
void specrun_event_free(specrun_event* event);

/* A request's figures (as specrun::RequestStats). Times are from submit, in milliseconds. */
typedef struct specrun_request_stats {
  int64_t prompt_tokens;       /* the prompt's tokens */
  int64_t tokens_generated;    /* tokens emitted (end-of-sequence excluded) */
  double queue_ms;             /* waiting for room in the batch or the KV cache */
  double ttft_ms;              /* time to the first token */
  double itl_ms_mean;          /* inter-token latency: mean */
  double itl_ms_p50;           /* median */
  double itl_ms_p99;           /* 99th percentile */
  double tokens_per_second;    /* tokens_generated over total_ms */
  double total_ms;             /* from submit to the end */
  int64_t steps;               /* engine steps the request took part in */
  int64_t drafted;             /* drafts verified */
  int64_t accepted;            /* drafts accepted */
  int64_t rejections;          /* steps that rejected a draft (accepted < drafted) */
  double acceptance_rate;      /* accepted / drafted */
  double mean_accepted_length; /* tokens committed per step */
  int64_t gamma_histogram[SPECRUN_MAX_GAMMA + 1]; /* [gamma]: steps that verified gamma drafts */
  double draft_ms;              /* time in the steps' drafting (shared with the batch) */
  double target_ms;             /* time in the steps' target passes (shared with the batch) */
  int64_t cached_prompt_tokens; /* of the prompt's tokens, taken from the prefix cache */
  int64_t looked_up;            /* drafts prompt lookup proposed in the draft model's place, where
                                   the two differed (draft_lookup_ngram) */
  int64_t looked_up_accepted;   /* of those, accepted */
  int64_t alternates;           /* alternates the target scored beside the drafts */
  int64_t alternates_accepted;  /* of those, accepted (each brings one token more) */
  int64_t host_waits;           /* times the steps waited for the device (shared with the batch):
                                   once a step for its verdict, once more for a draft model's
                                   drafts (once a draft position where prompt lookup joins
                                   them) */
  uint64_t bytes_to_host;       /* bytes the steps copied back from the device (shared) */
} specrun_request_stats;

/* A finished request. */
typedef struct specrun_result {
  uint64_t request;             /* the request's id */
  int32_t* tokens;              /* [token_count] every generated token */
  size_t token_count;           /* how many */
  char* text;                   /* their text, NUL-terminated ("" without a tokenizer) */
  size_t text_length;           /* bytes of text, without the NUL */
  specrun_finish_reason reason; /* why it finished */
  char* error;                  /* what failed (reason SPECRUN_FINISH_FAILED), else "" */
  specrun_request_stats stats;  /* its figures */
  /* Where the request asked (params->logprobs >= 0); freed with the result. */
  specrun_token_logprob* logprobs; /* [logprob_count], one per token; else NULL */
  size_t logprob_count;            /* token_count or 0 */
} specrun_result;

/* Blocks until the request finishes; free the result with specrun_result_free. May be called
 * again (each call returns a new copy). */
specrun_status specrun_request_wait(specrun_request* request, specrun_result** result);
void specrun_result_free(specrun_result* result);

specrun_status specrun_request_id(const specrun_request* request, uint64_t* id);
/* *finished: nonzero once the request's last event was delivered. */
specrun_status specrun_request_finished(const specrun_request* request, int* finished);
/* Asks the engine to stop the request at its next step (SPECRUN_FINISH_CANCELLED; its KV blocks
 * are freed). No effect once it finished or after the engine is gone. */
specrun_status specrun_request_cancel(specrun_request* request);
/* Releases the handle; the request itself goes on (cancel it first to stop it). NULL is
 * ignored. */
void specrun_request_free(specrun_request* request);

/* Cancels a request by id; *cancelled (may be NULL) is 0 when the id is unknown or finished. */
specrun_status specrun_engine_cancel(specrun_engine* engine, uint64_t request, int* cancelled);

/* Engine-wide figures since the engine started (as specrun::EngineStats). */
typedef struct specrun_engine_stats {
  int64_t submitted;            /* requests accepted by submit */
  int64_t finished;             /* requests that finished, for any reason */
  int64_t running;              /* in the batch now */
  int64_t waiting;              /* queued for room now */
  int64_t tokens_generated;     /* over every request */
  int64_t steps;                /* batched steps run */
  double mean_batch;            /* sequences per step, on average */
  int64_t drafted;              /* drafts verified */
  int64_t accepted;             /* drafts accepted */
  double acceptance_rate;       /* accepted / drafted */
  double draft_ms;              /* time drafting */
  double target_ms;             /* time in target passes (prefill, verification) */
  double uptime_ms;             /* since creation */
  double tokens_per_second;     /* tokens_generated over uptime */
  int64_t kv_tokens_capacity;   /* the target's KV cache, in tokens */
  int64_t kv_tokens_free;       /* positions new tokens may take now (cached ones included) */
  int64_t kv_tokens_cached;     /* positions in reusable prefix blocks now */
  int64_t prompt_tokens;        /* prompt tokens of the requests started */
  int64_t cached_prompt_tokens; /* of those, taken from the prefix cache */
  double prefix_cache_hit_rate; /* cached_prompt_tokens / prompt_tokens */
  int64_t drafted_ahead;        /* sequence steps that drafted ahead of verification (overlap) */
  int64_t ahead_taken;          /* of those, the ones whose drafts ahead the next step proposed */
  int64_t host_waits;           /* times the steps waited for the device */
  uint64_t bytes_to_host;       /* bytes the steps copied back from the device */
  /* [draft position, from 0] drafts verified at that position of their step, and of those the
   * drafts accepted: where along the drafts acceptance falls off */
  int64_t drafted_at[SPECRUN_MAX_GAMMA];
  int64_t accepted_at[SPECRUN_MAX_GAMMA];
} specrun_engine_stats;

specrun_status specrun_engine_stats_get(const specrun_engine* engine, specrun_engine_stats* stats);

/* What one model will hold on the engine's device, planned before anything loads (as
 * specrun::ModelMemory). */
typedef struct specrun_model_memory {
  uint64_t weight_bytes;       /* weights as loaded: stored dtype on the CPU, bf16 on a GPU, 8-bit
                                  codes plus f32 scales where quantized */
  uint64_t kv_bytes_per_token; /* K and V of every layer (f32) */
  int64_t kv_tokens;           /* KV capacity, whole blocks */
  uint64_t kv_bytes;           /* the KV cache */
  uint64_t workspace_bytes;    /* activations of the largest forward, its logits and the
                                  distributions processed from them */
} specrun_model_memory;

/* The memory plan (as specrun::MemoryPlan): both models, the total (the backend's own scratch
 * included, which specrun::MemoryPlan gives apart) and the device's free memory when planned (0
 * when unknown). */
typedef struct specrun_memory_plan {
  specrun_model_memory target;
  specrun_model_memory draft; /* zero without a draft */
  uint64_t total_bytes;
  uint64_t available_bytes;
} specrun_memory_plan;

/* Plans `config`'s memory from the checkpoints' configs and tensor headers, reading no weight
 * (specrun_engine_create refuses a config whose plan exceeds the available memory). Fails as
 * specrun_engine_create would for a bad config or checkpoint. */
specrun_status specrun_plan_memory(const specrun_engine_config* config, specrun_memory_plan* plan);
/* The plan an engine was checked against. */
specrun_status specrun_engine_memory_get(const specrun_engine* engine, specrun_memory_plan* plan);

/* What the engine runs on. The strings are the engine's (valid until specrun_engine_destroy). */
typedef struct specrun_engine_info {
  const char* target;        /* resolved checkpoint directory */
  const char* draft;         /* "" without a draft */
  int64_t target_parameters; /* parameters of the target */
  int64_t draft_parameters;  /* of the draft; 0 without one */
  int64_t vocab_size;        /* rows of the target's embedding: token ids are below this */
  int32_t bos_token_id;      /* the model's (first) beginning-of-sequence id; -1 when none */
  int64_t context_limit;     /* positions one sequence may hold */
  int has_tokenizer;         /* nonzero: text in and out (else token ids only) */
  const char* device;        /* "cpu", "cuda:0" */
  int threads;               /* CPU threads */
  /* The CPU's matmul: the copy of its kernels that runs ("native", "x86-64-v4+bf16", ...) and what
   * activations meet the weights as, the config's activations resolved ("f32", "bf16", "int8",
   * or auto's "f32 (int8 for GGUF blocks)" on CPUs without bf16 pairs); both "" on a GPU. */
  const char* cpu_kernels;
  const char* activations;
} specrun_engine_info;

specrun_status specrun_engine_info_get(const specrun_engine* engine, specrun_engine_info* info);

/* The target's tokenizer (SPECRUN_ERROR_FAILED without one). specrun_tokenize returns
 * [*count] ids to free with specrun_tokens_free; specrun_detokenize a NUL-terminated string
 * (special tokens skipped) to free with specrun_string_free. */
specrun_status specrun_tokenize(const specrun_engine* engine, const char* text,
                                int add_special_tokens, int32_t** tokens, size_t* count);
specrun_status specrun_detokenize(const specrun_engine* engine, const int32_t* tokens, size_t count,
                                  char** text);
void specrun_tokens_free(int32_t* tokens);
void specrun_string_free(char* text);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPECRUN_SPECRUN_H */
