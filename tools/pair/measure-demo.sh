#!/usr/bin/env bash
# Measures the demo's pair (SmolLM2-135M-Instruct with models/smollm2-draft) on the demo's five
# held-out questions, greedy and at the demo's temperature (0.7, top-p 0.9): for each, `specrun
# --compare` with 5 alternating rounds, the median speedup and its range, acceptance, and whether
# the output equals the target's alone. Writes one JSON file (default
# bench/results/cpu-smollm2-demo.json) and prints a table. --draft measures another draft in
# the shipped one's place. Extra arguments go to specrun.
#   tools/pair/measure-demo.sh [--out FILE] [--draft GGUF] [specrun flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=bench/results/cpu-smollm2-demo.json
draft=models/smollm2-draft/draft.gguf
while [[ ${1:-} == --out || ${1:-} == --draft ]]; do
  [[ $1 == --out ]] && out=$2 || draft=$2
  shift 2
done
target=$(bash tools/python/smollm2-path.sh)
specrun=${SPECRUN_BUILD_DIR:-build}/bin/specrun
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3
count=$("$python" -c 'import json; print(len(json.load(open("models/smollm2-draft/samples.json"))["questions"]))')
for ((index = 0; index < count; ++index)); do
  question=$("$python" -c 'import json, sys
print(json.load(open("models/smollm2-draft/samples.json"))["questions"][int(sys.argv[1])])' "$index")
  for temperature in 0 0.7; do
    "$specrun" --target "$target" --draft "$draft" --chat \
      --prompt "$question" --max-tokens 200 --temperature "$temperature" --top-p 0.9 \
      --compare --compare-rounds 5 --quiet --stats-json "$work/$index-$temperature.json" "$@" \
      >"$work/$index-$temperature.txt"
  done
done
"$python" - "$work" "$out" "$count" "$*" "$draft" <<'EOF'
import json, os, platform, sys
work, out, count, flags, draft = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
questions = json.load(open("models/smollm2-draft/samples.json"))["questions"]
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
            if line.startswith("model name")), platform.processor())
runs = []
print(f"{'question':<54} {'T':>4} {'accept':>6} {'speedup (range)':>22} {'same':>5}")
for index in range(count):
    for temperature in ["0", "0.7"]:
        stats = json.load(open(os.path.join(work, f"{index}-{temperature}.json")))
        runs.append({"question": questions[index], "temperature": float(temperature), **stats})
        print(f"{questions[index][:54]:<54} {temperature:>4} {stats['acceptance_rate']:6.3f} "
              f"{stats['speedup']:6.2f}x ({stats['speedup_min']:.2f}-{stats['speedup_max']:.2f}x)"
              f" {str(stats['baseline_same_output']):>5}")
summary = {}
for temperature in [0.0, 0.7]:
    mine = [r for r in runs if r["temperature"] == temperature]
    summary[str(temperature)] = {
        "speedups": [r["speedup"] for r in mine],
        "at_least_1.5x": sum(r["speedup"] >= 1.5 for r in mine),
        "acceptance": [r["acceptance_rate"] for r in mine],
        "same_output": [r["baseline_same_output"] for r in mine]}
    print(f"T={temperature}: {summary[str(temperature)]['at_least_1.5x']} of {len(mine)} "
          f"questions at 1.5x or more; speedups {summary[str(temperature)]['speedups']}")
with open(out, "w") as file:
    json.dump({"machine": cpu, "cores": os.cpu_count(), "draft": draft, "flags": flags,
               "summary": summary,
               "runs": runs}, file, indent=1)
    file.write("\n")
print(f"wrote {out}")
EOF
