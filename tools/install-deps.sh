#!/usr/bin/env bash
# Installs specrun's build and test dependencies from Debian 12's packages (only those missing).
# The CUDA toolkit is not installed here: the CUDA backend is built when nvcc is already present.
# Usage: tools/install-deps.sh [--tests | --build]. --tests adds what only the test suite needs (a
# browser for the chat page's test, nginx for the replicas' test: tools/run-tests.sh passes it), so
# that the demo's setup stays light. --build installs only what building specrun's libraries and
# tools takes, without the test suite's (configure with -DSPECRUN_BUILD_TESTS=OFF): the container
# image's build stage (deploy/container/Containerfile).
set -euo pipefail

build_packages=(
  cmake ninja-build g++ pkg-config       # toolchain
  libspdlog-dev libfmt-dev               # logging
  nlohmann-json3-dev                     # JSON: safetensors headers, config.json
  libcli11-dev                           # command-line parsing
  libtomlplusplus-dev                    # TOML configuration files
  libpcre2-dev libutf8proc-dev           # tokenizer: Unicode regexes, normalization forms
  libcpp-httplib-dev prometheus-cpp-dev  # specrun serve: HTTP, Prometheus metrics
)
packages=(
  "${build_packages[@]}"
  libgtest-dev libgmock-dev              # tests
  python3 python3-numpy                  # the independent NumPy reference and model converters
  clang libclang-rt-14-dev               # libFuzzer and CI's Clang sanitizer pass (tests/fuzz)
)
if [[ ${1:-} == --build ]]; then
  packages=("${build_packages[@]}")
elif [[ ${1:-} == --tests ]]; then
  packages+=(
    chromium chromium-driver  # the chat page of specrun serve in a headless browser (label browser)
    nginx                     # replicas of specrun serve behind nginx (label deploy; the test runs
                              # its own nginx as the current user on high ports)
  )
elif [[ $# -gt 0 ]]; then
  echo "usage: tools/install-deps.sh [--tests | --build]" >&2
  exit 2
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
# Installed, nginx's package starts its service on port 80 unless a policy-rc.d forbids it (in a
# container without systemd invoke-rc.d runs the init script, and a failed start fails the
# install). The tests start their own nginx: while installing, a policy-rc.d refuses every
# service start, and is removed afterwards (one already there is left as it is).
policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\n# tools/install-deps.sh: no service starts while it installs\nexit 101\n' |
    $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  trap '$sudo rm -f "$policy"' EXIT
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
