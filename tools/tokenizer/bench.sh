#!/usr/bin/env bash
# Tokenizer encode throughput, specrun against the reference (Hugging Face tokenizers through its
# Python binding, the pinned PyPI package in .venv), side by side in one run, single thread, on
# ~3 MB of mixed prose and code, for the seven tokenizer.json files in ../shared/tokenizers. Both
# sides must produce the same ids (compared by checksum) or the run fails. Prints a Markdown table
# with the ratios.
#
#   tools/tokenizer/bench.sh [BUILD_DIR]      (default build; needs specrun-tokbench built)
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${1:-${SPECRUN_BUILD_DIR:-build}}
shared=$(realpath -m ../shared/tokenizers)
if [[ ! -d "$shared" ]]; then
  echo "bench: $shared is absent (the tokenizer files come from ../shared)" >&2
  exit 1
fi
bash tools/setup-python.sh tokenizers
python=.venv/bin/python
if ! "$python" -c 'import tokenizers' 2>/dev/null; then
  echo "bench: the reference is not installed in .venv (PyPI unreachable?)" >&2
  exit 1
fi
corpus="$build_dir/tokenizer-bench-corpus.txt"
python3 tools/tokenizer/make_bench_corpus.py "$corpus" 3
pin=()
if command -v taskset >/dev/null; then pin=(taskset -c 0); fi
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
reference=$("$python" -c 'import platform, tokenizers
print(f"tokenizers {tokenizers.__version__} (Python {platform.python_version()})")')
echo "input: $(wc -c <"$corpus") bytes, $(wc -l <"$corpus") lines; CPU: $cpu, $(nproc) cores;" \
  "one thread; reference: $reference"
echo
echo "| tokenizer | shape | reference MB/s | specrun MB/s | specrun / reference |"
echo "|---|---|---|---|---|"
for family in llama3 llama2 qwen3 llama3_1 gemma3 deepseek_v3 gptoss; do
  json="$shared/$family/tokenizer.json"
  ours=$("${pin[@]}" "$build_dir/bin/specrun-tokbench" --tokenizer "$json" --input "$corpus")
  theirs=$("${pin[@]}" "$python" tools/tokenizer/bench_reference.py "$json" "$corpus")
  python3 - "$family" "$ours" "$theirs" <<'PY'
import json, sys
family, ours, theirs = sys.argv[1], sys.argv[2], sys.argv[3]
ours = {r["shape"]: r for r in map(json.loads, ours.splitlines())}
theirs = {r["shape"]: r for r in map(json.loads, theirs.splitlines())}
for shape in ("whole", "lines"):
    o, t = ours[shape], theirs[shape]
    if (o["tokens"], o["checksum"]) != (t["tokens"], t["checksum"]):
        sys.exit(f"bench: {family} {shape}: ids differ from the reference "
                 f"({o['tokens']} vs {t['tokens']} tokens)")
    print(f"| {family} | {shape} | {t['mb_per_s']:.2f} | {o['mb_per_s']:.2f} | "
          f"{o['mb_per_s'] / t['mb_per_s']:.1f}x |")
PY
done
