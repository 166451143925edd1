#!/usr/bin/env python3
"""Trains specrun's bundled draft/target pair on the Python standard library's source.

  train.py tokenizer --work DIR           BPE tokenizer and the encoded corpus splits
  train.py model --work DIR --role ROLE   trains the draft or the target, exports it to DIR/ROLE
  train.py evaluate --work DIR            held-out loss of each exported model, as bf16 weights

tools/pair/train.sh runs the three steps and copies the result into models/. Needs Debian's
python3-torch (with libopenblas0-pthread), python3-numpy and python3-regex.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
from model import LlamaForCausalLM, hf_config, load_safetensors, save_safetensors  # noqa: E402

VOCAB_SIZE = 4096
CONTEXT = 512  # training sequence length, and the models' max_position_embeddings

# Each role's shape and training budget. The target has six times the draft's parameters and,
# with its second stage (train.sh), about 25 times its training compute: 580 steps against 150.
# On this little data a bigger model is not ahead per token: with the draft trained as long as
# the target (550 steps), the two ended level on held-out text. A draft is the cheap model in
# every sense, so it gets the short budget.
ROLES = {
    "target": {
        "shape": {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 8,
                  "num_attention_heads": 8, "num_key_value_heads": 4,
                  "tie_word_embeddings": False},
        "steps": 320, "batch": 16, "learning_rate": 2e-3,
    },
    "draft": {
        "shape": {"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
                  "num_attention_heads": 4, "num_key_value_heads": 2,
                  "tie_word_embeddings": True},
        "steps": 150, "batch": 16, "learning_rate": 3e-3,
    },
}


def model_config(role):
    return {
        **ROLES[role]["shape"],
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
    }


def encode_split(tokenizer, documents):
    """Each document as BOS, its tokens, EOS; all concatenated. [tokens] uint16"""
    ids = []
    for _, text in documents:
        ids.append(tokenizer.bos_id)
        ids.extend(tokenizer.encode(text))
        ids.append(tokenizer.eos_id)
    return numpy.array(ids, dtype=numpy.uint16)


def command_tokenizer(args):
    os.makedirs(args.work, exist_ok=True)
    train, held_out = corpus.split()
    started = time.time()
    merges = bpe.train([text for _, text in train], VOCAB_SIZE)
    tokenizer = bpe.Tokenizer(merges)
    bpe.save(tokenizer, os.path.join(args.work, "tokenizer.json"))
    train_ids = encode_split(tokenizer, train)
    held_ids = encode_split(tokenizer, held_out)
    train_ids.tofile(os.path.join(args.work, "train.bin"))
    held_ids.tofile(os.path.join(args.work, "held_out.bin"))
    manifest = {
        "root": corpus.stdlib_root(),
        "python": sys.version.split()[0],
        "train_files": len(train), "held_out_files": len(held_out),
        "train_bytes": sum(len(t.encode()) for _, t in train),
        "held_out_bytes": sum(len(t.encode()) for _, t in held_out),
        "train_tokens": int(train_ids.size), "held_out_tokens": int(held_ids.size),
        "held_out": [path for path, _ in held_out],
    }
    with open(os.path.join(args.work, "corpus.json"), "w") as stream:
        json.dump(manifest, stream, indent=1)
    print(f"tokenizer: {len(merges)} merges in {time.time() - started:.0f} s; "
          f"{manifest['train_tokens']} train tokens, {manifest['held_out_tokens']} held out")


def load_ids(work, name):
    return torch.from_numpy(numpy.fromfile(os.path.join(work, name), dtype=numpy.uint16)
                            .astype(numpy.int64))


def held_out_loss(model, ids, batch=16):
    """Mean next-token cross-entropy over non-overlapping CONTEXT windows of ids."""
    windows = (ids.numel() - 1) // CONTEXT
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, windows, batch):
            rows = range(start, min(windows, start + batch))
            x = torch.stack([ids[r * CONTEXT:(r + 1) * CONTEXT] for r in rows])
            y = torch.stack([ids[r * CONTEXT + 1:(r + 1) * CONTEXT + 1] for r in rows])
            logits = model(x).float()
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                     reduction="sum").item()
            count += y.numel()
    model.train()
    return total / count


def export(model, tokenizer, directory):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as stream:
        json.dump(hf_config(model.config, tokenizer), stream, indent=2)
        stream.write("\n")
    with open(os.path.join(directory, "generation_config.json"), "w") as stream:
        json.dump({"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id}, stream,
                  indent=2)
        stream.write("\n")
    save_safetensors(model, os.path.join(directory, "model.safetensors"))
    bpe.save(tokenizer, os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as stream:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast",
                   "bos_token": bpe.BEGIN_OF_TEXT, "eos_token": bpe.END_OF_TEXT,
                   "model_max_length": CONTEXT}, stream, indent=2)
        stream.write("\n")


def command_model(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    role = ROLES[args.role]
    steps = args.steps or role["steps"]
    batch = role["batch"]
    tokenizer = bpe.load(os.path.join(args.work, "tokenizer.json"))
    train_ids = load_ids(args.work, "train.bin")
    held_ids = load_ids(args.work, "held_out.bin")
    model = LlamaForCausalLM(model_config(args.role))
    directory = os.path.join(args.work, args.role)
    previous = None
    if args.resume:
        # A second stage: start from the exported weights (Adam starts afresh, with its own
        # warm-up), so a budget can be split across runs.
        load_safetensors(model, os.path.join(directory, "model.safetensors"))
        with open(os.path.join(args.work, f"{args.role}.json")) as stream:
            previous = json.load(stream)
    learning_rate = args.learning_rate or role["learning_rate"]
    print(f"{args.role}: {model.parameter_count() / 1e6:.2f}M parameters, {steps} steps of "
          f"{batch}x{CONTEXT} tokens ({steps * batch * CONTEXT / train_ids.numel():.1f} epochs)",
          flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate, betas=(0.9, 0.95))
    warmup = max(1, steps // 20)
    generator = torch.Generator().manual_seed(args.seed)
    started = time.time()
    log = []
    for step in range(steps):
        if step < warmup:
            scale = (step + 1) / warmup
        else:
            progress = (step - warmup) / max(1, steps - warmup)
            scale = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * scale
        starts = torch.randint(0, train_ids.numel() - CONTEXT - 1, (batch,), generator=generator)
        x = torch.stack([train_ids[s:s + CONTEXT] for s in starts])  # [batch, CONTEXT]
        y = torch.stack([train_ids[s + 1:s + CONTEXT + 1] for s in starts])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.time() - started
            print(f"{args.role} step {step}/{steps} loss {loss.item():.3f} "
                  f"{elapsed:.0f} s ({elapsed / (step + 1):.2f} s/step)", flush=True)
            log.append({"step": step, "loss": loss.item(), "seconds": elapsed})
    export(model, tokenizer, directory)
    reloaded = LlamaForCausalLM(model.config)
    load_safetensors(reloaded, os.path.join(directory, "model.safetensors"))
    loss = held_out_loss(reloaded, held_ids)
    report = {"role": args.role, "parameters": model.parameter_count(), "steps": steps,
              "batch": batch, "context": CONTEXT, "tokens_seen": steps * batch * CONTEXT,
              "seconds": time.time() - started, "threads": args.threads,
              "learning_rate": learning_rate, "held_out_loss": loss, "log": log}
    if previous is not None:
        report["stages"] = previous.get("stages", [{k: v for k, v in previous.items()
                                                    if k != "log"}])
        report["stages"].append({k: v for k, v in report.items() if k not in ("log", "stages")})
        report["steps"] += previous["steps"]
        report["tokens_seen"] += previous["tokens_seen"]
        report["seconds"] += previous["seconds"]
    with open(os.path.join(args.work, f"{args.role}.json"), "w") as stream:
        json.dump(report, stream, indent=1)
    print(f"{args.role}: held-out loss {loss:.4f} (bf16 weights) after "
          f"{report['seconds'] / 60:.1f} min", flush=True)


def command_evaluate(args):
    held_ids = load_ids(args.work, "held_out.bin")
    for role in ("draft", "target"):
        model = LlamaForCausalLM(model_config(role))
        load_safetensors(model, os.path.join(args.work, role, "model.safetensors"))
        print(f"{role}: held-out loss {held_out_loss(model, held_ids):.4f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tokenizer = commands.add_parser("tokenizer")
    tokenizer.add_argument("--work", required=True)
    model = commands.add_parser("model")
    model.add_argument("--work", required=True)
    model.add_argument("--role", choices=sorted(ROLES), required=True)
    model.add_argument("--steps", type=int, default=0, help="override the role's step count")
    model.add_argument("--threads", type=int, default=os.cpu_count())
    model.add_argument("--seed", type=int, default=1234)
    model.add_argument("--learning-rate", type=float, default=0.0,
                       help="override the role's peak learning rate")
    model.add_argument("--resume", action="store_true",
                       help="continue from WORK/ROLE/model.safetensors (a further stage)")
    evaluate = commands.add_parser("evaluate")
    evaluate.add_argument("--work", required=True)
    args = parser.parse_args()
    {"tokenizer": command_tokenizer, "model": command_model,
     "evaluate": command_evaluate}[args.command](args)


if __name__ == "__main__":
    main()
