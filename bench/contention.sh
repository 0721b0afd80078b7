#!/usr/bin/env bash
# Training speed beside competing work: tapelm against the PyTorch reference, on the `baby`
# configuration (docs/formats.md §5), quiet and under two loads, alternating. A run's figure is its
# median tokens/s over ITERS steps. The loads, on a 2-core machine:
#   hog   one shell busy loop (`while :; do :; done`), started before the run and killed after it,
#         so one core is left to the program;
#   pair  a second copy of the same program with the same setting, started at the same moment
#         (as two test suites or two users' jobs share a machine); both copies' figures are kept.
#
#   bash bench/contention.sh [ROUNDS (5)] [ITERS (20)] > bench/CONTENTION.jsonl
#   python3 bench/contention_report.py bench/CONTENTION.jsonl
#
# Every round runs each setting quiet, then under each load, tapelm's then PyTorch's, each program
# at: `default` (2 threads, no OpenMP variable set: tapelm then chooses how its threads wait from
# the CPU and the load it sees at start-up, see autograd/omp_wait.h), `spin20us` (tapelm only: the
# spin count tapelm chooses on a quiet machine, about 20 us, whatever the load: its default before
# it read the load), `spin300k` (tapelm only: GOMP_SPINCOUNT=300000, libgomp's own default, which
# tapelm ran with before that), `passive` (2 threads, OMP_WAIT_POLICY=passive) and `t1` (1 thread).
# TAPELM_SETTINGS and PYTORCH_SETTINGS name a subset (space-separated). OpenBLAS's core is left as
# the environment has it for both programs. One JSON line per run on stdout (tapelm's with the
# `omp_wait` its run reported).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
ITERS=${2:-20}
PY=${PYTHON:-/usr/bin/python3}
REF=${REFERENCE_DIR:-../shared/reference}
TAPELM=${TAPELM:-build/tapelm}
# PyTorch, Debian's, installed as bench/compare.sh installs it when missing (without it every
# PyTorch run would fail on a line that is not its JSON)
if ! "$PY" -c 'import torch' 2>/dev/null; then
  echo "contention.sh: PyTorch is missing for $PY: installing python3-torch with apt-get" >&2
  sudo_if() { if [[ $(id -u) == 0 ]]; then "$@"; else sudo "$@"; fi; }
  sudo_if env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >&2 ||
    { sudo_if apt-get update >&2 && sudo_if env DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch >&2; } ||
    { echo "contention.sh: could not install python3-torch" >&2; exit 1; }
  "$PY" -c 'import torch' || { echo "contention.sh: $PY still cannot import torch" >&2; exit 1; }
fi
BABY=(--set vocab_size=65 --set n_layer=4 --set n_head=4 --set n_kv_head=4 --set n_embd=128 --set block_size=64
  --set batch_size=12)

# the count tapelm spins on this quiet CPU (asked before any load starts)
SPIN20=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u TAPELM_GOMP_SPINCOUNT "$TAPELM" inspect --system |
  sed -n 's/^openmp wait spin \([0-9]*\) pauses.*/\1/p')
[[ -n $SPIN20 ]] || { echo "contention.sh: tapelm inspect --system named no spin count (is the machine busy?)" >&2; exit 1; }

hog_pid=""
start_hog() { bash -c 'while :; do :; done' & hog_pid=$!; sleep 0.2; }
stop_hog() { if [[ -n $hog_pid ]]; then kill "$hog_pid" 2>/dev/null || true; wait "$hog_pid" 2>/dev/null || true; hog_pid=""; fi; }
trap stop_hog EXIT

# one program run: PROGRAM SETTING -> its tokens/s
measure() {
  local who=$1 setting=$2 out threads=2
  local -a envv=(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u TAPELM_GOMP_SPINCOUNT -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS)
  case $setting in
    passive) envv+=(OMP_WAIT_POLICY=passive) ;;
    spin300k) envv+=(GOMP_SPINCOUNT=300000) ;;
    spin20us) envv+=(GOMP_SPINCOUNT="$SPIN20") ;;
    t1) threads=1 ;;
  esac
  if [[ $who == tapelm ]]; then
    out=$("${envv[@]}" "$TAPELM" --threads "$threads" bench "${BABY[@]}" --mode train --iters "$ITERS" --warmup 2 --json 2>/dev/null)
    # the figure, then how tapelm's threads waited in this run (it reads the load at start-up)
    python3 -c "import json,sys; d=json.load(sys.stdin); print(d['tokens_per_s'], end=', \"omp_wait\": '); print(json.dumps(d['omp_wait']))" <<< "$out"
  else
    out=$("${envv[@]}" "$PY" "$REF/bench.py" --threads "$threads" --vocab 65 --layers 4 --heads 4 --kv-heads 4 --dim 128 --block 64 \
      --batch 12 --mode train --iters "$ITERS" --warmup 2 2>/dev/null | tail -1)
    python3 -c "import json,sys; print(json.load(sys.stdin)['tok_per_s_median'])" <<< "$out"
  fi
}

line() { printf '{"who": "%s", "setting": "%s", "load": "%s", "round": %s, "tok_s": %s}\n' "$1" "$2" "$3" "$round" "$4"; }

run() {
  local who=$1 setting=$2 load=$3 tok other tmp
  case $load in
    quiet) tok=$(measure "$who" "$setting") ;;
    hog) start_hog; tok=$(measure "$who" "$setting"); stop_hog ;;
    pair)
      tmp=$(mktemp)
      measure "$who" "$setting" > "$tmp" &
      tok=$(measure "$who" "$setting")
      wait $!
      other=$(cat "$tmp"); rm -f "$tmp"
      line "$who" "$setting" pair2 "$other"
      ;;
  esac
  line "$who" "$setting" "$load" "$tok"
}

for round in $(seq 1 "$ROUNDS"); do
  for who in tapelm pytorch; do
    read -r -a settings <<< "${PYTORCH_SETTINGS:-default passive t1}"
    [[ $who == tapelm ]] && read -r -a settings <<< "${TAPELM_SETTINGS:-default spin20us spin300k passive t1}"
    for s in "${settings[@]}"; do
      for load in quiet hog pair; do run "$who" "$s" "$load"; done
    done
  done
done
