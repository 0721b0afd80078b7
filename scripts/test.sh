#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the layering check (and its own
# self-test), the unit tests (CTest) in the Release build, then again in a build with
# AddressSanitizer and UndefinedBehaviorSanitizer, where any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/check_layers.sh --self-test
bash scripts/check_layers.sh
bash scripts/setup.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)")

if [ "${TAPELM_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "== sanitizer pass (address, undefined) =="
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DTAPELM_SANITIZE=ON -DTAPELM_BENCH=OFF > build-asan.log 2>&1 \
    || { cat build-asan.log; exit 1; }
  cmake --build build-asan -j"$(nproc)" 2>&1 | tail -n 3
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  # The robustness suite's own ASan and LSan options (libhdf5's error paths) are its test's
  # environment: see CMakeLists.txt.
  (cd build-asan && ctest --output-on-failure -j"$(nproc)")
fi
