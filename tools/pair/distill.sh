#!/usr/bin/env bash
# Distils a draft for the chat demo's target, SmolLM2-135M-Instruct, on the CPU:
#   tools/pair/distill.sh [--plain] [WORK_DIR] [OUT]
# The target answers 9,600 generated questions through `specrun serve` (greedy and at T 0.7,
# top-p 0.9; ~35-46 minutes on two idle cores), kept in WORK_DIR (default build/distill) and
# asked again only where it has none.
# The demo's draft (the default, installed as OUT, default models/smollm2-draft/draft.gguf): one
# layer that reads the target's features (EAGLE-style; README "Drafts that read the target's
# features"). The target's features at every position of the answers are computed once
# (store-features, ~13 minutes, 2.1 GB), then the draft learns them and the next token, 850 steps
# of 2,048 tokens and 1,600 of 4,096 from there (~15 and ~45 minutes); the checkpoint with the
# lowest held-out loss is exported with the target's head reduced to the 8,192 tokens most
# frequent in the answers.
# --plain: the previous draft (four narrow layers that read tokens only; OUT default
# WORK_DIR/plain-draft.gguf), initialised from the target's embeddings and first layers, learns
# the answers, then (a second phase) half from them and half from the target's own distributions
# (KL); exported with a head of its own over the 16,384 tokens most frequent in the answers
# (training ~63 and ~42 minutes).
set -euo pipefail
plain=false
if [[ ${1:-} == --plain ]]; then
  plain=true
  shift
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "${1:-$root/build/distill}")
if $plain; then
  out=$(realpath -m "${2:-$work/plain-draft.gguf}")
else
  out=$(realpath -m "${2:-$root/models/smollm2-draft/draft.gguf}")
fi
cd "$root"
bash tools/setup-python.sh smollm2 transformers gguf
target=$(bash tools/python/smollm2-path.sh)
SPECRUN_TARGETS="specrun" bash tools/build.sh >/dev/null
python=${SPECRUN_VENV:-$root/.venv}/bin/python
mkdir -p "$work" "$(dirname "$out")"
distill=("$python" "$root/tools/pair/distill.py" --target "$target" --work "$work")
[[ -f "$work/data.json" ]] ||
  "${distill[@]}" generate --specrun "${SPECRUN_BUILD_DIR:-build}/bin/specrun"
if $plain; then
  "${distill[@]}" train
  cp "$work/draft.pt" "$work/phase1.pt"
  "${distill[@]}" train --init-from "$work/phase1.pt" --kl-weight 0.5 --steps 450 \
    --learning-rate 5e-4
  "${distill[@]}" evaluate --specrun "${SPECRUN_BUILD_DIR:-build}/bin/specrun"
  "${distill[@]}" export --out "$out"
else
  "${distill[@]}" store-features
  "${distill[@]}" train-features --stored-features --steps 850 --tokens-per-step 2048 \
    --learning-rate 2e-3
  cp "$work/feature-draft.pt" "$work/feature-draft-phase1.pt"
  "${distill[@]}" train-features --stored-features --init-from "$work/feature-draft-phase1.pt" \
    --steps 1600 --tokens-per-step 4096 --learning-rate 1.5e-3 --evaluate-every 200
  "${distill[@]}" export-features --out "$out" --head-tokens 8192
fi
echo "wrote $out"
