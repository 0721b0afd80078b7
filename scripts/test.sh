#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the layering check (and its own
# self-test) and the check of docs/formats.md's section references, then the unit tests (CTest)
# twice from one build: against the Release build, and against a copy of tapelm built with
# AddressSanitizer and UndefinedBehaviorSanitizer, where any report fails the run
# (TAPELM_SKIP_SANITIZERS=1 skips that pass).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/check_layers.sh --self-test
bash scripts/check_layers.sh
bash scripts/check_doc_refs.sh
bash scripts/setup.sh
sanitize=ON
[ "${TAPELM_SKIP_SANITIZERS:-0}" = "1" ] && sanitize=OFF
bash scripts/build.sh -DTAPELM_SANITIZE=$sanitize -DTAPELM_BENCH=OFF
cd build
echo "== Release pass =="
ctest --output-on-failure -j"$(nproc)" -L release
if [ "$sanitize" = ON ]; then
  echo "== sanitizer pass (address, undefined) =="
  ctest --output-on-failure -j"$(nproc)" -L sanitize
fi
