#!/usr/bin/env bash
# Peak RSS and step time of bf16 against f32 training on GPT-2-small's shape (12 layers, d 768,
# 12 heads, vocab 50257: 124 M parameters; T 512, batch 4, dropout 0): `tapelm bench --mode
# train` of 3 timed steps after 1 untimed, under /usr/bin/time, f32 and bf16 alternating, ROUNDS
# rounds. With BASE=path/to/another/tapelm each round also runs that binary, alternating, for
# before/after pairs (docs/guide/precision.md, "What is kept"). Needs a CPU with AVX512-BF16
# (bf16-emulated otherwise: PRECISIONS="f32 bf16-emulated") and about 6 GB.
#
#   bench/bf16_memory.sh [ROUNDS (3)]      # BUILD=build by default
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=$(realpath "${BUILD:-build}")
unset OPENBLAS_CORETYPE TAPELM_BLAS_CORE
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/cfg.json" <<JSON
{"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 512, "batch_size": 4, "dropout": 0}
JSON
bins=("$build/tapelm")
[ -n "${BASE:-}" ] && bins=("$(realpath "$BASE")" "${bins[@]}")
"$build/tapelm" inspect --system | grep -E '^(cpu|simd|bf16)'
echo "| round | binary | precision | peak RSS (GiB) | median step (s) |"
echo "|---|---|---|---:|---:|"
for r in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    for p in ${PRECISIONS:-f32 bf16}; do
      /usr/bin/time -f "%M" -o "$work/rss" "$bin" bench --mode train --config "$work/cfg.json" --iters 3 --warmup 1 \
        --precision "$p" --json > "$work/out" 2> "$work/err" || { cat "$work/err" >&2; exit 1; }
      step=$(grep -o '"median_s":[0-9.]*' "$work/out" | cut -d: -f2)
      echo "| $r | $bin | $p | $(awk -v k="$(cat "$work/rss")" 'BEGIN{printf "%.3f", k / 1048576}') | $(printf %.2f "$step") |"
    done
  done
done
