#!/usr/bin/env bash
# Two tapelm binaries' decoding steps side by side, alternating run by run (A B A B ...), at
# bench/llama_cpp_decode.sh's shape (6 layers, 8 heads, d 512, SwiGLU 1408, vocabulary 512; the
# last 128 positions of CONTEXT timed) for each KV count: the median step time over ROUNDS runs
# with its min–max, and the median of each run's context switches (perf stat), which count the
# times a thread of the team went to sleep and had to be woken.
#
#   bench/decode_ab.sh A_BINARY B_BINARY [WEIGHTS f32|q8_0] [CACHE f32|f16|q8] [BATCH] [CONTEXT] [ROUNDS] ["KVS"]
#   e.g. bench/decode_ab.sh /tmp/tapelm_before build/tapelm q8_0 f16 1 256 7 "4 2 1"
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1 b=$2 w=${3:-q8_0} cache=${4:-f16} batch=${5:-1} ctx=${6:-256} rounds=${7:-7} kvs=${8:-8 4 2 1}
unset OPENBLAS_CORETYPE TAPELM_BLAS_CORE
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cfg.json" <<'JSON'
{"n_layer": 6, "n_head": 8, "n_kv_head": 8, "n_embd": 512, "mlp_hidden": 1408, "block_size": 4096, "norm": "rmsnorm",
 "mlp": "swiglu", "pos": "rope", "vocab_size": 512, "batch_size": 1, "max_iters": 1, "eval_iters": 1, "eval_interval": 1}
JSON
"$b" inspect --system | grep -E '^(cpu|simd)'
for r in $(seq "$rounds"); do
  for who in A B; do
    bin=$a; [ "$who" = B ] && bin=$b
    for kv in $kvs; do
      ms=$(perf stat -e context-switches -x, -o "$work/ps" "$bin" bench --mode decode --json --config "$work/cfg.json" \
             --set n_kv_head="$kv" --batch "$batch" --prompt $((ctx - 128)) --context "$ctx" --iters 8 --warmup 1 \
             --weights "$w" --kv-cache "$cache" 2> /dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['step_ms'])")
      echo "$who $kv $ms $(grep context-switches "$work/ps" | cut -d, -f1)" >> "$work/rows"
    done
  done
done
python3 - "$work/rows" "$w" "$cache" "$batch" "$ctx" <<'PY'
import collections, statistics, sys
ms, cs = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    who, kv, t, c = line.split()
    ms[(who, int(kv))].append(float(t))
    cs[(who, int(kv))].append(int(c))
print(f"weights {sys.argv[2]}, cache {sys.argv[3]}, batch {sys.argv[4]}, context {sys.argv[5]}")
print("| binary | KV | step ms, median (min–max) | context switches a run, median |")
print("|---|---:|---:|---:|")
for k in sorted(ms, key=lambda k: (k[0], -k[1])):
    v = ms[k]
    print(f"| {k[0]} | {k[1]} | {statistics.median(v):.3f} ({min(v):.3f}–{max(v):.3f}) | {statistics.median(cs[k]):.0f} |")
PY
