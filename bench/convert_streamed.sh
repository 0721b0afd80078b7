#!/usr/bin/env bash
# A model larger than memory in float32, converted one block at a time (bench/CONVERT_STREAMED.md):
# a synthetic Hugging Face directory of a real MHA model's shape (bench/make_synthetic_hf.cpp,
# random BF16 weights) converted by aligned-fit with 16,384 calibration tokens of tinyshakespeare,
# then the result evaluated on 4,096 tokens, each under /usr/bin/time for the wall time and the
# peak RSS. The import of the same directory is tried first: for Llama-2-7B on a 24 GB machine it
# is refused (the whole model in float32).
#
#   bench/convert_streamed.sh [llama2-7b|gpt2-xl] [WORKDIR (bench_work)]   # BUILD=build by default
#
# Needs a build with -DTAPELM_BENCH=ON (make_synthetic_hf) and the disk for the model (13.5 GB for
# Llama-2-7B in BF16, 3.2 GB for GPT-2-XL) and its conversion.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:-llama2-7b}
work=${2:-bench_work}
build=${BUILD:-build}
case "$shape" in
  llama2-7b) shape_args=(); kv=8 ;;
  gpt2-xl) shape_args=(--family gpt2 --layers 48 --d 1600 --heads 25 --kv 25 --hidden 6400 --vocab 50257 --ctx 1024); kv=5 ;;
  *) echo "convert_streamed.sh: shape $shape: llama2-7b or gpt2-xl" >&2; exit 1 ;;
esac
mkdir -p "$work"
dir="$work/$shape"
[ -f "$dir/config.json" ] || "$build/make_synthetic_hf" --out "$dir" "${shape_args[@]}"
"$build/tapelm" inspect --system | grep -E '^(cpu|simd|threads|sgemm peak|cpu peak|memory bandwidth)'
echo "model: $(du -sh "$dir" | cut -f1) in $(ls "$dir"/*.safetensors | wc -l) safetensors files"
echo "--- import (the whole model in float32)"
"$build/tapelm" import --format hf --model "$dir" --out "$work/$shape.import.h5" 2>&1 || true
rm -f "$work/$shape.import.h5"
out="$work/$shape-kv$kv.h5"
echo "--- convert, one block at a time"
if [ -f "$out" ]; then
  echo "$out: kept from an earlier run (remove it to time the conversion again)"
else
  /usr/bin/time -f "wall %e s, peak RSS %M KB" "$build/tapelm" convert --from "$dir" --kv-heads "$kv" --method aligned-fit \
    --calib corpora/tinyshakespeare.txt --calib-tokens 16384 --out "$out" 2>&1
fi
ls -l "$out"
echo "--- eval of the result on 4,096 tokens (streamed when it does not fit in float32)"
/usr/bin/time -f "wall %e s, peak RSS %M KB" "$build/tapelm" eval --checkpoint "$out" --data corpora/tinyshakespeare.txt \
  --tokens 4096 --batch 1 2>&1
