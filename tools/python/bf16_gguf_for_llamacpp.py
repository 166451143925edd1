#!/usr/bin/env python3
"""Writes a generated bf16 Llama checkpoint (specrun-genmodel's config.json and model.safetensors)
as a BF16 GGUF that llama.cpp loads, so that llama-bench measures the same weights specbench does
(bench/README.md, "The CPU backend"). Its vocabulary is placeholder tokens of the model's size:
llama-bench measures speed, not text. q and k rows are interleaved for GGUF's RoPE pairing, as
llama.cpp's own converter does.

Usage: bf16_gguf_for_llamacpp.py CHECKPOINT_DIR OUT.gguf   (the venv of setup-python.sh gguf)
"""
import json
import struct
import sys

import gguf
import numpy as np


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, out = sys.argv[1], sys.argv[2]
    config = json.load(open(f"{source}/config.json"))
    raw = open(f"{source}/model.safetensors", "rb").read()
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_size])

    def bits(name):  # a bf16 tensor as its uint16 bits (NumPy has no bf16)
        entry = header[name]
        if entry["dtype"] != "BF16":
            sys.exit(f"{name} is {entry['dtype']}, not BF16")
        begin, end = entry["data_offsets"]
        data = raw[8 + header_size + begin:8 + header_size + end]
        return np.frombuffer(data, np.uint16).reshape(entry["shape"])

    def interleave(weight, heads):  # rotate-half rows -> interleaved pairs, per head
        rows, columns = weight.shape
        return weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2).reshape(
            rows, columns)

    writer = gguf.GGUFWriter(out, "llama")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    vocab = config["vocab_size"]
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>".encode() for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([3, 3, 3] + [1] * (vocab - 3))  # unk, bos, eos are control tokens
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def matrix(name, weight):
        writer.add_tensor(name, np.ascontiguousarray(weight), raw_shape=weight.shape,
                          raw_dtype=gguf.GGMLQuantizationType.BF16)

    def norm(name, weight):  # GGUF norms are f32
        writer.add_tensor(name, (weight.astype(np.uint32) << 16).view(np.float32))

    matrix("token_embd.weight", bits("model.embed_tokens.weight"))
    norm("output_norm.weight", bits("model.norm.weight"))
    if "lm_head.weight" in header:
        matrix("output.weight", bits("lm_head.weight"))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norm(f"blk.{i}.attn_norm.weight", bits(p + "input_layernorm.weight"))
        norm(f"blk.{i}.ffn_norm.weight", bits(p + "post_attention_layernorm.weight"))
        matrix(f"blk.{i}.attn_q.weight", interleave(bits(p + "self_attn.q_proj.weight"), heads))
        matrix(f"blk.{i}.attn_k.weight", interleave(bits(p + "self_attn.k_proj.weight"), kv_heads))
        matrix(f"blk.{i}.attn_v.weight", bits(p + "self_attn.v_proj.weight"))
        matrix(f"blk.{i}.attn_output.weight", bits(p + "self_attn.o_proj.weight"))
        matrix(f"blk.{i}.ffn_gate.weight", bits(p + "mlp.gate_proj.weight"))
        matrix(f"blk.{i}.ffn_up.weight", bits(p + "mlp.up_proj.weight"))
        matrix(f"blk.{i}.ffn_down.weight", bits(p + "mlp.down_proj.weight"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
