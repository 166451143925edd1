#!/usr/bin/env bash
# Distils a plain draft (four narrow layers, reading tokens only) for the chat demo's target,
# SmolLM2-135M-Instruct, and writes it to OUT (default WORK_DIR/plain-draft.gguf): the demo's draft
# until the one that reads the target's features (tools/pair/distill-features.sh, which shares
# these answers) replaced it.
#   tools/pair/distill.sh [WORK_DIR] [OUT]
# The target answers 9,600 generated questions through `specrun serve` (greedy and at T 0.7,
# top-p 0.9); the draft, initialised from the target's embeddings and first layers, learns those
# answers, then (a second phase) half from them and half from the target's own distributions (KL);
# the result is exported as GGUF with the target's tokenizer and a head that scores the 16,384
# tokens most frequent in the answers (distill.py --head-tokens). About 2.5 hours on two otherwise
# idle CPU cores (answers ~35-46 minutes, training ~63 and ~42).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "${1:-$root/build/distill}")
out=$(realpath -m "${2:-$work/plain-draft.gguf}")
cd "$root"
bash tools/setup-python.sh smollm2 transformers gguf
target=$(bash tools/python/smollm2-path.sh)
SPECRUN_TARGETS="specrun" bash tools/build.sh >/dev/null
python=${SPECRUN_VENV:-$root/.venv}/bin/python
mkdir -p "$work"
distill=("$python" "$root/tools/pair/distill.py" --target "$target" --work "$work")
"${distill[@]}" generate --specrun "${SPECRUN_BUILD_DIR:-build}/bin/specrun"
"${distill[@]}" train
cp "$work/draft.pt" "$work/phase1.pt"
"${distill[@]}" train --init-from "$work/phase1.pt" --kl-weight 0.5 --steps 450 --learning-rate 5e-4
"${distill[@]}" evaluate --specrun "${SPECRUN_BUILD_DIR:-build}/bin/specrun"
mkdir -p "$(dirname "$out")"
"${distill[@]}" export --out "$out"
echo "wrote $out"
