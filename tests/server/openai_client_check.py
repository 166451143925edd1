"""Drives a running `specrun serve` with the official OpenAI Python client.

Usage: openai_client_check.py BASE_URL MODEL

Checks, with the client's own parsing: completions and chat completions, streamed (with
stream_options.include_usage) and not, the stream's pieces adding up to the whole response for the
same seed, usage counts, and the client's exception classes for a refused model and a refused
field. Prints one JSON object (the greedy completion's text, for comparison with the CLI) and
exits 0, or prints what failed and exits 1.
"""
import json
import sys

import openai


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
        client.completions.create(model=model, prompt="x", max_tokens=1, n=2)
        failures.append("n=2 was accepted")
    except openai.BadRequestError as error:
        check("'n'" in str(error), "the n refusal names the field")
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
