#!/usr/bin/env python3
"""Writes models/samples.json: sample prompts and evaluation text, all from held-out files.

- prompts: the first function in each of a few held-out modules whose docstring is short, cut
  after the docstring, so the models complete its body. Each comes with its ids under the
  training tokenizer (BOS first), which specrun's own tokenizer must reproduce.
- evaluation: a few thousand-byte excerpts of held-out files, for the held-out loss test.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402

PROMPT_MODULES = ("textwrap.py", "bz2.py", "uuid.py", "plistlib.py", "pstats.py",
                  "mailbox.py", "xml/dom/minidom.py", "multiprocessing/context.py")
EVALUATION_MODULES = ("textwrap.py", "enum.py", "doctest.py", "mailbox.py", "uuid.py",
                      "importlib/_bootstrap_external.py")
MAX_PROMPT_BYTES = 400
EVALUATION_BYTES = 3000


def first_documented_function(text):
    """The text from a top-level `def` through its closing docstring line, or None."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if not line.startswith("def ") or not line.rstrip().endswith(":"):
            continue
        body = lines[index + 1] if index + 1 < len(lines) else ""
        stripped = body.strip()
        if not stripped.startswith('"""'):
            continue
        for end in range(index + 1, min(len(lines), index + 15)):
            closing = lines[end].strip()
            if (end == index + 1 and closing.count('"""') >= 2) or (
                    end > index + 1 and closing.endswith('"""')):
                prompt = "\n".join(lines[index:end + 1]) + "\n"
                if len(prompt.encode("utf-8")) <= MAX_PROMPT_BYTES:
                    return prompt
                break
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", required=True, help="train.py's work directory")
    parser.add_argument("--out", required=True, help="samples.json to write")
    args = parser.parse_args()
    tokenizer = bpe.load(os.path.join(args.work, "tokenizer.json"))
    _, held_out = corpus.split()
    texts = dict(held_out)
    prompts = []
    for module in PROMPT_MODULES:
        prompt = first_documented_function(texts[module])
        if prompt is not None:
            prompts.append({"source": module, "text": prompt,
                            "ids": tokenizer.encode(prompt, add_bos=True)})
    evaluation = []
    for module in EVALUATION_MODULES:
        excerpt = texts[module].encode("utf-8")[:EVALUATION_BYTES].decode("utf-8", "ignore")
        evaluation.append({"source": module, "text": excerpt})
    results = {}
    for role in ("draft", "target"):
        with open(os.path.join(args.work, f"{role}.json")) as stream:
            results[role] = json.load(stream)["held_out_loss"]
    with open(os.path.join(args.work, "corpus.json")) as stream:
        manifest = json.load(stream)
    document = {
        "corpus": f"Python {manifest['python']} standard library ({manifest['root']}), "
                  f"*.py outside the test suites",
        "held_out_files": manifest["held_out"],
        "held_out_loss": results,
        "prompts": prompts,
        "evaluation": evaluation,
    }
    with open(args.out, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=1, ensure_ascii=False)
        stream.write("\n")
    print(f"{args.out}: {len(prompts)} prompts, {len(evaluation)} evaluation excerpts")


if __name__ == "__main__":
    main()
