#!/usr/bin/env bash
# The container image's smoke test (ctest container_smoke, label deploy): builds
# deploy/container/Containerfile (CPU, specrun alone), runs it with the bundled pair
# (models/pycode-target, models/pycode-draft) mounted read-only, waits for /health, sends one
# completion and stops the container with SIGTERM, which must exit 0 within the shutdown grace.
#
# It skips (exit 77, one line saying why) where no image can be built here: no podman and no docker
# daemon, or a base image neither present nor pullable (no registry reachable). Environment:
#   SPECRUN_CONTAINER_ENGINE  podman or docker (default: podman where installed, else docker
#                             where its daemon answers)
#   SPECRUN_CONTAINER_BUILD_BASE, SPECRUN_CONTAINER_BASE
#                             the build and runtime stages' images (default debian:12 and
#                             debian:12-slim), e.g. a registry mirror's or ones imported locally
#   SPECRUN_CONTAINER_KEEP=1  keep the image (specrun-smoke:latest) afterwards
# Host networking throughout (build and run): no bridge network or NAT is needed, and the server
# listens on a free port of 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."
skip() { echo "container-smoke: skipped: $*"; exit 77; }

for tool in curl python3; do
  command -v "$tool" >/dev/null || skip "no $tool here"
done
engine=${SPECRUN_CONTAINER_ENGINE:-}
if [[ -z "$engine" ]]; then
  if command -v podman >/dev/null && timeout 20 podman info >/dev/null 2>&1; then
    engine=podman
  elif command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
    engine=docker
  else
    skip "no container engine (podman not installed or not working, no docker daemon answering)"
  fi
elif ! timeout 20 "$engine" info >/dev/null 2>&1; then
  skip "$engine does not answer ($engine info fails: no daemon?)"
fi
build_base=${SPECRUN_CONTAINER_BUILD_BASE:-debian:12}
base=${SPECRUN_CONTAINER_BASE:-debian:12-slim}
for image in "$build_base" "$base"; do
  if ! "$engine" image inspect "$image" >/dev/null 2>&1 &&
     ! timeout 120 "$engine" pull -q "$image" >/dev/null 2>&1; then
    skip "base image $image is not here and cannot be pulled (no registry reachable?);" \
      "set SPECRUN_CONTAINER_BUILD_BASE and SPECRUN_CONTAINER_BASE to local images"
  fi
done

image=specrun-smoke:latest
name=specrun-smoke-$$
log=$(mktemp)
cleanup() {
  "$engine" rm -f "$name" >/dev/null 2>&1 || true
  if [[ "${SPECRUN_CONTAINER_KEEP:-}" != 1 ]]; then
    "$engine" rmi -f "$image" >/dev/null 2>&1 || true
  fi
  rm -f "$log"
}
trap cleanup EXIT

# Podman writes OCI images by default, which have no HEALTHCHECK: the docker format keeps it.
format=()
if [[ "$engine" == podman ]]; then format=(--format docker); fi
start=$(date +%s)
if ! "$engine" build "${format[@]}" --network host -f deploy/container/Containerfile -t "$image" \
    --build-arg BUILD_BASE="$build_base" --build-arg BASE="$base" --build-arg SPECRUN_CUDA=OFF \
    . >"$log" 2>&1; then
  tail -n 40 "$log"
  echo "container-smoke: FAILED: the image did not build" >&2
  exit 1
fi
echo "container-smoke: built $image with $engine in $(($(date +%s) - start)) s" \
  "($("$engine" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}'))"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$engine" run -d --name "$name" --network host \
  -v "$PWD/models/pycode-target:/models/target:ro" -v "$PWD/models/pycode-draft:/models/draft:ro" \
  "$image" serve --config /etc/specrun/specrun.toml --host 127.0.0.1 --port "$port" \
  --shutdown-grace 10 --threads 2 >/dev/null
fail() {
  "$engine" logs "$name" 2>&1 | tail -n 20
  echo "container-smoke: FAILED: $*" >&2
  exit 1
}
# The image's user is not root.
[[ "$("$engine" exec "$name" id -u)" != 0 ]] || fail "the container runs as root"
ready=""
for _ in $(seq 120); do
  if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then ready=1; break; fi
  [[ "$("$engine" inspect --format '{{.State.Running}}' "$name")" == true ]] || fail "the server exited"
  sleep 0.5
done
[[ -n "$ready" ]] || fail "/health did not answer 200 within 60 s"
reply=$(curl -fsS "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "specrun", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}') ||
  fail "the completion failed"
python3 -c 'import json, sys; r = json.loads(sys.argv[1]); assert r["choices"][0]["text"], r' \
  "$reply" || fail "the completion has no text: $reply"
# The health check the image declares answers too (curl inside the image, as HEALTHCHECK runs it).
"$engine" exec "$name" curl -fsS -o /dev/null "http://127.0.0.1:$port/health" ||
  fail "curl in the image did not reach /health"
stop_start=$(date +%s)
"$engine" stop -t 20 "$name" >/dev/null
code=$("$engine" inspect --format '{{.State.ExitCode}}' "$name")
[[ "$code" == 0 ]] || fail "the server exited $code on SIGTERM"
echo "container-smoke: /health, one completion and SIGTERM (exit 0 after" \
  "$(($(date +%s) - stop_start)) s) passed"
