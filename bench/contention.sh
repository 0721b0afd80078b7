#!/usr/bin/env bash
# Training speed beside one competing busy process: tapelm against the PyTorch reference, on the
# `baby` configuration (docs/formats.md §5), quiet and loaded, alternating. A run's figure is its
# median tokens/s over ITERS steps; the hog is one shell busy loop (`while :; do :; done`) started
# before the run and killed after it, so on a 2-core machine one core is left to the program.
#
#   bash bench/contention.sh [ROUNDS (5)] [ITERS (20)] > bench/CONTENTION.jsonl
#   python3 bench/contention_report.py bench/CONTENTION.jsonl
#
# Every round runs each setting quiet, then loaded, tapelm's then PyTorch's, each program at:
# `default` (2 threads, no OpenMP variable set), `passive` (2 threads, OMP_WAIT_POLICY=passive)
# and `t1` (1 thread). OpenBLAS's core is left as the environment has it for both programs. One
# JSON line per run on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
ITERS=${2:-20}
PY=${PYTHON:-/usr/bin/python3}
REF=${REFERENCE_DIR:-../shared/reference}
TAPELM=${TAPELM:-build/tapelm}
BABY=(--set vocab_size=65 --set n_layer=4 --set n_head=4 --set n_kv_head=4 --set n_embd=128 --set block_size=64
  --set batch_size=12)

hog_pid=""
start_hog() { bash -c 'while :; do :; done' & hog_pid=$!; sleep 0.2; }
stop_hog() { if [[ -n $hog_pid ]]; then kill "$hog_pid" 2>/dev/null || true; wait "$hog_pid" 2>/dev/null || true; hog_pid=""; fi; }
trap stop_hog EXIT

# one run: PROGRAM SETTING LOAD -> a JSON line
run() {
  local who=$1 setting=$2 load=$3 out tok threads=2
  local -a envv=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS)
  case $setting in
    passive) envv+=(OMP_WAIT_POLICY=passive) ;;
    t1) threads=1 ;;
  esac
  [[ $load == 1 ]] && start_hog
  if [[ $who == tapelm ]]; then
    out=$("${envv[@]}" "$TAPELM" --threads "$threads" bench "${BABY[@]}" --mode train --iters "$ITERS" --warmup 2 --json 2>/dev/null)
    tok=$(python3 -c "import json,sys; print(json.load(sys.stdin)['tokens_per_s'])" <<< "$out")
  else
    out=$("${envv[@]}" "$PY" "$REF/bench.py" --threads "$threads" --vocab 65 --layers 4 --heads 4 --kv-heads 4 --dim 128 --block 64 \
      --batch 12 --mode train --iters "$ITERS" --warmup 2 2>/dev/null | tail -1)
    tok=$(python3 -c "import json,sys; print(json.load(sys.stdin)['tok_per_s_median'])" <<< "$out")
  fi
  stop_hog
  printf '{"who": "%s", "setting": "%s", "load": %s, "round": %s, "tok_s": %s}\n' "$who" "$setting" "$load" "$round" "$tok"
}

for round in $(seq 1 "$ROUNDS"); do
  for who in tapelm pytorch; do
    for s in default passive t1; do
      run "$who" "$s" 0
      run "$who" "$s" 1
    done
  done
done
