#!/usr/bin/env python3
"""Three specrun serve replicas behind nginx (deploy/nginx), under load, one of them killed.

Starts three replicas of the bundled pair on loopback and an unprivileged nginx with the
configuration deploy/nginx/render.py writes, then runs CLIENTS streaming clients for LOAD_SECONDS:
each holds conversations of several turns (a completion prompt that grows by the last answer and a
new line), every turn under the conversation's X-Session-Id. Mid-load one replica is killed with
SIGKILL and restarted on its port. Checks:

  - every request is answered or fails explicitly (client-side timeouts; no thread hangs), and
    the only failures are the requests in flight on the killed replica, which end with an error
    (a cut stream or a 502) rather than being replayed elsewhere;
  - affinity: before the kill each conversation's turns reach one replica, and every later turn
    served by the replica of the turn before it has prompt tokens from its prefix cache
    (usage.prompt_tokens_details.cached_tokens), the first turn none (its prefix is its own);
  - requests that start after the kill go to the other replicas and succeed; after the restart
    (and nginx's fail_timeout) new conversations reach the restarted replica again;
  - a replica with --max-requests in flight answers 429 with Retry-After, passed to the client
    and not retried on another replica; streams reach the client before they end (unbuffered);
  - /health through nginx is 200, /metrics is 404 (replicas are scraped directly).

Skips (exit 77, one line) without nginx. Python 3's standard library only.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
CLIENTS = 32
LOAD_SECONDS = 24.0
KILL_AT = 6.0  # seconds into the load
RESTART_AFTER = 1.5  # seconds after the kill
TURNS = 4
MAX_TOKENS = 16
MAX_REQUESTS = 16  # each replica's --max-requests
FAIL_TIMEOUT = 10  # nginx's, seconds (the template's default)
CLIENT_TIMEOUT = 20.0  # seconds a client waits on one read
REQUEST_TIMEOUT = 30.0  # seconds a client waits for a whole response (heartbeats keep reads alive)
MODEL = "pycode-target"

TOPICS = [
    "def parse_header(line):\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import os\n\ndef walk_files(root):\n",
    "def merge_sorted(a, b):\n    result = []\n",
    "def read_config(path):\n    with open(path) as f:\n",
    "class Stack:\n    def push(self, item):\n",
]
FOLLOW_UPS = [
    "\n\ndef test_it():\n",
    "\n    # then\n",
    "\n\nclass Helper:\n",
    "\n    return None\n",
]


def free_ports(count):
    """`count` distinct free ports: each socket stays bound until all are chosen, so the kernel
    cannot hand the same port out twice."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def http_get(port, path, headers=None, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def wait_healthy(port, deadline, process=None):
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process on port {port} exited with {process.returncode}")
        try:
            status, _ = http_get(port, "/health", timeout=2.0)
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"port {port}: /health not 200 in time")


def metric(port, name):
    """The sum of a metric's samples on a replica (None when unreachable)."""
    try:
        status, text = http_get(port, "/metrics", timeout=2.0)
    except OSError:
        return None
    if status != 200:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Replica:
    def __init__(self, specrun, models, port, directory, index):
        self.specrun, self.models, self.port = specrun, models, port
        self.directory, self.index, self.starts = directory, index, 0
        self.process = None

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.directory, f"replica{self.index}.{self.starts}.log"), "wb")
        self.process = subprocess.Popen(
            [self.specrun, "serve", "--target", os.path.join(self.models, "pycode-target"),
             "--draft", os.path.join(self.models, "pycode-draft"), "--host", "127.0.0.1",
             "--port", str(self.port), "--max-requests", str(MAX_REQUESTS)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Attempt:
    """One HTTP request a client made, and how it ended."""

    def __init__(self, session, turn, number):
        self.session, self.turn, self.number = session, turn, number
        self.request_id = f"{session}/t{turn}/a{number}"
        self.start = self.end = None
        self.status = None  # the HTTP status, None when there was none
        self.outcome = None  # ok, retry (429/503), cut, http, exception
        self.detail = ""
        self.text = ""
        self.usage = None
        self.first_chunk = None  # when the first data line arrived
        self.upstream = None  # from nginx's access log


def stream_completion(port, attempt, prompt, session):
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json", "X-Session-Id": session,
               "X-Request-Id": attempt.request_id}
    attempt.start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        response = conn.getresponse()
        attempt.status = response.status
        if response.status in (429, 503):
            attempt.outcome = f"retry{response.status}"
            attempt.detail = response.getheader("Retry-After") or ""
            response.read()
            return
        if response.status != 200:
            attempt.outcome, attempt.detail = "http", f"HTTP {response.status}"
            response.read()
            return
        done = False
        while True:
            if time.monotonic() - attempt.start > REQUEST_TIMEOUT:
                attempt.outcome, attempt.detail = "timeout", f"no end in {REQUEST_TIMEOUT:.0f} s"
                return
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators and heartbeat comments
            if attempt.first_chunk is None:
                attempt.first_chunk = time.monotonic()
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                attempt.outcome, attempt.detail = "cut", "error event: " + str(chunk["error"])
                return
            for choice in chunk.get("choices", []):
                attempt.text += choice.get("text", "")
            if chunk.get("usage"):
                attempt.usage = chunk["usage"]
        if done and attempt.usage is not None:
            attempt.outcome = "ok"
        else:
            attempt.outcome, attempt.detail = "cut", "the stream ended without [DONE]"
    except http.client.IncompleteRead as error:
        attempt.outcome, attempt.detail = "cut", f"IncompleteRead ({error!r})"
    except (OSError, http.client.HTTPException, ValueError) as error:
        attempt.outcome, attempt.detail = "exception", f"{type(error).__name__}: {error}"
    finally:
        attempt.end = time.monotonic()
        conn.close()


def client(port, index, load_end, attempts, lock):
    conversation = 0
    while time.monotonic() < load_end:
        session = f"c{index}-{conversation}"
        conversation += 1
        prompt = f"# conversation {session}\n" + TOPICS[(index + conversation) % len(TOPICS)]
        for turn in range(1, TURNS + 1):
            if time.monotonic() >= load_end:
                break
            number = 0
            while True:
                attempt = Attempt(session, turn, number)
                stream_completion(port, attempt, prompt, session)
                with lock:
                    attempts.append(attempt)
                if not attempt.outcome.startswith("retry"):
                    break
                if number >= 20 or time.monotonic() >= load_end + 5:
                    attempt.outcome = "gave_up"
                    attempt.detail = f"still {attempt.status} after {number} retries"
                    break
                number += 1
                try:
                    delay = float(attempt.detail)
                except ValueError:
                    delay = 1.0
                time.sleep(min(delay, 2.0))
            if attempt.outcome == "ok":
                prompt += attempt.text
            prompt += FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)]


def read_access_log(path):
    """request id -> (status, upstream addresses as nginx lists them)."""
    entries = {}
    pattern = re.compile(r'" (\d{3}) .*request_id=(\S+) session=\S+ upstream=(.*?) upstream_status=')
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = pattern.search(line)
            if match:
                entries[match.group(2)] = (int(match.group(1)), match.group(3))
    return entries


def check_full_replica(port, replicas, failures):
    """MAX_REQUESTS streams held open on one session's replica, then one more: 429."""
    session = "full-replica"
    body = json.dumps({"model": MODEL, "prompt": "# a long one\ndef main():\n", "max_tokens": 400,
                       "ignore_eos": True, "stream": True})
    headers = {"Content-Type": "application/json", "X-Session-Id": session}
    held = []
    try:
        for i in range(MAX_REQUESTS):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
            conn.request("POST", "/v1/completions", body=body,
                         headers=dict(headers, **{"X-Request-Id": f"{session}/{i}"}))
            response = conn.getresponse()
            held.append(conn)
            if response.status != 200:
                failures.append(f"held stream {i}: HTTP {response.status}")
                return
            # A token's chunk arrives while the request still runs: the stream is not buffered.
            while True:
                line = response.readline()
                if not line:
                    failures.append(f"held stream {i} ended before its first chunk")
                    return
                if line.startswith(b"data:"):
                    break
        rejected_before = {r.port: metric(r.port, 'specrun_requests_total{outcome="rejected"}')
                           for r in replicas}
        status, _ = None, None
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
        try:
            conn.request("POST", "/v1/completions", body=body,
                         headers=dict(headers, **{"X-Request-Id": f"{session}/over"}))
            response = conn.getresponse()
            status, retry_after = response.status, response.getheader("Retry-After")
            response.read()
        finally:
            conn.close()
        if status != 429 or retry_after is None:
            failures.append(f"a request past --max-requests: HTTP {status}, Retry-After "
                            f"{retry_after!r} (expected 429 with Retry-After)")
        rejected = {r.port: metric(r.port, 'specrun_requests_total{outcome="rejected"}')
                    for r in replicas}
        grew = [p for p in rejected if (rejected[p] or 0) > (rejected_before[p] or 0)]
        if len(grew) != 1:
            failures.append(f"the 429 was counted by replicas {grew}: expected exactly one "
                            "(nginx must not retry it on another)")
        print(f"full replica: {MAX_REQUESTS} streams held, the next request got {status} "
              f"Retry-After: {retry_after}")
        if len(grew) != 1:
            return
        # Clients that hang up cancel their requests on the replica: nginx closes its side.
        cancelled_metric = 'specrun_requests_total{outcome="cancelled"}'
        cancelled_before = metric(grew[0], cancelled_metric) or 0
        for conn in held:
            conn.close()
        deadline = time.monotonic() + 10
        cancelled = cancelled_before
        while time.monotonic() < deadline and cancelled < cancelled_before + MAX_REQUESTS:
            time.sleep(0.1)
            cancelled = metric(grew[0], cancelled_metric) or 0
        if cancelled < cancelled_before + MAX_REQUESTS:
            failures.append(f"{MAX_REQUESTS} streams closed by their clients: the replica "
                            f"cancelled {cancelled - cancelled_before:.0f}")
        else:
            print(f"the {MAX_REQUESTS} held streams closed: their requests were cancelled")
    finally:
        for conn in held:
            conn.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--specrun", required=True)
    parser.add_argument("--source-dir", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("--nginx", default=os.environ.get("SPECRUN_NGINX"))
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    nginx = args.nginx or shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
    if not nginx or not os.access(nginx, os.X_OK):
        where = f"{nginx} is not executable" if nginx else "no nginx on PATH or in /usr/sbin"
        print(f"SKIP: {where} (tools/install-deps.sh --tests installs Debian's nginx)")
        return SKIP
    source = os.path.abspath(args.source_dir)
    models = os.path.join(source, "models")
    render = os.path.join(source, "deploy", "nginx", "render.py")

    directory = tempfile.mkdtemp(prefix="specrun-nginx-")
    os.chmod(directory, 0o755)  # nginx's workers run as nobody when the test runs as root
    *replica_ports, nginx_port = free_ports(4)
    replicas = [Replica(args.specrun, models, port, directory, i)
                for i, port in enumerate(replica_ports)]
    nginx_process = None
    failures = []
    started = time.monotonic()
    try:
        for replica in replicas:
            replica.start()
        subprocess.run([sys.executable, render, "--standalone", directory,
                        "--listen", f"127.0.0.1:{nginx_port}",
                        "--fail-timeout", f"{FAIL_TIMEOUT}s"]
                       + [arg for r in replicas for arg in ("--replica", f"127.0.0.1:{r.port}")],
                       check=True)
        nginx_log = open(os.path.join(directory, "nginx.stderr"), "wb")
        nginx_process = subprocess.Popen(
            [nginx, "-p", directory, "-c", os.path.join(directory, "nginx.conf"), "-e", "stderr",
             "-g", f"daemon off; pid {directory}/nginx.pid; error_log stderr;"],
            stdout=nginx_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        nginx_log.close()
        deadline = time.monotonic() + 60
        for replica in replicas:
            wait_healthy(replica.port, deadline, replica.process)
        wait_healthy(nginx_port, deadline, nginx_process)

        status, body = http_get(nginx_port, "/health")
        if status != 200 or json.loads(body).get("status") != "ok":
            failures.append(f"/health through nginx: {status} {body!r}")
        status, _ = http_get(nginx_port, "/metrics")
        if status != 404:
            failures.append(f"/metrics through nginx: {status}, expected 404")
        status, body = http_get(nginx_port, "/v1/models")
        if status != 200 or MODEL not in body:
            failures.append(f"/v1/models through nginx: {status} {body[:200]!r}")

        # The load, with the kill and the restart of one replica in the middle of it.
        attempts, lock = [], threading.Lock()
        load_start = time.monotonic()
        load_end = load_start + LOAD_SECONDS
        threads = [threading.Thread(target=client, args=(nginx_port, i, load_end, attempts, lock),
                                    daemon=True) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        victim = replicas[1]
        time.sleep(KILL_AT)
        poll_until = time.monotonic() + 5
        while time.monotonic() < poll_until and (metric(victim.port, "specrun_requests_running")
                                                 or 0) < 2:
            time.sleep(0.02)
        kill_time = time.monotonic()
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        killed_time = time.monotonic()
        time.sleep(RESTART_AFTER)
        victim.start()
        wait_healthy(victim.port, time.monotonic() + 30, victim.process)
        ready_time = time.monotonic()
        for thread in threads:
            thread.join(timeout=max(0.0, load_end + REQUEST_TIMEOUT + 5 - time.monotonic()))
        hung = sum(thread.is_alive() for thread in threads)
        if hung:
            failures.append(f"{hung} clients still waiting {REQUEST_TIMEOUT + 5:.0f} s after "
                            "the load ended")
        with lock:
            attempts = list(attempts)

        log = read_access_log(os.path.join(directory, "access.log"))
        victim_address = f"127.0.0.1:{victim.port}"
        for attempt in attempts:
            entry = log.get(attempt.request_id)
            if entry is not None:
                attempt.upstream = entry[1]
        unlogged = [a.request_id for a in attempts if a.upstream is None]
        if unlogged:
            failures.append(f"{len(unlogged)} requests missing from nginx's access log: "
                            f"{unlogged[:5]}")

        # Every request answered or failed explicitly; failures only for those in flight on the
        # killed replica.
        at = lambda t: t - load_start
        outcomes = {}
        for attempt in attempts:
            outcomes[attempt.outcome] = outcomes.get(attempt.outcome, 0) + 1
        errors = [a for a in attempts if a.outcome != "ok" and not a.outcome.startswith("retry")]
        for attempt in errors:
            in_flight = attempt.start < killed_time and attempt.end >= kill_time
            on_victim = victim_address in (attempt.upstream or "").split(", ")
            if not (in_flight and on_victim):
                failures.append(
                    f"{attempt.request_id} failed outside the kill ({attempt.outcome}: "
                    f"{attempt.detail}; {at(attempt.start):.2f}-{at(attempt.end):.2f} s, "
                    f"upstream {attempt.upstream}; kill at {at(kill_time):.2f} s)")
        if not errors:
            failures.append("no stream failed at the kill: the killed replica had none in flight")
        after_kill = [a for a in attempts
                      if a.start >= killed_time and not a.outcome.startswith("retry")]
        if not after_kill or any(a.outcome != "ok" for a in after_kill):
            failures.append("requests after the kill did not all succeed")
        if any((a.upstream or "").split(", ")[-1] == victim_address
               for a in after_kill if a.start < ready_time):
            failures.append("a request was answered by the killed replica while it was down")

        # Affinity and the prefix cache.
        sessions = {}
        for attempt in attempts:
            if attempt.outcome == "ok":
                sessions.setdefault(attempt.session, {})[attempt.turn] = attempt
        split = [s for s, turns in sessions.items()
                 if len({a.upstream for a in turns.values() if a.end < kill_time}) > 1]
        if split:
            failures.append(f"{len(split)} conversations reached several replicas before the "
                            f"kill: {split[:5]}")
        first_turn_hits = 0
        follow_ups = hits = moved = 0
        misses = []
        for turns in sessions.values():
            for turn, attempt in turns.items():
                cached = attempt.usage["prompt_tokens_details"]["cached_tokens"]
                if turn == 1:
                    first_turn_hits += cached > 0
                    continue
                previous = turns.get(turn - 1)
                if previous is None:
                    continue
                restarted = (attempt.upstream == victim_address and previous.end < kill_time)
                if attempt.upstream != previous.upstream or restarted:
                    moved += 1
                    continue
                follow_ups += 1
                if cached > 0:
                    hits += 1
                else:
                    misses.append(attempt.request_id)
        if first_turn_hits:
            failures.append(f"{first_turn_hits} first turns had cached tokens: their prompts "
                            "were meant to share no block")
        if follow_ups == 0 or hits < follow_ups:
            failures.append(f"{follow_ups - hits} of {follow_ups} later turns on their "
                            f"conversation's replica missed the prefix cache: {misses[:5]}")

        # The restarted replica rejoins: new conversations reach it.
        rejoined = [a for a in attempts if a.outcome == "ok" and a.upstream == victim_address
                    and a.start > ready_time]
        if not rejoined:
            failures.append(f"the restarted replica served nothing in the "
                            f"{load_end - ready_time:.1f} s after it was ready")
        served = {r.index: sum(1 for a in attempts if a.outcome == "ok"
                               and a.upstream == f"127.0.0.1:{r.port}") for r in replicas}
        cached_tokens = sum(a.usage["prompt_tokens_details"]["cached_tokens"]
                            for a in attempts if a.outcome == "ok")
        prompt_tokens = sum(a.usage["prompt_tokens"] for a in attempts if a.outcome == "ok")
        print(f"load: {CLIENTS} clients for {LOAD_SECONDS:.0f} s, {len(attempts)} requests: "
              + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
              + f"; served per replica {served}")
        print(f"kill of replica 1 at {at(kill_time):.2f} s: {len(errors)} requests in flight "
              "failed: " + ", ".join(sorted({f'{a.outcome} ({a.detail[:60]})' for a in errors})))
        print(f"restart: ready at {at(ready_time):.2f} s; first new request on it at "
              + (f"{at(min(a.start for a in rejoined)):.2f} s, {len(rejoined)} served"
                 if rejoined else "never"))
        print(f"affinity: {hits} of {follow_ups} later turns on their conversation's replica "
              f"hit the prefix cache ({moved} moved by the kill or the rejoin); "
              f"{cached_tokens} of {prompt_tokens} prompt tokens cached")

        if nginx_process.poll() is None:
            check_full_replica(nginx_port, replicas, failures)
            # Retry of what never reached a replica: an idle replica killed, the next request for
            # one of its conversations is refused there and goes to another.
            idle = replicas[2]
            idle_address = f"127.0.0.1:{idle.port}"
            # A conversation of replica 2's before the kill (while all three were up: later
            # ones may have been the killed replica's, passed on while it was out).
            keys = sorted({a.session for a in attempts
                           if a.upstream == idle_address and a.end < kill_time})
            idle.process.send_signal(signal.SIGKILL)
            idle.process.wait()
            if keys:
                attempt = Attempt(keys[0], 1, "refused")
                stream_completion(nginx_port, attempt, "# after a refused connection\n", keys[0])
                entry = read_access_log(os.path.join(directory, "access.log")).get(
                    attempt.request_id)
                upstreams = entry[1].split(", ") if entry else []
                print(f"refused connection: {attempt.outcome}, upstream {entry and entry[1]}")
                if (attempt.outcome != "ok" or len(upstreams) != 2
                        or upstreams[0] != idle_address):
                    failures.append(f"a request for a killed idle replica: {attempt.outcome} "
                                    f"{attempt.detail}, upstreams {upstreams} (expected a retry "
                                    "on another replica)")
            else:
                failures.append("no conversation reached replica 2")
    except Exception as error:  # noqa: BLE001: reported as the test's failure, with the logs
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        if nginx_process is not None and nginx_process.poll() is None:
            nginx_process.send_signal(signal.SIGTERM)
            try:
                nginx_process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                nginx_process.kill()
                nginx_process.wait()
        for replica in replicas:
            replica.stop()

    print(f"total {time.monotonic() - started:.1f} s")
    if failures:
        for failure in failures:
            print("FAIL:", failure)
        for name in sorted(os.listdir(directory)):
            if name.endswith(".log") and name != "access.log" or name == "nginx.stderr":
                with open(os.path.join(directory, name), errors="replace") as f:
                    tail = f.read()[-2000:]
                print(f"--- {name} (tail)\n{tail}")
        print(f"(files kept in {directory})")
        return 1
    if not args.keep:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
