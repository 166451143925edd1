#!/usr/bin/env python3
"""Live comparison input: writes COUNT random strings (seeded; SPECRUN_LIVE_SEED overrides the
seed) with the reference's encode ids and decode text, one JSON object per line:
    {"text": ..., "ids": [...], "decoded": ...}
The reference is Hugging Face tokenizers from the project's venv (tools/setup-python.sh
tokenizers). Usage: live_sample.py TOKENIZER_JSON COUNT [SEED]
"""
import json
import os
import sys

from tokenizers import Tokenizer

from gen_golden import mulberry32

RANGES = [(0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F),
          (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
          (0x1100, 0x11FF), (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
          (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF)]
PIECES = [" ", "  ", "\t", "\r", "\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u0085",
          "\u200d", "\ufe0f", "'s", "'T", "'re", "'LL", "'d", "1234", "3.14", "the", " the", "The",
          "ing", "<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|endoftext|>",
          "<|im_start|>", "<|im_end|>", "<think>", "</think>", "\u2581", "\u0120", "e\u0301",
          "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f44d\U0001f3fd", "...", "!!", "->",
          "::", "{}", "()", "0x1F", "    ", "\t\t"]


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: live_sample.py TOKENIZER_JSON COUNT [SEED]")
    tok = Tokenizer.from_file(sys.argv[1])
    count = int(sys.argv[2])
    seed = int(os.environ.get("SPECRUN_LIVE_SEED") or (sys.argv[3] if len(sys.argv) > 3 else 1))
    random = mulberry32(seed)

    def below(n):
        return int(random() * n)

    out = []
    for _ in range(count):
        text = []
        for _ in range(1 + below(24)):
            if random() < 0.4:
                text.append(PIECES[below(len(PIECES))])
            else:
                lo, hi = RANGES[below(len(RANGES))]
                text.extend(chr(lo + below(hi - lo + 1)) for _ in range(1 + below(6)))
        text = "".join(text)
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        out.append(json.dumps({"text": text, "ids": ids, "decoded": decoded}))
    sys.stdout.write("".join(line + "\n" for line in out))


if __name__ == "__main__":
    main()
