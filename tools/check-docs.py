#!/usr/bin/env python3
"""Keeps the documentation true to the repository (ctest runs each check, label cpu).

  check-docs.py links                 every link in README.md, docs/ and bench/README.md is
                                      relative, stays inside the repository and resolves: the file
                                      exists and a #fragment names a heading of it
  check-docs.py configuration         docs/configuration.md is what configs/default.toml says
  check-docs.py configuration --write writes docs/configuration.md from configs/default.toml
  check-docs.py recipes BUILD_DIR PYTHON [--device]
                                      runs the README's recipes, each fenced block after a
                                      `<!-- recipe: NAME [OPTION...] -->` comment, from the
                                      repository root, in order, with BUILD_DIR for build/ and a
                                      scratch folder for the paths they install to. Options:
                                      `background` starts a server the next recipes talk to;
                                      `python` runs the block with PYTHON; `needs=MODULE` skips it
                                      with one line where PYTHON cannot import MODULE (all
                                      skipped: exit 77); `device` marks a GPU recipe, run only
                                      with --device (and the others only without), where
                                      `stand-in=NAME:PATH,...` replaces checkpoints a GPU machine
                                      does not hold by small ones and `drop=FLAG` removes a flag
                                      the stand-ins cannot honour

Each failure is one line naming the file and line; the exit status is 1 if any failed.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

# The repository checked: this script's own, or SPECRUN_DOCS_ROOT (tests/check_docs_test.py gives it
# a tree of broken pages).
ROOT = os.environ.get("SPECRUN_DOCS_ROOT") or os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "bench/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md"))
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as file:
        return file.read()


def lines_outside_code(text):
    """(line number, line) of the text that is not inside a fenced code block."""
    inside = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield number, line


def slug(heading):
    """The anchor a Markdown renderer gives a heading (GitHub's rule: lower case, punctuation
    other than hyphens and underscores dropped, spaces become hyphens)."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    result = set()
    for _, line in lines_outside_code(read(path)):
        match = re.match(r"^#{1,6} (.*)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def check_links():
    failures = []
    for page in PAGES:
        for number, line in lines_outside_code(read(page)):
            line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
            for match in LINK.finditer(line):
                target = match.group(1) or match.group(2)
                where = f"{page}:{number}: link {target}"
                if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target):
                    failures.append(f"{where} leaves the repository (a user's clone has only "
                                    "the repository; name the package or project instead)")
                    continue
                path, _, fragment = target.partition("#")
                resolved = os.path.normpath(
                    os.path.join(os.path.dirname(page), path)) if path else page
                if resolved.startswith("..") or os.path.isabs(resolved):
                    failures.append(f"{where} points outside the repository")
                    continue
                if not os.path.exists(os.path.join(ROOT, resolved)):
                    failures.append(f"{where}: no such file {resolved}")
                    continue
                if fragment:
                    if not resolved.endswith(".md"):
                        failures.append(f"{where}: a #fragment of a file that is not Markdown")
                    elif fragment not in anchors(resolved):
                        failures.append(f"{where}: {resolved} has no heading #{fragment}")
    return failures


def configuration_page():
    """docs/configuration.md from configs/default.toml: its tables and keys, each with its
    default and the comment above it."""
    text = read("configs/default.toml")
    tomllib.loads(text)  # a file that does not parse is the failure to report, not a page
    out = [
        "# Configuration",
        "",
        "<!-- Written by `tools/check-docs.py configuration --write` from configs/default.toml;",
        "     the test docs_configuration fails when the two differ. Edit the TOML file. -->",
        "",
        "`specrun --config FILE` (and `specrun serve --config FILE`, `EngineConfig::from_toml`,",
        "`specrun_engine_create_from_toml`) reads a TOML file of the tables below; command-line",
        "flags override it. An unknown table or key, a value of the wrong type or out of range is",
        "one error naming the file, line and key. Every key of `[speculative]` and `[sampling]` is",
        "also a flag of the same name with dashes (`--draft-p-min`) and a field of the server's",
        "`speculative` object or request body ([server](server.md)). The file",
        "[`configs/default.toml`](../configs/default.toml) holds every key at its default.",
        "",
    ]
    comment = []
    previous = None
    preamble = True
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        if not stripped:
            if preamble:
                comment = []
            continue
        preamble = False
        header = re.match(r"^\[([A-Za-z_]+)\]$", stripped)
        if header:
            out += ([""] if out[-1] else []) + [f"## [{header.group(1)}]", ""]
            if comment:
                out += [" ".join(comment), ""]
            out += ["| key | default | meaning |", "|---|---|---|"]
            comment = []
            continue
        key, _, value = stripped.partition("=")
        # A key the comment above its neighbour already covers (gamma_min's covers gamma_max).
        meaning = " ".join(comment).replace("|", "\\|") or f"See `{previous}` above."
        out.append(f"| `{key.strip()}` | `{value.strip()}` | {meaning} |")
        previous = key.strip()
        comment = []
    return "\n".join(out) + "\n"


def check_configuration(write):
    page = configuration_page()
    path = os.path.join(ROOT, "docs/configuration.md")
    if write:
        with open(path, "w", encoding="utf-8") as file:
            file.write(page)
        return []
    if not os.path.exists(path) or read("docs/configuration.md") != page:
        return ["docs/configuration.md:1: differs from configs/default.toml; run "
                "tools/check-docs.py configuration --write"]
    return []


def recipes():
    """The README's recipes: (name, mode, line, code)."""
    found = []
    lines = read("README.md").split("\n")
    for index, line in enumerate(lines):
        match = re.match(r"^<!-- recipe: ([\w-]+)((?: \S+)*) -->$", line.strip())
        if not match:
            continue
        options = {}
        for option in match.group(2).split():
            key, _, value = option.partition("=")
            if key not in ("background", "python", "needs", "device", "stand-in", "drop"):
                raise SystemExit(f"README.md:{index + 1}: unknown recipe option {option}")
            options[key] = value
        start = index + 1
        if start >= len(lines) or not FENCE.match(lines[start]):
            raise SystemExit(f"README.md:{index + 1}: a recipe comment must stand right above "
                             "a fenced block")
        end = start + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        found.append((match.group(1), options, start + 1, "\n".join(lines[start + 1:end])))
    return found


def wait_for_health(url, process, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def run_recipes(build_dir, python, device):
    failures = []
    found = recipes()
    if not found:
        return ["README.md:1: no recipes (a `<!-- recipe: NAME -->` comment before a block)"]
    background = []
    environment = dict(os.environ)
    with tempfile.TemporaryDirectory() as scratch:
        # build/bin/ in a recipe is the build under test; the recipes write only under scratch.
        environment["SPECRUN_RECIPE_SCRATCH"] = scratch
        try:
            ran = 0
            for name, options, line, code in found:
                where = f"README.md:{line}: recipe {name}"
                if ("device" in options) != device:
                    continue
                needs = options.get("needs")
                # Found, not imported: a package may import what only its own tool needs.
                probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{needs}') is None)"
                if needs and subprocess.run([python, "-c", probe], capture_output=True).returncode:
                    print(f"{where}: skipped ({needs} is not installed for {python})")
                    continue
                ran += 1
                code = re.sub(r"(?<![\w./-])build(?=/|\s|$)", build_dir.rstrip("/"), code)
                code = code.replace("/opt/specrun", os.path.join(scratch, "prefix"))
                code = code.replace("build-example", os.path.join(scratch, "build-example"))
                for stand_in in filter(None, options.get("stand-in", "").split(",")):
                    name_given, _, path = stand_in.partition(":")
                    code = code.replace(name_given, path)
                if options.get("drop"):
                    code = re.sub(r"\s" + re.escape(options["drop"]) + r"(?=\s|$)", "", code)
                mode = ("background" if "background" in options else
                        "python" if "python" in options else "shell")
                if mode == "background":
                    log = open(os.path.join(scratch, f"{name}.log"), "w")
                    process = subprocess.Popen(["bash", "-c", code], cwd=ROOT, env=environment,
                                               stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)
                    background.append(process)
                    port = re.search(r"--port (\d+)", code)
                    url = f"http://127.0.0.1:{port.group(1) if port else 8080}/health"
                    if not wait_for_health(url, process, 120):
                        log.close()
                        failures.append(f"{where}: no 200 from {url}: " +
                                        open(log.name).read()[-2000:])
                        break
                    continue
                command = [python, "-c", code] if mode == "python" else ["bash", "-ec", code]
                result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True,
                                        text=True, timeout=900)
                if result.returncode != 0:
                    failures.append(f"{where} exited {result.returncode}:\n{result.stdout[-2000:]}"
                                    f"\n{result.stderr[-3000:]}")
                elif not result.stdout.strip():
                    failures.append(f"{where} printed nothing")
                else:
                    print(f"{where}: ok ({len(result.stdout)} bytes of output)")
            if ran == 0 and not failures:
                return None
        finally:
            for process in background:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
    return failures


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("links", "configuration", "recipes"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "links":
        failures = check_links()
    elif sys.argv[1] == "configuration":
        failures = check_configuration("--write" in sys.argv[2:])
    else:
        if len(sys.argv) not in (4, 5) or sys.argv[4:] not in ([], ["--device"]):
            print(__doc__, file=sys.stderr)
            return 2
        failures = run_recipes(sys.argv[2], sys.argv[3], sys.argv[4:] == ["--device"])
        if failures is None:
            print("every recipe was skipped", file=sys.stderr)
            return 77
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
