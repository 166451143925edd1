"""The training corpus: the Python standard library's own source, as Debian installs it.

Every file under /usr/lib/python3.X (the interpreter that runs this script) whose name ends in
.py, in sorted order, except site-packages/dist-packages and the test suites. Each file is one
document. A stable hash of a file's relative path puts it in the held-out split, so the split
does not depend on which files a given installation happens to have.

The standard library is under the Python Software Foundation License, which permits this use.
"""

import hashlib
import os
import sys
import sysconfig

HELD_OUT_PERCENT = 5  # share of files (by path hash) kept out of training


def stdlib_root():
    return sysconfig.get_paths()["stdlib"]


def _skipped(relative):
    parts = relative.split(os.sep)
    return (
        parts[0] in ("site-packages", "dist-packages", "test", "idlelib", "turtledemo")
        or "tests" in parts
        or "test" in parts
    )


def is_held_out(relative):
    digest = hashlib.sha256(relative.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % 100 < HELD_OUT_PERCENT


def documents(root=None):
    """Yields (relative path, text) for every corpus file, in a fixed order."""
    root = root or stdlib_root()
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if _skipped(relative):
                continue
            found.append((relative, path))
    found.sort()
    for relative, path in found:
        with open(path, "rb") as stream:
            data = stream.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        yield relative, text.replace("\r\n", "\n")


def split(root=None):
    """Returns (train, held_out): lists of (relative path, text)."""
    train, held_out = [], []
    for relative, text in documents(root):
        (held_out if is_held_out(relative) else train).append((relative, text))
    return train, held_out


if __name__ == "__main__":
    train, held_out = split()
    def size(docs):
        return sum(len(text.encode("utf-8")) for _, text in docs)
    print(f"{stdlib_root()} (Python {sys.version.split()[0]})")
    print(f"train: {len(train)} files, {size(train)} bytes")
    print(f"held out: {len(held_out)} files, {size(held_out)} bytes")
