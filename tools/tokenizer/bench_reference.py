#!/usr/bin/env python3
"""The reference side of tools/tokenizer/bench.sh: Hugging Face tokenizers (the Python binding
from the project's venv) encoding a text file as one string and line by line, fastest of REPEATS
runs, in the JSON shape specrun-tokbench prints. Run it on one core with RAYON_NUM_THREADS=1.

Usage: bench_reference.py TOKENIZER_JSON INPUT [REPEATS]
"""
import json
import pathlib
import sys
import time

from tokenizers import Tokenizer


def checksum(ids, value):
    """FNV-1a over the ids, as specrun-tokbench computes it."""
    for i in ids:
        value = ((value ^ i) * 16777619) & 0xFFFFFFFF
    return value


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: bench_reference.py TOKENIZER_JSON INPUT [REPEATS]")
    tok = Tokenizer.from_file(sys.argv[1])
    text = pathlib.Path(sys.argv[2]).read_text(encoding="utf-8")
    repeats = max(1, int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    lines = text.split("\n")
    megabytes = len(text.encode("utf-8")) / 1e6

    def encode(s):
        return tok.encode(s, add_special_tokens=False).ids

    encode(text[:100000])  # warm-up, as on the specrun side
    best_whole = best_lines = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        whole = encode(text)
        best_whole = min(best_whole, time.perf_counter() - start)
        start = time.perf_counter()
        per_line = [encode(line) for line in lines]
        best_lines = min(best_lines, time.perf_counter() - start)
    line_sum = 2166136261
    for ids in per_line:
        line_sum = checksum(ids, line_sum)
    for shape, seconds, tokens, value in (
            ("whole", best_whole, len(whole), checksum(whole, 2166136261)),
            ("lines", best_lines, sum(map(len, per_line)), line_sum)):
        print(json.dumps({"impl": "reference", "shape": shape,
                          "mb_per_s": round(megabytes / seconds, 3), "tokens": tokens,
                          "checksum": value}))


if __name__ == "__main__":
    main()
