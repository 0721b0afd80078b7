#!/usr/bin/env bash
# A model larger than memory in float32, converted one block at a time (bench/CONVERT_STREAMED.md):
# a synthetic Hugging Face directory of a real MHA model's shape (bench/make_synthetic_hf.cpp,
# random BF16 weights) converted by aligned-fit with 16,384 calibration tokens of tinyshakespeare
# and written as an HF directory in BF16, then the result evaluated on 4,096 tokens (the README's
# two commands), each under
# /usr/bin/time for the wall time and the peak RSS. Before it: the import (streamed, BF16 kept),
# a `mean` conversion checked against the definition by bench/check_mean_conversion.py (which
# reads the safetensors itself), and a streamed sample of the mean conversion (byte-level
# vocabulary added: the synthetic model has no tokenizer).
#
#   bench/convert_streamed.sh [llama2-7b|gpt2-xl] [WORKDIR (bench_work)]   # BUILD=build by default
#
# Needs a build with -DTAPELM_BENCH=ON (make_synthetic_hf), python3-numpy for the check, and the
# disk for the model (13.5 GB for Llama-2-7B in BF16, 3.2 GB for GPT-2-XL) and its conversions.
# GPT-2's HF layout has no config with fewer KV heads: gpt2-xl is written as a tapelm checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:-llama2-7b}
work=${2:-bench_work}
build=${BUILD:-build}
timed() { /usr/bin/time -f "wall %e s, peak RSS %M KB" "$@" 2>&1; }
case "$shape" in
  llama2-7b) shape_args=(); kv=8; out="$work/$shape-kv$kv"; format=(--format hf --dtype bf16) ;;
  gpt2-xl) shape_args=(--family gpt2 --layers 48 --d 1600 --heads 25 --kv 25 --hidden 6400 --vocab 50257 --ctx 1024); kv=5
           out="$work/$shape-kv$kv.h5"; format=() ;;
  *) echo "convert_streamed.sh: shape $shape: llama2-7b or gpt2-xl" >&2; exit 1 ;;
esac
mkdir -p "$work"
dir="$work/$shape"
[ -f "$dir/config.json" ] || "$build/make_synthetic_hf" --out "$dir" "${shape_args[@]}"
"$build/tapelm" inspect --system | grep -E '^(cpu|simd|threads|sgemm peak|cpu peak|memory bandwidth)'
echo "model: $(du -sh "$dir" | cut -f1) in $(ls "$dir"/*.safetensors | wc -l) safetensors files"
echo "--- import (one tensor at a time, BF16 kept)"
timed "$build/tapelm" import --format hf --model "$dir" --out "$work/$shape.import.h5"
rm -f "$work/$shape.import.h5"
if [ "$shape" = llama2-7b ]; then
  echo "--- mean conversion, checked against the definition"
  rm -rf "$work/$shape-mean"
  timed "$build/tapelm" convert --from "$dir" --kv-heads "$kv" --method mean "${format[@]}" --out "$work/$shape-mean" | tail -2
  /usr/bin/python3 bench/check_mean_conversion.py "$dir" "$work/$shape-mean" --blocks 0 15 31 | grep -v "the same bytes"
  echo "--- sample from it, one block at a time per token"
  /usr/bin/python3 bench/byte_vocab.py "$work/$shape-mean"
  timed "$build/tapelm" sample --checkpoint "$work/$shape-mean" --prompt "ROMEO:" --tokens 3 --greedy
  rm -rf "$work/$shape-mean"
fi
echo "--- convert, one block at a time"
if [ -e "$out" ]; then
  echo "$out: kept from an earlier run (remove it to time the conversion again)"
else
  timed "$build/tapelm" convert --from "$dir" --kv-heads "$kv" --method aligned-fit \
    --calib corpora/tinyshakespeare.txt --calib-tokens 16384 "${format[@]}" --out "$out"
fi
du -sh "$out"
echo "--- eval of the result on 4,096 tokens (streamed when it does not fit in float32), as the README runs it"
timed "$build/tapelm" eval --checkpoint "$out" --data corpora/tinyshakespeare.txt --tokens 4096
