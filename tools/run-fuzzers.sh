#!/usr/bin/env bash
# Fuzzes specrun's readers of untrusted input (tests/fuzz: safetensors and GGUF files, config.json,
# tokenizer.json with encode and streaming decode, the TOML settings, chat templates compiled and
# rendered, the server's request bodies and raw connections, structured output's grammars and JSON
# schemas) with libFuzzer under AddressSanitizer and UndefinedBehaviorSanitizer, each for SECONDS
# (default 60), starting from the seed corpus in tests/fuzz/corpus/, one harness per core at a time.
# Usage: tools/run-fuzzers.sh [SECONDS] [HARNESS...]
#
# A finding (a crash, a sanitizer report, a leak, an input taking over 10 s, an allocation past
# 2 GB, an exception other than specrun::Error) fails the run: the reproducer is kept under
# BUILD/fuzz-findings/ and printed in base64 with the command that replays it. Inputs that add
# coverage collect in BUILD/fuzz-corpus/ (not in the source tree); copy the ones worth keeping
# into tests/fuzz/corpus/, where every build's ctest replays them (label fuzz).
#
# Environment: SPECRUN_BUILD_DIR (default build-fuzz), a Clang build with -DSPECRUN_FUZZ=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
harnesses=("$@")
if [[ ${#harnesses[@]} -eq 0 ]]; then
  harnesses=(fuzz_safetensors fuzz_gguf fuzz_model_config fuzz_tokenizer fuzz_settings
    fuzz_chat_template fuzz_openai_request fuzz_http_request fuzz_grammar)
fi
build_dir=${SPECRUN_BUILD_DIR:-build-fuzz}

CC=clang CXX=clang++ SPECRUN_BUILD_DIR="$build_dir" SPECRUN_SANITIZE=address,undefined \
  SPECRUN_CUDA=OFF SPECRUN_CMAKE_ARGS="-DSPECRUN_FUZZ=ON" SPECRUN_TARGETS="${harnesses[*]}" \
  bash tools/build.sh

# One harness: its libFuzzer run, output in BUILD/fuzz-HARNESS.log, exit status in .status.
fuzz_one() {
  local harness=$1
  local seeds=tests/fuzz/corpus/$harness corpus=$build_dir/fuzz-corpus/$harness
  local findings=$build_dir/fuzz-findings log=$build_dir/fuzz-$harness.log
  mkdir -p "$corpus" "$findings"
  local extra=()
  # The real checkpoint beside the project, when present, reaches further than handmade seeds.
  if [[ $harness == fuzz_gguf && -f ../shared/models/stories260K/stories260K.gguf ]]; then
    extra=(../shared/models/stories260K)
  fi
  local status=0
  "$build_dir/fuzz/$harness" -max_total_time="$seconds" -max_len=2097152 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/$harness-" \
    "$corpus" "$seeds" "${extra[@]}" >"$log" 2>&1 || status=$?
  echo "$status" >"$log.status"
}

# libFuzzer runs one process on one core: the harnesses run SPECRUN_FUZZ_JOBS at a time (default:
# one per core), each for the whole SECONDS.
jobs=${SPECRUN_FUZZ_JOBS:-$(nproc)}
running=0
for harness in "${harnesses[@]}"; do
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
  echo "=== $harness: ${seconds}s ==="
  fuzz_one "$harness" &
  running=$((running + 1))
done
wait

failed=()
for harness in "${harnesses[@]}"; do
  log=$build_dir/fuzz-$harness.log
  findings=$build_dir/fuzz-findings
  if [[ $(cat "$log.status") != 0 ]]; then
    failed+=("$harness")
    echo "=== $harness: finding ==="
    tail -n 60 "$log"
    for reproducer in "$findings/$harness"-*; do
      [[ -f $reproducer ]] || continue
      echo "--- reproducer $reproducer ($(stat -c %s "$reproducer") bytes), base64:"
      head -c 65536 "$reproducer" | base64 -w 120
      echo "--- replay: $build_dir/fuzz/$harness $reproducer"
    done
  else
    echo "=== $harness ==="
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)" "$log" || true
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run-fuzzers: findings in ${failed[*]}" >&2
  exit 1
fi
echo "run-fuzzers: ${harnesses[*]}: no findings in ${seconds}s each"
