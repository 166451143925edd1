#!/usr/bin/env python3
"""Hugging Face transformers as the reference for the prompts of OpenAI chat requests.

  chat_request_reference.py --out FILE --tokenizers DIR

For each model under --tokenizers with a chat template in its tokenizer_config.json (llama3,
llama3_1, gemma3, qwen3, deepseek_v3), renders a fixed set of OpenAI chat request bodies the way
vLLM serves them: the messages converted as vLLM's chat_utils converts them (content flattened to
a string, text parts joined by newlines; an assistant's tool_calls kept, their function.arguments
JSON text parsed into objects, an empty list dropped; a tool message's tool_call_id and any
message's name kept), then tokenizer.apply_chat_template(messages, tools=..., tokenize=False,
add_generation_prompt=..., continue_final_message=..., **chat_template_kwargs). The bodies cover
tools (definitions with nested JSON Schema and Unicode), a history with assistant tool calls and
tool results, content beside calls, chat_template_kwargs (Qwen3's enable_thinking), and
continue_final_message. Writes FILE:

  {"models": {NAME: {"directory", "source", "bos_token", "eos_token"}},
   "cases": [{"model", "body", "output", "token_ids"} or {"model", "body", "error", "message"}]}

"token_ids" is the output encoded with add_special_tokens=False, as the server encodes it.
"""

import argparse
import copy
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MODELS = ["llama3", "llama3_1", "gemma3", "qwen3", "deepseek_v3"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city, in \u00b0C.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "e.g. Z\u00fcrich, \u6771\u4eac"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web; returns \"snippets\".",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {"site": {"type": "string"}},
                            "additionalProperties": False},
                "top_k": {"type": "integer", "minimum": 1, "default": 3},
            },
            "required": ["query"],
        },
    },
}
NO_PARAMETERS = {"type": "function", "function": {"name": "now"}}

USER = {"role": "user", "content": "What is the weather in Paris and in Z\u00fcrich?"}
CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather",
                      "arguments": "{\"city\": \"Z\u00fcrich\", \"unit\": \"celsius\"}"}},
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18\u00b0C, sunny"},
    {"role": "tool", "tool_call_id": "call_2",
     "content": [{"type": "text", "text": "12\u00b0C"}, {"type": "text", "text": "rain"}]},
]
ANSWER = {"role": "assistant", "content": "Paris: 18\u00b0C and sunny; Z\u00fcrich: 12\u00b0C, rain."}


def bodies():
    """The request bodies, as a client sends them."""
    history = [USER, CALLS] + RESULTS
    return [
        {"messages": [{"role": "user", "content": "Hello!"}]},
        {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": False},
        {"messages": [{"role": "system", "content": "Be brief."}, USER], "tools": [WEATHER]},
        {"messages": [USER], "tools": [WEATHER, SEARCH, NO_PARAMETERS]},
        {"messages": [USER], "tools": []},
        {"messages": history, "tools": [WEATHER]},
        {"messages": history + [ANSWER, {"role": "user", "content": "And tomorrow?"}],
         "tools": [WEATHER, SEARCH]},
        {"messages": history + [ANSWER], "tools": [WEATHER], "add_generation_prompt": False},
        # History without tools in the request.
        {"messages": history},
        # Content beside the calls; a call without arguments; an empty list of calls.
        {"messages": [USER, dict(CALLS, content="Let me look both up."), RESULTS[0]],
         "tools": [WEATHER]},
        {"messages": [{"role": "user", "content": "Time?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "c", "type": "function",
                           "function": {"name": "now", "arguments": ""}}]},
                      {"role": "tool", "tool_call_id": "c", "content": "12:00"}],
         "tools": [NO_PARAMETERS]},
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "hello", "tool_calls": []},
                      {"role": "user", "content": "bye", "name": "ann"}]},
        # chat_template_kwargs.
        {"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [USER], "tools": [WEATHER], "chat_template_kwargs": {"enable_thinking": False}},
        {"messages": [USER], "chat_template_kwargs": {"enable_thinking": True, "unused": [1, 2]}},
        # continue_final_message.
        {"messages": [USER, {"role": "assistant", "content": "In Paris it is"}],
         "add_generation_prompt": False, "continue_final_message": True},
        {"messages": [USER, {"role": "assistant", "content": "The answer:  \n"}],
         "add_generation_prompt": False, "continue_final_message": True},
        {"messages": [USER, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nIt is"}],
         "add_generation_prompt": False, "continue_final_message": True},
    ]


def vllm_messages(messages):
    """The messages as vLLM's chat_utils gives them to apply_chat_template (string content)."""
    converted = []
    for message in messages:
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            text = "\n".join(part["text"] for part in content)
        result = {"role": message["role"], "content": text}
        if message["role"] == "assistant" and message.get("tool_calls") is not None:
            result["tool_calls"] = copy.deepcopy(message["tool_calls"])
        if message["role"] == "tool" and "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            result["name"] = message["name"]
        converted.append(result)
    for message in converted:
        calls = message.get("tool_calls")
        if message["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del message["tool_calls"]
            continue
        for call in calls:
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    call["function"]["arguments"] = json.loads(arguments)
                except json.JSONDecodeError:
                    call["function"]["arguments"] = {}
            elif not isinstance(arguments, (dict, list)):
                call["function"]["arguments"] = {}
    return converted


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizers", required=True)
    args = parser.parse_args()

    try:
        from transformers import AutoTokenizer as Tokenizer
    except ImportError:
        # AutoTokenizer imports torch; the tokenizer.json class renders and encodes alike.
        from transformers import PreTrainedTokenizerFast as Tokenizer

    models = {}
    cases = []
    for name in MODELS:
        directory = os.path.join(args.tokenizers, name)
        config_path = os.path.join(directory, "tokenizer_config.json")
        if not os.path.exists(config_path):
            continue
        with open(config_path, encoding="utf-8") as config_file:
            source = json.load(config_file).get("chat_template")
        if not source:
            continue
        tokenizer = Tokenizer.from_pretrained(directory)
        models[name] = {"directory": directory, "source": source,
                        "bos_token": tokenizer.bos_token or "",
                        "eos_token": tokenizer.eos_token or ""}
        for body in bodies():
            case = {"model": name, "body": body}
            try:
                output = tokenizer.apply_chat_template(
                    vllm_messages(body["messages"]), tools=body.get("tools"), tokenize=False,
                    add_generation_prompt=body.get("add_generation_prompt", True),
                    continue_final_message=body.get("continue_final_message", False),
                    **body.get("chat_template_kwargs", {}))
                case["output"] = output
                case["token_ids"] = tokenizer.encode(output, add_special_tokens=False)
            except Exception as error:  # the template raised: that is a case too
                case["error"] = type(error).__name__
                case["message"] = str(error)
            cases.append(case)
    if not models:
        raise SystemExit("no chat template found under " + args.tokenizers)
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump({"models": models, "cases": cases}, out, ensure_ascii=False)
    raised = sum(1 for case in cases if "error" in case)
    print(f"{len(cases)} requests over {len(models)} templates, {raised} raised", file=sys.stderr)


if __name__ == "__main__":
    main()
