#!/usr/bin/env bash
# compare.sh -- tapelm against the PyTorch reference (docs/formats.md §5), alternating, several rounds.
#
# For every configuration of docs/formats.md §5 it runs, round after round,
#   tapelm        build/tapelm --threads N bench ... --json          at N threads and N threads + OMP_WAIT_POLICY=passive
#   PyTorch       python3 ../shared/reference/bench.py ...           at 1 thread, N threads, N threads + OMP_WAIT_POLICY=passive
# (the -bf16 rows: tapelm --precision bf16 against bench/autocast_bench.py, bench.py's step under
# torch.autocast bf16; on a CPU without bf16 instructions tapelm refuses bf16 and only PyTorch runs)
# each under /usr/bin/time -f %M (peak RSS), then prints tables of the medians over rounds, the
# tapelm/PyTorch ratio (PyTorch held at the best of its three settings), peak RSS, nano-training
# model FLOP/s against the measured sgemm peak and tapelm's 2-thread/1-thread speed-up on `mid`,
# each next to its target, and writes them to bench/RESULTS.<class>.md (class avx512 or avx2, from
# the CPU's flags) with the date and the machine: one results file per CPU class, so that a
# regression on either shows.
#
# Run it on a quiet machine: every other busy process skews both programs (and PyTorch's spinning
# OpenMP threads most). See --help.
set -uo pipefail

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
HELPER="$SCRIPT_DIR/compare_report.py"
INVOCATION="bench/compare.sh${*:+ $*}"

usage() {
  cat <<'EOF'
Usage: bench/compare.sh [options]

Runs tapelm and the PyTorch reference (docs/formats.md §5) alternately, several rounds, and prints/writes
a table of medians, ratios against the targets, peak RSS, nano MFU and mid 2-thread scaling.

Options:
  --rounds N            rounds (default 3)
  --iters N             timed iterations per run (default: train 10, nano 5, decode 5)
  --warmup N            untimed iterations per run (default: train 2, decode 1)
  --threads N           the multi-thread setting (default 2); PyTorch runs at 1, N, N+passive
  --tapelm-settings L   comma list of tapelm settings whose best is its figure (default tN,tNp);
                        a setting is tK (K threads) or tKp (K threads, OMP_WAIT_POLICY=passive),
                        e.g. --tapelm-settings t2 (tapelm links libgomp: it spins like PyTorch)
  --peer-settings L     PyTorch settings (default t1,tN,tNp)
  --only PAT[,PAT...]   only the rows whose name contains PAT (shell globs allowed), e.g.
                        --only baby   --only decode   --only 'mid-kv8'   --only train-nano
  --quick               smoke test: 1 round, 2 iterations, 1 warm-up
  --out FILE            results file (default bench/RESULTS.<class>.md); raw runs go to FILE with .jsonl
  --timeout SECS        kill a single run after SECS (default 3600)
  --list                list the rows and exit
  --dry-run             print the commands and exit
  -h, --help            this help

Environment:
  TAPELM          tapelm binary (default: build/tapelm of this repository)
  FORCE_CORE      the OpenBLAS core to force for PyTorch and tapelm's f settings (default: the
                  core `tapelm inspect --system` reports with no environment variable set)
  REFERENCE_DIR   directory of the PyTorch reference bench.py (default: ../shared/reference
                  relative to the repository root)
  PYTHON          interpreter for the reference (default /usr/bin/python3, Debian's torch)
  CPU_CLASS       the results file's class (default from /proc/cpuinfo: avx512, avx2 with FMA, or
                  other); name a stand-in as such, e.g. CPU_CLASS=avx2-standin for AVX2 paths
                  forced on an AVX-512 CPU

Rows: train-baby, train-mid-kv8, train-mid-kv2, train-mid-kv1, train-nano, train-nano-bf16,
      train-gpt2s, train-gpt2s-bf16 (GPT-2 small's shape: 12 layers, d 768, vocab 50257, T 512,
      batch 4), decode-mid-kv{8,2,1}-b{1,32}  (KV 2 and 1 decode rows are informative)
      A -bf16 row is its f32 row in bf16 mixed precision (tapelm --precision bf16, PyTorch autocast);
      the report sets the two side by side: the step's and the linear layers' products' speed-up.
Installs python3-torch (+ python3-h5py) and the `time` package with apt-get if missing, and says so.
EOF
}

# ------------------------------------------------------------------------------------- options
ROUNDS=3
ITERS=""
WARMUP=""
THREADS=2
TAPELM_SETTINGS=""
PEER_SETTINGS=""
ONLY=""
QUICK=0
OUT=""
TIMEOUT=3600
LIST=0
DRY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --tapelm-settings) TAPELM_SETTINGS=$2; shift 2 ;;
    --peer-settings) PEER_SETTINGS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --list) LIST=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in ROUNDS THREADS TIMEOUT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --${v,,} needs a positive integer" >&2; exit 2; }
done
[[ -z $ITERS || $ITERS =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --iters needs a positive integer" >&2; exit 2; }
[[ -z $WARMUP || $WARMUP =~ ^[0-9]+$ ]] || { echo "compare.sh: --warmup needs an integer" >&2; exit 2; }
if [[ $QUICK == 1 ]]; then
  ROUNDS=1; ITERS=${ITERS:-2}; WARMUP=${WARMUP:-1}
fi
TAPELM_SETTINGS=${TAPELM_SETTINGS:-t$THREADS,t${THREADS}p}
PEER_SETTINGS=${PEER_SETTINGS:-t1,t$THREADS,t${THREADS}p}
IFS=, read -r -a TAPELM_SET <<<"$TAPELM_SETTINGS"
IFS=, read -r -a PEER_SET <<<"$PEER_SETTINGS"
for s in "${TAPELM_SET[@]}" "${PEER_SET[@]}"; do
  [[ $s =~ ^t[1-9][0-9]*p?f?$ ]] || { echo "compare.sh: bad setting '$s' (tK, tKp, tKf or tKpf)" >&2; exit 2; }
done

# the output file, resolved against the caller's directory before we cd to the repository root
cpu_class() {
  local f
  f=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  if [[ $f == *" avx512f "* ]]; then echo avx512
  elif [[ $f == *" avx2 "* && $f == *" fma "* ]]; then echo avx2
  else echo other
  fi
}
export CPU_CLASS=${CPU_CLASS:-$(cpu_class)}
[[ $CPU_CLASS =~ ^[a-z0-9-]+$ ]] || { echo "compare.sh: bad CPU_CLASS '$CPU_CLASS' (letters, digits, '-')" >&2; exit 2; }
if [[ -z $OUT ]]; then
  OUT="$ROOT/bench/RESULTS.$CPU_CLASS.md"
elif [[ $OUT != /* ]]; then
  OUT="$PWD/$OUT"
fi
RAW="${OUT%.md}.jsonl"
[[ $RAW == "$OUT" ]] && RAW="$OUT.jsonl"
mkdir -p "$(dirname "$OUT")" || exit 1
cd "$ROOT" || exit 1

rel() {  # a path relative to the repository root when it is inside or next to it
  local p=$1
  case "$p" in
    "$ROOT"/*) echo "${p#"$ROOT"/}" ;;
    "$(dirname "$ROOT")"/*) echo "../${p#"$(dirname "$ROOT")"/}" ;;
    *) echo "$p" ;;
  esac
}

TAPELM=${TAPELM:-$ROOT/build/tapelm}
[[ $TAPELM == /* ]] || TAPELM="$ROOT/$TAPELM"
REF_DIR=${REFERENCE_DIR:-$SCRIPT_DIR/../../shared/reference}
REF_DIR=$(cd "$REF_DIR" 2>/dev/null && pwd) || { echo "compare.sh: reference directory not found: ${REFERENCE_DIR:-../shared/reference} (set REFERENCE_DIR)" >&2; exit 1; }
[[ -f $REF_DIR/bench.py ]] || { echo "compare.sh: $(rel "$REF_DIR")/bench.py not found (set REFERENCE_DIR)" >&2; exit 1; }
PY=${PYTHON:-/usr/bin/python3}
TAPELM_D=$(rel "$TAPELM")
REF_D=$(rel "$REF_DIR")

# ---------------------------------------------------------------------------------------- rows
# name mode L H KV d T B decode_batch default_iters [precision (f32) [vocab (65)]]
ALL_ROWS=(
  "train-baby         train  4 4 4 128  64 12  0 10"
  "train-mid-kv8      train  6 8 8 256 128 32  0 10"
  "train-mid-kv2      train  6 8 2 256 128 32  0 10"
  "train-mid-kv1      train  6 8 1 256 128 32  0 10"
  "train-nano         train  6 6 6 384 256 64  0 5"
  "train-nano-bf16    train  6 6 6 384 256 64  0 5 bf16"
  "train-gpt2s        train 12 12 12 768 512 4 0 3 f32 50257"
  "train-gpt2s-bf16   train 12 12 12 768 512 4 0 3 bf16 50257"
  "decode-mid-kv8-b1  decode 6 8 8 256 128 32  1 5"
  "decode-mid-kv8-b32 decode 6 8 8 256 128 32 32 5"
  "decode-mid-kv2-b1  decode 6 8 2 256 128 32  1 5"
  "decode-mid-kv2-b32 decode 6 8 2 256 128 32 32 5"
  "decode-mid-kv1-b1  decode 6 8 1 256 128 32  1 5"
  "decode-mid-kv1-b32 decode 6 8 1 256 128 32 32 5"
)
SCALING_ROW=train-mid-kv8

ROWS=()
for r in "${ALL_ROWS[@]}"; do
  read -r name _ <<<"$r"
  if [[ -z $ONLY ]]; then ROWS+=("$r"); continue; fi
  IFS=, read -r -a pats <<<"$ONLY"
  for p in "${pats[@]}"; do
    # shellcheck disable=SC2053
    if [[ $name == *$p* ]]; then ROWS+=("$r"); break; fi
  done
done
if [[ $LIST == 1 ]]; then
  printf '%-20s %-6s %2s %2s %2s %4s %4s %3s %s\n' row mode L H KV d T B decode-batch
  for r in "${ROWS[@]}"; do read -r n m L H KV d T B DB _ <<<"$r"; printf '%-20s %-6s %2s %2s %2s %4s %4s %3s %s\n' "$n" "$m" "$L" "$H" "$KV" "$d" "$T" "$B" "$( [[ $m == decode ]] && echo "$DB" )"; done
  exit 0
fi
[[ ${#ROWS[@]} -gt 0 ]] || { echo "compare.sh: --only '$ONLY' matches no row (see --list)" >&2; exit 2; }

# ---------------------------------------------------------------------------- prerequisites
NOTES=()
as_root() { if [[ $(id -u) == 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
apt_install() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" ||
    { as_root apt-get update && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"; }
}
if [[ $DRY == 0 ]]; then
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "compare.sh: PyTorch is missing for $PY: installing python3-torch python3-h5py with apt-get" >&2
    apt_install python3-torch python3-h5py >&2 || { echo "compare.sh: could not install python3-torch" >&2; exit 1; }
    "$PY" -c 'import torch' || { echo "compare.sh: $PY still cannot import torch" >&2; exit 1; }
    NOTES+=("python3-torch and python3-h5py were missing and were installed with apt-get by this script")
  fi
  if [[ ! -x /usr/bin/time ]]; then
    echo "compare.sh: /usr/bin/time is missing: installing the Debian package 'time' with apt-get" >&2
    apt_install time >&2 || { echo "compare.sh: could not install time" >&2; exit 1; }
    NOTES+=("/usr/bin/time was missing; the Debian package 'time' was installed by this script")
  fi
fi

wait_for_tapelm() {  # the binary may be mid-rebuild: wait until it exists and has not changed for 3 s
  local tries=0
  while :; do
    if [[ -x $TAPELM ]]; then
      local age=$(( $(date +%s) - $(stat -c %Y "$TAPELM") ))
      [[ $age -ge 3 ]] && return 0
    fi
    (( tries++ == 0 )) && echo "  (waiting for $TAPELM_D to appear / finish linking)" >&2
    (( tries > 120 )) && { echo "compare.sh: $TAPELM_D is missing" >&2; return 1; }
    sleep 2
  done
}

# ---------------------------------------------------------------------------------- commands
# build_cmd ROW WHO SETTING -> sets CMD (array), ENVV (array of VAR=value) and CMD_TXT (for display)
build_cmd() {
  local row=$1 who=$2 setting=$3
  local name mode L H KV d T B DB it prec V
  read -r name mode L H KV d T B DB it prec V <<<"$row"
  prec=${prec:-f32}; V=${V:-65}
  local iters=${ITERS:-$it}
  local warm=${WARMUP:-$([[ $mode == train ]] && echo 2 || echo 1)}
  local th=${setting#t}; th=${th%f}; th=${th%p}
  ENVV=()
  [[ $setting == *p || $setting == *pf ]] && ENVV=(OMP_WAIT_POLICY=passive)
  # The same OpenBLAS kernels for PyTorch as tapelm runs; tapelm's f settings force them too.
  if [[ -n $BEST_CORE && ( $who == torch || $setting == *f ) ]]; then ENVV+=(OPENBLAS_CORETYPE="$BEST_CORE"); fi
  if [[ $who == tapelm ]]; then
    CMD=("$TAPELM" --threads "$th" bench --set "vocab_size=$V" --set "n_layer=$L" --set "n_head=$H"
         --set "n_kv_head=$KV" --set "n_embd=$d" --set "block_size=$T" --set "batch_size=$B"
         --mode "$mode")
    [[ $mode == decode ]] && CMD+=(--batch "$DB")
    [[ $prec != f32 ]] && CMD+=(--precision "$prec")
    CMD+=(--iters "$iters" --warmup "$warm" --json)
    CMD_TXT="${ENVV[*]:+${ENVV[*]} }/usr/bin/time -f %M $TAPELM_D ${CMD[*]:1}"
  else
    if [[ $prec == bf16 ]]; then  # bench.py's step with its forward under torch.autocast bf16
      CMD=("$PY" "$SCRIPT_DIR/autocast_bench.py" --reference-dir "$REF_DIR")
    else
      CMD=("$PY" "$REF_DIR/bench.py")
    fi
    local head=${#CMD[@]}
    CMD+=(--threads "$th" --vocab "$V" --layers "$L" --heads "$H" --kv-heads "$KV"
         --dim "$d" --block "$T" --batch "$B" --mode "$mode")
    [[ $mode == decode ]] && CMD+=(--decode-batch "$DB")
    CMD+=(--iters "$iters" --warmup "$warm")
    if [[ $prec == bf16 ]]; then
      CMD_TXT="${ENVV[*]:+${ENVV[*]} }/usr/bin/time -f %M $PY bench/autocast_bench.py --reference-dir $REF_D ${CMD[*]:head}"
    else
      CMD_TXT="${ENVV[*]:+${ENVV[*]} }/usr/bin/time -f %M $PY $REF_D/bench.py ${CMD[*]:head}"
    fi
  fi
}

# The OpenBLAS core tapelm runs with no environment variable (after its core guard): forced for
# PyTorch and for tapelm's f settings (OPENBLAS_CORETYPE=... on their command lines).
BEST_CORE=${FORCE_CORE:-}
if [[ -z $BEST_CORE && -x $TAPELM ]]; then
  BEST_CORE=$(env -u OPENBLAS_CORETYPE -u TAPELM_BLAS_CORE "$TAPELM" inspect --system 2>/dev/null | sed -n 's/^openblas core \([A-Za-z0-9_]*\).*/\1/p' | head -1)
fi

# bf16 rows: tapelm refuses bf16 on a CPU without bf16 instructions (one line saying what is
# missing); then only PyTorch's autocast runs, and the report says why tapelm's are absent.
BF16_REFUSED=""
for r in "${ROWS[@]}"; do
  read -r _ _ _ _ _ _ _ _ _ _ prec _ <<<"$r"
  [[ $prec == bf16 && $DRY == 0 ]] || continue
  if [[ -x $TAPELM ]] && ! probe=$("$TAPELM" --threads 1 bench --precision bf16 --set n_layer=1 --set n_embd=32 \
      --set n_head=2 --set block_size=8 --batch 1 --iters 1 --warmup 0 --json 2>&1 >/dev/null); then
    BF16_REFUSED=$(printf '%s' "$probe" | tail -1)
    NOTES+=("tapelm's bf16 runs were not made: ${BF16_REFUSED#tapelm: error: }")
    echo "compare.sh: tapelm refuses bf16 here (${BF16_REFUSED#tapelm: error: }): its bf16 runs are skipped" >&2
  fi
  break
done

# the runs of one round, in order: "rowindex who setting"
PLAN=()
for i in "${!ROWS[@]}"; do
  read -r name _ _ _ _ _ _ _ _ _ prec _ <<<"${ROWS[$i]}"
  tl=("${TAPELM_SET[@]}")
  if [[ $name == "$SCALING_ROW" && " ${tl[*]} " != *" t1 "* ]]; then tl+=(t1); fi
  # f32 training rows also run tapelm with the best core forced: its speed with no environment
  # variable set must be within 10 % of that (bf16 products do not run on OpenBLAS)
  [[ $name == train-* && ${prec:-f32} == f32 ]] && tl+=("t${THREADS}f")
  [[ ${prec:-f32} == bf16 && -n $BF16_REFUSED ]] && tl=()
  for s in "${tl[@]}"; do PLAN+=("$i tapelm $s"); done
  for s in "${PEER_SET[@]}"; do PLAN+=("$i torch $s"); done
done

if [[ $DRY == 1 ]]; then
  for p in "${PLAN[@]}"; do
    read -r i who s <<<"$p"; read -r name _ <<<"${ROWS[$i]}"
    build_cmd "${ROWS[$i]}" "$who" "$s"
    echo "# $name $who $s"; echo "$CMD_TXT"
  done
  echo "# x $ROUNDS rounds" ; exit 0
fi

# ------------------------------------------------------------------------------------ meta
ITERS_DESC=${ITERS:-"train 10, nano 5, decode 5"}
WARMUP_DESC=${WARMUP:-"train 2, decode 1"}
TAPELM_REV=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo "?")
TAPELM_BLAS_CORE=""
TAPELM_BLAS_LIB=""
if [[ $DRY != 1 ]] && wait_for_tapelm; then
  TAPELM_BLAS_CORE=$(env -u OPENBLAS_CORETYPE -u TAPELM_BLAS_CORE "$TAPELM" inspect --system 2>/dev/null | sed -n 's/^openblas core //p' | head -1)
  TAPELM_BLAS_LIB=$(ldd "$TAPELM" 2>/dev/null | awk '/libopenblas/ {print $3; exit}' | sed 's|.*/\(openblas[^/]*/[^/]*\)$|\1|')
fi
tbest=""
for s in "${TAPELM_SET[@]}"; do tbest+="${tbest:+, }$s"; done
TAPELM_BEST_DESC="the best of its setting(s) $tbest (tK = K threads, p = OMP_WAIT_POLICY=passive); the 1-thread run on $SCALING_ROW only serves the scaling row"
[[ " ${TAPELM_SET[*]} " == *" t1 "* ]] && TAPELM_BEST_DESC="the best of its settings $tbest (tK = K threads, p = OMP_WAIT_POLICY=passive)"

DATE=$(date '+%Y-%m-%d %H:%M %Z')
meta_json() {  # $1: partial description or empty
  M_DATE="$DATE" M_ROUNDS="$ROUNDS" M_THREADS="$THREADS" M_QUICK="$QUICK" M_ITERS="$ITERS_DESC" M_WARMUP="$WARMUP_DESC" \
  M_TBIN="$TAPELM_D" M_TREV="$TAPELM_REV" M_TCORE="$TAPELM_BLAS_CORE" M_TLIB="$TAPELM_BLAS_LIB" \
  M_TBEST="$TAPELM_BEST_DESC" M_INV="$INVOCATION" M_FORCED="$BEST_CORE" "$PY" - "$1" "${NOTES[@]}" <<'EOF'
import json, os, sys
e = os.environ
print(json.dumps({
    "date": e["M_DATE"], "rounds": int(e["M_ROUNDS"]), "threads": int(e["M_THREADS"]), "quick": e["M_QUICK"] == "1",
    "iters_desc": e["M_ITERS"], "warmup_desc": e["M_WARMUP"],
    "tapelm_bin": e["M_TBIN"], "tapelm_rev": e["M_TREV"],
    "tapelm_blas_core": e["M_TCORE"], "tapelm_blas_lib": e["M_TLIB"],
    "tapelm_best_desc": e["M_TBEST"], "invocation": e["M_INV"], "forced_core": e["M_FORCED"],
    "partial": sys.argv[1], "notes": sys.argv[2:]}))
EOF
}
report() {  # $1: partial description or empty;  $2: quiet?
  local meta; meta=$(meta_json "$1")
  if [[ ${2:-} == quiet ]]; then
    "$PY" "$HELPER" report --raw "$RAW" --out "$OUT" --out-display "$(rel "$OUT")" --meta "$meta" \
      --tapelm-best-from "$TAPELM_SETTINGS" >/dev/null 2>&1
  else
    "$PY" "$HELPER" report --raw "$RAW" --out "$OUT" --out-display "$(rel "$OUT")" --meta "$meta" \
      --tapelm-best-from "$TAPELM_SETTINGS"
  fi
}

# ------------------------------------------------------------------------------------- run
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tapelm-compare.XXXXXX")
CHILD=""
cleanup() { rm -rf "$TMP"; }
on_int() {
  echo "" >&2; echo "compare.sh: interrupted" >&2
  [[ -n $CHILD ]] && kill "$CHILD" 2>/dev/null
  [[ -s $RAW ]] && report "interrupted" quiet && echo "partial results in $(rel "$OUT")" >&2
  cleanup; exit 130
}
trap on_int INT TERM
trap cleanup EXIT
: >"$RAW"

TOTAL=$(( ${#PLAN[@]} * ROUNDS ))
echo "compare.sh: ${#ROWS[@]} row(s), ${#PLAN[@]} runs per round, $ROUNDS round(s): $TOTAL runs; tapelm $TAPELM_D ($TAPELM_REV), PyTorch $REF_D/bench.py via $PY" >&2
echo "compare.sh: raw runs -> $(rel "$RAW"); results -> $(rel "$OUT")" >&2
uptime_load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)
[[ -n $uptime_load ]] && echo "compare.sh: load average now $uptime_load (want a quiet machine)" >&2

eta() {  # remaining runs from plan index $1 of round $2
  local r=$2 k=$1
  {
    while (( r <= ROUNDS )); do
      while (( k < ${#PLAN[@]} )); do
        read -r i who s <<<"${PLAN[$k]}"; read -r name _ <<<"${ROWS[$i]}"
        echo "$name $who $s"; k=$((k + 1))
      done
      k=0; r=$((r + 1))
    done
  } | "$PY" "$HELPER" eta --raw "$RAW"
}

N=0
START=$(date +%s)
for (( round = 1; round <= ROUNDS; round++ )); do
  for k in "${!PLAN[@]}"; do
    read -r i who s <<<"${PLAN[$k]}"
    read -r name _ <<<"${ROWS[$i]}"
    N=$((N + 1))
    build_cmd "${ROWS[$i]}" "$who" "$s"
    left=$( (( N > 1 )) && eta "$k" "$round" || echo "?")
    printf '[%d/%d] round %d/%d  %-19s %-6s %-4s  (elapsed %ds, ETA %s)\n' \
      "$N" "$TOTAL" "$round" "$ROUNDS" "$name" "$( [[ $who == torch ]] && echo PyTorch || echo tapelm)" "$s" \
      "$(( $(date +%s) - START ))" "$left" >&2
    tries=1
    [[ $who == tapelm ]] && tries=2
    rc=127; secs=0; : >"$TMP/out"; : >"$TMP/rss"; echo "tapelm binary not available" >"$TMP/err"
    for (( t = 1; t <= tries; t++ )); do
      [[ $who == tapelm ]] && { wait_for_tapelm || break; }
      t0=$(date +%s.%N)
      env -u OMP_WAIT_POLICY -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u GOTO_NUM_THREADS \
          -u MKL_NUM_THREADS "${ENVV[@]}" \
          timeout "$TIMEOUT" /usr/bin/time -f %M -o "$TMP/rss" "${CMD[@]}" >"$TMP/out" 2>"$TMP/err" &
      CHILD=$!
      wait "$CHILD"; rc=$?
      CHILD=""
      t1=$(date +%s.%N)
      secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
      # a tapelm failure while the binary is being rebuilt: wait and retry once
      if [[ $who == tapelm && $rc != 0 && $t -lt $tries ]] && ! grep -q '^{' "$TMP/out"; then
        echo "    (tapelm failed with exit $rc; retrying once in 5 s in case it was being rebuilt)" >&2
        sleep 5; continue
      fi
      break
    done
    "$PY" "$HELPER" record --row "$name" --who "$who" --setting "$s" --round "$round" --rc "$rc" \
      --secs "$secs" --stdout "$TMP/out" --stderr "$TMP/err" --rss-file "$TMP/rss" \
      --cmd "$CMD_TXT" >>"$RAW"
  done
  (( round < ROUNDS )) && report "after round $round of $ROUNDS" quiet
done

echo "compare.sh: done in $(( $(date +%s) - START )) s" >&2
report ""
