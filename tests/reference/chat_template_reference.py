#!/usr/bin/env python3
"""Hugging Face transformers as the reference for specrun's chat templates.

  chat_template_reference.py --out DIR --tokenizers DIR [--smollm2 GGUF] [--count N] [--seed S]

For each model -- the tokenizer_config.json of llama3, llama3_1, gemma3, qwen3 and deepseek_v3
under --tokenizers, and SmolLM2-135M-Instruct's GGUF file (--smollm2) -- loads the tokenizer with
AutoTokenizer.from_pretrained offline, draws --count conversations (seeded: the same ones on every
run) and renders each with tokenizer.apply_chat_template(messages, tokenize=False,
add_generation_prompt=...). Writes DIR/NAME.json:

  {"name", "origin", "source": the template, "cases": [{"context", "output"} or
   {"context", "error", "message"}]}

"context" is exactly what the template was rendered with (captured from jinja2's Template.render:
the messages after transformers' clean-up, add_generation_prompt, tools and documents, and the
special-token strings), "output" the text transformers returned, "error" and "message" the type and
the text of the exception the template raised. An empty conversation, which apply_chat_template
refuses before rendering, is rendered through transformers' compiled template with the context of
the others.

The conversations mix valid and invalid role orders, with and without a system message, empty
content, Unicode (CJK, emoji, right-to-left text with its marks), content with leading and trailing
whitespace and newlines, Jinja-looking text, special tokens, thinking blocks, content given as a
list of parts, a missing content, conversations ending with the user or the assistant, and
add_generation_prompt true and false. No tools. The parts of a content list have their keys in
OpenAI's order (type, then text), which the context keeps: a template printing them shows it.
"""

import argparse
import copy
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

TOKENIZER_MODELS = ["llama3", "llama3_1", "gemma3", "qwen3", "deepseek_v3"]

TEXTS = [
    "Hello!",
    "What is the capital of France?",
    "Paris is the capital of France.",
    "",
    " ",
    "  leading and trailing spaces  ",
    "\n\nnewlines around\n\n",
    "\tTabbed\tcontent\t",
    "line one\nline two\r\nline three\rline four",
    "\u00a0non-breaking spaces\u00a0",
    "\u3000ideographic space\u3000",
    "\u2028line separator\u2029",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e2d\u6587\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "Emoji: \U0001F600 \U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467 \u2764\ufe0f",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u200f\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd\u200e mixed RTL",
    "Combining: e\u0301 a\u0308 n\u0303",
    "{{ x }} and {% if true %}jinja{% endif %} {# comment #}",
    "{{ raise_exception('no') }}",
    "'single' and \"double\" quotes, a backslash \\ and \\n escaped",
    "<|im_end|><|eot_id|><start_of_turn><end_of_turn><bos></s>",
    "<\uff5cUser\uff5c>fake<\uff5cAssistant\uff5c>",
    "<think>\nreasoning here\n</think>\n\nThe answer is 4.",
    "Some thoughts</think>final answer",
    "<think></think>",
    "</think>",
    "<tool_response>not a tool</tool_response>",
    "Control \x01\x02 characters \x7f and \x1b[0m",
    "A longer message. " * 40,
    "Zero-width\u200bspace and soft\u00adhyphen",
    "\ufeffbyte order mark",
    "Math: \u2211 x\u00b2 \u2264 \u221e, \u03c0 \u2248 3.14159",
]

SYSTEM_TEXTS = [
    "You are a helpful assistant.",
    "",
    "  Be concise.  \n",
    "\u4f60\u662f\u4e00\u4e2a\u6709\u5e2e\u52a9\u7684\u52a9\u624b\u3002",
    "Answer in JSON: {\"key\": \"value\"}",
    "{% raw %}not raw{% endraw %}",
]


def text(rng):
    return rng.choice(TEXTS)


def content(rng, role, unusual):
    """A message's content: a string, or in an `unusual` conversation sometimes a list of parts
    or nothing at all."""
    draw = rng.random() if unusual else 1.0
    if draw < 0.25:
        parts = [{"type": "text", "text": text(rng)}]
        if rng.random() < 0.5:
            parts.append({"type": "text", "text": text(rng)})
        return parts
    if draw < 0.4:
        return None  # apply_chat_template drops keys whose value is None
    if role == "system":
        return rng.choice(SYSTEM_TEXTS)
    return text(rng)


def message(rng, role, unusual):
    result = {"role": role}
    value = content(rng, role, unusual)
    if value is not None or rng.random() < 0.5:
        result["content"] = value
    if role == "assistant" and rng.random() < 0.08:
        result["reasoning_content"] = rng.choice(["Let me think.", "\nstep 1\nstep 2\n", ""])
    return result


def conversation(rng):
    """A list of messages: most in a valid order, some not; one in ten with unusual contents."""
    unusual = rng.random() < 0.1
    shape = rng.random()
    if shape < 0.72:
        messages = []
        if rng.random() < 0.4:
            messages.append(message(rng, "system", unusual))
        turns = rng.randint(1, 7)
        for turn in range(turns):
            messages.append(message(rng, "user" if turn % 2 == 0 else "assistant", unusual))
        return messages
    if shape < 0.95:
        roles = ["system", "user", "assistant", "user", "assistant"]
        return [message(rng, rng.choice(roles), unusual) for _ in range(rng.randint(1, 6))]
    return [message(rng, rng.choice(["developer", "user", "assistant", "narrator"]), unusual)
            for _ in range(rng.randint(1, 3))]


class Capture:
    """Records the keyword arguments of every jinja2 Template.render call."""

    def __init__(self):
        import jinja2.environment
        self.calls = []
        self._template = jinja2.environment.Template
        self._render = self._template.render
        capture = self

        def render(template, *args, **kwargs):
            capture.calls.append(copy.deepcopy(kwargs))
            return capture._render(template, *args, **kwargs)

        self._template.render = render

    def last(self):
        return self.calls[-1] if self.calls else None


def load_models(args):
    from transformers import AutoTokenizer

    models = []
    for name in TOKENIZER_MODELS:
        directory = os.path.join(args.tokenizers, name)
        config_path = os.path.join(directory, "tokenizer_config.json")
        if not os.path.exists(config_path):
            continue
        with open(config_path, encoding="utf-8") as config_file:
            source = json.load(config_file).get("chat_template")
        tokenizer = AutoTokenizer.from_pretrained(directory)
        models.append((name, f"{name}/tokenizer_config.json", source, tokenizer))
    if args.smollm2:
        import gguf

        reader = gguf.GGUFReader(args.smollm2)
        source = reader.fields["tokenizer.chat_template"].contents()
        tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(args.smollm2),
                                                  gguf_file=os.path.basename(args.smollm2))
        models.append(("smollm2", os.path.basename(args.smollm2), source, tokenizer))
    return models


def reference(name, origin, source, tokenizer, count, seed, capture):
    from transformers.utils.chat_template_utils import _compile_jinja_template

    if tokenizer.chat_template != source:
        raise SystemExit(f"{name}: the tokenizer's chat_template differs from {origin}'s")
    rng = random.Random(f"{seed}:{name}")
    cases = []
    template_context = None
    for index in range(count):
        messages = conversation(rng) if index > 0 else []
        add_generation_prompt = rng.random() < 0.5
        extra = {}
        if name == "qwen3" and rng.random() < 0.15:
            extra["enable_thinking"] = rng.random() < 0.5
        capture.calls.clear()
        try:
            if messages:
                output = tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)
                context = capture.last()
                template_context = template_context or context
            else:
                # apply_chat_template refuses an empty conversation before rendering; render the
                # template itself with the context transformers builds for any other.
                tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
                context = dict(capture.last(), messages=[],
                               add_generation_prompt=add_generation_prompt)
                capture.calls.clear()
                output = _compile_jinja_template(source).render(**context)
            cases.append({"context": context, "output": output})
        except Exception as error:  # the template raised: that is a case too
            context = capture.last()
            if context is None:
                raise SystemExit(f"{name}: transformers failed before rendering: {error!r}")
            cases.append({"context": context, "error": type(error).__name__,
                          "message": str(error)})
    return {"name": name, "origin": origin, "source": source, "cases": cases}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizers", required=True,
                        help="directory with llama3/, llama3_1/, gemma3/, qwen3/, deepseek_v3/")
    parser.add_argument("--smollm2", help="SmolLM2-135M-Instruct's GGUF file")
    parser.add_argument("--count", type=int, default=240)
    parser.add_argument("--seed", type=int, default=20240611)
    args = parser.parse_args()

    capture = Capture()
    os.makedirs(args.out, exist_ok=True)
    models = load_models(args)
    if not models:
        raise SystemExit("no tokenizer found under " + args.tokenizers)
    for name, origin, source, tokenizer in models:
        result = reference(name, origin, source, tokenizer, args.count, args.seed, capture)
        with open(os.path.join(args.out, name + ".json"), "w", encoding="utf-8") as out:
            json.dump(result, out, ensure_ascii=False)
        raised = sum(1 for case in result["cases"] if "error" in case)
        print(f"{name}: {len(result['cases'])} conversations, {raised} raised", file=sys.stderr)


if __name__ == "__main__":
    main()
