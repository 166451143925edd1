#!/usr/bin/env python3
"""Checks that the CPU matmul's per-instruction-set copies keep their code to themselves.

Each copy (kernels/CMakeLists.txt) is compiled with its own instruction set. Any inline function
or template it instantiates under a name that other files share (a weak symbol outside its own
namespaces) is a definition the linker may pick for every caller: an AVX-512 body running on an
AVX2 machine. Header code the copies compile lives in SPECRUN_ISA_NAMESPACE
(kernels/core/isa_namespace.h); this test fails on any weak symbol an object defines outside the
`isa_<copy>` namespace and the copy's own namespace, naming each.

Usage: isa_symbols.py NM COPY=OBJECT [COPY=OBJECT ...]
"""
import subprocess
import sys

# Weak symbols of the compiler's own that hold no instructions of the copy's choosing: the
# personality routine's reference, and Clang's one-line call of std::terminate.
HARMLESS_PREFIXES = ("DW.ref.", "__clang_call_terminate")


def foreign_weak_symbols(nm, copy, path):
    listing = subprocess.run([nm, "-C", "--defined-only", path], check=True,
                             capture_output=True, text=True).stdout
    owned = (f"::isa_{copy}::", f"specrun::kernels::cpu::{copy}::")
    found = []
    for line in listing.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) < 3 or parts[1] not in ("W", "V", "u"):
            continue
        name = parts[2]
        if name.startswith(HARMLESS_PREFIXES) or any(mark in name for mark in owned):
            continue
        found.append(name)
    return found


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    nm = sys.argv[1]
    failures = 0
    for argument in sys.argv[2:]:
        copy, _, path = argument.partition("=")
        for name in foreign_weak_symbols(nm, copy, path):
            print(f"{path}: the {copy} copy defines {name}, a name other files share: move the "
                  f"code into SPECRUN_ISA_NAMESPACE or out of the copy")
            failures += 1
        print(f"{copy}: {path} checked")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
