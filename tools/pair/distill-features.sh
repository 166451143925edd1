#!/usr/bin/env bash
# Distils a draft that reads its target's features (EAGLE-style: one layer of the target's shape,
# README "Drafts that read the target's features") for the chat demo's target, SmolLM2-135M-
# Instruct, and installs it as OUT (default models/smollm2-draft/draft.gguf, the demo's draft):
#   tools/pair/distill-features.sh [WORK_DIR] [OUT]
# It trains on the answers of tools/pair/distill.sh (generated here if WORK_DIR has none): the
# target's features at every position are computed once (store-features, ~13 minutes on two
# cores, 2.1 GB), then the draft learns them and the next token, first 850 steps of 2,048 tokens,
# then 1,600 of 4,096 from there (about 15 and 45 minutes); the checkpoint with the lowest
# held-out loss is exported with the target's head reduced to the 8,192 tokens most frequent in
# the answers.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "${1:-$root/build/distill}")
out=$(realpath -m "${2:-$root/models/smollm2-draft/draft.gguf}")
cd "$root"
bash tools/setup-python.sh smollm2 transformers gguf
target=$(bash tools/python/smollm2-path.sh)
SPECRUN_TARGETS="specrun" bash tools/build.sh >/dev/null
python=${SPECRUN_VENV:-$root/.venv}/bin/python
mkdir -p "$work"
distill=("$python" "$root/tools/pair/distill.py" --target "$target" --work "$work")
[[ -f "$work/data.json" ]] ||
  "${distill[@]}" generate --specrun "${SPECRUN_BUILD_DIR:-build}/bin/specrun"
"${distill[@]}" store-features
"${distill[@]}" train-features --stored-features --steps 850 --tokens-per-step 2048 \
  --learning-rate 2e-3
cp "$work/feature-draft.pt" "$work/feature-draft-phase1.pt"
"${distill[@]}" train-features --stored-features --init-from "$work/feature-draft-phase1.pt" \
  --steps 1600 --tokens-per-step 4096 --learning-rate 1.5e-3 --evaluate-every 200
mkdir -p "$(dirname "$out")"
"${distill[@]}" export-features --out "$out" --head-tokens 8192
echo "wrote $out"
