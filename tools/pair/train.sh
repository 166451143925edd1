#!/usr/bin/env bash
# Trains the bundled draft/target pair from scratch and installs it under models/:
#   tools/pair/train.sh [WORK_DIR]
# About an hour on two otherwise idle CPU cores. Installs its Debian packages when run as root.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "${1:-$root/build/pair}")
python=/usr/bin/python3
if [[ $(id -u) == 0 ]]; then
  apt-get install -y -q python3-torch libopenblas0-pthread python3-numpy python3-regex >/dev/null
fi
mkdir -p "$work"
"$python" "$root/tools/pair/train.py" tokenizer --work "$work"
"$python" "$root/tools/pair/train.py" model --work "$work" --role draft
"$python" "$root/tools/pair/train.py" model --work "$work" --role target
# A second stage at half the peak learning rate: the target needs more tokens than the draft
# to end clearly better.
"$python" "$root/tools/pair/train.py" model --work "$work" --role target --resume --steps 260 \
  --learning-rate 1e-3 --seed 4321
"$python" "$root/tools/pair/train.py" evaluate --work "$work"
for role in draft target; do
  rm -rf "$root/models/pycode-$role"
  mkdir -p "$root/models/pycode-$role"
  cp "$work/$role"/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json} \
    "$root/models/pycode-$role/"
done
"$python" "$root/tools/pair/samples.py" --work "$work" --out "$root/models/samples.json"
echo "installed models/pycode-draft and models/pycode-target"
