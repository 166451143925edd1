"""Drives a running `specrun serve` with the official OpenAI Python client.

Usage: openai_client_check.py BASE_URL MODEL

Checks, with the client's own parsing: completions and chat completions, streamed (with
stream_options.include_usage) and not, the stream's pieces adding up to the whole response for the
same seed, usage counts, logprobs in both endpoints' shapes, n=2, response_format json_schema
(the output validated by jsonschema where it is installed), tools with tool_choice "required"
streamed (the arguments validated against the parameters), and the client's exception classes for
a refused model and a refused field. Prints one JSON object (the greedy completion's text, for comparison with the CLI) and
exits 0, or prints what failed and exits 1.
"""
import json
import sys

import openai

try:
    import jsonschema
except ImportError:  # validated by hand below where it is missing
    jsonschema = None


def valid(document, schema):
    """Whether `document` validates against `schema` (jsonschema, or by hand for the two flat
    object schemas above where it is not installed)."""
    if jsonschema is not None:
        try:
            jsonschema.validate(document, schema)
            return True
        except jsonschema.ValidationError:
            return False
    if not isinstance(document, dict) or set(document) != set(schema["required"]):
        return False
    for key, rule in schema["properties"].items():
        value = document[key]
        if rule["type"] == "string" and not (isinstance(value, str) and
                                             len(value) <= rule["maxLength"]):
            return False
        if rule["type"] == "integer" and not (isinstance(value, int) and
                                              rule["minimum"] <= value <= rule["maximum"]):
            return False
    return True


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    # Completions: whole, then streamed with the same seed.
    prompt = "def fib(n):"
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=32, temperature=0.8,
                                      seed=5)
    check(whole.object == "text_completion", "completion object")
    check(whole.choices[0].finish_reason == "length", "completion finish_reason")
    check(whole.usage.completion_tokens == 32, "completion usage")
    pieces = list(client.completions.create(model=model, prompt=prompt, max_tokens=32,
                                            temperature=0.8, seed=5, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].text for chunk in pieces if chunk.choices)
    check(text == whole.choices[0].text, "streamed completion equals the whole one")
    check(pieces[-1].usage is not None and pieces[-1].usage.total_tokens ==
          whole.usage.total_tokens, "streamed completion's usage chunk")

    # Chat completions.
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "Name a prime number."}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                          temperature=0.7, seed=9)
    check(chat.object == "chat.completion", "chat object")
    check(chat.choices[0].message.role == "assistant", "chat role")
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                            temperature=0.7, seed=9, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(content == chat.choices[0].message.content, "streamed chat equals the whole one")
    check(chunks[0].choices[0].delta.role == "assistant", "first chat chunk carries the role")
    check(chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens ==
          chat.usage.prompt_tokens, "streamed chat's usage chunk")

    # Refusals surface as the client's exceptions.
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        failures.append("an unknown model was accepted")
    except openai.NotFoundError:
        pass
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1, n=17)
        failures.append("n=17 was accepted")
    except openai.BadRequestError as error:
        check("'n'" in str(error), "the n refusal names the field")

    # Logprobs: completions' lists and chat's content entries, one per token.
    scored = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0,
                                       logprobs=2)
    lp = scored.choices[0].logprobs
    check(len(lp.tokens) == 8 and len(lp.token_logprobs) == 8 and len(lp.text_offset) == 8,
          "completion logprobs: one entry per token")
    check(all(len(top) <= 2 for top in lp.top_logprobs), "completion top_logprobs")
    scored_chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                                 temperature=0, logprobs=True, top_logprobs=2)
    content = scored_chat.choices[0].logprobs.content
    check(len(content) == 8, "chat logprobs: one entry per token")
    check(all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 and
              isinstance(entry.bytes, list) for entry in content), "chat logprob entries")

    # n=2: two choices, indexed.
    two = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=1.0,
                                    seed=3, n=2)
    check([c.index for c in two.choices] == [0, 1], "n=2 gives choices 0 and 1")
    check(two.usage.completion_tokens == 16, "n=2 usage sums the choices")

    # Structured output: the answer validates against the schema.
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 8},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    shaped = client.chat.completions.create(
        model=model, messages=messages, max_tokens=200, seed=2,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": schema, "strict": True}},
        extra_body={"ignore_eos": False})
    check(valid(json.loads(shaped.choices[0].message.content), schema),
          "response_format json_schema output validates")

    # tool_choice "required", streamed: the call's arguments validate against its parameters.
    parameters = {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 10},
                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "days"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": parameters}}]
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(
            model=model, messages=messages, max_tokens=400, seed=4, tools=tools,
            tool_choice="required", parallel_tool_calls=False, stream=True,
            extra_body={"ignore_eos": False}):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.function.name:
                    call["name"] = delta.function.name
                call["arguments"] += delta.function.arguments or ""
    check(finish == "tool_calls" and len(calls) == 1, "tool_choice required streams one call")
    for call in calls.values():
        check(call["name"] == "get_weather" and valid(json.loads(call["arguments"]), parameters),
              "the call's arguments validate against its parameters")
    models = client.models.list()
    check([m.id for m in models.data] == [model], "models list")

    greedy = client.completions.create(model=model, prompt=prompt, max_tokens=24, temperature=0)
    if failures:
        print("; ".join(failures))
        return 1
    print(json.dumps({"greedy": greedy.choices[0].text}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
