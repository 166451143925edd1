#!/usr/bin/env python3
"""tools/check-docs.py on trees made to fail: each break must fail its check with one line naming
the page, the line and what is wrong, and the same tree mended must pass (ctest docs_checks_fail)."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools",
                      "check-docs.py")
GOOD_README = "# Project\n\nSee [the guide](docs/guide.md#setting-up).\n"
GOOD_GUIDE = "# Guide\n\n## Setting up\n\nBack to the [README](../README.md).\n"
TOML = "# The defaults.\n\n[model]\n# What to load.\ntarget = \"\"\n"


def tree(root, readme=GOOD_README, guide=GOOD_GUIDE, toml=TOML, configuration=None):
    # docs/server.md: the configuration page links it.
    for path, text in (("README.md", readme), ("bench/README.md", "# Measurements\n"),
                       ("docs/guide.md", guide), ("docs/server.md", "# Server\n"),
                       ("configs/default.toml", toml)):
        os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as file:
            file.write(text)
    if configuration is not None:
        with open(os.path.join(root, "docs/configuration.md"), "w", encoding="utf-8") as file:
            file.write(configuration)


def check(root, *arguments):
    return subprocess.run([sys.executable, SCRIPT, *arguments], capture_output=True, text=True,
                          env=dict(os.environ, SPECRUN_DOCS_ROOT=root))


def main():
    failures = []

    def expect(root, arguments, code, fragments, what):
        result = check(root, *arguments)
        missing = [f for f in fragments if f not in result.stderr]
        if result.returncode != code or missing:
            failures.append(f"{what}: exit {result.returncode} (want {code}), missing {missing}: "
                            f"{result.stderr}")

    with tempfile.TemporaryDirectory() as root:
        tree(root)
        check(root, "configuration", "--write")
        expect(root, ["links"], 0, [], "a good tree's links")
        expect(root, ["configuration"], 0, [], "a good tree's configuration page")
        for readme, fragments, what in (
                ("[a](docs/missing.md)\n", ["README.md:1", "no such file docs/missing.md"],
                 "a missing file"),
                ("\n[a](docs/guide.md#nowhere)\n", ["README.md:2", "no heading #nowhere"],
                 "a missing heading"),
                ("[a](https://example.org/)\n", ["README.md:1", "leaves the repository"],
                 "an address outside"),
                ("[a](../outside.md)\n", ["README.md:1", "points outside the repository"],
                 "a path outside")):
            tree(root, readme=readme)
            expect(root, ["links"], 1, fragments, what)
        # Links in code are examples, not links.
        tree(root, readme="```\n[a](docs/missing.md)\n```\n`[b](nowhere.md)`\n")
        expect(root, ["links"], 0, [], "links inside code")
        # The configuration page drifts from the TOML file it was written from.
        tree(root, toml=TOML + "# Another.\ndraft = \"\"\n")
        expect(root, ["configuration"], 1,
               ["docs/configuration.md:1", "differs from configs/default.toml"],
               "a configuration page behind its TOML file")
        # A recipe comment not above a fenced block, and an unknown recipe option.
        for readme, fragment in (("<!-- recipe: x -->\ntext\n", "must stand right above"),
                                 ("<!-- recipe: x sideways -->\n```sh\ntrue\n```\n",
                                  "unknown recipe option sideways")):
            tree(root, readme=readme)
            result = check(root, "recipes", root, sys.executable)
            if result.returncode == 0 or fragment not in result.stdout + result.stderr:
                failures.append(f"recipe {fragment}: exit {result.returncode}: {result.stderr}")
        # A recipe that fails names itself and its line.
        tree(root, readme="# R\n\n<!-- recipe: broken -->\n```sh\nexit 3\n```\n")
        expect(root, ["recipes", root, sys.executable], 1,
               ["README.md:4: recipe broken exited 3"], "a failing recipe")
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{len(failures)} checks failed" if failures else "every break caught", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
