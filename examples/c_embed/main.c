/* c_embed: specrun embedded in a C99 program through its C ABI. Loads a target checkpoint (and
 * optionally a draft), submits one prompt, streams the generated text to stdout as it forms whole
 * characters (token ids for a checkpoint without tokenizer.json), then prints the request's and
 * the engine's figures to stderr.
 *
 *   c_embed --target DIR [--draft DIR] [--prompt TEXT | --prompt-ids 1,2,3]
 *           [--max-tokens N] [--temperature T] [--seed S]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <specrun/specrun.h>

/* What the stream callback needs: whether text or token ids are printed, and whether an id was
 * printed yet (ids are separated by spaces). */
typedef struct stream_state {
  int text;     /* nonzero: the engine has a tokenizer, print event text */
  int first_id; /* nonzero until the first id is printed */
} stream_state;

/* Runs on the engine's thread for every event of the request, in order. */
static void on_event(const specrun_event* event, void* user_data) {
  stream_state* state = (stream_state*)user_data;
  size_t i;
  if (state->text) {
    fwrite(event->text, 1, event->text_length, stdout);
  } else {
    for (i = 0; i < event->token_count; ++i) {
      printf(state->first_id ? "%d" : " %d", (int)event->tokens[i]);
      state->first_id = 0;
    }
  }
  fflush(stdout);
}

static int usage(const char* program) {
  fprintf(stderr,
          "usage: %s --target DIR [--draft DIR] [--prompt TEXT | --prompt-ids 1,2,3]\n"
          "          [--max-tokens N] [--temperature T] [--seed S]\n",
          program);
  return 2;
}

/* "1,2,3" -> ids; returns the count, or -1 for anything that is not a list of ids. */
static long parse_ids(const char* text, int32_t* ids, long capacity) {
  long count = 0;
  const char* cursor = text;
  while (*cursor != '\0') {
    char* end = NULL;
    long value;
    errno = 0;
    value = strtol(cursor, &end, 10);
    if (end == cursor || errno != 0 || value < 0 || value > 2147483647L || count == capacity) {
      return -1;
    }
    ids[count++] = (int32_t)value;
    cursor = end;
    if (*cursor == ',') ++cursor;
  }
  return count;
}

static int fail(const char* what, specrun_status status) {
  fprintf(stderr, "c_embed: %s failed (%s): %s\n", what, specrun_status_name(status),
          specrun_last_error());
  return 1;
}

int main(int argc, char** argv) {
  specrun_engine_config config;
  specrun_sampling sampling;
  specrun_request_params params;
  specrun_engine_info info;
  specrun_engine_stats engine_stats;
  specrun_engine* engine = NULL;
  specrun_request* request = NULL;
  specrun_result* result = NULL;
  specrun_status status;
  stream_state state;
  const char* prompt = NULL;
  const char* prompt_ids = NULL;
  int32_t ids[1024];
  long id_count = 0;
  int i;

  specrun_engine_config_init(&config);
  specrun_sampling_init(&sampling);
  /* Flags come in pairs: a name and its value. */
  for (i = 1; i < argc; i += 2) {
    const char* value = i + 1 < argc ? argv[i + 1] : NULL;
    if (value == NULL) return usage(argv[0]);
    if (strcmp(argv[i], "--target") == 0) {
      config.target = value;
    } else if (strcmp(argv[i], "--draft") == 0) {
      config.draft = value;
    } else if (strcmp(argv[i], "--prompt") == 0) {
      prompt = value;
    } else if (strcmp(argv[i], "--prompt-ids") == 0) {
      prompt_ids = value;
    } else if (strcmp(argv[i], "--max-tokens") == 0) {
      sampling.max_tokens = strtol(value, NULL, 10);
    } else if (strcmp(argv[i], "--temperature") == 0) {
      sampling.temperature = strtof(value, NULL);
    } else if (strcmp(argv[i], "--seed") == 0) {
      sampling.seed = strtoull(value, NULL, 10);
    } else {
      return usage(argv[0]);
    }
  }
  if (config.target == NULL) return usage(argv[0]);

  status = specrun_engine_create(&config, &engine);
  if (status != SPECRUN_OK) return fail("loading the models", status);
  specrun_engine_info_get(engine, &info);
  fprintf(stderr, "c_embed: target %s (%lld parameters)%s%s on %s with %d threads\n", info.target,
          (long long)info.target_parameters, info.draft[0] != '\0' ? ", draft " : "", info.draft,
          info.device, info.threads);

  specrun_request_params_init(&params);
  if (prompt_ids != NULL) {
    id_count = parse_ids(prompt_ids, ids, (long)(sizeof(ids) / sizeof(ids[0])));
    if (id_count <= 0) {
      fprintf(stderr, "c_embed: --prompt-ids: '%s' is not a list of token ids\n", prompt_ids);
      specrun_engine_destroy(engine);
      return 1;
    }
    params.prompt_ids = ids;
    params.prompt_id_count = (size_t)id_count;
  } else if (prompt != NULL || info.has_tokenizer) {
    params.prompt = prompt != NULL ? prompt : "Once upon a time";
  } else {
    ids[0] = 1; /* no tokenizer and no prompt: start from the common BOS id */
    params.prompt_ids = ids;
    params.prompt_id_count = 1;
  }
  state.text = info.has_tokenizer;
  state.first_id = 1;
  params.sampling = &sampling;
  params.on_event = on_event;
  params.user_data = &state;

  status = specrun_submit(engine, &params, &request);
  if (status != SPECRUN_OK) {
    specrun_engine_destroy(engine);
    return fail("submitting the prompt", status);
  }
  status = specrun_request_wait(request, &result);
  if (status != SPECRUN_OK) {
    specrun_request_free(request);
    specrun_engine_destroy(engine);
    return fail("waiting for the result", status);
  }
  printf("\n");
  fprintf(stderr,
          "c_embed: %lld prompt tokens, %lld generated (stop: %s) in %.1f ms: %.1f tokens/s\n"
          "c_embed: time to first token %.2f ms; inter-token latency mean %.2f ms, p99 %.2f ms\n"
          "c_embed: %lld steps, acceptance %.3f (%lld of %lld drafts), %.2f tokens per step\n",
          (long long)result->stats.prompt_tokens, (long long)result->stats.tokens_generated,
          specrun_finish_reason_name(result->reason), result->stats.total_ms,
          result->stats.tokens_per_second, result->stats.ttft_ms, result->stats.itl_ms_mean,
          result->stats.itl_ms_p99, (long long)result->stats.steps, result->stats.acceptance_rate,
          (long long)result->stats.accepted, (long long)result->stats.drafted,
          result->stats.mean_accepted_length);
  if (specrun_engine_stats_get(engine, &engine_stats) == SPECRUN_OK) {
    fprintf(stderr, "c_embed: engine: %lld requests, %lld tokens, KV %lld of %lld tokens free\n",
            (long long)engine_stats.finished, (long long)engine_stats.tokens_generated,
            (long long)engine_stats.kv_tokens_free, (long long)engine_stats.kv_tokens_capacity);
  }
  i = result->reason == SPECRUN_FINISH_FAILED ? 1 : 0;
  if (i) fprintf(stderr, "c_embed: the request failed: %s\n", result->error);
  specrun_result_free(result);
  specrun_request_free(request);
  specrun_engine_destroy(engine);
  return i;
}
