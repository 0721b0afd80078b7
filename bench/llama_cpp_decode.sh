#!/usr/bin/env bash
# Decoding speed per KV count in llama.cpp beside tapelm, at bench/decode.sh's shape but for the
# SwiGLU width (1408, Llama's 8/3·d): 6 layers, 8 heads, d 512, RoPE, rmsnorm, vocabulary 512 (the tests' sentencepiece model),
# KV heads 8, 4, 2, 1; decode.sh's rows (batch 1 at contexts 256, 1024, 4096; batch 16 at 256 and
# 1024); 128 timed steps after prefilling the rest of each sequence's context. Weights are random (one training step from the init), converted to fewer KV
# heads by mean pooling, exported to GGUF (f32, and q8_0 as people run llama.cpp) — speed does not
# depend on their values. llama.cpp is the prebuilt CPU library npm's @node-llama-cpp/linux-x64
# ships, called directly by bench/llama_cpp_decode.cpp (compiled here against the llama.h of the
# llama.cpp source node-llama-cpp bundles; node-llama-cpp's own evaluation loop adds milliseconds
# per token), with llama.cpp's default context settings (flash attention auto) and its KV cache in
# f16 (its default) and q8_0; q8_0 weights with the f16 and the q8_0 cache. tapelm runs `bench
# --mode decode` at the same shapes with f32 weights and cache, and with q8_0 weights (--weights
# q8_0) and an f16 or q8 cache. Both use 2 threads and run alternately, row by row. Prints JSON lines.
#
#   mkdir /tmp/nlc && (cd /tmp/nlc && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install \
#       node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1)
#   bash bench/llama_cpp_decode.sh NODE_MODULES [REPS (3)] > bench/LLAMA_CPP_DECODE.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
modules=$1
reps=${2:-3}
# rows: batch, context (bench/decode.sh's); ROWS="16 256;1 4096" runs only those rows again
if [[ ${ROWS:-} == *$'\n'* ]]; then echo "llama_cpp_decode.sh: ROWS: rows are separated by ';', not new lines" >&2; exit 1; fi
if [ -n "${ROWS:-}" ]; then IFS=';' read -r -a ROWS <<< "$ROWS"; else ROWS=("1 256" "1 1024" "1 4096" "16 256" "16 1024"); fi
for row in "${ROWS[@]}"; do
  [[ $row =~ ^[0-9]+\ [0-9]+$ ]] && [ "${row#* }" -gt 128 ] ||
    { echo "llama_cpp_decode.sh: ROWS: '$row' is not 'BATCH CONTEXT' with CONTEXT above 128 (e.g. ROWS=\"16 256;1 4096\")" >&2; exit 1; }
done
T=build/tapelm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
libs=$(bash bench/build_llama_cpp_decode.sh "$modules" "$work")
head -c 200000 corpora/tinyshakespeare.txt > "$work/t.txt"
$T prepare --text "$work/t.txt" --out "$work/c" --tokenizer-model tests/fixtures/spm_bpe512.model --quiet > /dev/null
keys='"n_layer": 6, "n_head": 8, "n_kv_head": 8, "n_embd": 512, "mlp_hidden": 1408, "block_size": 4096, "norm": "rmsnorm",
  "mlp": "swiglu", "pos": "rope", "batch_size": 1, "max_iters": 1, "eval_iters": 1, "eval_interval": 1'
echo "{$keys}" > "$work/cfg.json"
$T train --config "$work/cfg.json" --data "$work/c" --out "$work/run" --quiet > /dev/null
for kv in 8 4 2 1; do
  $T convert --from "$work/run/checkpoint.h5" --kv-heads $kv --method mean --out "$work/kv$kv.h5" > /dev/null
  for dt in f32 q8_0; do
    $T export --checkpoint "$work/kv$kv.h5" --format gguf --dtype $dt --out "$work/kv${kv}_$dt.gguf" > /dev/null
  done
done
# what runs per row: weights and cache of tapelm and of llama.cpp (RUNS overrides, e.g. RUNS=llama:f32:f32
# for llama.cpp's f32 cache, off its fast path: 2-12x slower than its f16 cache in the 2026-11-25 table)
RUNS=${RUNS:-tapelm:f32:f32 tapelm:q8_0:f16 tapelm:q8_0:q8 llama:f32:f16 llama:q8_0:f16 llama:q8_0:q8_0}
for row in "${ROWS[@]}"; do
  read -r B C <<< "$row"
  for kv in 8 4 2 1; do
    for run in $RUNS; do
      IFS=: read -r who dt cache <<< "$run"
      if [ "$who" = tapelm ]; then
        $T bench --mode decode --json --config "$work/cfg.json" --set n_kv_head=$kv --batch "$B" --prompt $((C - 128)) --context $C \
          --iters "$reps" --warmup 1 --weights $dt --kv-cache $cache 2>/dev/null |
          python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'impl': 'tapelm', 'dtype': '$dt', 'kv_cache': '$cache', 'batch': $B, 'KV': $kv, 'context': d['context'], 'step_ms': d['step_ms'], 'step_ms_min': d['step_ms_min'], 'step_ms_max': d['step_ms_max'], 'prefill_ms': d['prefill_ms'], 'threads': d['threads'], 'bandwidth_limit_pct': d['bandwidth_limit_pct'], 'cpu': d['cpu']}))"
      else
        "$work/lcd" "$libs" "$work/kv${kv}_$dt.gguf" $C 128 "$reps" 2 "$B" "$cache" |
          python3 -c "import json,sys; d=json.load(sys.stdin); d['KV']=$kv; d['dtype']='$dt'; print(json.dumps(d))"
      fi
    done
  done
done
