#!/usr/bin/env bash
# Sets up the project's Python environment for the reference implementations: a virtual
# environment at .venv/ (never the system Python) with the pinned packages of each GROUP named,
# from tools/python/requirements-GROUP.txt. Usage: tools/setup-python.sh GROUP [GROUP...]
#
# Idempotent and quiet: a group already installed at its pinned versions is skipped. Never fails
# the caller when PyPI is unreachable or a package will not install: it says so in one line and
# the tests that need the group skip. Prints nothing on success.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SPECRUN_VENV:-$root/.venv}
if [[ $# -eq 0 ]]; then
  echo "usage: tools/setup-python.sh GROUP [GROUP...] (groups: $(ls "$root"/tools/python/ |
    sed -n 's/^requirements-\(.*\)\.txt$/\1/p' | tr '\n' ' '))" >&2
  exit 2
fi
if [[ ! -x "$venv/bin/python" ]]; then
  python=$(command -v python3 || true)
  if [[ -z "$python" ]] || ! "$python" -m venv "$venv" >/dev/null 2>&1; then
    echo "setup-python: cannot create a virtual environment at $venv (python3 with venv needed);" \
      "the tests that need the Python references will skip" >&2
    exit 0
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
fi
for group in "$@"; do
  requirements="$root/tools/python/requirements-$group.txt"
  if [[ ! -f "$requirements" ]]; then
    echo "setup-python: no group '$group' (no $requirements)" >&2
    exit 2
  fi
  # Installed means every pin is there at its version (asked of the venv itself, not of a stamp
  # file: a venv whose earlier install stopped partway is installed again).
  if "$venv/bin/python" - "$requirements" >/dev/null 2>&1 <<'PYTHON'; then continue; fi
import re, sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    pin = re.match(r"^\s*([A-Za-z0-9_.-]+)==(\S+)", line)
    if pin is None:
        continue
    try:
        if version(pin.group(1)) != pin.group(2):
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PYTHON
  # A line "# options: ..." in the requirements file adds pip options (e.g. --no-deps).
  options=$(sed -n 's/^# options: *\(\(--[a-z-]* *\)*\).*/\1/p' "$requirements")
  # No pip cache: the torch wheels would keep gigabytes in ~/.cache for nothing.
  # shellcheck disable=SC2086
  if ! timeout 1800 "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
      $options -r "$requirements" >"$venv/pip-$group.log" 2>&1; then
    echo "setup-python: installing '$group' failed (see $venv/pip-$group.log); the tests that" \
      "need it will skip" >&2
  fi
done
exit 0
