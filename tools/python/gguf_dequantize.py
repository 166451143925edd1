#!/usr/bin/env python3
"""Dequantises raw ggml blocks with gguf-py, llama.cpp's own Python package: the independent
reference tests/test_gguf.cpp compares specrun's dequantisers with.

Usage: gguf_dequantize.py TYPE IN OUT   (TYPE a ggml type name such as Q4_K; IN whole blocks;
OUT receives the values as little-endian float32)
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    qtype = GGMLQuantizationType[argv[0]]
    data = np.fromfile(argv[1], dtype=np.uint8)
    values = dequantize(data, qtype).astype("<f4").reshape(-1)
    values.tofile(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
