#!/usr/bin/env bash
# The GPU checks in one place, for a machine with an NVIDIA GPU (sm_90: H100, H200) and the CUDA
# toolkit: build, the GPU tests, compute-sanitizer memcheck on them, and the device benchmarks the
# CUDA backend is judged by. Logs go to $OUT when it is set, else to gpu-check-logs/.
#
#   tools/gpu-check.sh build|test|sanitize|bench|all
#
# Where the machine reaches no package registry, stage the Debian packages first on one that does
# (from the project root), and take .deps along:
#   ../shared/offline/stage-deps.sh $(tools/gpu-check.sh packages)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev
  libtomlplusplus-dev libtomlplusplus3 libgtest-dev libgmock-dev libpcre2-dev libpcre2-8-0
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2)
stage=${1:-all}
if [[ $stage == packages ]]; then
  echo "${packages[*]}"
  exit 0
fi

logs=${OUT:-gpu-check-logs}
mkdir -p "$logs"
build=${SPECRUN_BUILD_DIR:-build-gpu}
prefix=()
if [[ -d .deps/root/usr ]]; then
  prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
  export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [[ -z ${CUDACXX:-} ]]; then
  CUDACXX=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  export CUDACXX
fi
gpu_tests=(test_cuda_device test_cuda_backend test_cuda_sampling test_cuda_engine
  test_cuda_hf_conformance)
# The Hugging Face references (tests/reference/hf_reference.py) need torch, which a machine
# without PyPI lacks: made elsewhere (any ctest run of test_hf_conformance writes them to
# build/hf_reference; take that folder along), they are used from here when present.
hf_reference=${SPECRUN_HF_REFERENCE_DIR:-$PWD/build/hf_reference}
if grep -qx ok "$hf_reference/status.txt" 2>/dev/null; then
  export SPECRUN_HF_REFERENCE_DIR=$hf_reference
else
  unset SPECRUN_HF_REFERENCE_DIR
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

run_tests() {
  # The GPU tests, then the rest of the suite on the same build (the CPU reference must still hold).
  local status=0
  ctest --test-dir "$build" -L gpu --output-on-failure -j 4 >"$logs/gpu-tests.txt" 2>&1 || status=1
  tail -n 5 "$logs/gpu-tests.txt"
  # ctest points this suite at the build's own references, which need torch here: run it on the
  # ones brought along.
  if [[ -n ${SPECRUN_HF_REFERENCE_DIR:-} ]]; then
    "$build/tests/test_cuda_hf_conformance" >"$logs/gpu-hf-conformance.txt" 2>&1 || status=1
    grep -E "^\[ hf cuda \]|PASSED|FAILED" "$logs/gpu-hf-conformance.txt" | tail -n 24
  else
    echo "no Hugging Face references at $hf_reference: test_cuda_hf_conformance skipped"
  fi
  ctest --test-dir "$build" -LE gpu -j "$(nproc)" >"$logs/cpu-tests.txt" 2>&1 || status=1
  tail -n 3 "$logs/cpu-tests.txt"
  return $status
}

sanitize() {
  local status=0
  : >"$logs/sanitizer.txt"
  for test in "${gpu_tests[@]}"; do
    echo "=== compute-sanitizer memcheck $test" >>"$logs/sanitizer.txt"
    # memcheck slows kernels by one or two orders of magnitude: a bound keeps one slow binary
    # from taking the whole session (a timeout shows as exit 124 in the log).
    timeout "${SANITIZER_TIMEOUT:-240}" compute-sanitizer --tool memcheck --error-exitcode 3 \
      --leak-check full "$build/tests/$test" --gtest_brief=1 >>"$logs/sanitizer.txt" 2>&1 ||
      { echo "exit $?" >>"$logs/sanitizer.txt"; status=1; }
  done
  grep -E "^=== |ERROR SUMMARY|PASSED|FAILED|^exit " "$logs/sanitizer.txt" | tail -n 24
  return $status
}

bench() {
  # The 8B shape with the 1B draft: decode against the floor, verification 2..16, prefill of 2048
  # tokens, the draft's step and end-to-end generation; then the same in deterministic mode, for
  # its cost.
  "$build/bin/specbench" --synthetic llama-3.1-8b --synthetic-draft llama-3.2-1b --device cuda \
    --json "$logs/bench-8b.json" 2>&1 | tee "$logs/bench-8b.txt"
  "$build/bin/specbench" --synthetic llama-3.1-8b --synthetic-draft "" --device cuda \
    --deterministic --json "$logs/bench-8b-deterministic.json" 2>&1 |
    tee "$logs/bench-8b-deterministic.txt"
}

case $stage in
  build) build_all ;;
  test) run_tests ;;
  sanitize) sanitize ;;
  bench) bench ;;
  all)
    build_all
    status=0
    run_tests || status=1
    sanitize || status=1
    bench || status=1
    exit $status
    ;;
  *)
    echo "usage: $0 build|test|sanitize|bench|all|packages" >&2
    exit 2
    ;;
esac
