"""Drives the chat page of a running `specrun serve` (GET /) in headless Chromium through Selenium.

Usage: chat_page_check.py BASE_URL QUESTION [--max-tokens N] [--screenshot PATH]

Loads the page, sets the temperature to 0, types QUESTION into the text box and presses Enter,
waits for the streamed answer to finish and reads it back from the page. Checks that it is not
empty and is the server's own answer: the same request made through the API, not streamed, gives
the same text (temperature 0 is greedy). Checks that the page coloured the answer by origin (text
from drafts the target accepted, where the server's final figures count any, and text the target
produced itself) and that its figures show an acceptance rate and tokens per second. With
--screenshot it saves a PNG of the page, the answer on it. Prints one JSON object (the answer and
the figures as shown) and exits 0, or prints what failed and exits 1.

Chromium and its driver are Debian's (/usr/bin/chromium, /usr/bin/chromedriver), named explicitly
so that Selenium never looks for (or downloads) a browser or driver of its own.
"""
import argparse
import json
import os
import re
import sys
import urllib.request

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def api(base_url, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base_url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def browser(width, height):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     "--force-device-scale-factor=1", f"--window-size={width},{height}"]:
        options.add_argument(argument)
    return webdriver.Chrome(options=options,
                            service=webdriver.ChromeService(executable_path=CHROMEDRIVER))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("question")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--screenshot")
    args = parser.parse_args()
    base_url = args.base_url.rstrip("/")
    # Selenium Manager is never needed with the driver named; offline, should anything ask it.
    os.environ["SE_OFFLINE"] = "true"
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    driver = browser(1000, 720)
    try:
        driver.get(base_url + "/")
        wait = WebDriverWait(driver, 120)
        # The page names the model once /v1/models lists it.
        model = api(base_url, "/v1/models")["data"][0]["id"]
        wait.until(lambda d: d.find_element(By.ID, "model").text == model)
        for field, value in [("temperature", "0"), ("max-tokens", str(args.max_tokens))]:
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        prompt = driver.find_element(By.ID, "prompt")
        prompt.send_keys(args.question)
        prompt.send_keys(Keys.ENTER)
        state = wait.until(lambda d: d.execute_script(
            "const answer = document.querySelector('.message.assistant');"
            "return answer && answer.dataset.state !== 'streaming' ? answer.dataset.state : null;"))
        page = driver.execute_script(
            "const answer = document.querySelector('.message.assistant');"
            "const pieces = [...answer.querySelectorAll('.content span')];"
            "return {text: answer.querySelector('.content').textContent,"
            "        draft: pieces.filter(p => p.dataset.origin === 'draft').length,"
            "        target: pieces.filter(p => p.dataset.origin === 'target').length,"
            "        acceptance: answer.querySelector('.acceptance').textContent,"
            "        speed: answer.querySelector('.speed').textContent,"
            "        tokens: answer.querySelector('.tokens').textContent,"
            "        error: answer.querySelector('.error').textContent,"
            "        question: document.querySelector('.message.user').textContent};")
        check(state == "done", f"the answer ended as '{state}': {page['error']}")
        check(page["question"] == args.question, "the question as typed is on the page")
        check(page["text"] != "", "the answer on the page is not empty")

        whole = api(base_url, "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": args.question}],
            "max_tokens": args.max_tokens, "temperature": 0})
        expected = whole["choices"][0]["message"]["content"]
        check(page["text"] == expected,
              f"the page's answer {page['text']!r} is the API's {expected!r}")
        check(page["target"] > 0, "the page shows text the target produced itself")
        if whole["speculative"]["accepted"] > 0:
            check(page["draft"] > 0, "the page shows text from drafts the target accepted")
        check(re.fullmatch(r"acceptance \d+(\.\d+)?% \(\d+ of \d+ drafts\)", page["acceptance"])
              is not None, f"the acceptance rate is a number: {page['acceptance']!r}")
        check(re.fullmatch(r"\d+(\.\d+)? tokens/s", page["speed"]) is not None,
              f"the speed is a number: {page['speed']!r}")
        if args.screenshot:
            driver.save_screenshot(args.screenshot)
    finally:
        driver.quit()
    if failures:
        print("; ".join(failures))
        return 1
    print(json.dumps({"answer": page["text"], "acceptance": page["acceptance"],
                      "speed": page["speed"], "tokens": page["tokens"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
