#!/usr/bin/env python3
"""Hugging Face transformers as the reference for specrun's logits, float32 on the CPU.

Four commands:

  hf_reference.py build --case NAME --model DIR
      Writes a small random model of one of the CASES below with save_pretrained: config.json
      as transformers writes it and model.safetensors in the case's dtype.

  hf_reference.py run --model DIR [--gguf-file FILE] --prompts FILE --out PREFIX
      Loads DIR with AutoModelForCausalLM.from_pretrained(DIR, dtype=float32) (with gguf_file when
      given: a GGUF model, dequantized to float32 by transformers), and for each prompt (one line
      of comma-separated token ids in FILE) decodes --new-tokens tokens greedily through the
      model's KV cache.

      Writes PREFIX.json, {"vocab_size", "torch", "transformers", "prompts": [{"tokens",
      "continuation", "row_offset"}]}, and PREFIX.bin, little-endian float32 logits: for each
      prompt, len(tokens) + len(continuation) rows of vocab_size, row i being the logits after
      token i of tokens + continuation. Row len(tokens) - 1 + j chose continuation[j].

      --bf16-weights-out PREFIX2 then, from the same load (a GGUF file's takes transformers
      longer than the decoding), rounds every matrix (every parameter of two or more dimensions)
      to bfloat16, to nearest even, and writes the same reference computed in float32 again to
      PREFIX2.json and PREFIX2.bin; of a GGUF file, only the matrices specrun widens to bf16 at
      load (the types it does not multiply as stored: Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), so that
      PREFIX2 holds the weight values specrun runs on with f32 activations (its Q4_0, Q4_1 and
      Q8_0 blocks widened to their f32 values, the norms F32 as stored). Against the plain
      reference it measures what that rounding alone does; against specrun it leaves only the
      arithmetic to compare.

  hf_reference.py tokenize --model DIR --gguf-file FILE --input IN.json --out OUT.json
      The tokenizer transformers builds from the GGUF file's metadata itself
      (AutoTokenizer.from_pretrained(DIR, gguf_file=FILE)). IN.json is {"texts": [...], "ids":
      [[...], ...]}; OUT.json holds, for each text, its ids with and without special tokens
      ("encode_special", "encode") and the decoding of the former with special tokens kept and
      skipped ("decode", "decode_skip"); and for each list of "ids", its decodings the same two
      ways ("ids_decode", "ids_decode_skip"). When the file's `tokenizer.ggml.pre` is one that
      transformers' converter does not know (LLAMA_CPP_DIGIT_SPLIT), also the ids with
      llama.cpp's pre-tokenization of it put in ("encode_llama_cpp", "encode_special_llama_cpp";
      see there), "pre" naming it.

  hf_reference.py cases --out DIR [--case NAME ...]
      For each case (default: all), writes the model to DIR/NAME and its reference, on prompts
      drawn here, to DIR/NAME.json and DIR/NAME.bin, in one start-up of torch; then DIR/status.txt
      says "ok". Without torch or transformers it writes the reason to DIR/status.txt instead and
      exits 0, so that the tests reading DIR skip with that line.
"""

import argparse
import json
import math
import os
import sys

try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    IMPORT_ERROR = None
except ImportError as error:
    IMPORT_ERROR = (f"Hugging Face transformers is not installed ({error}); "
                    "tools/setup-python.sh transformers installs it")

# Small models of the families specrun loads, each in bf16 and in f32. Positions reach the longest
# prompt plus the continuation (under 128), far below max_position_embeddings.
_COMMON = dict(bos_token_id=1, eos_token_id=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
               hidden_act="silu")
_FAMILIES = {
    # Grouped-query attention (6 query heads on 2 KV heads), untied output projection, 3 layers.
    "llama_gqa": ("Llama", dict(
        vocab_size=384, hidden_size=96, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)),
    # The embedding is the output projection.
    "llama_tied": ("Llama", dict(
        vocab_size=320, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True)),
    # Llama 3.1's band-wise RoPE scaling with a 32-position original context: with head_dim 32 and
    # theta 500000, pair 0 keeps its frequency, pair 1 is interpolated and pairs 2-15 are slowed
    # eightfold, turning far enough over ~100 positions to matter.
    "llama3_rope_scaling": ("Llama", dict(
        vocab_size=300, hidden_size=128, intermediate_size=320, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=32))),
    # A window of 8 positions, shorter than every prompt.
    "mistral_sliding_window": ("Mistral", dict(
        vocab_size=288, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
        tie_word_embeddings=False)),
    # Bias on q, k and v (Qwen2 always has it), theta 1e6.
    "qwen2_qkv_bias": ("Qwen2", dict(
        vocab_size=352, hidden_size=128, intermediate_size=288, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
        use_sliding_window=False, rope_parameters=dict(rope_type="default",
                                                       rope_theta=1000000.0))),
    # Qwen3: every head of q and k RMS-normalised with its own gains before RoPE; heads wider
    # than hidden / heads (4 x 32 = 128 query channels on a 96-wide model), as Qwen3's are.
    "qwen3_qk_norm": ("Qwen3", dict(
        vocab_size=336, hidden_size=96, intermediate_size=224, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
        attention_bias=False, use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen3 with tied embeddings, as its smaller models ship, and one KV head.
    "qwen3_tied": ("Qwen3", dict(
        vocab_size=304, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
        attention_bias=False, use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Gemma 3: local layers (a window of 8, RoPE base 1e4) around a global one (base 1e5, scaled
    # linearly by 4), q/k norms, norms on the attention's and the MLP's outputs, gains 1 + w,
    # GELU-tanh, embeddings times sqrt(hidden), a query scale of 24^-0.5 rather than 32^-0.5,
    # heads wider than hidden / heads, tied embeddings.
    "gemma3_local_global": ("Gemma3", dict(
        vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
        sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
        rope_parameters=dict(
            full_attention=dict(rope_type="linear", factor=4.0, rope_theta=100000.0),
            sliding_attention=dict(rope_type="default", rope_theta=10000.0)))),
    # Gemma 3 as its 4B and larger models ship (Gemma3ForConditionalGeneration): the text model of
    # gemma3_local_global's kind in text_config, its weights under language_model.model. beside a
    # small SigLIP vision tower and projector, which text alone never runs.
    "gemma3_multimodal": ("Gemma3Multimodal", dict(
        vocab_size=336, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
        rope_parameters=dict(
            full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
            sliding_attention=dict(rope_type="default", rope_theta=10000.0)))),
}
_DTYPES = ("bf16", "f32")
CASES = [f"{family}_{dtype}" for family in _FAMILIES for dtype in _DTYPES]
# Prompt lengths: all longer than the sliding window, the longest plus the continuation still far
# inside every model's context.
_PROMPT_LENGTHS = (9, 16, 27, 45)


def _initialize(model, config, seed):
    """Weights of a trained model's scale, not transformers' init (normal, std 0.02), whose
    logits are nearly flat (every top-2 margin tiny, greedy decoding then meaningless).

    Projections: normal with std 1/sqrt(fan_in), so each keeps its input's scale and attention
    scores are of order one (attention is neither uniform nor one-hot). Norm gains 1 +- 0.1
    (Gemma stores a gain's offset from one: 0 +- 0.1), biases std 0.3 (large enough that
    dropping them changes the logits). The output projection has std 3/sqrt(hidden): logits have
    a spread of ~3 and a peaked top, as trained models do. A tied embedding is the output
    projection, so it takes that scale too.
    """
    generator = torch.Generator().manual_seed(seed)
    text = config.get_text_config()
    hidden = text.hidden_size
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # A multimodal model's text weights, named as the text model's.
            if name.startswith("model.language_model."):
                name = "model." + name[len("model.language_model."):]
            if name.endswith("norm.weight") and config.model_type.startswith("gemma"):
                # Gemma stores a gain as its offset from one: 1 + w is the gain, about one.
                values = 0.1 * torch.randn(parameter.shape, generator=generator)
            elif name.endswith("norm.weight"):
                values = 1.0 + 0.1 * torch.randn(parameter.shape, generator=generator)
            elif name.endswith(".bias"):
                values = 0.3 * torch.randn(parameter.shape, generator=generator)
            elif name == "lm_head.weight" or (name == "model.embed_tokens.weight" and
                                              text.tie_word_embeddings):
                values = 3.0 / math.sqrt(hidden) * torch.randn(parameter.shape, generator=generator)
            elif name == "model.embed_tokens.weight":
                values = torch.randn(parameter.shape, generator=generator)
            elif parameter.dim() < 2:
                values = 0.1 * torch.randn(parameter.shape, generator=generator)
            else:
                values = torch.randn(parameter.shape, generator=generator) / math.sqrt(
                    parameter.shape[1])
            parameter.copy_(values.to(parameter.dtype))


def build(case, model_dir):
    if case not in CASES:
        raise SystemExit(f"unknown case {case!r}; cases: {', '.join(CASES)}")
    family, dtype_name = case.rsplit("_", 1)
    prefix, options = _FAMILIES[family]
    # Gemma 3's text model has its own config class (its "Gemma3Config" is the multimodal one);
    # it names its activation hidden_activation.
    common = dict(_COMMON)
    if prefix.startswith("Gemma3"):
        del common["hidden_act"]
    if prefix == "Gemma3Multimodal":
        # Image tokens past the text's ids; a 28-pixel image of 14-pixel patches, 4 tokens each.
        text_config = transformers.Gemma3TextConfig(**common, **options)
        vision_config = transformers.SiglipVisionConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            image_size=28, patch_size=14)
        config = transformers.Gemma3Config(
            text_config=text_config, vision_config=vision_config, mm_tokens_per_image=4,
            boi_token_index=options["vocab_size"] - 3, eoi_token_index=options["vocab_size"] - 2,
            image_token_index=options["vocab_size"] - 1, tie_word_embeddings=True)
        model = transformers.Gemma3ForConditionalGeneration(config).eval()
    else:
        config_class = getattr(transformers,
                               prefix + ("TextConfig" if prefix == "Gemma3" else "Config"))
        config = config_class(**common, **options)
        model = getattr(transformers, prefix + "ForCausalLM")(config).eval()
    _initialize(model, config, seed=CASES.index(case) + 1)
    model.to(torch.bfloat16 if dtype_name == "bf16" else torch.float32)
    model.save_pretrained(model_dir)
    return config


def _read_prompts(path):
    prompts = []
    with open(path) as f:
        for line in f:
            if line.strip():
                prompts.append([int(t) for t in line.split(",")])
    if not prompts:
        raise SystemExit(f"{path}: no prompts")
    return prompts


def run(model_dir, gguf_file, prompts, new_tokens, out_prefix, bf16_out_prefix=None):
    with torch.no_grad():
        model = _load(model_dir, gguf_file)
        _reference(model, prompts, new_tokens, out_prefix)
        if bf16_out_prefix:
            kept = _kept_as_stored(os.path.join(model_dir, gguf_file)) if gguf_file else set()
            # A tied embedding is one parameter, rounded once.
            for name, parameter in model.named_parameters():
                if parameter.dim() >= 2 and _gguf_name(name) not in kept:
                    parameter.copy_(parameter.to(torch.bfloat16).to(torch.float32))
            _reference(model, prompts, new_tokens, bf16_out_prefix)


# transformers' parameter names of a decoder's matrices, by their GGUF names' parts.
_GGUF_MODULES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_name(name):
    """The GGUF tensor name of a transformers parameter ("model.layers.3.mlp.up_proj.weight" is
    "blk.3.ffn_up.weight"), or None for a parameter no GGUF matrix names."""
    if name.endswith("embed_tokens.weight"):
        return "token_embd.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if "layers" in parts:
        index = parts.index("layers")
        layer, module = parts[index + 1], ".".join(parts[index + 2:-1])
        if module in _GGUF_MODULES:
            return f"blk.{layer}.{_GGUF_MODULES[module]}.weight"
    return None


def _kept_as_stored(path):
    """The GGUF matrices specrun multiplies as stored (Q4_0, Q4_1, Q8_0), by name."""
    import gguf
    kept_types = {gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1,
                  gguf.GGMLQuantizationType.Q8_0}
    return {t.name for t in gguf.GGUFReader(path).tensors
            if len(t.shape) == 2 and t.tensor_type in kept_types}


def _load(model_dir, gguf_file):
    kwargs = {}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
        # GGUF files may say "no padding token" as id 2^32 - 1, which transformers takes for an
        # id and refuses; padding plays no part here.
        config = transformers.AutoConfig.from_pretrained(model_dir, gguf_file=gguf_file)
        if config.pad_token_id is not None and not 0 <= config.pad_token_id < config.vocab_size:
            config.pad_token_id = None
        kwargs["config"] = config
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs).eval()
    # bf16 checkpoints are widened to float32 at load, exactly: every weight must be float32 now.
    wrong = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if wrong:
        raise SystemExit(f"{model_dir}: parameters not in float32 after loading: {wrong[:3]}")
    return model


def _reference(model, prompts, new_tokens, out_prefix):
    vocab = model.config.get_text_config().vocab_size
    rows, manifest = [], []
    offset = 0
    for tokens in prompts:
        if any(t < 0 or t >= vocab for t in tokens):
            raise SystemExit(f"token id out of range [0, {vocab})")
        # Prefill: the logits at every prompt position, then greedy steps through the cache.
        output = model(torch.tensor([tokens]), use_cache=True)
        logits = [output.logits[0]]
        cache = output.past_key_values
        continuation = []
        for _ in range(new_tokens):
            token = int(torch.argmax(logits[-1][-1]))
            continuation.append(token)
            output = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = output.past_key_values
            logits.append(output.logits[0])
        block = torch.cat(logits, dim=0)
        assert block.shape == (len(tokens) + new_tokens, vocab)
        rows.append(block)
        manifest.append({"tokens": tokens, "continuation": continuation, "row_offset": offset})
        offset += block.shape[0]
    torch.cat(rows, dim=0).to(torch.float32).numpy().astype("<f4").tofile(out_prefix + ".bin")
    with open(out_prefix + ".json", "w") as f:
        json.dump({"vocab_size": vocab, "torch": torch.__version__,
                   "transformers": transformers.__version__, "prompts": manifest}, f)


# llama.cpp's pre-tokenizers that split every digit off before GPT-2's regex (llama-vocab.cpp:
# `\p{N}`, then GPT-2's expression, for LLAMA_VOCAB_PRE_TYPE_STARCODER, _REFACT and _SMOLLM), as
# the original tokenizer.json files do (Digits(individual_digits=True), then ByteLevel).
# transformers 5.23's GGUF converter has no entry for them (GGUF_PRE_TOKENIZER_SPLITS in
# integrations/gguf/gguf_tokenizer_mapping.py) and falls back to ByteLevel's GPT-2 regex alone,
# which keeps a run of digits in one piece with the space before it: "  1" becomes " " + " 1"
# (ids Ġ, Ġ, 1) where the file's own pre-tokenizer gives "  " + "1" (ĠĠ, 1).
LLAMA_CPP_DIGIT_SPLIT = ("smollm", "starcoder", "refact")


def tokenize(model_dir, gguf_file, input_path, out_path):
    import copy
    from gguf import GGUFReader
    from tokenizers import Regex, pre_tokenizers
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf_file)
    field = GGUFReader(os.path.join(model_dir, gguf_file)).fields.get("tokenizer.ggml.pre")
    pre = field.contents() if field is not None else None
    # transformers' conversion with only its pre-tokenizer replaced by the file's, everything else
    # (vocabulary, merges, added tokens, post-processor, decoder) as transformers built it.
    completed = None
    if pre in LLAMA_CPP_DIGIT_SPLIT:
        completed = copy.deepcopy(tokenizer.backend_tokenizer)
        completed.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    with open(input_path, encoding="utf-8") as f:
        request = json.load(f)
    result = {"transformers": transformers.__version__, "pre": pre, "encode": [],
              "encode_special": [], "decode": [], "decode_skip": [], "ids_decode": [],
              "ids_decode_skip": []}
    if completed is not None:
        result["encode_llama_cpp"], result["encode_special_llama_cpp"] = [], []
    for text in request["texts"]:
        ids = tokenizer.encode(text, add_special_tokens=True)
        result["encode_special"].append(ids)
        result["encode"].append(tokenizer.encode(text, add_special_tokens=False))
        if completed is not None:
            result["encode_llama_cpp"].append(completed.encode(text, add_special_tokens=False).ids)
            result["encode_special_llama_cpp"].append(
                completed.encode(text, add_special_tokens=True).ids)
        result["decode"].append(tokenizer.decode(ids, skip_special_tokens=False))
        result["decode_skip"].append(tokenizer.decode(ids, skip_special_tokens=True))
    for ids in request.get("ids", []):
        result["ids_decode"].append(tokenizer.decode(ids, skip_special_tokens=False))
        result["ids_decode_skip"].append(tokenizer.decode(ids, skip_special_tokens=True))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)


def cases(out_dir, names):
    os.makedirs(out_dir, exist_ok=True)
    status = os.path.join(out_dir, "status.txt")
    if os.path.exists(status):
        os.remove(status)
    if IMPORT_ERROR is not None:
        with open(status, "w") as f:
            f.write(IMPORT_ERROR + "\n")
        print(IMPORT_ERROR)
        return
    for name in names or CASES:
        model_dir = os.path.join(out_dir, name)
        config = build(name, model_dir)
        generator = torch.Generator().manual_seed(1000 + CASES.index(name))
        vocab = config.get_text_config().vocab_size
        prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist()
                   for length in _PROMPT_LENGTHS]
        run(model_dir, None, prompts, 64, os.path.join(out_dir, name))
    with open(status, "w") as f:
        f.write("ok\n")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="write a random model of one case")
    build_parser.add_argument("--case", required=True, choices=CASES)
    build_parser.add_argument("--model", required=True, help="directory to write")
    run_parser = commands.add_parser("run", help="logits and greedy continuations")
    run_parser.add_argument("--model", required=True, help="model directory")
    run_parser.add_argument("--gguf-file", help="a GGUF file in the model directory")
    run_parser.add_argument("--prompts", required=True, help="one prompt per line: ids, commas")
    run_parser.add_argument("--new-tokens", type=int, default=64)
    run_parser.add_argument("--out", required=True, help="writes OUT.json and OUT.bin")
    run_parser.add_argument("--bf16-weights-out",
                            help="then round every matrix to bfloat16 (of a GGUF file, those "
                            "specrun widens to bf16) and write the reference again to "
                            "BF16_WEIGHTS_OUT.json and .bin")
    tokenize_parser = commands.add_parser("tokenize", help="a GGUF file's tokenizer")
    tokenize_parser.add_argument("--model", required=True, help="model directory")
    tokenize_parser.add_argument("--gguf-file", required=True, help="a GGUF file in it")
    tokenize_parser.add_argument("--input", required=True, help="texts and ids (JSON)")
    tokenize_parser.add_argument("--out", required=True, help="writes OUT (JSON)")
    cases_parser = commands.add_parser("cases", help="every case's model and reference")
    cases_parser.add_argument("--out", required=True, help="directory to write")
    cases_parser.add_argument("--case", action="append", choices=CASES, help="default: all")
    args = parser.parse_args(argv)

    if IMPORT_ERROR is None:
        transformers.utils.logging.disable_progress_bar()
        # One thread: the reference's numbers must not depend on the machine's core count, and
        # the models are too small to gain from more.
        torch.set_num_threads(1)
    elif args.command != "cases":
        raise SystemExit(IMPORT_ERROR)
    if args.command == "cases":
        cases(args.out, args.case)
    elif args.command == "build":
        build(args.case, args.model)
    elif args.command == "tokenize":
        tokenize(args.model, args.gguf_file, args.input, args.out)
    else:
        run(args.model, args.gguf_file, _read_prompts(args.prompts), args.new_tokens, args.out,
            args.bf16_weights_out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
