#!/usr/bin/env python3
"""Independent NumPy reference for the Llama-family forward pass.

Written from the Hugging Face modeling semantics (modeling_llama.py, modeling_mistral.py,
modeling_qwen2.py and modeling_rope_utils.py), not from specrun's C++ code, so that the C++
backend can be checked against something that shares none of its code. Everything is computed in
float64: the stored weights (f32, f16 or bf16) widen to float64 exactly, so the only difference
from an exact computation is float64 rounding, far below the float32 errors being measured.

Usage:
    llama_ref.py --model DIR --tokens 1,2,3 --out FILE [--rope-style rotate-half|interleaved]

Writes the logits for every position of the token sequence (one sequence, causal attention,
positions 0..n-1) as raw little-endian float64 [num_tokens, vocab_size] to FILE.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


# --------------------------------------------------------------------------------------------
# safetensors


def read_safetensors(path):
    """Returns {name: float64 array} for every tensor of one safetensors file.

    Layout: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
    {dtype, shape, data_offsets [begin, end)} (offsets relative to the byte after the header),
    an optional "__metadata__" entry, then the data.
    """
    with open(path, "rb") as f:
        blob = f.read()
    (header_len,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        shape = tuple(info["shape"])
        dtype = info["dtype"]
        if dtype == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2")
        elif dtype == "BF16":
            # bfloat16 is the top half of a float32: widen the bits and reinterpret.
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        elif dtype == "F64":
            values = np.frombuffer(raw, dtype="<f8")
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        expected = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if values.size != expected:
            raise ValueError(f"{path}: tensor {name}: {values.size} values for shape {shape}")
        tensors[name] = values.astype(np.float64).reshape(shape)
    return tensors


def load_weights(model_dir):
    """All tensors of the checkpoint: model.safetensors, or the shards an index names."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(os.path.join(model_dir, shard)))
        missing = set(weight_map) - set(tensors)
        if missing:
            raise ValueError(f"index names tensors absent from the shards: {sorted(missing)}")
        return tensors
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


# --------------------------------------------------------------------------------------------
# RoPE


def rope_inv_freq(config, head_dim):
    """Per-pair inverse frequencies, after rope_scaling (HF's ROPE_INIT_FUNCTIONS)."""
    theta = float(config.get("rope_theta", 10000.0))
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling")
    if not scaling:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        # Positions divided by the factor, i.e. every frequency divided by it.
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        # HF _compute_llama3_parameters: long wavelengths are slowed by `factor`, short ones kept,
        # the band between interpolated smoothly.
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context_len = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2.0 * math.pi / inv_freq
        inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor)
        smoothed = (1.0 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(is_medium, smoothed, inv_freq_llama)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r}")


def apply_rope(x, inv_freq, style):
    """Rotates x [tokens, heads, head_dim] at positions 0..tokens-1.

    rotate-half (HF) pairs channel i with i + head_dim/2; interleaved (Meta, GGUF) pairs 2i with
    2i + 1. Pair i turns by angle position * inv_freq[i]:
        out1 = x1 cos - x2 sin,  out2 = x2 cos + x1 sin.
    """
    tokens, _, head_dim = x.shape
    half = head_dim // 2
    angles = np.arange(tokens, dtype=np.float64)[:, None] * inv_freq[None, :]  # [tokens, half]
    cos = np.cos(angles)[:, None, :]
    sin = np.sin(angles)[:, None, :]
    if style == "rotate-half":
        x1, x2 = x[..., :half], x[..., half:]
    elif style == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        raise ValueError(f"unknown rope style {style!r}")
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    out = np.empty_like(x)
    if style == "rotate-half":
        out[..., :half], out[..., half:] = out1, out2
    else:
        out[..., 0::2], out[..., 1::2] = out1, out2
    return out


# --------------------------------------------------------------------------------------------
# the forward pass


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def linear(x, weights, name):
    """y = x W^T + b, with the bias only when the checkpoint has one."""
    y = x @ weights[name + ".weight"].T
    bias = weights.get(name + ".bias")
    if bias is not None:
        y = y + bias
    return y


def silu(x):
    return x / (1.0 + np.exp(-x))


def layer_sliding_window(config, architecture, layer):
    """The attention window of one layer, or None for full causal attention."""
    if architecture == "MistralForCausalLM":
        return config.get("sliding_window")
    if architecture == "Qwen2ForCausalLM" and config.get("use_sliding_window", False):
        # HF Qwen2: layers from max_window_layers on use the sliding window.
        layer_types = config.get("layer_types")
        if layer_types is not None:
            return config.get("sliding_window") if layer_types[layer] == "sliding_attention" \
                else None
        if layer >= config.get("max_window_layers", config["num_hidden_layers"]):
            return config.get("sliding_window")
    return None


def attention_mask(tokens, window):
    """[tokens, tokens] booleans: query p sees key j when j <= p (and p - j < window)."""
    query = np.arange(tokens)[:, None]
    key = np.arange(tokens)[None, :]
    allowed = key <= query
    if window is not None:
        allowed &= (query - key) < window
    return allowed


def forward(config, weights, tokens, rope_style):
    architecture = config["architectures"][0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {architecture!r}")
    hidden = config["hidden_size"]
    num_heads = config["num_attention_heads"]
    num_kv_heads = config.get("num_key_value_heads") or num_heads
    head_dim = config.get("head_dim") or hidden // num_heads
    eps = float(config.get("rms_norm_eps", 1e-6))
    group = num_heads // num_kv_heads
    inv_freq = rope_inv_freq(config, head_dim)
    n = len(tokens)

    x = weights["model.embed_tokens.weight"][np.asarray(tokens, dtype=np.int64)]  # [n, hidden]
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"], eps)
        q = linear(h, weights, p + "self_attn.q_proj").reshape(n, num_heads, head_dim)
        k = linear(h, weights, p + "self_attn.k_proj").reshape(n, num_kv_heads, head_dim)
        v = linear(h, weights, p + "self_attn.v_proj").reshape(n, num_kv_heads, head_dim)
        q = apply_rope(q, inv_freq, rope_style)
        k = apply_rope(k, inv_freq, rope_style)
        # GQA: query head hd reads key/value head hd // group (HF repeat_kv).
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
        mask = attention_mask(n, layer_sliding_window(config, architecture, layer))
        scores = np.where(mask[None, :, :], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, num_heads * head_dim)
        x = x + linear(attn, weights, p + "self_attn.o_proj")

        h = rms_norm(x, weights[p + "post_attention_layernorm.weight"], eps)
        gate = linear(h, weights, p + "mlp.gate_proj")
        up = linear(h, weights, p + "mlp.up_proj")
        x = x + linear(silu(gate) * up, weights, p + "mlp.down_proj")

    x = rms_norm(x, weights["model.norm.weight"], eps)
    if config.get("tie_word_embeddings", False):
        # HF ties the parameters: the embedding is the classifier even if lm_head was saved.
        head = weights["model.embed_tokens.weight"]
    else:
        head = weights["lm_head.weight"]
    return x @ head.T  # [n, vocab]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="directory with config.json and weights")
    parser.add_argument("--tokens", required=True, help="comma-separated token ids")
    parser.add_argument("--out", required=True, help="output file: float64 [tokens, vocab]")
    parser.add_argument("--rope-style", default="rotate-half",
                        choices=("rotate-half", "interleaved"))
    args = parser.parse_args(argv)

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    if not tokens:
        parser.error("--tokens is empty")
    weights = load_weights(args.model)
    vocab = weights["model.embed_tokens.weight"].shape[0]
    if any(t < 0 or t >= vocab for t in tokens):
        parser.error(f"token id out of range [0, {vocab})")
    logits = forward(config, weights, tokens, args.rope_style)
    logits.astype("<f8").tofile(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
