#!/usr/bin/env bash
# The GPU checks in one place, for a machine with an NVIDIA GPU (sm_90: H100, H200) and the CUDA
# toolkit: build, the GPU tests, compute-sanitizer (memcheck on every GPU test binary, racecheck
# and synccheck on the attention and sampling kernels), and the device benchmarks the CUDA backend
# is judged by. Logs go to $OUT when it is set (one archive and the benchmark JSON), else to
# gpu-check-logs/.
#
#   tools/gpu-check.sh build|test|sanitize|bench|bench-quantized|bench-kv|profile|profile-detail|recipes|all
#   tools/gpu-check.sh pack                              here: binaries for sm_90 into gpu-carry/
#   tools/gpu-check.sh carried                           there: test, sanitize, bench on gpu-carry/
#   tools/gpu-check.sh carried bench-ab                  there: this build's step against a baseline
#
# Device time is short and a 16-core build still costs minutes of it, so the usual path is to
# build here (same nvcc, sm_90), `pack`, carry gpu-carry/ along and run `carried` there. The pack
# holds the GPU test binaries, specbench, specrun, the shared libraries Debian gives them (spdlog,
# fmt, PCRE2, utf8proc; cuBLAS is the machine's own) and the Hugging Face references, compressed.
#
# Where the machine must build and reaches no package registry, download the Debian packages that
# `tools/gpu-check.sh packages` lists on a machine that reaches them (`apt-get download`), unpack
# each into .deps/root (`dpkg -x PACKAGE.deb .deps/root`) and take .deps along.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev
  libtomlplusplus-dev libtomlplusplus3 libgtest-dev libgmock-dev libpcre2-dev libpcre2-8-0
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libcpp-httplib-dev
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  libcivetweb-dev libcivetweb1 zlib1g-dev libcurl4-openssl-dev libcurl4)
stage=${1:-all}
if [[ $stage == packages ]]; then
  echo "${packages[*]}"
  exit 0
fi

gpu_tests=(test_cuda_device test_cuda_backend test_cuda_backend_ops test_cuda_sampling
  test_cuda_engine test_cuda_hf_conformance)
build=${SPECRUN_BUILD_DIR:-build-gpu}

if [[ $stage == pack ]]; then
  # Here, after `cmake --build <build> --target ${gpu_tests[*]} specbench specrun` with
  # SPECRUN_CUDA_ARCHITECTURES=90: SPECRUN_BUILD_DIR names that build.
  rm -rf gpu-carry && mkdir -p gpu-carry/pack/tests gpu-carry/pack/bin gpu-carry/pack/lib
  for test in "${gpu_tests[@]}"; do cp "$build/tests/$test" gpu-carry/pack/tests/; done
  cp "$build/bin/specbench" "$build/bin/specrun" gpu-carry/pack/bin/
  for binary in gpu-carry/pack/tests/* gpu-carry/pack/bin/*; do
    ldd "$binary" | awk '/=> \// {print $3}'
  done | sort -u | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so|ld-linux|libcublas' |
    xargs -I{} cp -L {} gpu-carry/pack/lib/
  ls gpu-carry/pack/lib
  if grep -qx ok "$build/hf_reference/status.txt" 2>/dev/null; then
    cp -r "$build/hf_reference" gpu-carry/pack/hf_reference
  fi
  # xz's largest dictionary (64 MiB) finds the CUDA kernels each test binary links again: the pack
  # comes to about two thirds of the default's size, inside what a device call carries.
  XZ_OPT=-9 tar -C gpu-carry -cJf gpu-carry/pack.tar.xz pack && rm -rf gpu-carry/pack
  du -h gpu-carry/pack.tar.xz
  exit 0
fi

logs=${OUT:+$(mktemp -d)/logs}
logs=${logs:-gpu-check-logs}
mkdir -p "$logs"
bin_root=$build
if [[ $stage == carried ]]; then
  unpacked=$(mktemp -d)
  tar -C "$unpacked" -xJf gpu-carry/pack.tar.xz
  bin_root=$unpacked/pack
  export LD_LIBRARY_PATH="$bin_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [[ -d $bin_root/hf_reference ]]; then export SPECRUN_HF_REFERENCE_DIR=$bin_root/hf_reference; fi
  # cuBLAS from the machine's toolkit, or from the Python wheels where the toolkit lacks it.
  cublas=$(find /usr/local/cuda/ /usr/local/cuda*/ /opt /usr/lib -name 'libcublas.so.13*' \
    -print -quit 2>/dev/null || true)
  if [[ -n $cublas ]]; then export LD_LIBRARY_PATH="$(dirname "$cublas"):$LD_LIBRARY_PATH"; fi
  echo "cuBLAS: ${cublas:-not found}"
fi
prefix=()
if [[ -d .deps/root/usr ]]; then
  prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
  export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ! command -v compute-sanitizer >/dev/null; then
  sanitizer=$(find /usr/local/cuda/bin /usr/local/cuda /opt -name compute-sanitizer -type f \
    -print -quit 2>/dev/null || true)
  if [[ -n $sanitizer ]]; then export PATH="$PATH:$(dirname "$sanitizer")"; fi
fi
if [[ -z ${CUDACXX:-} ]]; then
  CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  export CUDACXX
fi
# The Hugging Face references (tests/reference/hf_reference.py) need torch: made elsewhere (any
# ctest run of test_hf_conformance writes them to build/hf_reference), they are used from here
# when present.
if [[ -z ${SPECRUN_HF_REFERENCE_DIR:-} ]]; then
  hf_reference=$PWD/build/hf_reference
  if grep -qx ok "$hf_reference/status.txt" 2>/dev/null; then
    export SPECRUN_HF_REFERENCE_DIR=$hf_reference
  fi
fi

build_all() {
  nvidia-smi >"$logs/build.txt" 2>&1 || echo "nvidia-smi failed" >>"$logs/build.txt"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECRUN_CUDA=ON \
    -DSPECRUN_CUDA_ARCHITECTURES=90 "${prefix[@]}" >>"$logs/build.txt" 2>&1
  if ! cmake --build "$build" -j "$(nproc)" >>"$logs/build.txt" 2>&1; then
    tail -n 40 "$logs/build.txt"
    return 1
  fi
  echo "build: ok ($build)"
}

# Each GPU test binary at once (one GPU holds them all), each bounded in time.
run_gpu_tests() {
  local status=0 test
  nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
  lscpu >"$logs/lscpu.txt" 2>&1 || true
  for test in "${gpu_tests[@]}"; do
    (rc=0
      timeout "${TEST_TIMEOUT:-150}" "$bin_root/tests/$test" >"$logs/test-$test.txt" 2>&1 || rc=$?
      echo "exit $rc" >>"$logs/test-$test.txt") &
  done
  wait
  for test in "${gpu_tests[@]}"; do
    local last
    last=$(tail -n 1 "$logs/test-$test.txt")
    [[ $last == "exit 0" ]] || status=1
    printf '%-26s %s; %s\n' "$test" "$last" \
      "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$logs/test-$test.txt" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Za-z]|Failure$|^\[ hf cuda \]' "$logs/test-$test.txt" |
      head -n 30 || true
  done
  return $status
}

run_tests() {
  local status=0
  run_gpu_tests || status=1
  # The rest of the suite on the same build (the CPU reference must still hold).
  if [[ $stage != carried ]]; then
    ctest --test-dir "$build" -LE gpu -j "$(nproc)" >"$logs/cpu-tests.txt" 2>&1 || status=1
    tail -n 3 "$logs/cpu-tests.txt"
  fi
  return $status
}

sanitize() {
  local status=0 name
  local runs=()
  if [[ -n ${SANITIZE_ONLY:-} ]]; then
    # "BINARY FILTER": every tool on those tests alone (a kernel change's own check).
    for tool in memcheck racecheck synccheck; do runs+=("$tool $SANITIZE_ONLY"); done
  else
    for test in "${gpu_tests[@]}"; do runs+=("memcheck $test *"); done
    # The attention, RoPE, matmul, sampling and gather kernels: their cases in the op harness, and
    # the tests that run them beyond it (batch invariance, fused ops, the emitted distribution).
    for tool in racecheck synccheck; do
      runs+=("$tool test_cuda_backend_ops *_attention_*:*_rope*:*_matmul*:*_logits_*:*_argmax_*:*_sample_*:*_verify_*:*_gather_*"
        "$tool test_cuda_backend *Attention*:*Rope*:*Matmul*" "$tool test_cuda_sampling *")
    done
  fi
  for run in "${runs[@]}"; do
    read -r tool test filter <<<"$run"
    name="$logs/sanitizer-$tool-$test.txt"
    local extra=()
    [[ $tool == memcheck ]] && extra=(--leak-check full)
    # A sanitizer slows kernels by one or two orders of magnitude: a bound keeps one slow binary
    # from taking the whole session (a timeout shows as exit 124 in the log).
    (rc=0
      timeout "${SANITIZER_TIMEOUT:-200}" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "${extra[@]}" "$bin_root/tests/$test" --gtest_brief=1 --gtest_filter="$filter" \
        >"$name" 2>&1 || rc=$?
      echo "exit $rc" >>"$name") &
  done
  wait
  for run in "${runs[@]}"; do
    read -r tool test filter <<<"$run"
    name="$logs/sanitizer-$tool-$test.txt"
    [[ $(tail -n 1 "$name") == "exit 0" ]] || status=1
    printf '%-10s %-26s %s; %s\n' "$tool" "$test" "$(tail -n 1 "$name")" \
      "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$name" | tail -n 1)"
  done
  return $status
}

bench() {
  # The 8B shape with the 1B draft: decode against the floor, verification 2..16, prefill of 2048
  # tokens, the draft's step and end-to-end generation; then the target alone in deterministic
  # mode, for its cost.
  local status=0
  timeout "${BENCH_TIMEOUT:-200}" "$bin_root/bin/specbench" --synthetic llama-3.1-8b \
    --synthetic-draft llama-3.2-1b --device cuda --json "$logs/bench-8b.json" \
    >"$logs/bench-8b.txt" 2>&1 || status=1
  timeout "${BENCH_TIMEOUT:-200}" "$bin_root/bin/specbench" --synthetic llama-3.1-8b \
    --synthetic-draft "" --device cuda --deterministic --json "$logs/bench-8b-deterministic.json" \
    >"$logs/bench-8b-deterministic.txt" 2>&1 || status=1
  cat "$logs/bench-8b.txt" "$logs/bench-8b-deterministic.txt" | grep -v '^specbench: writing'
  return $status
}

# Quantized targets: the 8B shape in FP8 and in INT8 against its bf16 self in the same run (decode,
# verification, prefill), then the 70B shape in FP8 with the 1B draft and an 8,192-token cache:
# whether it fits an 80 GB H100 is the memory the run reports as taken by the models.
bench_quantized() {
  local status=0 dtype
  for dtype in fp8 int8; do
    timeout "${BENCH_TIMEOUT:-200}" "$bin_root/bin/specbench" --synthetic llama-3.1-8b \
      --synthetic-draft "" --device cuda --quantize "$dtype" --json "$logs/bench-8b-$dtype.json" \
      >"$logs/bench-8b-$dtype.txt" 2>&1 || status=1
  done
  timeout "${BENCH_TIMEOUT:-200}" "$bin_root/bin/specbench" --synthetic llama-3.1-70b \
    --synthetic-draft llama-3.2-1b --device cuda --quantize fp8 --kv-cache-tokens 8192 \
    --json "$logs/bench-70b-fp8.json" >"$logs/bench-70b-fp8.txt" 2>&1 || status=1
  cat "$logs"/bench-8b-fp8.txt "$logs"/bench-8b-int8.txt "$logs"/bench-70b-fp8.txt |
    grep -v '^specbench: writing'
  return $status
}

# The KV cache's dtype: the 8B target alone with an f32 and a bf16 cache, at a context of 512 and
# of 4,096 tokens (decode, verification up to 8 tokens, prefill), then the 70B shape in FP8 with the
# 1B draft and 8,192-token bf16 caches (the memory it takes against the f32 caches' 76.46 GiB).
bench_kv() {
  local status=0 context dtype
  for context in 512 4096; do
    for dtype in f32 bf16; do
      timeout "${BENCH_TIMEOUT:-200}" "$bin_root/bin/specbench" --synthetic llama-3.1-8b \
        --synthetic-draft "" --device cuda --context "$context" --max-verify-tokens 8 \
        --kv-cache-dtype "$dtype" --json "$logs/bench-8b-kv-$dtype-$context.json" \
        >"$logs/bench-8b-kv-$dtype-$context.txt" 2>&1 || status=1
    done
  done
  timeout "${BENCH_TIMEOUT:-200}" "$bin_root/bin/specbench" --synthetic llama-3.1-70b \
    --synthetic-draft llama-3.2-1b --device cuda --quantize fp8 --kv-cache-tokens 8192 \
    --kv-cache-dtype bf16 --json "$logs/bench-70b-fp8-kv-bf16.json" \
    >"$logs/bench-70b-fp8-kv-bf16.txt" 2>&1 || status=1
  cat "$logs"/bench-8b-kv-*.txt "$logs"/bench-70b-fp8-kv-bf16.txt | grep -v '^specbench: writing'
  return $status
}

# This build against an earlier one in the same call: gpu-carry/specbench-baseline.xz (an earlier
# build's bin/specbench, xz-compressed) and this build's specbench measure the 8B target alone in
# turn, twice each (decode, verification up to 8 tokens, prefill), so that the machine's drift moves
# both sides alike.
bench_ab() {
  if [[ ! -f gpu-carry/specbench-baseline.xz ]]; then
    echo "bench-ab: no gpu-carry/specbench-baseline.xz"
    return 1
  fi
  local status=0 round side binary baseline
  baseline=$(mktemp -d)/specbench-baseline
  xz -dc gpu-carry/specbench-baseline.xz >"$baseline" && chmod +x "$baseline"
  for round in 1 2; do
    for side in baseline build; do
      binary=$bin_root/bin/specbench
      [[ $side == baseline ]] && binary=$baseline
      timeout "${BENCH_TIMEOUT:-200}" "$binary" --synthetic llama-3.1-8b --synthetic-draft "" \
        --device cuda --max-verify-tokens 8 --json "$logs/bench-ab-$side-$round.json" \
        >"$logs/bench-ab-$side-$round.txt" 2>&1 || status=1
      echo "$side, round $round: $(grep -E '^target' "$logs/bench-ab-$side-$round.txt")"
      grep -E '^verification' "$logs/bench-ab-$side-$round.txt" || true
    done
  done
  return $status
}

# Where a decode or verification step's time goes: Nsight Compute's duration of every kernel in a
# window of launches, one window among the 8B target's batch-1 decode steps and one among its
# 5-token verification steps, under specbench's default options (a step is about 500 launches: the
# CSV names each kernel, so a window that drifted shows). Clocks are left as they are. PROFILE_ARGS
# adds specbench options (e.g. "--quantize fp8 --max-verify-tokens 4": the FP8 target, with no
# bf16 baseline before it, so the decode window falls where it does for bf16).
# Nsight Compute's command line, where the machine has it.
find_ncu() {
  command -v ncu || find /usr/local/cuda/bin /opt/nvidia -name ncu -type f -print -quit \
    2>/dev/null || true
}

# The launch windows both profiles skip to: "name launches-to-skip", comma-separated.
profile_windows() {
  local windows=()
  IFS=, read -r -a windows <<<"${PROFILE_WINDOWS:-decode 3000,verify5 42000}"
  printf '%s\n' "${windows[@]}"
}

profile() {
  local ncu window status=0
  ncu=$(find_ncu)
  if [[ -z $ncu ]]; then
    echo "profile: no ncu on this machine"
    return 1
  fi
  while read -r window; do
    read -r what skip <<<"$window"
    timeout "${PROFILE_TIMEOUT:-150}" "$ncu" --clock-control none --metrics gpu__time_duration.sum \
      --csv --print-units base --launch-skip "$skip" --launch-count "${PROFILE_LAUNCHES:-1500}" \
      "$bin_root/bin/specbench" --synthetic llama-3.1-8b --synthetic-draft "" --device cuda ${PROFILE_ARGS:-} \
      </dev/null >"$logs/ncu-$what.csv" 2>"$logs/ncu-$what.err" || status=1
    echo "ncu $what: $(grep -c gpu__time_duration "$logs/ncu-$what.csv") kernels"
    python3 tools/ncu_step_breakdown.py "$logs/ncu-$what.csv" --json "$logs/ncu-$what.json" ||
      status=1
  done < <(profile_windows)
  return $status
}

# Why a kernel takes its time: Nsight Compute's full set of sections (throughput against the
# roofline, occupancy, warp stalls, memory traffic) for the first PROFILE_DETAIL_LAUNCHES kernels
# matching PROFILE_KERNELS after the same windows' skips: one decode step's and one 5-token
# verification step's matmuls and attention.
profile_detail() {
  local ncu window status=0
  ncu=$(find_ncu)
  if [[ -z $ncu ]]; then
    echo "profile-detail: no ncu on this machine"
    return 1
  fi
  while read -r window; do
    read -r what skip <<<"$window"
    timeout "${PROFILE_TIMEOUT:-150}" "$ncu" --clock-control none --set full \
      --kernel-name "regex:${PROFILE_KERNELS:-skinny_matmul|paged_attention|merge_splits}" \
      --launch-skip-before-match "$skip" --launch-count "${PROFILE_DETAIL_LAUNCHES:-6}" \
      "$bin_root/bin/specbench" --synthetic llama-3.1-8b --synthetic-draft "" --device cuda ${PROFILE_ARGS:-} \
      </dev/null >"$logs/ncu-detail-$what.txt" 2>&1 || status=1
    echo "ncu detail $what: $(grep -cE '^  [a-z_]+.*\(([0-9]+, ){2}[0-9]+\)x' "$logs/ncu-detail-$what.txt") kernels"
    grep -E '^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput' \
      "$logs/ncu-detail-$what.txt" | head -n 80 || true
  done < <(profile_windows)
  return $status
}

# The README's GPU recipes (the blocks marked `device`), as written but for the checkpoints, which
# small stand-ins replace (tools/check-docs.py recipes --device).
recipes() {
  local status=0
  timeout "${RECIPE_TIMEOUT:-300}" python3 tools/check-docs.py recipes "$bin_root" python3 --device \
    >"$logs/recipes.txt" 2>&1 || status=1
  tail -n 20 "$logs/recipes.txt"
  return $status
}

finish() {
  if [[ -n ${OUT:-} ]]; then
    cp "$logs"/bench-*.json "$logs"/ncu-*.json "$logs"/ncu-detail-*.txt "$OUT"/ 2>/dev/null || true
    tar -C "$(dirname "$logs")" -czf "$OUT/gpu-check-logs.tar.gz" logs
  fi
}
trap finish EXIT

case $stage in
  build) build_all ;;
  test) run_tests ;;
  sanitize) sanitize ;;
  bench) bench ;;
  bench-quantized) bench_quantized ;;
  bench-kv) bench_kv ;;
  bench-ab) bench_ab ;;
  profile) profile ;;
  profile-detail) profile_detail ;;
  recipes) recipes ;;
  all | carried)
    # `carried test sanitize` runs those steps alone. The benchmark comes before the sanitizers:
    # its figures are the ones a slow sanitizer must not cost.
    status=0
    if [[ $stage == all ]]; then build_all; fi
    steps=("${@:2}")
    [[ ${#steps[@]} -gt 0 ]] || steps=(test recipes bench sanitize)
    for step in "${steps[@]}"; do
      case $step in
        test) run_tests || status=1 ;;
        bench) bench || status=1 ;;
        bench-quantized) bench_quantized || status=1 ;;
        bench-kv) bench_kv || status=1 ;;
        bench-ab) bench_ab || status=1 ;;
        sanitize) sanitize || status=1 ;;
        profile) profile || status=1 ;;
        profile-detail) profile_detail || status=1 ;;
        recipes) recipes || status=1 ;;
        *) echo "unknown step $step" >&2; exit 2 ;;
      esac
    done
    exit $status
    ;;
  *)
    echo "usage: $0 build|test|sanitize|bench|bench-quantized|bench-kv|bench-ab|profile|profile-detail|recipes|all|pack|carried|packages" >&2
    exit 2
    ;;
esac
