#!/usr/bin/env python3
"""Tokenizes stdin line by line with the tokenizer a GGUF file's metadata describes, built
independently of specrun: gguf-py reads the metadata and Hugging Face `tokenizers` (the
reference library) runs it, assembled from its own components the way transformers' GGUF
converter assembles a byte-level (`gpt2`) tokenizer, with the pre-tokenizer llama.cpp's
`tokenizer.ggml.pre` names. Prints one JSON list of ids per line, as `specrun tokenize` does.

Usage: gguf_tokenize.py MODEL.gguf [--add-special] < lines
"""

import json
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if len(f.data) == 1 and f.types[0].name != "ARRAY":
        return f.contents()
    return f.contents()


def build(path):
    reader = GGUFReader(path)
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"gguf_tokenize: tokenizer.ggml.model {model!r}: only gpt2 is built here")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
    pre = field(reader, "tokenizer.ggml.pre", "default")
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False,
                                     ignore_merges=pre in ("llama-bpe", "llama3")))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt2"):
        tokenizer.pre_tokenizer = byte_level
    elif pre in ("smollm", "starcoder", "refact"):
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("llama-bpe", "llama3"):
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise SystemExit(f"gguf_tokenize: pre-tokenizer {pre!r} is not built here")
    tokenizer.decoder = decoders.ByteLevel()
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t in (2, 3)]
    tokenizer.add_special_tokens(special)
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    if field(reader, "tokenizer.ggml.add_bos_token", False):
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], bos)])
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    tokenizer = build(argv[0])
    add_special = "--add-special" in argv[1:]
    for line in sys.stdin.buffer.read().split(b"\n")[:-1]:
        text = line.decode("utf-8", errors="replace")
        ids = tokenizer.encode(text, add_special_tokens=add_special).ids
        sys.stdout.write(json.dumps(ids, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
