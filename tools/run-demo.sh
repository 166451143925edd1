#!/usr/bin/env bash
# Sets up and runs the demo: builds specrun, writes a small generated Llama-shaped checkpoint and
# generates from it on the CPU. Extra arguments go to specrun (e.g. --temperature 0.8 --seed 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
SPECRUN_TARGETS="specrun specrun-genmodel" bash tools/build.sh >/dev/null
build_dir=${SPECRUN_BUILD_DIR:-build}
model="$build_dir/demo-model"
if [[ ! -f "$model/model.safetensors" ]]; then
  "$build_dir/bin/specrun-genmodel" --out "$model" --vocab 512 --hidden 256 --intermediate 688 \
    --layers 4 --heads 8 --kv-heads 4 --seed 7
fi
echo "demo: generating 32 tokens from a generated (random-weight) checkpoint in $model" >&2
"$build_dir/bin/specrun" --target "$model" --prompt-ids 1,72,101,108 --max-tokens 32 \
  --temperature 0 --ignore-eos "$@"
