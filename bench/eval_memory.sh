#!/usr/bin/env bash
# The streamed evaluation's memory estimate (train/eval.h streamed_eval_bytes) against its peak
# RSS (bench/EVAL_MEMORY.md): one synthetic model of Llama's layout (bench/make_synthetic_hf,
# random BF16 weights) as an HF directory, as a checkpoint (BF16 kept, and widened to f32) and as
# GGUF files (f32, q8_0), each evaluated with --stream on several token counts and batches under
# /usr/bin/time. Prints one Markdown row a run: the estimate, the peak RSS and their ratio.
#
#   bench/eval_memory.sh [WORKDIR (bench_work/eval_memory)]   # BUILD=build by default
#
# Needs a build with -DTAPELM_BENCH=ON (make_synthetic_hf) and about 5 GB of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench_work/eval_memory}
build=${BUILD:-build}
mkdir -p "$work"
shape=(--layers 8 --d 2048 --heads 16 --kv 16 --hidden 5504 --vocab 32000 --ctx 2048)
if [ ! -f "$work/hf/config.json" ]; then
  "$build/make_synthetic_hf" --out "$work/hf" "${shape[@]}" >/dev/null
  # a byte-level vocabulary of the model's 32,000 ids (GGUF files carry one): GPT-2's bytes-to-characters
  # table, then pairs of them, no merges
  /usr/bin/python3 bench/byte_vocab.py "$work/hf" --ids 32000
fi
[ -f "$work/bf16.h5" ] || "$build/tapelm" import --format hf --model "$work/hf" --out "$work/bf16.h5" >/dev/null
[ -f "$work/f32.h5" ] || "$build/tapelm" convert --from "$work/hf" --kv-heads 16 --dtype f32 --out "$work/f32.h5" >/dev/null
for q in f32 q8_0; do
  [ -f "$work/$q.gguf" ] || "$build/tapelm" export --checkpoint "$work/hf" --format gguf --dtype "$q" --out "$work/$q.gguf" >/dev/null
done
"$build/tapelm" inspect --system | grep -E '^(cpu|threads)'
echo "| form | tokens | batch | estimate | peak RSS | estimate / RSS |"
echo "|---|---:|---:|---:|---:|---:|"
for form in hf bf16.h5 f32.h5 f32.gguf q8_0.gguf; do
  for run in "2048 1" "4096 16" "8192 2"; do
    set -- $run
    out=$(/usr/bin/time -f "rss %M" "$build/tapelm" eval --checkpoint "$work/$form" --data corpora/tinyshakespeare.txt \
            --stream --tokens "$1" --batch "$2" --json 2>&1)
    est=$(echo "$out" | grep -o '"memory_estimate_bytes":[0-9.e+]*' | cut -d: -f2)
    rss=$(echo "$out" | grep -o '^rss [0-9]*' | cut -d' ' -f2)
    awk -v f="$form" -v t="$1" -v b="$2" -v e="$est" -v r="$rss" \
      'BEGIN { printf "| %s | %d | %d | %.2f GB | %.2f GB | %.3f |\n", f, t, b, e / 1e9, r * 1024 / 1e9, e / (r * 1024) }'
  done
done
