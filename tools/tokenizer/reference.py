#!/usr/bin/env python3
"""The reference (Hugging Face tokenizers, from the project's venv) behind the same interface as
`specrun tokenize` / `specrun detokenize`, for comparing any tokenizer.json from outside:

    diff <(build/bin/specrun tokenize --tokenizer T.json < in.txt) \\
         <(.venv/bin/python tools/tokenizer/reference.py tokenize T.json < in.txt)

Usage: reference.py tokenize|detokenize TOKENIZER_JSON [--add-special] [--skip-special] [--json]
Input lines are split on b"\\n" only; invalid UTF-8 becomes U+FFFD, as specrun sees it.
"""
import argparse
import json
import sys

from tokenizers import Tokenizer

from gen_golden import split_lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["tokenize", "detokenize"])
    parser.add_argument("tokenizer")
    parser.add_argument("--add-special", action="store_true")
    parser.add_argument("--skip-special", action="store_true")
    parser.add_argument("--json", action="store_true", help="detokenize: print JSON strings")
    args = parser.parse_args()
    tok = Tokenizer.from_file(args.tokenizer)
    out = []
    for line in split_lines(sys.stdin.buffer.read()):
        if args.command == "tokenize":
            ids = tok.encode(line, add_special_tokens=args.add_special).ids
            out.append(json.dumps(ids, separators=(",", ":")))
        else:
            text = tok.decode(json.loads(line), skip_special_tokens=args.skip_special)
            out.append(json.dumps(text, ensure_ascii=False) if args.json else text)
    sys.stdout.buffer.write("".join(line + "\n" for line in out).encode("utf-8"))


if __name__ == "__main__":
    main()
