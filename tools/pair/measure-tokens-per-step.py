#!/usr/bin/env python3
"""Tokens a target step brings, by draft and speculation shape, for the chat demo's pair.

Each draft (--draft, repeatable) drafts for SmolLM2-135M-Instruct on the five held-out demo
questions and the questions on new topics (chat_prompts.HELD_OUT + NEW_TOPICS), at each fixed
shape (--shape GAMMA:ALTERNATES, repeatable), greedy and at T 0.7 (top-p 0.9), with the demo's
quantization and shared-noise verification at seed 1: the tokens and steps are the same on every
run on a machine with the same kernels, so two drafts compare without the machine's noise, which
a speedup measured on a shared VM carries (tools/pair/measure-demo.sh measures that). Writes
--out as JSON: per draft, shape and temperature, each question's tokens per step and their mean.

  tools/pair/measure-tokens-per-step.py --draft A.gguf --draft B.gguf --shape 2:1 --shape 3:0 \\
      --out bench/results/FILE.json
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "pair"))
import chat_prompts  # noqa: E402


def specrun_arguments(target, draft, question, temperature, gamma, alternates):
    """specrun's arguments for one answer of at most 200 tokens, as the demo quantizes."""
    return ["--target", target, "--draft", draft, "--draft-quantize", "int8", "--quantize-lm-head",
            "--activations", "int8", "--max-tokens", "200", "--chat", "--prompt", question,
            "--temperature", str(temperature), "--top-p", "0.9", "--seed", "1", "--controller",
            "fixed", "--gamma", str(gamma), "--draft-alternates", str(alternates)]


def run(specrun, target, draft, question, temperature, gamma, alternates):
    """(tokens, steps) of one answer."""
    with tempfile.NamedTemporaryFile(suffix=".json") as stats_file:
        command = [specrun, *specrun_arguments(target, draft, question, temperature, gamma,
                                               alternates), "--quiet", "--stats-json",
                   stats_file.name]
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:
            raise SystemExit(f"measure-tokens-per-step: {' '.join(command)} failed:\n"
                             f"{done.stderr}")
        stats = json.load(stats_file)
    return stats["tokens_generated"], stats["steps"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="append", required=True, help="a draft's GGUF file")
    parser.add_argument("--shape", action="append", required=True,
                        help="GAMMA:ALTERNATES, a fixed gamma and alternates per draft")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--specrun", default=os.path.join(ROOT, "build", "bin", "specrun"))
    args = parser.parse_args()
    shapes = []
    for shape in args.shape:
        gamma, _, alternates = shape.partition(":")
        if not (gamma.isdigit() and alternates.isdigit() and int(gamma) > 0):
            parser.error(f"--shape takes GAMMA:ALTERNATES (e.g. 2:1), got '{shape}'")
        shapes.append((int(gamma), int(alternates)))
    for draft in args.draft:
        if not os.path.isfile(draft):
            parser.error(f"--draft {draft}: no such file")
    target = subprocess.run(["bash", os.path.join(ROOT, "tools", "python", "smollm2-path.sh")],
                            check=True, capture_output=True, text=True).stdout.strip()
    questions = chat_prompts.HELD_OUT + chat_prompts.new_topic_questions()
    results = []
    for gamma, alternates in shapes:
        for temperature in (0.0, 0.7):
            for draft in args.draft:
                per_question = []
                for question in questions:
                    tokens, steps = run(args.specrun, target, draft, question, temperature, gamma,
                                        alternates)
                    per_question.append(round(tokens / steps, 3))
                mean = sum(per_question) / len(per_question)
                print(f"gamma {gamma}, {alternates} alternates, T {temperature}, {draft}: "
                      f"{mean:.3f} tokens a step", flush=True)
                results.append({"draft": draft, "gamma": gamma, "alternates": alternates,
                                "temperature": temperature, "mean_tokens_per_step": round(mean, 4),
                                "tokens_per_step": per_question})
    with open(args.out, "w") as file:
        json.dump({"what": "tokens a target step brings at fixed speculation shapes "
                           "(tools/pair/measure-tokens-per-step.py): deterministic, shared-noise "
                           "verification at seed 1",
                   "machine": platform.processor() or platform.machine(),
                   "command": " ".join(["specrun", *specrun_arguments(
                       "SmolLM2-135M-Instruct.Q4_1.gguf", "DRAFT", "QUESTION", "T", "G", "A")]),
                   "questions": questions, "results": results}, file, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
