#!/usr/bin/env python3
"""Regenerates the tokenizer conformance golden files from the reference implementation: Hugging
Face tokenizers (Rust core, the pinned PyPI package in the project's venv) on the real
tokenizer.json files in ../shared/tokenizers/<family>/.

    bash tools/setup-python.sh tokenizers
    .venv/bin/python tools/tokenizer/gen_golden.py [--shared DIR] [--out DIR] [FAMILY...]

For each family (default: all) it writes OUT/golden_<family>.json:
  lines:        encode(line, add_special_tokens=False) for every corpus line (the corpus is split
                on b"\\n" only; each line's bytes are decoded with every maximal invalid UTF-8
                subsequence replaced by U+FFFD, as the C++ side does)
  blocks:       encode of runs of BLOCK_LINES lines joined with "\\n" (newline handling)
  special:      the ids add_special_tokens=True puts before and after, and the lines where that
                is not the whole difference
  decoded:      decode(ids, False) where it differs from the line's text; decoded_skip:
                decode(ids, True) where it differs from decoded
  probes:       decode of short id windows, single tokens and unknown ids, both skip modes
"""
import argparse
import json
import math
import pathlib
import sys

from tokenizers import Tokenizer, __version__ as tokenizers_version

FAMILIES = ["llama3", "llama2", "qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss"]
BLOCK_LINES = 6
BLOCK_SOURCE_LINES = 132  # the prose, code and whitespace groups
PROBES = 240
PROBE_SPECIALS = ["<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                  "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]
ROOT = pathlib.Path(__file__).resolve().parents[2]


def split_lines(data):
    """Splits bytes on b"\\n"; the empty piece after a final newline is not a line."""
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    return [piece.decode("utf-8", errors="replace") for piece in pieces]


def mulberry32(seed):
    """A small seeded generator, so the probes are the same on every run (32-bit arithmetic)."""
    mask = 0xFFFFFFFF
    state = seed & mask

    def imul(a, b):
        return (a * b) & mask

    def random():
        nonlocal state
        state = (state + 0x6D2B79F5) & mask
        t = imul(state ^ (state >> 15), 1 | state)
        t = ((t + imul(t ^ (t >> 7), 61 | t)) & mask) ^ t
        return ((t ^ (t >> 14)) & mask) / 4294967296

    return random


def below(random, n):
    return math.floor(random() * n)


def special_ids_around(tok):
    """The ids add_special_tokens adds, found on a plain word."""
    plain = tok.encode("x", add_special_tokens=False).ids
    with_special = tok.encode("x", add_special_tokens=True).ids
    prefix = 0
    while prefix < len(with_special) and with_special[prefix] != plain[0]:
        prefix += 1
    return with_special[:prefix], with_special[prefix + len(plain):]


def probes(tok, family, all_ids):
    random = mulberry32(0x5EED + len(family))
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    specials = [i for i in map(tok.token_to_id, PROBE_SPECIALS) if i is not None]
    out = []
    for p in range(PROBES):
        kind = p % 8
        if kind == 0:
            ids = [below(random, vocab_size)]  # any single token
        elif kind == 1:
            ids = [below(random, vocab_size), below(random, vocab_size)]
        elif kind == 2 and specials:
            at = below(random, len(all_ids) - 3)

            def pick():
                return specials[below(random, len(specials))]

            first = pick()
            ids = [first, *all_ids[at:at + 3], vocab_size + 7, pick()]
        else:
            # A window of the corpus' own ids: it often starts or ends inside a character.
            at = below(random, len(all_ids) - 6)
            ids = all_ids[at:at + 1 + below(random, 6)]
        out.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                    "skip": tok.decode(ids, skip_special_tokens=True)})
    return out


def golden(tok, family, lines, blocks):
    before, after = special_ids_around(tok)
    out = {
        "family": family,
        "tokenizer": f"shared/tokenizers/{family}/tokenizer.json",
        "reference": f"tokenizers=={tokenizers_version} (PyPI)",
        "corpus_lines": len(lines),
        "block_lines": BLOCK_LINES,
        "block_source_lines": BLOCK_SOURCE_LINES,
        "special": {"before": before, "after": after, "exceptions": {}},
        "lines": [],
        "decoded": {},
        "decoded_skip": {},
        "blocks": [],
        "probes": [],
    }
    all_ids = []
    for i, line in enumerate(lines):
        ids = tok.encode(line, add_special_tokens=False).ids
        out["lines"].append(ids)
        all_ids.extend(ids)
        special = tok.encode(line, add_special_tokens=True).ids
        if special != before + ids + after:
            out["special"]["exceptions"][str(i)] = special
        decoded = tok.decode(ids, skip_special_tokens=False)
        if decoded != line:
            out["decoded"][str(i)] = decoded
        skipped = tok.decode(ids, skip_special_tokens=True)
        if skipped != decoded:
            out["decoded_skip"][str(i)] = skipped
    out["blocks"] = [tok.encode(block, add_special_tokens=False).ids for block in blocks]
    out["probes"] = probes(tok, family, all_ids)
    return out


def dump(out):
    """Compact JSON with one entry per line, so that the file diffs well."""
    body = json.dumps(out, ensure_ascii=False, separators=(",", ":"))
    return body.replace("],[", "],\n[").replace('},{"ids"', '},\n{"ids"') + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=pathlib.Path, default=ROOT.parent / "shared",
                        help="the shared folder holding tokenizers/<family>/ (default ../shared)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/data/tokenizer",
                        help="where golden_<family>.json go (default tests/data/tokenizer)")
    parser.add_argument("--corpus", type=pathlib.Path, help="default: OUT/corpus.txt")
    parser.add_argument("families", nargs="*", default=FAMILIES, metavar="FAMILY")
    args = parser.parse_args()
    lines = split_lines((args.corpus or args.out / "corpus.txt").read_bytes())
    blocks = ["\n".join(lines[i:i + BLOCK_LINES])
              for i in range(0, min(BLOCK_SOURCE_LINES, len(lines)), BLOCK_LINES)]
    for family in args.families:
        path = args.shared / "tokenizers" / family / "tokenizer.json"
        if not path.is_file():
            sys.exit(f"gen_golden: {path} is absent")
        out = golden(Tokenizer.from_file(str(path)), family, lines, blocks)
        target = args.out / f"golden_{family}.json"
        target.write_text(dump(out), encoding="utf-8")
        print(f"{target}: {len(lines)} lines, {len(blocks)} blocks, {len(out['probes'])} probes")


if __name__ == "__main__":
    main()
