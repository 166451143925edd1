#!/usr/bin/env bash
# Sets up and runs the demo: builds specrun and completes held-out Python code with the bundled
# pair (models/pycode-target, 8M parameters, drafted for by models/pycode-draft, 1.3M), on the CPU.
# The prompt, a function signature and docstring from a module the models never saw, is printed
# first; the completion streams after it. Then come the stats, and the speedup over the target
# alone measured on the same request (--compare).
# Extra arguments go to specrun, e.g. --prompt 'def fib(n):' --temperature 0.8, or --prompt-index 3
# for another of the sample prompts in models/samples.json.
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
args=("$@")
if [[ " $* " != *" --prompt "* && " $* " != *" --prompt-ids "* ]]; then
  python=/usr/bin/python3
  [[ -x "$python" ]] || python=python3
  prompt=$("$python" -c 'import json, sys
prompts = json.load(open("models/samples.json"))["prompts"]
sys.stdout.write(prompts[int(sys.argv[1]) % len(prompts)]["text"] + "|")' "$index")
  prompt=${prompt%|}  # the bar keeps the prompt's final newline from $(...)
  echo "demo: completing a held-out function from the Python standard library" >&2
  printf '%s' "$prompt"
  args=(--prompt "$prompt" "${args[@]}")
fi
# Defaults for what the arguments leave out.
[[ " $* " == *" --max-tokens "* ]] || args=(--max-tokens 160 "${args[@]}")
[[ " $* " == *" --temperature "* ]] || args=(--temperature 0.7 --top-p 0.9 "${args[@]}")
exec "$build_dir/bin/specrun" --compare "${args[@]}"
