#!/usr/bin/env python3
"""Converts a llama2.c legacy checkpoint (e.g. stories260K.bin) to Hugging Face layout.

Writes OUT_DIR/config.json and OUT_DIR/model.safetensors (every tensor F32), a
LlamaForCausalLM checkpoint that specrun (or transformers) loads directly.

llama2.c legacy format (all little-endian):
    7 x int32 header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
        (a negative vocab_size means the classifier is a separate tensor, not the embedding)
    float32 arrays, matrices stored [out, in]:
        token_embedding [vocab, dim]
        rms_att [L, dim]
        wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim], wo [L, dim, dim]
        rms_ffn [L, dim]
        w1 [L, hidden, dim], w2 [L, dim, hidden], w3 [L, hidden, dim]
        rms_final [dim]
        freq_cis_real [seq_len, head_size/2], freq_cis_imag [seq_len, head_size/2]
        wcls [vocab, dim]  (only when vocab_size was negative)

llama2.c rotates interleaved channel pairs (2i, 2i+1), Meta's convention. With --layout hf (the
default) the q and k rows are permuted exactly as transformers' convert_llama_weights_to_hf.py
does, so the standard rotate-half RoPE gives the same model; --layout meta keeps the rows as they
are, for a runtime that applies interleaved RoPE.

With --tokenizer tok512.bin it also writes OUT_DIR/tokenizer.json: llama2.c's tokenizer export
(SentencePiece BPE pieces with their scores, "▁" written as a space, BOS and EOS written as
"\n<s>\n" and "\n</s>\n", bytes as "<0xNN>") turned back into the Llama 2 tokenizer.json layout
(Prepend/Replace normalizer, byte-fallback BPE, TemplateProcessing adding BOS, and the decoder that
undoes them), its merges derived from the piece scores as Hugging Face's SentencePiece converter
derives them.

Usage:
    convert_llama2c.py stories260K.bin OUT_DIR [--layout hf|meta] [--tokenizer tok512.bin]
                       [--dtype f32|bf16]
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

HEADER_INTS = 7


def read_llama2c(path):
    """Returns (header dict, {llama2.c name: float32 array}) and checks the file size exactly."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 4 * HEADER_INTS:
        raise ValueError(f"{path}: {len(blob)} bytes, too short for the header")
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = struct.unpack(
        "<7i", blob[:4 * HEADER_INTS])
    shared_classifier = vocab > 0
    vocab = abs(vocab)
    if min(dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len) <= 0:
        values = (dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len)
        raise ValueError(f"{path}: implausible header {values}")
    if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
        raise ValueError(f"{path}: dim {dim} / heads {n_heads} / kv heads {n_kv_heads} mismatch")
    head_size = dim // n_heads
    kv_dim = n_kv_heads * head_size
    layout = [
        ("token_embedding", (vocab, dim)),
        ("rms_att", (n_layers, dim)),
        ("wq", (n_layers, dim, dim)),
        ("wk", (n_layers, kv_dim, dim)),
        ("wv", (n_layers, kv_dim, dim)),
        ("wo", (n_layers, dim, dim)),
        ("rms_ffn", (n_layers, dim)),
        ("w1", (n_layers, hidden, dim)),
        ("w2", (n_layers, dim, hidden)),
        ("w3", (n_layers, hidden, dim)),
        ("rms_final", (dim,)),
        ("freq_cis_real", (seq_len, head_size // 2)),
        ("freq_cis_imag", (seq_len, head_size // 2)),
    ]
    if not shared_classifier:
        layout.append(("wcls", (vocab, dim)))
    expected = 4 * HEADER_INTS + 4 * sum(int(np.prod(shape)) for _, shape in layout)
    if len(blob) != expected:
        raise ValueError(f"{path}: {len(blob)} bytes, the header implies {expected}")
    arrays = {}
    offset = 4 * HEADER_INTS
    for name, shape in layout:
        count = int(np.prod(shape))
        arrays[name] = np.frombuffer(blob, dtype="<f4", count=count, offset=offset).reshape(shape)
        offset += 4 * count
    header = dict(dim=dim, hidden_dim=hidden, n_layers=n_layers, n_heads=n_heads,
                  n_kv_heads=n_kv_heads, vocab_size=vocab, seq_len=seq_len,
                  shared_classifier=shared_classifier)
    return header, arrays


def check_rope_table(header, arrays, theta):
    """The stored cos/sin table must be llama2.c's RoPE with this theta: a format sanity check."""
    head_size = header["dim"] // header["n_heads"]
    inv_freq = 1.0 / theta ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size)
    angles = np.arange(header["seq_len"], dtype=np.float64)[:, None] * inv_freq[None, :]
    error = max(np.abs(arrays["freq_cis_real"] - np.cos(angles)).max(),
                np.abs(arrays["freq_cis_imag"] - np.sin(angles)).max())
    # float32 sin/cos of angles up to seq_len: a few ulps of the angle, far below 1e-3.
    if error > 1e-3:
        raise ValueError(f"freq_cis table differs from RoPE theta {theta} by {error}")


def permute_to_rotate_half(w, n_heads):
    """HF convert_llama_weights_to_hf.py `permute`: interleaved rows -> rotate-half rows.

    Row h*hd + 2i + j (head h, pair i, member j) moves to h*hd + j*hd/2 + i.
    """
    dim1, dim2 = w.shape
    return w.reshape(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(0, 2, 1, 3).reshape(
        dim1, dim2)


def to_bf16_bits(array):
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write_safetensors(path, tensors, dtype="F32"):
    """Writes {name: float32 array} as one safetensors file (F32 or BF16, data 8-byte aligned)."""
    element = 4 if dtype == "F32" else 2
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, array in tensors.items():
        size = array.size * element
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # the spec allows trailing spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for array in tensors.values():
            data = (np.ascontiguousarray(array, dtype="<f4") if dtype == "F32"
                    else to_bf16_bits(array).astype("<u2"))
            f.write(data.tobytes())


def convert(source, out_dir, layout, dtype="F32"):
    header, arrays = read_llama2c(source)
    theta = 10000.0
    check_rope_table(header, arrays, theta)
    n_heads, n_kv_heads = header["n_heads"], header["n_kv_heads"]

    tensors = {"model.embed_tokens.weight": arrays["token_embedding"]}
    for layer in range(header["n_layers"]):
        p = f"model.layers.{layer}."
        wq, wk = arrays["wq"][layer], arrays["wk"][layer]
        if layout == "hf":
            wq = permute_to_rotate_half(wq, n_heads)
            wk = permute_to_rotate_half(wk, n_kv_heads)
        tensors[p + "input_layernorm.weight"] = arrays["rms_att"][layer]
        tensors[p + "self_attn.q_proj.weight"] = wq
        tensors[p + "self_attn.k_proj.weight"] = wk
        tensors[p + "self_attn.v_proj.weight"] = arrays["wv"][layer]
        tensors[p + "self_attn.o_proj.weight"] = arrays["wo"][layer]
        tensors[p + "post_attention_layernorm.weight"] = arrays["rms_ffn"][layer]
        tensors[p + "mlp.gate_proj.weight"] = arrays["w1"][layer]
        tensors[p + "mlp.down_proj.weight"] = arrays["w2"][layer]
        tensors[p + "mlp.up_proj.weight"] = arrays["w3"][layer]
    tensors["model.norm.weight"] = arrays["rms_final"]
    if not header["shared_classifier"]:
        tensors["lm_head.weight"] = arrays["wcls"]

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": header["vocab_size"],
        "hidden_size": header["dim"],
        "intermediate_size": header["hidden_dim"],
        "num_hidden_layers": header["n_layers"],
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": theta,
        "max_position_embeddings": header["seq_len"],
        "tie_word_embeddings": header["shared_classifier"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32" if dtype == "F32" else "bfloat16",
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, dtype)


def read_llama2c_tokenizer(path, vocab_size):
    """Returns [(piece, score)] in id order, pieces in SentencePiece form ("▁" for spaces)."""
    with open(path, "rb") as f:
        blob = f.read()
    offset = 4  # max_token_length, unused
    pieces = []
    for token_id in range(vocab_size):
        if offset + 8 > len(blob):
            raise ValueError(f"{path}: ends after {token_id} of {vocab_size} tokens")
        score, length = struct.unpack("<fi", blob[offset:offset + 8])
        offset += 8
        text = blob[offset:offset + length].decode("utf-8")
        offset += length
        if text == "\n<s>\n":
            text = "<s>"
        elif text == "\n</s>\n":
            text = "</s>"
        pieces.append((text.replace(" ", "\u2581"), score))
    if offset != len(blob):
        raise ValueError(f"{path}: {len(blob) - offset} bytes left after {vocab_size} tokens")
    return pieces


def tokenizer_json(pieces):
    """The Llama 2 tokenizer.json layout around these SentencePiece BPE pieces."""
    vocab = {piece: token_id for token_id, (piece, _) in enumerate(pieces)}
    # Merges as transformers' SentencePieceExtractor builds them: every split of a piece into two
    # pieces of the vocabulary, ordered by the merged piece's score (then by the halves' ids).
    merges = []
    for token_id, (piece, score) in enumerate(pieces):
        if piece in ("<unk>", "<s>", "</s>") or piece.startswith("<0x"):
            continue
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda merge: (vocab[merge[0]], vocab[merge[1]]))
        merges.extend(local)
    merges.sort(key=lambda merge: merge[2], reverse=True)
    special = lambda token_id, content: {
        "id": token_id, "content": content, "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": "<unk>",
            "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
            "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
            "merges": [[left, right] for left, right, _ in merges]},
    }


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="llama2.c legacy .bin file")
    parser.add_argument("out_dir", help="directory for config.json and model.safetensors")
    parser.add_argument("--layout", choices=("hf", "meta"), default="hf",
                        help="hf: q/k rows permuted for rotate-half RoPE (default); "
                             "meta: rows kept, for interleaved RoPE")
    parser.add_argument("--tokenizer", help="llama2.c tokenizer .bin: also write tokenizer.json")
    parser.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                        help="stored dtype of the weights (bf16 rounds to nearest even)")
    args = parser.parse_args(argv)
    try:
        convert(args.checkpoint, args.out_dir, args.layout, args.dtype.upper())
        if args.tokenizer:
            with open(os.path.join(args.out_dir, "config.json")) as f:
                vocab_size = json.load(f)["vocab_size"]
            pieces = read_llama2c_tokenizer(args.tokenizer, vocab_size)
            with open(os.path.join(args.out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(tokenizer_json(pieces), f, ensure_ascii=False, indent=1)
                f.write("\n")
    except (OSError, ValueError) as error:
        print(f"convert_llama2c: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
