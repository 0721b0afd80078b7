#!/usr/bin/env bash
# Step time of the sharded training state (the training key `shard`) against plain data
# parallelism on 2 ranks of one thread each: `shard: none` (one all-reduce of every gradient per
# step), `optimizer` (ZeRO stage 1: the same all-reduce, then each rank updates its share and
# broadcasts it) and `gradients` (ZeRO stage 2: each gradient reduced to its keeper during
# backward, one MPI_Reduce a parameter, then the same updates; the new values go back by
# MPI_Ibcast in both stages), and `parameters` (ZeRO stage 3: stage 2, and each block's weights
# kept by one rank, MPI_Ibcast to the other just before the block's forward and again before its
# backward). Two shapes: `mid`
# (6 layers, d 256, T 128, batch 32 a rank; 4.8 M parameters, where the per-parameter messages'
# latency shows) and GPT-2-small's (12 layers, d 768, vocab 50257, T 256, batch 2 a rank; 124 M,
# where their bytes do). The three settings run in turn, ROUNDS times; each run's figure is the
# median tokens/s `train` prints over its steps, the table the median over rounds with the spread
# (min-max) and the ratio to `none` (bench/SHARD_MEMORY.md).
#
#   bench/shard_speed.sh [WORKDIR (bench_work/shard_speed)]   # BUILD=build, ROUNDS=3 by default
#   SHARDS="none gradients parameters" bench/shard_speed.sh    # the settings (first: the ratios' base)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench_work/shard_speed}
build=$(realpath "${BUILD:-build}")
rounds=${ROUNDS:-3}
read -r -a shards <<< "${SHARDS:-none optimizer gradients}"
unset OPENBLAS_CORETYPE TAPELM_BLAS_CORE
mkdir -p "$work"
head -c 200000 corpora/tinyshakespeare.txt > "$work/text.txt"
common='"dropout": 0, "eval_iters": 1, "eval_interval": 100000, "log_interval": 1, "checkpoint_interval": 100000, "final_eval_tokens": 256, "threads": 1'
cat > "$work/mid.json" <<JSON
{"n_layer": 6, "n_head": 8, "n_embd": 256, "vocab_size": 65, "block_size": 128, "batch_size": 32, "max_iters": 30, $common}
JSON
cat > "$work/gpt2.json" <<JSON
{"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50257, "block_size": 256, "batch_size": 2, "max_iters": 8, $common}
JSON
"$build/tapelm" inspect --system | grep -E '^(cpu|simd)'
declare -A rates
for r in $(seq "$rounds"); do
  for shape in mid gpt2; do
    for shard in "${shards[@]}"; do
      rm -rf "$work/run"
      out=$(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$build/tapelm" train --config "$work/$shape.json" \
              --data "$work/text.txt" --out "$work/run" --set shard="$shard" 2>&1)
      rate=$(echo "$out" | grep -o 'median [0-9]* tokens/s' | grep -o '[0-9]*')
      rates[$shape.$shard]+="$rate "
      echo "round $r $shape $shard: $rate tokens/s" >&2
    done
  done
done
rm -rf "$work/run"
echo "| shape | shard | tokens/s, median of $rounds (min-max) | ÷ ${shards[0]} |"
echo "|---|---|---:|---:|"
for shape in mid gpt2; do
  base=$(echo "${rates[$shape.${shards[0]}]}" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  for shard in "${shards[@]}"; do
    echo "${rates[$shape.$shard]}" | tr ' ' '\n' | grep . | sort -n |
      awk -v s="$shape" -v h="$shard" -v b="$base" '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "| %s | %s | %d (%d-%d) | %.3f |\n", s, h, m, a[1], a[NR], m/b}'
  done
done
