#!/usr/bin/env python3
"""Writes the fuzz harnesses' seed corpus into tests/fuzz/corpus/<harness>/ (Python standard
library only; run it again after changing it, and commit what it writes).

Each harness gets well-formed inputs that reach deep into its reader, and the hostile shapes the
hardening work fixed: deep nesting, many header entries, sizes whose products overflow, huge ids,
catastrophic regexes, files that end early, templates that loop, double strings or recurse without
end. The chat templates of ../shared/tokenizers are included when that directory is there. The
inputs stay small (the largest is about 120 KB) so that the corpus replays in seconds in every
sanitizer pass; tools/run-fuzzers.sh raises libFuzzer's maximum input length above the largest of
them.
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def write(harness, name, data):
    directory = os.path.join(CORPUS, harness)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(directory, name), "wb") as out:
        out.write(data)


def deep_array(depth):
    return "[" * depth + "]" * depth


def deep_object(depth):
    return '{"a":' * depth + "1" + "}" * depth


# ---- safetensors -----------------------------------------------------------------------------


def safetensors(header, data=b"", pad=True):
    text = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_corpus():
    f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
    bf16 = struct.pack("<4H", 0x3F80, 0xC000, 0x3F00, 0x4050)
    write("fuzz_safetensors", "good",
          safetensors({"__metadata__": {"format": "pt"},
                       "a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                       "b.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]},
                       "c": {"dtype": "F16", "shape": [0], "data_offsets": [24, 24]}},
                      f32 + bf16))
    write("fuzz_safetensors", "unaligned",
          safetensors({"x": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 6,
                      pad=False))
    write("fuzz_safetensors", "overlap",
          safetensors({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
    write("fuzz_safetensors", "shape-overflow",
          safetensors({"x": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 0]}}))
    write("fuzz_safetensors", "offset-past-end",
          safetensors({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8))
    write("fuzz_safetensors", "header-length-huge", struct.pack("<Q", 2**63) + b"{}")
    write("fuzz_safetensors", "truncated", struct.pack("<Q", 100) + b'{"x": {"dtype"')
    write("fuzz_safetensors", "deep-nesting", safetensors(deep_array(20000).encode()))
    write("fuzz_safetensors", "deep-metadata",
          safetensors(('{"__metadata__":' + deep_object(5000) + "}").encode()))
    many = {"t%05d" % i: {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(2000)}
    write("fuzz_safetensors", "many-entries", safetensors(many))
    write("fuzz_safetensors", "duplicate-key",
          safetensors(b'{"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
                      b'"x":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}'))


# ---- GGUF ------------------------------------------------------------------------------------

GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8


def gguf_string(text):
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def gguf_value(kind, value):
    if kind == GGUF_UINT32:
        return struct.pack("<I", value)
    if kind == GGUF_INT32:
        return struct.pack("<i", value)
    if kind == GGUF_FLOAT32:
        return struct.pack("<f", value)
    if kind == GGUF_BOOL:
        return struct.pack("<?", value)
    if kind == GGUF_STRING:
        return gguf_string(value)
    item_kind, items = value
    return struct.pack("<IQ", item_kind, len(items)) + b"".join(gguf_value(item_kind, v) for v in items)


def gguf(metadata, tensors, version=3, alignment=32):
    """metadata: [(key, kind, value)]; tensors: [(name, dims innermost first, ggml type, bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(metadata))
    for key, kind, value in metadata:
        out += gguf_string(key) + struct.pack("<I", kind) + gguf_value(kind, value)
    offset = 0
    data = b""
    for name, dims, kind, payload in tensors:
        out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, offset)
        padded = payload + b"\0" * (-len(payload) % alignment)
        data += padded
        offset += len(padded)
    out += b"\0" * (-len(out) % alignment)
    return out + data


def tiny_llama_gguf():
    dim, hidden, vocab = 8, 16, 6
    tokens = ["<unk>", "<s>", "</s>", "\u2581a", "b", "<0x41>"]
    metadata = [
        ("general.architecture", GGUF_STRING, "llama"),
        ("llama.context_length", GGUF_UINT32, 64),
        ("llama.embedding_length", GGUF_UINT32, dim),
        ("llama.block_count", GGUF_UINT32, 1),
        ("llama.feed_forward_length", GGUF_UINT32, hidden),
        ("llama.attention.head_count", GGUF_UINT32, 2),
        ("llama.attention.head_count_kv", GGUF_UINT32, 1),
        ("llama.attention.layer_norm_rms_epsilon", GGUF_FLOAT32, 1e-5),
        ("llama.rope.freq_base", GGUF_FLOAT32, 10000.0),
        ("tokenizer.ggml.model", GGUF_STRING, "llama"),
        ("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, tokens)),
        ("tokenizer.ggml.scores", GGUF_ARRAY, (GGUF_FLOAT32, [0.0, 0.0, 0.0, -1.0, -2.0, 0.0])),
        ("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_INT32, [2, 3, 3, 1, 1, 6])),
        ("tokenizer.ggml.bos_token_id", GGUF_UINT32, 1),
        ("tokenizer.ggml.eos_token_id", GGUF_UINT32, 2),
    ]

    def f32(count, seed):
        return struct.pack("<%df" % count, *[((i * 7 + seed) % 11 - 5) / 8.0 for i in range(count)])

    def q8_0(rows, columns):  # blocks of 32: an f16 scale and 32 int8 values
        block = struct.pack("<e", 0.125) + bytes((i * 5) % 256 for i in range(32))
        return block * (rows * columns // 32)

    def q4_0(rows, columns):  # blocks of 32: an f16 scale and 16 bytes of nibbles
        block = struct.pack("<e", 0.25) + bytes((i * 37) % 256 for i in range(16))
        return block * (rows * columns // 32)

    kv = dim // 2
    tensors = [
        ("token_embd.weight", [dim, vocab], GGML_F32, f32(dim * vocab, 1)),
        ("output_norm.weight", [dim], GGML_F32, f32(dim, 2)),
        ("blk.0.attn_norm.weight", [dim], GGML_F32, f32(dim, 3)),
        ("blk.0.ffn_norm.weight", [dim], GGML_F32, f32(dim, 4)),
        ("blk.0.attn_q.weight", [dim, dim], GGML_F16, struct.pack("<%de" % (dim * dim), *[0.01 * i for i in range(dim * dim)])),
        ("blk.0.attn_k.weight", [dim, kv], GGML_F32, f32(dim * kv, 5)),
        ("blk.0.attn_v.weight", [dim, kv], GGML_F32, f32(dim * kv, 6)),
        ("blk.0.attn_output.weight", [dim, dim], GGML_F32, f32(dim * dim, 7)),
        ("blk.0.ffn_gate.weight", [32, hidden], GGML_Q8_0, q8_0(hidden, 32)),
        ("blk.0.ffn_up.weight", [32, hidden], GGML_Q4_0, q4_0(hidden, 32)),
        ("blk.0.ffn_down.weight", [hidden, dim], GGML_F32, f32(hidden * dim, 8)),
    ]
    return metadata, tensors


def gguf_corpus():
    metadata, tensors = tiny_llama_gguf()
    write("fuzz_gguf", "tiny-llama", gguf(metadata, tensors))
    write("fuzz_gguf", "no-tensors", gguf(metadata, []))
    write("fuzz_gguf", "version-2", gguf(metadata[:3], tensors[:1], version=2))
    good = gguf(metadata, tensors)
    write("fuzz_gguf", "truncated", good[: len(good) // 2])
    write("fuzz_gguf", "huge-counts", b"GGUF" + struct.pack("<IQQ", 3, 2**62, 2**62))
    write("fuzz_gguf", "huge-string", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**60))
    nested = (GGUF_ARRAY, [(GGUF_UINT32, [1, 2])] * 3)
    write("fuzz_gguf", "array-of-arrays", gguf([("x", GGUF_ARRAY, nested)], []))
    overflow = [("t", [2**40, 2**40], GGML_F32, b"")]
    write("fuzz_gguf", "dims-overflow", gguf(metadata, overflow))
    # Empty, but its first two extents overflow an int64 element count (a fuzzer's finding).
    hidden = [("t", [65472, 273778395316224, 0], GGML_F32, b"")]
    write("fuzz_gguf", "dims-overflow-before-zero", gguf(metadata, hidden))
    write("fuzz_gguf", "bad-alignment",
          gguf(metadata + [("general.alignment", GGUF_UINT32, 3)], tensors[:1]))


# ---- config.json -----------------------------------------------------------------------------


def config_corpus():
    llama = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": [2, 3], "torch_dtype": "bfloat16",
    }
    write("fuzz_model_config", "llama", json.dumps(llama, indent=1))
    scaled = dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 128})
    write("fuzz_model_config", "llama3-rope", json.dumps(scaled))
    write("fuzz_model_config", "qwen2", json.dumps(dict(llama, architectures=["Qwen2ForCausalLM"],
                                                         model_type="qwen2", head_dim=16)))
    write("fuzz_model_config", "mistral", json.dumps(dict(llama, architectures=["MistralForCausalLM"],
                                                           model_type="mistral", sliding_window=None)))
    write("fuzz_model_config", "heads-overflow",
          json.dumps(dict(llama, num_attention_heads=2**62 + 64, head_dim=4)))
    write("fuzz_model_config", "zero-heads", json.dumps(dict(llama, num_attention_heads=0)))
    write("fuzz_model_config", "negative-layers", json.dumps(dict(llama, num_hidden_layers=-1)))
    write("fuzz_model_config", "float-sizes", json.dumps(dict(llama, hidden_size=64.5)))
    write("fuzz_model_config", "deep-nesting", deep_array(20000))
    write("fuzz_model_config", "deep-value",
          json.dumps(llama)[:-1] + ', "rope_scaling": ' + deep_object(5000) + "}")
    write("fuzz_model_config", "huge-numbers", json.dumps(dict(llama, vocab_size=10**30, rope_theta=1e308)))
    # Found by fuzzing: a head_dim within the dimension limit sized RoPE's table at 3.8 GB.
    write("fuzz_model_config", "huge-head-dim", json.dumps(dict(llama, head_dim=1888888888)))
    # quantization_config module lists: names, suffixes and compressed-tensors' "re:" patterns,
    # one that would backtrack without end and one that does not compile.
    compressed = {"quant_method": "compressed-tensors", "format": "float-quantized",
                  "config_groups": {"group_0": {"targets": ["Linear"],
                                                "weights": {"num_bits": 8, "type": "float",
                                                            "strategy": "channel"}}}}
    for name, ignore in [("ignore-names", ["lm_head", "self_attn.q_proj"]),
                         ("ignore-patterns", ["re:.*lm_head", "re:model\\.layers\\.[0-9]+\\.mlp\\..*"]),
                         ("ignore-backtracking", ["re:(.*)*x$", "re:(a|a)*b", "re:((.+)+)+y"]),
                         ("ignore-bad-pattern", ["re:[", "re:(?<", "re:\\"])]:
        write("fuzz_model_config", name,
              json.dumps(dict(llama, quantization_config=dict(compressed, ignore=ignore))))
    write("fuzz_model_config", "fp8-not-convert",
          json.dumps(dict(llama, quantization_config={
              "quant_method": "fp8", "activation_scheme": "dynamic",
              "modules_to_not_convert": ["lm_head", "re:.*gate.*"]})))


# ---- tokenizer.json --------------------------------------------------------------------------


def byte_level_bpe():
    # GPT-2's byte-to-unicode table, so that the vocabulary covers every byte.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    vocab = {table[b]: b for b in range(256)}
    merges = []
    for pair in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w"), ("o", "r"),
                 ("\u0120w", "or"), ("l", "d"), ("\u0120wor", "ld")]:
        merges.append(" ".join(pair))
        vocab["".join(pair)] = len(vocab)
    return {
        "version": "1.0",
        "added_tokens": [
            {"id": len(vocab), "content": "<|begin|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
            {"id": len(vocab) + 1, "content": "<|end|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True},
        ],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [len(vocab)],
                                                            "tokens": ["<|begin|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


def sentencepiece_bpe():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece in ["\u2581", "\u2581t", "he", "\u2581the", "\u2581a", "n", "d", "nd", "\u2581and", "\u00e9"]:
        vocab.setdefault(piece, len(vocab))
    for c in "abcdefghijklmnopqrstuvwxyz.,!?":
        vocab.setdefault(c, len(vocab))
    return {
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True, "normalized": False},
                         {"id": 1, "content": "<s>", "special": True, "normalized": False},
                         {"id": 2, "content": "</s>", "special": True, "normalized": False}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                  "vocab": vocab, "merges": [["\u2581", "t"], ["h", "e"], ["\u2581t", "he"],
                                             ["\u2581", "a"], ["n", "d"], ["\u2581a", "nd"]]},
    }


def tokenizer_corpus():
    texts = ["", "hello world", "Hello, World! 123456 <|begin|>x<|end|>", "caf\u00e9 \u4f60\u597d \U0001F600\n\n\t  ",
             "\xff\xfe invalid? ", "a" * 300]
    for name, document in [("byte-level", byte_level_bpe()), ("sentencepiece", sentencepiece_bpe())]:
        encoded = json.dumps(document, ensure_ascii=False)
        write("fuzz_tokenizer", name, encoded)
        for i, text in enumerate(texts):
            write("fuzz_tokenizer", "%s-text%d" % (name, i), encoded.encode() + b"\0" + text.encode("utf-8", "surrogateescape"))
    # The hostile shapes of the hardening work.
    document = sentencepiece_bpe()
    depth = 3000
    nested = '{"type":"Sequence","normalizers":[' * depth + '{"type":"NFC"}' + "]}" * depth
    text = json.dumps(dict(document, normalizer=None))
    write("fuzz_tokenizer", "deep-normalizer", text.replace('"normalizer": null', '"normalizer": ' + nested, 1))
    huge_id = sentencepiece_bpe()
    huge_id["model"]["vocab"]["zz"] = 50_000_000
    write("fuzz_tokenizer", "huge-id", json.dumps(huge_id))
    negative = sentencepiece_bpe()
    negative["added_tokens"].append({"id": -5, "content": "<neg>", "special": True})
    write("fuzz_tokenizer", "negative-id", json.dumps(negative))
    catastrophic = byte_level_bpe()
    catastrophic["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    write("fuzz_tokenizer", "catastrophic-regex", json.dumps(catastrophic).encode() + b"\0" + b"a" * 40 + b"!")
    write("fuzz_tokenizer", "deep-array", deep_array(20000))
    write("fuzz_tokenizer", "not-an-object", "[1, 2, 3]")


# ---- TOML settings ---------------------------------------------------------------------------


def settings_corpus():
    with open(os.path.join(HERE, "..", "..", "configs", "default.toml"), "rb") as default:
        write("fuzz_settings", "default", default.read())
    write("fuzz_settings", "partial", "[sampling]\ntemperature = 0.7\ntop_p = 0.9\n[runtime]\nthreads = 2\n")
    write("fuzz_settings", "paths", '[model]\ntarget = "pair/target"\ndraft = "../outside"\n')
    write("fuzz_settings", "unknown-key", "[sampling]\ntemprature = 0.7\n")
    write("fuzz_settings", "tiny-top-p", "[sampling]\ntop_p = 1e-50\n")
    write("fuzz_settings", "huge-integers", "[runtime]\nkv_cache_tokens = 9223372036854775807\nmax_batch = -9223372036854775808\n")
    write("fuzz_settings", "deep-array", "x = " + deep_array(5000) + "\n")
    write("fuzz_settings", "deep-inline-table", "x = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n")
    write("fuzz_settings", "dotted-keys", "a" + ".a" * 3000 + " = 1\n")
    write("fuzz_settings", "bad-utf8", b"[sampling]\nseed = 1 # \xff\xfe\n")


# ---- chat templates --------------------------------------------------------------------------

# SmolLM2-135M-Instruct's template (GGUF metadata tokenizer.chat_template), which this script,
# standard library only, cannot read from the GGUF file.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

# A conversation for the harness (after a NUL byte): pieces cut at 0x01, each a selector byte
# (role, content shape) then the text.
CONVERSATION = b"\x01".join([
    b"\x0csystem prompt", b"\x0c  hi \xe4\xbd\xa0\xe5\xa5\xbd\n",
    b"\x0d<think>\nhm\n</think>\n\nok", b"\x04parts", b"\x00", b"\xfdreasoning",
    b"\x0c{{ x }}\xff\xfe"])

KITCHEN_SINK = """{%- set ns = namespace(count=0, roles=[]) -%}
{%- for m in messages if m.role != 'tool' -%}
  {%- set ns.count = ns.count + 1 -%}{%- set ns.roles = ns.roles + [m.role] -%}
  {{- loop.index }}/{{ loop.length }} {{ m.role|upper }}:
  {{- (m.content if m.content is string else m.content|tojson)|trim }}
  {%- if loop.last and not add_generation_prompt %}{{ eos_token }}{% endif %}
{% else %}empty{% endfor -%}
{%- macro show(x, sep=', ') %}{{ x|join(sep) }}{% endmacro -%}
{{ show(ns.roles) }} {{ ns.count is even }}
{{ messages|selectattr('role', 'equalto', 'user')|list|length }}
{{ messages|map(attribute='role')|unique|list }} {{ (messages|first).role }}
{{ messages[::-1][0]['role'] }} {{ [3, 1, 2]|sort|reverse|list }}
{{ {'a': [1, 2.5, none, true], 'b': 'x'}|tojson(indent=2, sort_keys=true) }}
{{ '  a b  '.strip().split(' ') }} {{ 'x</think>y'.split('</think>')[-1].lstrip('\\n') }}
{{ 'abc'[1:] ~ 'Abc'.lower() }}
{%- with a = 7 // 2, b = 2 ** 10 %} {{ a }} {{ b % 7 }} {{ -a }} {{ a / 2 }} {{ 'z' * 3 }}
{%- endwith %}
{%- filter upper %} {{ bos_token }} {{ range(3)|list }} {{ dict(a=1).items()|list }}{% endfilter %}
{%- if messages[0] is defined and messages[0].content is defined %}
  {%- generation %}{{ messages[0].content }}{% endgeneration %}
{%- endif %}
{{ raise_exception('done') if ns.count > 1000 else 'ok' }}"""


def chat_template_corpus():
    tokenizers = os.path.join(HERE, "..", "..", "..", "shared", "tokenizers")
    templates = {"smollm2": SMOLLM2_TEMPLATE, "kitchen-sink": KITCHEN_SINK}
    # The real templates from ../shared/tokenizers, when it is there.
    for name in ["llama3", "llama3_1", "gemma3", "qwen3", "deepseek_v3"]:
        path = os.path.join(tokenizers, name, "tokenizer_config.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as config:
                templates[name] = json.load(config)["chat_template"]
    for name, source in templates.items():
        write("fuzz_chat_template", name, source)
        write("fuzz_chat_template", name + "-conversation", source.encode() + b"\0" + CONVERSATION)
    # Deep nesting of blocks and of expressions, past the bounds and just within them.
    write("fuzz_chat_template", "deep-blocks", "{% if true %}" * 70 + "x" + "{% endif %}" * 70)
    write("fuzz_chat_template", "deep-blocks-within", "{% for i in [1] %}" * 60 + "{{ i }}" +
          "{% endfor %}" * 60)
    write("fuzz_chat_template", "deep-parentheses", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")
    write("fuzz_chat_template", "deep-lists", "{{ " + "[" * 300 + "]" * 300 + " }}")
    write("fuzz_chat_template", "long-chain", "{{ 0" + " + 1" * 300 + " }}")
    write("fuzz_chat_template", "many-nots", "{{ " + "not " * 3000 + "x }}")
    write("fuzz_chat_template", "deep-value",
          "{% set ns = namespace(v=[]) %}{% for i in range(100) %}{% set ns.v = [ns.v] %}"
          "{% endfor %}{{ ns.v }}")
    # Work without end: huge loops, strings that double, recursion.
    write("fuzz_chat_template", "huge-loops",
          "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}")
    write("fuzz_chat_template", "huge-string", "{{ 'x' * 100000000 }}")
    write("fuzz_chat_template", "doubling",
          "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
          "{% endfor %}{{ ns.s|length }}")
    write("fuzz_chat_template", "list-doubling",
          "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}"
          "{% endfor %}{{ ns.l|length }}")
    write("fuzz_chat_template", "deep-evaluation",
          "{% macro f(n) %}{{ " + "[" * 120 + "f(n + 1)" + "]" * 120 + " }}{% endmacro %}{{ f(0) }}")
    write("fuzz_chat_template", "macro-recursion",
          "{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 2) }}{% endmacro %}{{ f(0) }}")
    write("fuzz_chat_template", "range-too-big",
          "{{ range(-9223372036854775807, 9223372036854775807)|list }}")
    # Tags that never end.
    for index, source in enumerate(["{{ messages", "{% if true", "{# comment", "{% raw %}x",
                                    "{{ 'string", "{% for m in messages %}{{ m }}",
                                    "{% if x %}{% else %}{% elif %}", "{{ (1 }}", "{{ {'a': 1 }}",
                                    "{%- set x %}", "{% macro m( %}", "{{ x|", "{{ x is }}"]):
        write("fuzz_chat_template", "unterminated-%d" % index, source)


# ---- OpenAI request bodies ----------------------------------------------------------------------


def openai_request_corpus():
    # The first byte picks the endpoint: even for /v1/completions, odd for /v1/chat/completions.
    def request(name, endpoint, body):
        text = body if isinstance(body, str) else json.dumps(body)
        write("fuzz_openai_request", name, bytes([endpoint]) + text.encode("utf-8"))

    request("completion", 0, {"model": "model", "prompt": "def fib(n):", "max_tokens": 16,
                              "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                              "seed": 7, "stop": ["\n\n", "END"], "stream": True,
                              "stream_options": {"include_usage": True},
                              "speculative": {"method": "draft", "gamma": 4,
                                              "controller": "fixed"}})
    request("token-ids", 0, {"model": "model", "prompt": [[1, 2, 3]], "n": 1})
    request("chat", 1, {"model": "model", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}], "max_completion_tokens": 8})
    request("unsupported", 0, {"model": "model", "prompt": "x", "logprobs": 3, "tools": [{}]})
    request("wrong-types", 1, {"model": 5, "messages": "hi", "stop": [1], "seed": 1.5})
    request("deep-nesting", 0, deep_array(20000))
    request("huge-numbers", 0, '{"model": "model", "prompt": "x", "max_tokens": 1e400, '
                               '"seed": 99999999999999999999999}')
    request("many-stops", 0, {"model": "model", "prompt": "abcabc" * 100,
                              "stop": ["abc" * i for i in range(1, 17)]})
    request("truncated", 1, '{"model": "model", "messages": [{"role": "us')


# ---- raw HTTP connections ------------------------------------------------------------------------


def http_corpus():
    def write_http(name, text):
        write("fuzz_http_request", name, text.encode("latin-1") if isinstance(text, str) else text)

    def post(path, body, extra=""):
        return ("POST %s HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n%s"
                "Content-Length: %d\r\n\r\n%s" % (path, extra, len(body), body))

    def chunked(path, body, piece):
        framed = "".join("%x\r\n%s\r\n" % (len(body[i:i + piece]), body[i:i + piece])
                         for i in range(0, len(body), piece))
        return ("POST %s HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n" % (path, framed))

    completion = json.dumps({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2})
    chat = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    health = "GET /health HTTP/1.1\r\nHost: fuzz\r\n\r\n"
    write_http("health", health)
    write_http("models", "GET /v1/models HTTP/1.1\r\nHost: fuzz\r\n\r\n")
    write_http("metrics", "GET /metrics HTTP/1.1\r\nHost: fuzz\r\n\r\n")
    write_http("completion", post("/v1/completions", completion))
    write_http("completion-stream", post("/v1/completions", json.dumps(
        {"model": "tiny", "prompt": [5, 6], "max_tokens": 3, "stream": True})))
    write_http("chat-no-tokenizer", post("/v1/chat/completions", chat))
    write_http("chunked", chunked("/v1/completions", completion, 7))
    write_http("chunked-one-byte", chunked("/v1/completions", completion, 1))
    write_http("chunked-extension",
               "POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\nTransfer-Encoding: chunked\r\n\r\n"
               "5;name=value\r\n{\"a\":\r\n0\r\nTrailer: x\r\n\r\n")
    write_http("chunked-huge-size", "POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\n"
               "Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nxx\r\n0\r\n\r\n")
    write_http("chunked-bad-size", "POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\n"
               "Transfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n")
    write_http("chunked-past-limit", chunked("/v1/completions",
                                             completion[:-1] + " " * 70000 + "}", 4096))
    write_http("chunked-and-length", "POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\n"
               "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
               "2\r\n{}\r\n0\r\n\r\n")
    write_http("length-past-limit", "POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\n"
               "Content-Length: 99999999999\r\n\r\n{")
    write_http("length-negative", "POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\n"
               "Content-Length: -5\r\n\r\n{}")
    write_http("length-short", post("/v1/completions", completion)[:-10])
    write_http("pipelined-gets", health * 3)
    write_http("pipelined-posts", post("/v1/completions", completion) * 2 + health)
    write_http("pipelined-chunked", chunked("/v1/completions", completion, 5) + health)
    write_http("expect-continue", post("/v1/completions", completion, "Expect: 100-continue\r\n"))
    write_http("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)))
    write_http("http09", "GET /health\r\n\r\n")
    write_http("http2-preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    write_http("unknown-method", "BREW /pot HTTP/1.1\r\nHost: fuzz\r\n\r\n")
    write_http("header-no-colon", "GET /health HTTP/1.1\r\nHost fuzz\r\n\r\n")
    write_http("many-headers", "GET /health HTTP/1.1\r\n" +
               "".join("X-%d: %d\r\n" % (i, i) for i in range(500)) + "\r\n")
    write_http("long-header", "GET /health HTTP/1.1\r\nX-Long: " + "a" * 70000 + "\r\n\r\n")
    write_http("long-path", "GET /" + "a" * 70000 + " HTTP/1.1\r\nHost: fuzz\r\n\r\n")
    write_http("unfinished", "POST /v1/completions HTTP/1.1\r\nHost: fu")


def grammar_corpus():
    # The first byte picks GBNF (even) or JSON Schema (odd); after a NUL, bytes choose tokens.
    steps = bytes(range(0, 250, 7)) + b"\xff\xff" + bytes(range(3, 200, 11))
    gbnf = {
        "arithmetic": 'root ::= expr\nexpr ::= term ([-+*/] term)*\nterm ::= [0-9]+ | "(" expr ")"\n',
        "repetition": 'root ::= "a"{2,5} [^"\\\\]* "\\u4f60"? ("x" | "y"){3}\n',
        "classes": 'root ::= [a-zA-Z_] [a-zA-Z0-9_]{0,8} ws "=" ws [0-9]+\nws ::= [ \\t]*\n',
        "left-recursion": "root ::= root \"a\" | \"b\"\n",
        "undefined": "root ::= missing\n",
        "deep-groups": "root ::= " + "(" * 200 + '"a"' + ")" * 200 + "\n",
    }
    for name, text in gbnf.items():
        write("fuzz_grammar", "gbnf-" + name, b"\x00" + text.encode() + b"\0" + steps)
    schemas = {
        "object": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                   "maxItems": 3}}, "required": ["name"]},
        "recursive": {"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [
            {"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["next"]}},
            "$ref": "#/$defs/node"},
        "pattern": {"type": "string", "pattern": "^[a-z]{2,4}-[0-9]+$"},
        "formats": {"type": "array", "prefixItems": [{"type": "string", "format": "date-time"},
                    {"type": "string", "format": "uuid"}]},
        "unsupported": {"type": "object", "not": {}},
    }
    for name, schema in schemas.items():
        write("fuzz_grammar", "schema-" + name, b"\x01" + json.dumps(schema).encode() + b"\0" + steps)
    write("fuzz_grammar", "schema-malformed", b"\x01{\"type\": [\"object\"")


def main():
    safetensors_corpus()
    gguf_corpus()
    config_corpus()
    tokenizer_corpus()
    settings_corpus()
    chat_template_corpus()
    openai_request_corpus()
    http_corpus()
    grammar_corpus()
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(CORPUS) for f in files)
    print("fuzz corpus: %d bytes in %s" % (total, CORPUS), file=sys.stderr)


if __name__ == "__main__":
    main()
