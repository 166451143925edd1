#!/usr/bin/env bash
# Distils a draft for the chat demo's target, SmolLM2-135M-Instruct, on the CPU:
#   tools/pair/distill.sh [--plain] [--quick] [--from DRAFT_GGUF] [--questions N] [WORK_DIR] [OUT]
# The target answers 9,600 generated questions (--questions N: the first N of them) through
# `specrun serve` (greedy and at T 0.7, top-p 0.9; ~35-46 minutes on two idle cores), kept in
# WORK_DIR (default build/distill) and asked again only where it has none; answers kept for
# another number of questions are refused.
# The demo's draft (the default, installed as OUT, default models/smollm2-draft/draft.gguf): one
# layer that reads the target's features (EAGLE-style; docs/speculation.md, "Drafts that read the target's
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
# --quick: every step of the recipe at a size of a minute (40 questions of 24 tokens, a few
# training steps, a 512-token head, held-out metrics on four new-topic questions): a draft that
# shows the recipe runs end to end and exports what specrun loads (the PyPI-model tests run it),
# not one that drafts well. Give WORK_DIR.
# --from DRAFT_GGUF: the feature draft trains further from this exported draft (e.g. the shipped
# models/smollm2-draft/draft.gguf, its matrices dequantised from Q8_0) rather than from the
# target: one phase of 800 steps of 4,096 tokens at a peak learning rate of 1e-3 (~36 minutes on
# the 2-core EPYC; how the shipped draft was trained from the one before it), the draft it starts
# from evaluated first and kept unless a step beats it, and exported with that draft's head. A
# file that is not a feature draft of the target's shape is refused before the target answers
# anything.
# SPECRUN_BIN: the specrun that answers the questions, instead of building build/bin/specrun.
# The answers (data.json) and the stored features (features.json) are computed only where WORK_DIR
# has none. Every step loads the target from WORK_DIR/target, transformers' conversion of its GGUF
# made by the first (float32, 540 MB; about 25 s, where each load from the GGUF would take as much).
set -euo pipefail
plain=false
quick=false
from=""
questions_asked=9600
while [[ ${1:-} == --plain || ${1:-} == --quick || ${1:-} == --from || ${1:-} == --questions ]]; do
  case $1 in
    --plain) plain=true ;;
    --quick) quick=true ;;
    --from)
      if [[ -z ${2:-} || ! -f $2 ]]; then
        echo "distill.sh: --from needs an exported feature draft's GGUF file, got '${2:-}'" >&2
        exit 2
      fi
      from=$(realpath "$2")
      shift
      ;;
    --questions)
      if [[ ! ${2:-} =~ ^[1-9][0-9]*$ ]]; then
        echo "distill.sh: --questions needs a positive count, got '${2:-}'" >&2
        exit 2
      fi
      questions_asked=$2
      shift
      ;;
  esac
  shift
done
if $quick && [[ -z ${1:-} ]]; then
  echo "distill.sh: --quick needs a WORK_DIR (its draft is no demo's)" >&2
  exit 2
fi
if $plain && [[ -n $from ]]; then
  echo "distill.sh: --from continues a feature draft, not the --plain one" >&2
  exit 2
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
specrun=${SPECRUN_BIN:-}
if [[ -z $specrun ]]; then
  SPECRUN_TARGETS="specrun" bash tools/build.sh >/dev/null
  specrun=${SPECRUN_BUILD_DIR:-build}/bin/specrun
fi
python=${SPECRUN_VENV:-$root/.venv}/bin/python
mkdir -p "$work" "$(dirname "$out")"
distill=("$python" "$root/tools/pair/distill.py" --target "$target" --work "$work")
# The sizes of each step: the recipe's, or --quick's (the first value of each pair).
size() { if $quick; then echo "$1"; else echo "$2"; fi; }
asked=$(size 40 "$questions_asked")
questions=(--questions "$asked" --max-new-tokens "$(size 24 192)" --batch "$(size 8 48)")
# The held-out metrics' answers to questions on new topics: --quick's four, of 24 tokens at most.
evaluation=()
$quick && evaluation=(--new-topics 4 --max-new-tokens 24)
# The feature draft trains with a head of the answers' 16,384 most frequent tokens and ships
# with 8,192 of them.
training_head=$(size 512 16384)
# A --from that is not a feature draft of the target's shape is refused before the target answers.
[[ -z $from ]] || "${distill[@]}" check-feature-draft --init-from "$from"
if [[ -f "$work/data.json" ]]; then
  kept=$("$python" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["questions"]))' \
    "$work/data.json")
  if [[ $kept != "$asked" ]]; then
    echo "distill.sh: $work/data.json holds the answers to $kept questions, not the $asked" \
      "asked: give another WORK_DIR, or remove it to ask again" >&2
    exit 2
  fi
else
  "${distill[@]}" generate --specrun "$specrun" "${questions[@]}"
fi
if $plain; then
  "${distill[@]}" train --steps "$(size 2 1200)" --tokens-per-step "$(size 256 4096)" \
    --evaluate-every "$(size 2 100)" "${evaluation[@]}"
  cp "$work/draft.pt" "$work/phase1.pt"
  "${distill[@]}" train --init-from "$work/phase1.pt" --kl-weight 0.5 --steps "$(size 2 450)" \
    --tokens-per-step "$(size 256 4096)" --evaluate-every "$(size 2 100)" --learning-rate 5e-4 \
    "${evaluation[@]}"
  "${distill[@]}" evaluate --specrun "$specrun" "${evaluation[@]}"
  "${distill[@]}" export --out "$out" --head-tokens "$(size 512 16384)"
else
  [[ -f "$work/features.json" ]] ||
    "${distill[@]}" store-features --tokens-per-step "$(size 512 4096)"
fi
if [[ -n $from ]]; then
  "${distill[@]}" train-features --stored-features --init-from "$from" --steps "$(size 2 800)" \
    --tokens-per-step "$(size 256 4096)" --learning-rate 1e-3 --evaluate-every "$(size 2 200)" \
    --head-tokens "$training_head" "${evaluation[@]}"
  "${distill[@]}" export-features --out "$out" --head-from "$from"
elif ! $plain; then
  "${distill[@]}" train-features --stored-features --steps "$(size 2 850)" \
    --tokens-per-step "$(size 256 2048)" --learning-rate 2e-3 --head-tokens "$training_head" \
    "${evaluation[@]}"
  cp "$work/feature-draft.pt" "$work/feature-draft-phase1.pt"
  "${distill[@]}" train-features --stored-features --init-from "$work/feature-draft-phase1.pt" \
    --steps "$(size 2 1600)" --tokens-per-step "$(size 256 4096)" --learning-rate 1.5e-3 \
    --evaluate-every "$(size 2 200)" --head-tokens "$training_head" "${evaluation[@]}"
  "${distill[@]}" export-features --out "$out" --head-tokens "$(size 512 8192)"
fi
echo "wrote $out"
