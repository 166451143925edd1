#!/usr/bin/env python3
"""Writes the tokenizer benchmark input: about 3 MB of mixed prose and code from text every
Debian machine with python3 has, concatenated in a fixed (sorted) order. Prose is the packages'
copyright files (license texts) under /usr/share/doc, code the Python standard library. Files
that are not valid UTF-8 are skipped; each half is cut at a line boundary. The result depends on
the installed packages, which is fine: both implementations read the same file in the same run.

Usage: make_bench_corpus.py OUT [MEGABYTES]
"""
import glob
import pathlib
import sys


def gather(paths, limit):
    parts, size = [], 0
    for path in sorted(paths):
        try:
            text = pathlib.Path(path).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if size + len(text.encode()) > limit:
            cut = text.encode()[: limit - size]
            cut = cut[: cut.rfind(b"\n") + 1] if b"\n" in cut else b""
            parts.append(cut.decode("utf-8", errors="ignore"))
            break
        parts.append(text)
        size += len(text.encode())
    return "".join(parts)


def main():
    out = pathlib.Path(sys.argv[1])
    half = int(float(sys.argv[2] if len(sys.argv) > 2 else 3) * 1e6 / 2)
    prose = gather(glob.glob("/usr/share/doc/*/copyright"), half)
    code = gather(glob.glob("/usr/lib/python3*/*.py") + glob.glob("/usr/lib/python3*/*/*.py"), half)
    # Interleave in blocks of lines so that both kinds run through the caches together.
    prose_lines, code_lines = prose.splitlines(True), code.splitlines(True)
    merged, block = [], 200
    for i in range(0, max(len(prose_lines), len(code_lines)), block):
        merged.extend(prose_lines[i:i + block])
        merged.extend(code_lines[i:i + block])
    out.write_text("".join(merged), encoding="utf-8")


if __name__ == "__main__":
    main()
