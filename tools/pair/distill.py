#!/usr/bin/env python3
"""Distils a draft for a chat target (SmolLM2-135M-Instruct) on the CPU, reproducibly.

  distill.py generate --target GGUF --work DIR   the target, run by `specrun serve`, answers
                                                 generated questions (chat_prompts.py), greedily
                                                 and at the demo's settings: DIR/data.json
  distill.py train --target GGUF --work DIR      a narrow draft, initialised from the target's
                                                 embeddings and first layers, learns to predict
                                                 those answers: DIR/draft.pt (--init-from FILE:
                                                 a second phase from a saved draft.pt or an
                                                 exported draft.gguf, kept only where it beats
                                                 its start on held-out answers; --kl-weight W:
                                                 partly on the target's own distributions)
  distill.py evaluate --target GGUF --work DIR   held-out loss and agreement with the target's
                                                 tokens, as trained and as exported (Q8_0), and
                                                 on its answers to questions on new topics:
                                                 DIR/metrics.json
  distill.py lookup --target GGUF --work DIR     agreement with the target's greedy answers on
                                                 new topics, teacher-forced, of the saved draft
                                                 and of the target as its own draft, alone and
                                                 with prompt lookup in their place (specrun's
                                                 speculative.draft_lookup_ngram, fixed on)
  distill.py export --target GGUF --work DIR --out FILE
                                                 the draft as GGUF (Q8_0 matrices), with the
                                                 target's tokenizer metadata copied verbatim and
                                                 a head reduced to --head-tokens tokens

  distill.py store-features --target GGUF --work DIR
                                                 the target's features (last hidden state) at
                                                 every position of DIR/data.json, computed once:
                                                 DIR/features.bf16 and DIR/features.json
  distill.py train-features --target GGUF --work DIR
                                                 a one-layer draft that reads the target's
                                                 features (EAGLE) learns its next feature and
                                                 token: DIR/feature-draft.pt (--stored-features:
                                                 read store-features' files rather than running
                                                 the target each step; --init-from FILE: further
                                                 from a saved feature-draft.pt or an exported
                                                 feature draft's GGUF)
  distill.py export-features --target GGUF --work DIR --out FILE
                                                 that draft as GGUF, its head the target's own
                                                 reduced to --head-tokens tokens

Every step loads the target, its tokenizer and its configuration from DIR/target, transformers'
conversion of the GGUF file made once (converted_target).

tools/pair/distill.sh runs the feature draft's steps (the demo's), with --plain the plain
draft's. Needs the project's virtual environment with the
smollm2, transformers and gguf groups of tools/setup-python.sh, and a built specrun.
"""

import argparse
import json
import math
import os
import re
import shutil
import sys
import time

import numpy
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_prompts  # noqa: E402

# The draft's shape: a residual stream of 256 rather than 576, four layers rather than 30, four
# of the target's nine query heads (two of its three KV heads), its MLP width. The tied embedding
# (49,152 x 256) is most of it; the draft costs about an eighth of the target per token on a
# memory-bound CPU.
DRAFT_SHAPE = {"hidden_size": 256, "num_hidden_layers": 4}
# Which target layers and heads initialise the draft's, by index: the first four layers (later
# ones, fed the embedding stream, start the draft far worse). Query heads 0, 1 share the target's
# KV head 0, query heads 3, 4 its KV head 1.
DRAFT_LAYERS_FROM = [0, 1, 2, 3]
DRAFT_QUERY_HEADS = [0, 1, 3, 4]
DRAFT_KV_HEADS = [0, 1]


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def converted_target(args):
    """WORK/target: the target as transformers converts its GGUF (config.json, the weights in
    float32 safetensors, Q4_1 dequantised exactly, and the tokenizer's files with its chat
    template), made once per work folder and loaded from there by every step. transformers' GGUF
    reader spends about 25 s a load on two cores (gguf-py parses the file's metadata, 49,152
    tokens and their merges, twice); the converted folder loads in under a second. source.json names
    the GGUF it came from by path, size and modification time: another target, or the file
    changed, is converted again."""
    import safetensors.torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers
    transformers.logging.set_verbosity_error()
    folder = os.path.join(args.work, "target")
    status = os.stat(args.target)
    source = {"path": os.path.abspath(args.target), "size": status.st_size,
              "mtime_ns": status.st_mtime_ns}
    try:
        with open(os.path.join(folder, "source.json")) as file:
            if json.load(file) == source:
                return folder
    except (OSError, ValueError):
        pass
    log(f"converting {args.target} into {folder}")
    gguf_folder, name = os.path.split(source["path"])
    model = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=name)
    # Written beside, then renamed: a conversion cut short leaves no folder that looks whole.
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    # Saved as plain float32 weights: transformers will not save a model it still marks as read
    # from GGUF, and what it read is exact in float32.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(partial)
    safetensors.torch.save_model(model, os.path.join(partial, "model.safetensors"))
    tokenizer.save_pretrained(partial)
    with open(os.path.join(partial, "source.json"), "w") as file:
        json.dump(source, file)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(partial, folder)
    return folder


def load_tokenizer(args):
    """transformers' conversion of the target's tokenizer, and the id of <|im_end|>."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(converted_target(args))
    return tokenizer, tokenizer.convert_tokens_to_ids("<|im_end|>")


def load_target(args):
    """The target in float32, as transformers' GGUF reader dequantises it (converted_target)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(converted_target(args), dtype=torch.float32)
    model.eval()
    return model


def target_config(args):
    """The target's transformers configuration (converted_target)."""
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(converted_target(args))


def chat_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# generate


def target_answers(args, questions, is_greedy):
    """The target's answers to `questions`, from `specrun serve` (the runtime the draft is for),
    many at once: a record per question, {"prompt": ids, "answer": ids (<|im_end|> appended where
    the answer ended), "greedy": bool}; is_greedy(index) says which are greedy, the rest are at
    the demo's settings (T 0.7, top-p 0.9)."""
    import concurrent.futures
    import signal
    import subprocess
    import urllib.request

    tokenizer, eos = load_tokenizer(args)
    # Port 0: the server picks a free one and names it in its first line on stderr.
    server = subprocess.Popen(
        [args.specrun, "serve", "--target", args.target, "--port", "0", "--model-name", "target",
         "--activations", "bf16", "--max-requests", str(4 * args.batch)] + args.specrun_args,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    announced = re.search(r"listening on (http://\S+)", server.stderr.readline())
    if not announced:
        server.kill()
        raise SystemExit(f"distill: {args.specrun} serve did not start: {server.stderr.read()}")
    url = announced.group(1)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"distill: {args.specrun} serve exited ({server.returncode})")
                time.sleep(0.5)

        def ask(index):
            greedy = is_greedy(index)
            body = {"model": "target", "max_tokens": args.max_new_tokens,
                    "messages": [{"role": "user", "content": questions[index]}],
                    "temperature": 0.0 if greedy else 0.7, "top_p": 1.0 if greedy else 0.9,
                    "seed": args.seed + index}
            request = urllib.request.Request(url + "/v1/chat/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=3600) as response:
                choice = json.load(response)["choices"][0]
            return index, greedy, choice["message"]["content"], choice["finish_reason"]

        records = [None] * len(questions)
        start = time.time()
        generated = 0
        with concurrent.futures.ThreadPoolExecutor(args.batch) as pool:
            for done, (index, greedy, answer, finish) in enumerate(
                    pool.map(ask, range(len(questions)))):
                prompt = chat_ids(tokenizer, questions[index])
                answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
                if finish == "stop":
                    answer_ids.append(eos)
                records[index] = {"prompt": prompt, "answer": answer_ids, "greedy": greedy}
                generated += len(answer_ids)
                if done % 64 == 63 or done + 1 == len(questions):
                    log(f"{done + 1}/{len(questions)} answers, {generated} tokens, "
                        f"{generated / (time.time() - start):.0f} tokens/s")
    finally:
        server.send_signal(signal.SIGINT)
        server.wait()
    return records


def generate(args):
    """The target's answers to the training questions: one in four greedy, the rest at the
    demo's settings (the draft must follow the target both ways)."""
    questions = chat_prompts.training_prompts(args.questions, args.seed)
    records = target_answers(args, questions, lambda index: index % 4 == 3)
    with open(os.path.join(args.work, "data.json"), "w") as file:
        json.dump({"questions": questions, "seed": args.seed, "records": records}, file)
    log(f"wrote {os.path.join(args.work, 'data.json')}")


# ---------------------------------------------------------------------------------------------
# train


def draft_config(target_config):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=target_config.vocab_size, hidden_size=DRAFT_SHAPE["hidden_size"],
        intermediate_size=target_config.intermediate_size,
        num_hidden_layers=DRAFT_SHAPE["num_hidden_layers"],
        num_attention_heads=len(DRAFT_QUERY_HEADS), num_key_value_heads=len(DRAFT_KV_HEADS),
        head_dim=target_config.head_dim,
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=target_config.rms_norm_eps, rope_theta=100000.0,
        rope_parameters=target_config.rope_parameters, tie_word_embeddings=True,
        bos_token_id=target_config.bos_token_id, eos_token_id=target_config.eos_token_id)


def initialise_from_target(draft, target):
    """The draft's residual stream is the target's projected onto the top principal directions of
    its embedding table (P, [576, 256]): embeddings E P, layer inputs W diag(g) P, layer outputs
    P^T W. RMS norms over 256 rather than 576 channels differ by sqrt(576 / 256), folded in."""
    with torch.no_grad():
        table = target.model.embed_tokens.weight.float()  # [vocab, 576]
        _, vectors = torch.linalg.eigh(table.T @ table)  # ascending eigenvalues
        width = draft.config.hidden_size
        projection = vectors[:, -width:].flip(-1).contiguous()  # [576, width]
        scale = math.sqrt(target.config.hidden_size / width)
        draft.model.embed_tokens.weight.copy_(table @ projection)
        final = target.model.norm.weight.float()
        # Softened: the tied head would otherwise predict each position's own token with great
        # confidence (held-out loss 17 nats rather than 8.6 at the start).
        draft.model.norm.weight.copy_(0.3 * scale * ((projection.T * final) @ projection).diagonal())
        for mine, index in zip(draft.model.layers, DRAFT_LAYERS_FROM):
            theirs = target.model.layers[index]
            g_attention = theirs.input_layernorm.weight.float()
            g_mlp = theirs.post_attention_layernorm.weight.float()
            head = target.config.head_dim
            for name, heads in [("q_proj", DRAFT_QUERY_HEADS), ("k_proj", DRAFT_KV_HEADS),
                                ("v_proj", DRAFT_KV_HEADS)]:
                weight = getattr(theirs.self_attn, name).weight.float()  # [heads * 64, 576]
                rows = torch.cat([weight[h * head:(h + 1) * head] for h in heads])
                getattr(mine.self_attn, name).weight.copy_(scale * (rows * g_attention) @ projection)
            weight = theirs.self_attn.o_proj.weight.float()  # [576, 9 * 64]
            columns = torch.cat([weight[:, h * head:(h + 1) * head] for h in DRAFT_QUERY_HEADS], 1)
            mine.self_attn.o_proj.weight.copy_(projection.T @ columns)
            for name in ["gate_proj", "up_proj"]:
                weight = getattr(theirs.mlp, name).weight.float()
                getattr(mine.mlp, name).weight.copy_(scale * (weight * g_mlp) @ projection)
            mine.mlp.down_proj.weight.copy_(projection.T @ theirs.mlp.down_proj.weight.float())
            mine.input_layernorm.weight.fill_(1.0)
            mine.post_attention_layernorm.weight.fill_(1.0)


def is_held_out(index):
    """Whether answer `index` of data.json is held out: 1 in 20."""
    return index % 40 in (18, 19)


def load_records(work):
    """The target's answers that generate wrote: DIR/data.json's records."""
    with open(os.path.join(work, "data.json")) as file:
        return json.load(file)["records"]


def load_split(work, context):
    """Training and held-out sequences: (ids, first answer position, greedy) triples; 1 in 20
    held out, greedy and sampled answers alike."""
    records = load_records(work)
    train_set, held_out = [], []
    for index, record in enumerate(records):
        (held_out if is_held_out(index) else train_set).append(as_item(record, context))
    return train_set, held_out


def as_item(record, context):
    """A record of target_answers as an (ids, first answer position, greedy) triple."""
    ids = (record["prompt"] + record["answer"])[:context]
    return torch.tensor(ids, dtype=torch.long), len(record["prompt"]), record["greedy"]


def new_topic_items(args, context):
    """The target's greedy answers to the first --new-topics of chat_prompts.new_topic_questions()
    as items, kept in DIR/new_topics.json and asked again only when the questions or the answers'
    cap change."""
    path = os.path.join(args.work, "new_topics.json")
    questions = chat_prompts.new_topic_questions()[:args.new_topics]
    kept = None
    if os.path.exists(path):
        with open(path) as file:
            kept = json.load(file)
    if (kept is None or kept["questions"] != questions or
            kept.get("max_new_tokens", 192) != args.max_new_tokens):
        kept = {"questions": questions, "max_new_tokens": args.max_new_tokens,
                "records": target_answers(args, questions, lambda index: True)}
        with open(path, "w") as file:
            json.dump(kept, file)
    return [as_item(record, context) for record in kept["records"]]


def batches(items, tokens_per_batch, generator):
    """Batches of similar-length sequences, right padded, about tokens_per_batch tokens each;
    labels -100 except where the next token is part of the answer."""
    for _, ids, labels in indexed_batches(items, tokens_per_batch, generator):
        yield ids, labels


def indexed_batches(items, tokens_per_batch, generator):
    """batches(), each with the indices into `items` of its rows: (indices, ids, labels)."""
    order = torch.randperm(len(items), generator=generator).tolist()
    order.sort(key=lambda i: len(items[i][0]) // 32)  # buckets of similar length, shuffled within
    groups, group, width = [], [], 0
    for i in order:
        width_with = max(width, len(items[i][0]))
        if group and width_with * (len(group) + 1) > tokens_per_batch:
            groups.append(group)
            group, width_with = [], len(items[i][0])
        group.append(i)
        width = width_with
    if group:
        groups.append(group)
    shuffled = torch.randperm(len(groups), generator=generator).tolist()
    for g in shuffled:
        members = [items[i] for i in groups[g]]
        width = max(len(ids) for ids, _, _ in members)
        ids = torch.zeros((len(members), width), dtype=torch.long)
        labels = torch.full((len(members), width), -100, dtype=torch.long)
        for row, (sequence, answer_start, _) in enumerate(members):
            ids[row, :len(sequence)] = sequence
            labels[row, answer_start - 1:len(sequence) - 1] = sequence[answer_start:]
        yield groups[g], ids, labels


def answer_logits(model, ids, labels):
    """The model's logits at the answer positions: [answer tokens, vocab]."""
    mask = labels != -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = model.model(input_ids=ids).last_hidden_state  # [batch, width, hidden]
        # The head (most of the draft's arithmetic) only where a loss is taken: not on the prompt
        # or the padding.
        logits = model.lm_head(hidden[mask])  # [answer tokens, vocab]
    return logits.float()


def answer_loss(model, ids, labels):
    """Mean cross-entropy and argmax agreement over the answer positions."""
    logits = answer_logits(model, ids, labels)
    answers = labels[labels != -100]
    loss = F.cross_entropy(logits, answers)
    agree = (logits.argmax(-1) == answers).float().mean()
    return loss, agree


def distillation_loss(draft, target, ids, labels, kl_weight):
    """(1 - kl_weight) x cross-entropy on the target's tokens + kl_weight x KL(p || q) from the
    target's own distributions p (computed here, at temperature 1) to the draft's q, over the
    answer positions; and the draft's argmax agreement with the target's tokens."""
    logits = answer_logits(draft, ids, labels)
    answers = labels[labels != -100]
    with torch.no_grad():
        target_log_p = F.log_softmax(answer_logits(target, ids, labels), -1)
    log_q = F.log_softmax(logits, -1)
    cross_entropy = F.nll_loss(log_q, answers)
    kl = F.kl_div(log_q, target_log_p, log_target=True, reduction="batchmean")
    agree = (logits.argmax(-1) == answers).float().mean()
    return (1.0 - kl_weight) * cross_entropy + kl_weight * kl, agree


def held_out_metrics(model, held_out, tokens_per_batch):
    model.eval()
    totals = {"greedy": [0.0, 0.0, 0], "sampled": [0.0, 0.0, 0]}
    with torch.no_grad():
        for kind in totals:
            items = [item for item in held_out if item[2] == (kind == "greedy")]
            for ids, labels in batches(items, tokens_per_batch, torch.Generator().manual_seed(0)):
                count = int((labels != -100).sum())
                loss, agree = answer_loss(model, ids, labels)
                totals[kind][0] += float(loss) * count
                totals[kind][1] += float(agree) * count
                totals[kind][2] += count
    model.train()
    return {kind: {"loss": t[0] / max(t[2], 1), "argmax_agreement": t[1] / max(t[2], 1),
                   "tokens": t[2]} for kind, t in totals.items()}


def adamw_with_schedule(parameters, args, warmup_cap):
    """AdamW (betas 0.9, 0.95, no weight decay) at args.learning_rate after at most `warmup_cap`
    linear warm-up steps, cosine to a tenth over args.steps: (optimizer, schedule)."""
    optimizer = torch.optim.AdamW(parameters, lr=args.learning_rate, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    warmup = max(1, min(warmup_cap, args.steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) *
        (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, args.steps) / args.steps))))
    return optimizer, schedule


def optimizer_step(loss, parameters, optimizer, schedule):
    """One step on `loss`, gradients clipped to norm 1."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    schedule.step()


def train(args):
    from transformers import LlamaForCausalLM
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    target = load_target(args) if args.kl_weight > 0 or not args.init_from else None
    if args.init_from:
        # A second phase: the draft goes on from a saved checkpoint (its own schedule, a new order
        # of batches).
        draft, _ = load_draft(args.init_from, args)
    else:
        draft = LlamaForCausalLM(draft_config(target.config))
        initialise_from_target(draft, target)
    if args.kl_weight > 0:
        target.requires_grad_(False)
    else:
        target = None
    train_set, held_out = load_split(args.work, 512)
    log(f"{len(train_set)} training answers "
        f"({sum(len(i[0]) - i[1] for i in train_set)} answer tokens), {len(held_out)} held out; "
        f"draft {sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M parameters")
    start_metrics = held_out_metrics(draft, held_out, args.tokens_per_step)
    log(f"held out at initialisation: {start_metrics}")
    optimizer, schedule = adamw_with_schedule(draft.parameters(), args, 50)
    generator = torch.Generator().manual_seed(args.seed)
    # From a checkpoint, the kept draft must beat where it started.
    best = (start_metrics["greedy"]["loss"] + start_metrics["sampled"]["loss"]
            if args.init_from else None)
    step, start, history = 0, time.time(), []
    draft.train()
    while step < args.steps:
        for ids, labels in batches(train_set, args.tokens_per_step, generator):
            if target is not None:
                loss, agree = distillation_loss(draft, target, ids, labels, args.kl_weight)
            else:
                loss, agree = answer_loss(draft, ids, labels)
            optimizer_step(loss, draft.parameters(), optimizer, schedule)
            step += 1
            if step % 25 == 0 or step == args.steps:
                log(f"step {step}/{args.steps}: loss {loss.item():.3f}, "
                    f"agreement {agree.item():.3f}, {time.time() - start:.0f} s")
            if step % args.evaluate_every == 0 or step == args.steps:
                # The checkpoint kept is the one with the lowest held-out loss so far: with a few
                # epochs over the answers the draft may start to memorise them.
                metrics = held_out_metrics(draft, held_out, args.tokens_per_step)
                history.append({"step": step, "seconds": time.time() - start, **metrics})
                log(f"held out: {metrics}")
                with open(os.path.join(args.work, "history.json"), "w") as file:
                    json.dump(history, file, indent=1)
                held_out_loss = metrics["greedy"]["loss"] + metrics["sampled"]["loss"]
                if best is None or held_out_loss < best:
                    best = held_out_loss
                    torch.save({"state": draft.state_dict(), "config": draft.config.to_dict(),
                                "step": step, "args": vars(args)},
                               os.path.join(args.work, "draft.pt"))
            if step == args.steps:
                break


# ---------------------------------------------------------------------------------------------
# a feature-conditioned draft (train-features, export-features)

# Its token embedding's width: the target's table projected onto its top principal directions
# (as the plain draft's), small enough for models/ while the 576-wide feature carries the context.
FEATURE_DRAFT_EMBEDDING = 256


class FeatureDraft(torch.nn.Module):
    """One Llama layer of the target's shape that reads, at each position j, the token x_j and the
    target's feature at j - 1 (its last hidden state after the final norm, which the target's head
    turns into the distribution of x_j): input = token_proj(embed(x_j)) + feature_proj(f_{j-1}).
    Its output after its own final norm stands for the target's feature at j, scored by the
    target's head, and is fed back as the feature for the next draft (EAGLE, Li et al. 2024)."""

    def __init__(self, target_config):
        from transformers.models.llama.modeling_llama import (LlamaDecoderLayer, LlamaRMSNorm,
                                                              LlamaRotaryEmbedding)
        super().__init__()
        width = target_config.hidden_size
        self.config = target_config
        self.embed = torch.nn.Embedding(target_config.vocab_size, FEATURE_DRAFT_EMBEDDING)
        self.token_proj = torch.nn.Linear(FEATURE_DRAFT_EMBEDDING, width, bias=False)
        self.feature_proj = torch.nn.Linear(width, width, bias=False)
        self.layer = LlamaDecoderLayer(target_config, 0)
        self.norm = LlamaRMSNorm(width, eps=target_config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(target_config)

    def initialise_from_target(self, target):
        with torch.no_grad():
            table = target.model.embed_tokens.weight.float()  # [vocab, 576]
            _, vectors = torch.linalg.eigh(table.T @ table)
            projection = vectors[:, -FEATURE_DRAFT_EMBEDDING:].flip(-1).contiguous()
            self.embed.weight.copy_(table @ projection)
            self.token_proj.weight.copy_(projection)  # back to the target's embedding space
            # The feature passes straight through at first: the layer learns what to add.
            self.feature_proj.weight.mul_(0.5)
            self.feature_proj.weight.add_(torch.eye(table.shape[1]))
            self.norm.weight.copy_(target.model.norm.weight.float())

    def forward(self, features, ids):
        """features [batch, width, 576] (f_{j-1}), ids [batch, width] (x_j): the draft's output
        features [batch, width, 576]."""
        x = self.token_proj(self.embed(ids)) + self.feature_proj(features)
        positions = torch.arange(ids.shape[1])[None].expand(ids.shape[0], -1)
        hidden = self.layer(x, position_ids=positions,
                            position_embeddings=self.rotary(x, positions))
        if isinstance(hidden, tuple):
            hidden = hidden[0]
        return self.norm(hidden)


def target_features(target, ids):
    """The target's features (last hidden state after its final norm): [batch, width, 576]."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        return target.model(input_ids=ids).last_hidden_state.float()


# The feature draft trains on sequences cut to this many tokens (prompt and answer).
FEATURE_CONTEXT = 512


class StoredFeatures:
    """The target's features at every position of every record of data.json, computed once by
    store-features: DIR/features.bf16 (bf16, [tokens, width], the records' sequences one after
    another, each cut to FEATURE_CONTEXT) and DIR/features.json (each record's offset and
    length). Reading them in place of the target's forward makes a training step about three
    times cheaper, so the draft can see its data several times."""

    def __init__(self, work, records):
        with open(os.path.join(work, "features.json")) as file:
            index = json.load(file)
        expected = [len(as_item(record, FEATURE_CONTEXT)[0]) for record in records]
        if index["lengths"] != expected:
            raise SystemExit(f"distill: {work}/features.json does not match {work}/data.json: "
                             "run store-features again")
        self.offsets, self.lengths, self.width = index["offsets"], index["lengths"], index["width"]
        self.store = numpy.memmap(os.path.join(work, "features.bf16"), dtype=numpy.int16,
                                  mode="r", shape=(index["tokens"], self.width))

    def batch(self, records, width):
        """The features of `records` (indices into data.json), right padded with zeros:
        [len(records), width, self.width] float32."""
        out = torch.zeros((len(records), width, self.width))
        for row, record in enumerate(records):
            start, length = self.offsets[record], self.lengths[record]
            rows = torch.from_numpy(numpy.array(self.store[start:start + length]))
            out[row, :length] = rows.view(torch.bfloat16).float()
        return out


def store_features(args):
    """The target's features of every record of data.json, for train-features --stored-features:
    DIR/features.bf16 and DIR/features.json (StoredFeatures)."""
    torch.set_num_threads(args.threads)
    target = load_target(args)
    records = load_records(args.work)
    items = [as_item(record, FEATURE_CONTEXT) for record in records]
    lengths = [len(ids) for ids, _, _ in items]
    offsets = [0]
    for length in lengths[:-1]:
        offsets.append(offsets[-1] + length)
    width, total = target.config.hidden_size, sum(lengths)
    path = os.path.join(args.work, "features.bf16")
    store = numpy.memmap(path + ".partial", dtype=numpy.int16, mode="w+", shape=(total, width))
    done, start = 0, time.time()
    for indices, ids, _ in indexed_batches(items, args.tokens_per_step,
                                           torch.Generator().manual_seed(0)):
        features = target_features(target, ids).to(torch.bfloat16).view(torch.int16)
        for row, index in enumerate(indices):
            store[offsets[index]:offsets[index] + lengths[index]] = \
                features[row, :lengths[index]].numpy()
        before, done = done, done + sum(lengths[index] for index in indices)
        if before // 100_000 != done // 100_000:
            log(f"features of {done}/{total} tokens, {time.time() - start:.0f} s")
    store.flush()
    del store
    os.replace(path + ".partial", path)
    with open(os.path.join(args.work, "features.json"), "w") as file:
        json.dump({"width": width, "tokens": total, "context": FEATURE_CONTEXT,
                   "offsets": offsets, "lengths": lengths}, file)
    log(f"stored the features of {total} tokens ({len(records)} records) in {path}")


class ReducedHead:
    """The target's head reduced to the tokens the exported draft scores (head_token_ids): its
    rows, and each token's index among them (-100 for the others, which count as misses)."""

    def __init__(self, target, ids):
        self.weight = target.lm_head.weight.detach()[torch.tensor(ids)]
        self.index = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
        self.index[torch.tensor(ids)] = torch.arange(len(ids))


def feature_draft_losses(draft, features, ids, labels, head, depth):
    """Depth 1: the draft reads the target's features f_0..f_{n-2} ([batch, width, 576]) with
    tokens x_1..x_{n-1} and predicts f_1..f_{n-1} (smooth L1) and, through the target's head
    reduced as exported, x_2..x_n (cross-entropy on the answer positions). Depth d > 1: the same
    with its own predictions of depth d - 1 as the features, as the d-th draft in a row reads
    them, weighted by half the depth before's. Returns (loss, [agreement at each depth])."""
    inputs, tokens = features[:, :-1], ids[:, 1:]
    mask = labels[:, 1:] != -100  # position j's output scores x_{j+1}
    answers = head.index[labels[:, 1:][mask]]
    truth = features[:, 1:][mask]
    total, agreements = 0.0, []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        predicted = draft(inputs, tokens).float()
        for level in range(1, depth + 1):
            if level > 1:
                fed = torch.cat([inputs[:, :1], predicted[:, :-1].detach()], 1)
                predicted = draft(fed, tokens).float()
            chosen = predicted[mask]
            logits = F.linear(chosen, head.weight).float()
            total = total + 0.5 ** (level - 1) * (
                F.smooth_l1_loss(chosen, truth) +
                F.cross_entropy(logits, answers, ignore_index=-100))
            agreements.append((logits.argmax(-1) == answers).float().mean())
    return total, agreements


def feature_draft_metrics(draft, items, features_of, tokens_per_batch, head, depth):
    """Held-out loss and agreement at depths 1 to `depth` over `items`; features_of(indices, ids)
    gives the target's features of a batch of them."""
    draft.eval()
    sums, count = [0.0] * (depth + 1), 0
    with torch.no_grad():
        for indices, ids, labels in indexed_batches(items, tokens_per_batch,
                                                    torch.Generator().manual_seed(0)):
            n = int((labels[:, 1:] != -100).sum())
            loss, agreements = feature_draft_losses(draft, features_of(indices, ids), ids, labels,
                                                    head, depth)
            for i, value in enumerate([loss] + agreements):
                sums[i] += float(value) * n
            count += n
    draft.train()
    metrics = {"loss": sums[0] / max(count, 1)}
    for level in range(1, depth + 1):
        metrics[f"agreement_depth{level}"] = sums[level] / max(count, 1)
    return {**metrics, "tokens": count}


def train_features(args):
    """Trains a FeatureDraft on the target's answers (data.json), the target computing its
    features as it goes (or, --stored-features, reading those store-features wrote):
    DIR/feature-draft.pt, the checkpoint with the lowest held-out loss, the draft it starts from
    (--init-from) evaluated first and kept unless a step beats it. --depth: drafts in a row it
    learns to make."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    target = load_target(args)
    target.requires_grad_(False)
    draft = FeatureDraft(target.config)
    if args.init_from:
        # Further training, on a schedule of its own.
        if args.init_from.endswith(".gguf"):
            load_feature_draft_gguf(draft, args.init_from)
        else:
            draft.load_state_dict(torch.load(args.init_from)["state"])
    else:
        draft.initialise_from_target(target)
    head = ReducedHead(target, head_token_ids(args.work, args.head_tokens))
    records = load_records(args.work)
    train_records = [i for i in range(len(records)) if not is_held_out(i)]
    held_records = [i for i in range(len(records)) if is_held_out(i)]
    # A fixed share of the held-out answers, greedy and sampled, keeps evaluations short.
    held_records = ([i for i in held_records if records[i]["greedy"]][:60] +
                    [i for i in held_records if not records[i]["greedy"]][:60])
    train_set = [as_item(records[i], FEATURE_CONTEXT) for i in train_records]
    held_out = [as_item(records[i], FEATURE_CONTEXT) for i in held_records]
    new_topics = new_topic_items(args, FEATURE_CONTEXT)
    stored = StoredFeatures(args.work, records) if args.stored_features else None

    def computed(indices, ids):
        return target_features(target, ids)

    def features_in(record_indices):
        if stored is None:
            return computed
        return lambda indices, ids: stored.batch([record_indices[i] for i in indices],
                                                 ids.shape[1])

    train_features_of = features_in(train_records)
    held_out_features_of = features_in(held_records)

    trainable = [p for p in draft.parameters() if p.requires_grad]
    log(f"{len(train_set)} training answers, feature draft "
        f"{sum(p.numel() for p in trainable) / 1e6:.2f}M parameters, features "
        f"{'stored' if stored else 'computed as it trains'}")
    optimizer, schedule = adamw_with_schedule(trainable, args, 20)
    generator = torch.Generator().manual_seed(args.seed)
    step, start, history, best = 0, time.time(), [], None
    draft.train()

    def evaluate():
        # The checkpoint with the lowest held-out loss is kept; a draft trained further starts as
        # the one to beat.
        nonlocal best
        metrics = {"held_out": feature_draft_metrics(draft, held_out, held_out_features_of,
                                                     args.tokens_per_step, head, args.depth),
                   "new_topics": feature_draft_metrics(draft, new_topics, computed,
                                                       args.tokens_per_step, head, args.depth)}
        history.append({"step": step, "seconds": time.time() - start, **metrics})
        log(f"evaluated: {json.dumps(metrics)}")
        with open(os.path.join(args.work, "feature-history.json"), "w") as file:
            json.dump(history, file, indent=1)
        if best is None or metrics["held_out"]["loss"] < best:
            best = metrics["held_out"]["loss"]
            torch.save({"state": draft.state_dict(), "step": step, "args": vars(args)},
                       os.path.join(args.work, "feature-draft.pt"))

    if args.init_from:
        evaluate()
    while step < args.steps:
        for indices, ids, labels in indexed_batches(train_set, args.tokens_per_step, generator):
            loss, agreements = feature_draft_losses(draft, train_features_of(indices, ids), ids,
                                                    labels, head, args.depth)
            optimizer_step(loss, trainable, optimizer, schedule)
            step += 1
            if step % 25 == 0 or step == args.steps:
                log(f"step {step}/{args.steps}: loss {loss.item():.3f}, agreement "
                    f"{' / '.join(f'{a.item():.3f}' for a in agreements)}, "
                    f"{time.time() - start:.0f} s")
            if step % args.evaluate_every == 0 or step == args.steps:
                evaluate()
            if step == args.steps:
                break


def feature_draft_tensor_names(config):
    """(GGUF name, FeatureDraft parameter, heads to de-interleave or None) for every tensor
    export_features writes but the head."""
    block = "blk.0."
    names = [("token_embd.weight", "embed.weight", None),
             ("token_proj.weight", "token_proj.weight", None),
             ("feature_proj.weight", "feature_proj.weight", None),
             ("output_norm.weight", "norm.weight", None),
             (block + "attn_norm.weight", "layer.input_layernorm.weight", None),
             (block + "ffn_norm.weight", "layer.post_attention_layernorm.weight", None),
             (block + "attn_q.weight", "layer.self_attn.q_proj.weight",
              config.num_attention_heads),
             (block + "attn_k.weight", "layer.self_attn.k_proj.weight",
              config.num_key_value_heads),
             (block + "attn_v.weight", "layer.self_attn.v_proj.weight", None),
             (block + "attn_output.weight", "layer.self_attn.o_proj.weight", None)]
    return names + [(block + f"ffn_{part}.weight", f"layer.mlp.{part}_proj.weight", None)
                    for part in ["gate", "up", "down"]]


def gguf_draft_state(reader, path, names, what):
    """The state an export wrote to a GGUF file (reader: its gguf.GGUFReader), by (GGUF name,
    parameter, heads to de-interleave or None): the Q8_0 matrices dequantised to f32."""
    import gguf
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    state = {}
    for gguf_name, name, heads in names:
        if gguf_name not in tensors:
            raise SystemExit(f"distill: {path} has no tensor {gguf_name}: not {what}")
        tensor = tensors[gguf_name]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weight = torch.from_numpy(values.copy()).float()
        state[name] = deinterleave_rope(weight, heads) if heads else weight
    return state


def load_draft_state(model, state, path, whose):
    """Loads `state` into `model`, every parameter but the rotary buffers, or one error naming
    the file."""
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:
        raise SystemExit(f"distill: {path} does not match {whose} shape: {error}")
    if unexpected or [key for key in missing if "rotary" not in key]:
        raise SystemExit(f"distill: {path} does not match {whose} shape: missing {missing}, "
                         f"unexpected {unexpected}")


def read_draft_gguf(path):
    """A gguf.GGUFReader of `path`, or one error naming the file."""
    import gguf
    try:
        return gguf.GGUFReader(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"distill: {path} is not a GGUF file: {error}")


def read_feature_draft_gguf(path):
    """The reader of `path`, refused in one line naming it when it is not a feature draft."""
    reader = read_draft_gguf(path)
    if "specrun.feature_width" not in reader.fields:
        raise SystemExit(f"distill: {path} is not a feature draft (no specrun.feature_width)")
    return reader


def load_feature_draft_gguf(draft, path, reader=None):
    """The inverse of export_features, into `draft` (a FeatureDraft): its Q8_0 matrices
    dequantised; the head, the target's own reduced, is not the draft's to train and is left."""
    if reader is None:
        reader = read_feature_draft_gguf(path)
    state = gguf_draft_state(reader, path, feature_draft_tensor_names(draft.config),
                             "a feature draft that export-features wrote")
    load_draft_state(draft, state, path, "the feature draft's")


def check_feature_draft(args):
    """Refuses, in one line naming the file, an --init-from that is not a feature draft of this
    target's shape as export-features writes it: distill.sh --from asks before the target answers
    anything (the answers take the better part of an hour)."""
    if not args.init_from:
        raise SystemExit("distill: check-feature-draft needs --init-from FILE")
    # What is no feature draft at all is refused before the target converts (about 25 s).
    reader = read_feature_draft_gguf(args.init_from)
    load_feature_draft_gguf(FeatureDraft(target_config(args)), args.init_from, reader)
    print(f"distill: {args.init_from} is a feature draft of the target's shape")


def exported_head_token_ids(path):
    """The tokens an exported draft's reduced head scores (specrun.output_token_ids), so that a
    draft trained further keeps its head whatever answers it trained on."""
    field = read_draft_gguf(path).fields.get("specrun.output_token_ids")
    if field is None:
        raise SystemExit(f"distill: {path} has no reduced head (no specrun.output_token_ids)")
    ids = [int(field.parts[index][0]) for index in field.data]
    log(f"reduced head: the {len(ids)} tokens of {path}")
    return ids


def export_features(args):
    """The feature draft (DIR/feature-draft.pt) as a GGUF file that specrun loads: one llama
    layer of the target's shape, specrun.feature_width, its narrow token embedding and the two
    input projections (token_proj, feature_proj), Q8_0 matrices, f32 norms, and as its head the
    target's own (tied) head reduced to --head-tokens tokens (or those --head-from's scores); the
    target's tokenizer keys copied verbatim."""
    if not args.out:
        raise SystemExit("distill: export-features needs --out FILE")
    # A --head-from without a reduced head is refused before anything loads or is written.
    ids = exported_head_token_ids(args.head_from) if args.head_from else None
    target = load_target(args)
    config = target.config
    saved = torch.load(os.path.join(args.work, "feature-draft.pt"))
    draft = FeatureDraft(config)
    draft.load_state_dict(saved["state"])
    writer = draft_gguf_writer(args.out, args.target,
                               "SmolLM2-135M-Instruct feature draft (specrun distilled)", config, 1)
    writer.add_uint32("specrun.feature_width", config.hidden_size)
    state = {name: tensor.float() for name, tensor in draft.state_dict().items()}

    def matrix(name, tensor):
        write_q8_0(writer, name, tensor)

    for gguf_name, name, heads in feature_draft_tensor_names(config):
        tensor = state[name]
        if tensor.dim() == 1:  # norms, in f32
            writer.add_tensor(gguf_name, tensor.numpy())
        else:
            matrix(gguf_name, interleave_rope(tensor, heads) if heads else tensor)
    if ids is None:
        ids = head_token_ids(args.work, args.head_tokens)
    matrix("output.weight", target.lm_head.weight.detach().float()[ids])
    writer.add_array("specrun.output_token_ids", ids)
    log(f"the feature draft of step {saved['step']}")
    finish_gguf(writer, args.out)


# ---------------------------------------------------------------------------------------------
# evaluate, export


def load_draft(path, args=None):
    """A draft.pt that train saved, or a draft.gguf that export wrote (its Q8_0 matrices
    dequantised; its reduced head dropped, the head being tied to the embedding in training; the
    target's configuration, from args, gives the rest): the model, and what was saved with it."""
    from transformers import LlamaConfig, LlamaForCausalLM
    if path.endswith(".gguf"):
        return load_draft_gguf(path, args), {"step": 0, "from": path}
    saved = torch.load(path)
    config = LlamaConfig.from_dict(saved["config"])
    draft = LlamaForCausalLM(config)
    draft.load_state_dict(saved["state"])
    return draft, saved


def load_draft_gguf(path, args):
    """The inverse of export: a LlamaForCausalLM with the GGUF draft's weights."""
    import gguf
    from transformers import LlamaForCausalLM
    if args is None:
        raise SystemExit("distill: a GGUF draft needs --target for its configuration")
    draft = LlamaForCausalLM(draft_config(target_config(args)))
    config = draft.config
    state = gguf_draft_state(gguf.GGUFReader(path), path, draft_tensor_names(config),
                             "a draft that export wrote")
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    load_draft_state(draft, state, path, "the draft's")
    return draft


def evaluate(args):
    """Held-out loss and argmax agreement of the saved draft, as trained and with its weights
    rounded as the export stores them (Q8_0), and on the target's greedy answers to questions on
    topics it never trained on (new_topic_items; needs --specrun), into DIR/metrics.json."""
    import gguf
    torch.set_num_threads(args.threads)
    draft, saved = load_draft(os.path.join(args.work, "draft.pt"))
    _, held_out = load_split(args.work, 512)
    new_topics = new_topic_items(args, 512)
    metrics = {"float": held_out_metrics(draft, held_out, args.tokens_per_step),
               "new_topics": held_out_metrics(draft, new_topics, args.tokens_per_step)["greedy"]}
    with torch.no_grad():
        for name, parameter in draft.named_parameters():
            if parameter.dim() == 2:
                data = parameter.detach().float().numpy()
                codes = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
                parameter.copy_(torch.from_numpy(
                    gguf.quants.dequantize(codes, gguf.GGMLQuantizationType.Q8_0)).view_as(parameter))
    metrics["q8_0"] = held_out_metrics(draft, held_out, args.tokens_per_step)
    metrics["step"] = saved["step"]
    with open(os.path.join(args.work, "history.json")) as file:
        metrics["history"] = json.load(file)
    with open(os.path.join(args.work, "metrics.json"), "w") as file:
        json.dump(metrics, file, indent=1)
    log(f"held out: {json.dumps({k: metrics[k] for k in ['float', 'q8_0', 'new_topics']})}")


def lookup_continuation(text, min_ngram, max_ngram):
    """What followed the latest earlier occurrence of the longest suffix n-gram of `text`
    (max_ngram down to min_ngram tokens), or None: specrun's lookup_continuation."""
    for n in range(min(max_ngram, len(text) - 1), min_ngram - 1, -1):
        suffix = text[len(text) - n:]
        for start in range(len(text) - n - 1, -1, -1):
            if text[start:start + n] == suffix:
                return text[start + n]
    return None


def lookup(args):
    """Teacher-forced agreement on the new-topic answers (new_topic_items) of the saved draft
    (its reduced head, as exported) and of the target drafting for itself: each model's argmax
    alone, and with prompt lookup's token in its place wherever the text so far ends in an n-gram
    of `min` to 3 tokens seen before and the model's top probability is below `below` (the rule
    specrun applies while lookup wins its contests). Prints one line per model and rule."""
    torch.set_num_threads(args.threads)
    draft, _ = load_draft(os.path.join(args.work, "draft.pt"))
    draft.eval()
    target = load_target(args)
    head = torch.tensor(head_token_ids(args.work, args.head_tokens))
    items = new_topic_items(args, 512)
    rules = [(0, 1.0), (1, 0.8), (2, 0.8), (2, 1.01)]  # (min n-gram, below); 0: no lookup
    for name, model, reduced in (("draft", draft, head), ("target", target, None)):
        agree = {rule: 0 for rule in rules}
        total = 0
        with torch.no_grad():
            for ids, start, _ in items:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
                    logits = model.lm_head(hidden[start - 1:-1]).float()
                if reduced is not None:
                    logits = logits[:, reduced]
                top, best = logits.softmax(-1).max(-1)
                tokens = reduced[best] if reduced is not None else best
                text = ids.tolist()
                for k in range(len(text) - start):
                    truth = text[start + k]
                    total += 1
                    for min_ngram, below in rules:
                        guess = int(tokens[k])
                        if min_ngram and float(top[k]) < below:
                            looked_up = lookup_continuation(text[:start + k], min_ngram, 3)
                            if looked_up is not None:
                                guess = looked_up
                        agree[(min_ngram, below)] += guess == truth
        for (min_ngram, below), count in agree.items():
            rule = f"lookup {min_ngram}-3-grams below {below}" if min_ngram else "alone"
            log(f"{name}, {rule}: agreement {count / total:.3f} over {total} answer tokens")


def head_token_ids(work, count):
    """The `count` tokens most frequent in the training split's answers (ties to the lower id),
    in increasing order; logs the share of held-out answer tokens they cover."""
    import collections
    records = load_records(work)
    train_counts, held_out = collections.Counter(), []
    for index, record in enumerate(records):
        if is_held_out(index):
            held_out.extend(record["answer"])
        else:
            train_counts.update(record["answer"])
    ranked = sorted(train_counts, key=lambda token: (-train_counts[token], token))[:count]
    chosen = set(ranked)
    coverage = sum(token in chosen for token in held_out) / max(len(held_out), 1)
    log(f"reduced head: {len(ranked)} tokens (of {len(train_counts)} in the training answers) "
        f"cover {coverage:.4f} of the held-out answer tokens")
    return sorted(ranked)


def interleave_rope(weight, heads):
    """Hugging Face's rotate-half rows of q/k to GGUF's interleaved pairs, per head."""
    rows, columns = weight.shape
    return (weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2)
            .reshape(rows, columns))


def deinterleave_rope(weight, heads):
    """The inverse of interleave_rope."""
    rows, columns = weight.shape
    return (weight.reshape(heads, rows // heads // 2, 2, columns).swapaxes(1, 2)
            .reshape(rows, columns))


def draft_tensor_names(config):
    """(GGUF name, Hugging Face name, heads) for each of the draft's tensors, in the order export
    writes them; heads is the head count whose q/k rows GGUF interleaves for rotary pairs, else
    None. The output projection is tied to the embedding (export may write a reduced one)."""
    names = [("token_embd.weight", "model.embed_tokens.weight", None),
             ("output_norm.weight", "model.norm.weight", None)]
    for i in range(config.num_hidden_layers):
        block, prefix = f"blk.{i}.", f"model.layers.{i}."
        names += [(block + "attn_norm.weight", prefix + "input_layernorm.weight", None),
                  (block + "ffn_norm.weight", prefix + "post_attention_layernorm.weight", None),
                  (block + "attn_q.weight", prefix + "self_attn.q_proj.weight",
                   config.num_attention_heads),
                  (block + "attn_k.weight", prefix + "self_attn.k_proj.weight",
                   config.num_key_value_heads),
                  (block + "attn_v.weight", prefix + "self_attn.v_proj.weight", None),
                  (block + "attn_output.weight", prefix + "self_attn.o_proj.weight", None),
                  (block + "ffn_gate.weight", prefix + "mlp.gate_proj.weight", None),
                  (block + "ffn_up.weight", prefix + "mlp.up_proj.weight", None),
                  (block + "ffn_down.weight", prefix + "mlp.down_proj.weight", None)]
    return names


def draft_gguf_writer(path, target_path, name, config, layers):
    """A GGUF writer for a draft of `config`'s shape with `layers` layers: the llama architecture
    keys, and the target's tokenizer keys copied verbatim (so the pair check sees one tokenizer)."""
    import gguf
    reader = gguf.GGUFReader(target_path)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(reader.fields["llama.rope.freq_base"].contents()))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub_type)
    return writer


def write_q8_0(writer, name, tensor):
    """A matrix as Q8_0."""
    import gguf
    codes = gguf.quants.quantize(tensor.contiguous().numpy(), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor(name, codes, raw_shape=codes.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def finish_gguf(writer, path):
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    log(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")


def export(args):
    """The draft as a GGUF file that specrun loads: llama architecture keys for its shape, the
    target's tokenizer keys copied verbatim (so the pair check sees one tokenizer), Q8_0 matrices
    and f32 norms; with --head-tokens, an output projection reduced to those tokens
    (specrun.output_token_ids; llama.cpp, which wants a row per token, cannot load that file)."""
    if not args.out:
        raise SystemExit("distill: export needs --out FILE")
    draft, saved = load_draft(os.path.join(args.work, "draft.pt"))
    config = draft.config
    writer = draft_gguf_writer(args.out, args.target,
                               "SmolLM2-135M-Instruct draft (specrun distilled)", config,
                               config.num_hidden_layers)
    state = {name: tensor.float() for name, tensor in draft.state_dict().items()}

    def matrix(name, tensor):
        write_q8_0(writer, name, tensor)

    for gguf_name, hf_name, heads in draft_tensor_names(config):
        weight = state[hf_name]
        if weight.dim() == 1:  # norms stay f32
            writer.add_tensor(gguf_name, weight.numpy())
            continue
        matrix(gguf_name, interleave_rope(weight, heads) if heads else weight)
        if gguf_name == "token_embd.weight" and args.head_tokens:
            # A reduced head: the draft scores only the tokens the target's training answers use
            # most (its output projection, tied in training, is those rows of the embedding), which
            # makes its step cheaper; a token outside is never proposed, and the target supplies it.
            ids = head_token_ids(args.work, args.head_tokens)
            matrix("output.weight", weight[ids])
            writer.add_array("specrun.output_token_ids", ids)
    finish_gguf(writer, args.out)


# ---------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["generate", "train", "evaluate", "lookup", "export", "store-features",
                                           "train-features", "export-features",
                                           "check-feature-draft"])
    parser.add_argument("--target", required=True, help="the target's GGUF file")
    parser.add_argument("--work", required=True, help="folder for data, checkpoints and logs")
    parser.add_argument("--out", help="export: the draft's GGUF file")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--questions", type=int, default=9600, help="generate: how many")
    parser.add_argument("--batch", type=int, default=48,
                        help="generate, evaluate: requests at once")
    parser.add_argument("--max-new-tokens", type=int, default=192,
                        help="generate, evaluate: answer cap")
    parser.add_argument("--specrun", default="build/bin/specrun",
                        help="generate, evaluate: the binary that runs the target")
    parser.add_argument("--specrun-args", nargs="*", default=[],
                        help="generate, evaluate: more flags for it")
    parser.add_argument("--steps", type=int, default=1200, help="train: optimizer steps")
    parser.add_argument("--tokens-per-step", type=int, default=4096, help="train: batch size")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="train: peak")
    parser.add_argument("--init-from",
                        help="train: start from this draft.pt or exported draft.gguf, not the "
                        "target")
    parser.add_argument("--kl-weight", type=float, default=0.0,
                        help="train: weight of KL(target || draft) on the target's own "
                        "distributions (computed by the target as it trains), the rest "
                        "cross-entropy on the target's tokens; 0: cross-entropy alone")
    parser.add_argument("--stored-features", action="store_true",
                        help="train-features: read the target's features from store-features' "
                        "files rather than computing them each step")
    parser.add_argument("--evaluate-every", type=int, default=100,
                        help="train, train-features: steps between held-out evaluations")
    parser.add_argument("--new-topics", type=int, default=len(chat_prompts.NEW_TOPICS),
                        help="train, train-features, evaluate: how many of the new-topic "
                        "questions the held-out metrics include (default all)")
    parser.add_argument("--head-tokens", type=int, default=16384,
                        help="export: tokens the draft's head scores (0: the whole vocabulary)")
    parser.add_argument("--head-from",
                        help="export-features: the head scores the tokens this exported draft's "
                             "does, rather than the answers' most frequent")
    parser.add_argument("--depth", type=int, default=2,
                        help="train-features: drafts in a row the draft trains to make, each past "
                             "the first reading its own output features (weights halving)")
    args = parser.parse_args()
    if args.depth < 1:
        parser.error(f"--depth takes at least 1, got {args.depth}")
    if args.new_topics < 1:
        parser.error(f"--new-topics takes at least 1, got {args.new_topics}")
    if not os.path.isfile(args.target):
        parser.error(f"--target {args.target}: no such file")
    os.makedirs(args.work, exist_ok=True)
    globals()[args.step.replace("-", "_")](args)


if __name__ == "__main__":
    main()
