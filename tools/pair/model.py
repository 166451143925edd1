"""A Llama decoder in plain PyTorch, with exactly Hugging Face LlamaForCausalLM's arithmetic and
parameter names, and its export to the Hugging Face layout (config.json, model.safetensors).
"""

import json
import math
import struct

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config["num_attention_heads"]
        self.kv_heads = config["num_key_value_heads"]
        self.head_dim = config["hidden_size"] // self.heads
        hidden = config["hidden_size"]
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        batch, length, _ = x.shape  # [batch, length, hidden]
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # [batch, heads, length, head_dim]
        k = k * cos + rotate_half(k) * sin
        repeat = self.heads // self.kv_heads
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        # Scaling q rather than the scores, and masking with a boolean, keeps the
        # [batch, heads, length, length] tensors to one write each.
        scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-1, -2)
        weights = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, inner = config["hidden_size"], config["intermediate_size"]
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        eps = config["rms_norm_eps"]
        self.input_layernorm = RMSNorm(config["hidden_size"], eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(config["num_hidden_layers"]))
        self.norm = RMSNorm(config["hidden_size"], config["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = Body(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        if config["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init)
        # Residual projections scaled down with depth, as GPT-2 does.
        scale = 0.02 / math.sqrt(2 * config["num_hidden_layers"])
        for layer in self.model.layers:
            nn.init.normal_(layer.self_attn.o_proj.weight, std=scale)
            nn.init.normal_(layer.mlp.down_proj.weight, std=scale)
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        inv_freq = 1.0 / (config["rope_theta"] ** (
            torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids):
        """ids [batch, length] -> logits [batch, length, vocab]"""
        length = ids.shape[1]
        positions = torch.arange(length, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)  # [length, head_dim]
        cos, sin = angles.cos(), angles.sin()
        mask = torch.ones(length, length, dtype=torch.bool).triu(1)  # True above the diagonal
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))

    def parameter_count(self):
        return sum(p.numel() for p in self.parameters())


def hf_config(config, tokenizer):
    """config.json as transformers' LlamaConfig writes it."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "rope_scaling": None,
        "torch_dtype": "bfloat16",
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "head_dim": config["hidden_size"] // config["num_attention_heads"],
        **config,
    }


def _bf16_bytes(tensor):
    return tensor.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()


def save_safetensors(model, path):
    """model.safetensors in bf16, with transformers' names (a tied lm_head is not stored)."""
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config["tie_word_embeddings"]:
            continue
        tensors[name] = tensor
    header = {"__metadata__": {"format": "pt"}}
    payloads = []
    offset = 0
    for name in sorted(tensors):
        data = _bf16_bytes(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        payloads.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)))
        stream.write(encoded)
        for data in payloads:
            stream.write(data)


def load_safetensors(model, path):
    """Loads a model.safetensors written by save_safetensors into model (as float32)."""
    with open(path, "rb") as stream:
        size = struct.unpack("<Q", stream.read(8))[0]
        header = json.loads(stream.read(size))
        body = stream.read()
    state = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.int16)
        state[name] = raw.view(torch.bfloat16).float().reshape(entry["shape"])
    if model.config["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state)
