#!/usr/bin/env bash
# Sets up and runs the demo: builds specrun and decodes speculatively on the CPU.
# - With ../shared/models/stories260K present (a real 260K-parameter TinyStories Llama): converts it
#   to Hugging Face layout with a tokenizer.json, uses the f32 model as the target and its bf16
#   rounding as the draft, and streams a story from a text prompt.
# - Otherwise: a generated (random-weight) layer-skip pair, so the tokens are noise and shown as
#   ids; the command still exercises the whole speculative path.
# Extra arguments go to specrun (e.g. --temperature 0.8 --seed 3 --no-draft).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
SPECRUN_TARGETS="specrun specrun-genmodel" bash tools/build.sh >/dev/null
build_dir=${SPECRUN_BUILD_DIR:-build}
demo="$build_dir/demo"
stories=../shared/models/stories260K
# Debian's python3 (with python3-numpy from install-deps.sh), ahead of any other on the PATH.
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3
if [[ -f "$stories/stories260K.bin" && -f "$stories/tok512.bin" ]]; then
  for dtype in f32 bf16; do
    if [[ ! -f "$demo/stories260K-$dtype/tokenizer.json" ]]; then
      "$python" tools/convert_llama2c.py "$stories/stories260K.bin" "$demo/stories260K-$dtype" \
        --tokenizer "$stories/tok512.bin" --dtype "$dtype"
    fi
  done
  echo "demo: stories260K (f32 target, its bf16 rounding as the draft), prompt 'Once upon a time'" >&2
  exec "$build_dir/bin/specrun" --target "$demo/stories260K-f32" --draft "$demo/stories260K-bf16" \
    --prompt "Once upon a time" --max-tokens 200 --temperature 0 "$@"
fi
if [[ ! -f "$demo/generated-target/model.safetensors" ]]; then
  "$build_dir/bin/specrun-genmodel" --out "$demo/generated-target" --vocab 512 --hidden 256 \
    --intermediate 688 --layers 4 --heads 8 --kv-heads 4 --seed 7 --shallow-layers 1 \
    --deep-scale 0.3
  "$build_dir/bin/specrun-genmodel" --truncate "$demo/generated-target" --layers 1 \
    --out "$demo/generated-draft"
fi
echo "demo: no ../shared/models/stories260K; a generated random-weight layer-skip pair (token ids)" >&2
exec "$build_dir/bin/specrun" --target "$demo/generated-target" --draft "$demo/generated-draft" \
  --prompt-ids 1,72,101,108 --max-tokens 64 --temperature 0 --ignore-eos "$@"
