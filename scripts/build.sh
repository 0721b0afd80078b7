#!/usr/bin/env bash
# Configures and builds tapelm in build/ (Release, -march=native). Extra arguments go to CMake;
# TAPELM_TARGET names one target to build (the main job builds only the tapelm binary).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" > build.log 2>&1 || { cat build.log; exit 1; }
cmake --build build -j"$(nproc)" ${TAPELM_TARGET:+--target "$TAPELM_TARGET"} 2>&1 | tail -n 3
