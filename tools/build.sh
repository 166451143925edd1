#!/usr/bin/env bash
# Configures and builds specrun. Environment:
#   SPECRUN_BUILD_DIR   build directory (default: build)
#   SPECRUN_CUDA        AUTO (default), ON or OFF
#   SPECRUN_SANITIZE    e.g. address,undefined (default: none)
#   SPECRUN_TARGETS     targets to build (default: all)
#   SPECRUN_CMAKE_ARGS  more configure arguments (e.g. -DSPECRUN_FUZZ=ON)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${SPECRUN_BUILD_DIR:-build}
# ccache, where installed, lets several build directories of one tree share object files.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DSPECRUN_CUDA="${SPECRUN_CUDA:-AUTO}" -DSPECRUN_SANITIZE="${SPECRUN_SANITIZE:-}" \
  -DSPECRUN_WERROR=ON ${SPECRUN_CMAKE_ARGS:-} >/dev/null
# shellcheck disable=SC2086
cmake --build "$build_dir" ${SPECRUN_TARGETS:+--target $SPECRUN_TARGETS}
