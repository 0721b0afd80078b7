#!/usr/bin/env bash
# Sharded training state (the training key `shard`: ZeRO stage 1 `optimizer`, stage 2
# `gradients`, stage 3 `parameters`) against the printed memory estimate: GPT-2-medium's shape (24 layers, d 1024,
# 16 heads, vocab 50257: 355 M parameters; T 256, batch 1, dropout 0) trained 2 steps on the first
# 40 kB of tinyshakespeare, one process, then N ranks with each `shard` (each rank one thread).
# Each rank runs under /usr/bin/time; prints per run the estimate `train` printed, every rank's
# peak RSS and their ratio (bench/SHARD_MEMORY.md).
#
#   bench/shard_memory.sh [WORKDIR (bench_work/shard_memory)]   # BUILD=build by default
#   RUNS="2 gradients;4 gradients" bench/shard_memory.sh         # "ranks shard" pairs, ; between
#   RUNS="1 none bf16;2 gradients bf16" bench/shard_memory.sh     # a third word: the key `moments`
#   RUNS="2 parameters f32 blocks" bench/shard_memory.sh          # a fourth: the key `recompute`
#   COMMAND=uptrain bench/shard_memory.sh                         # `uptrain` instead of `train`:
#       an MHA model of the same shape (its random init, written by `train` with max_iters 0),
#       converted to 4 KV heads by mean pooling on rank 0, then uptrained 2 steps (fraction 1 of
#       max_iters set to 2) by every rank
#
# Needs about 18 GB of memory (2 ranks unsharded; 4 ranks sharding gradients) and 5 GB of disk
# (the checkpoint of 355 M parameters with AdamW).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench_work/shard_memory}
build=$(realpath "${BUILD:-build}")
unset OPENBLAS_CORETYPE TAPELM_BLAS_CORE
mkdir -p "$work"
head -c 40000 corpora/tinyshakespeare.txt > "$work/text.txt"
cat > "$work/cfg.json" <<JSON
{"n_layer": 24, "n_head": 16, "n_embd": 1024, "vocab_size": 50257, "block_size": 256, "batch_size": 1, "dropout": 0,
 "max_iters": 2, "eval_iters": 1, "eval_interval": 1000, "log_interval": 1, "checkpoint_interval": 1000, "threads": 1}
JSON
command=${COMMAND:-train}
if [ "$command" = uptrain ]; then
  rm -rf "$work/source"
  "$build/tapelm" train --config "$work/cfg.json" --data "$work/text.txt" --out "$work/source" --set max_iters=0 --quiet
  args=(uptrain --from "$work/source/checkpoint.h5" --kv-heads 4 --method mean --fraction 1 --set max_iters=2)
else
  args=(train --config "$work/cfg.json")
fi
cat > "$work/rank.sh" <<'SH'
#!/bin/sh
exec /usr/bin/time -f "%M" -o "$RSS_DIR/rss.${OMPI_COMM_WORLD_RANK:-0}" "$@"
SH
chmod +x "$work/rank.sh"
"$build/tapelm" inspect --system | grep -E '^(cpu|simd)'
# tapelm prints sizes in binary units under the names KB, MB, GB (byte_size_str divides by 1024);
# the RSS column is in decimal GB (10^9 bytes), and the ratio compares the two in bytes
echo "| run ($command) | estimate a rank (printed by $command; its GB are GiB) | peak RSS by rank | estimate / RSS |"
echo "|---|---|---|---|"
IFS=';' read -r -a runs <<< "${RUNS:-1 none;2 none;2 optimizer;2 gradients;4 gradients}"
for run in "${runs[@]}"; do
  set -- $run
  rm -rf "$work/run" "$work"/rss.*
  launch=()
  [ "$1" -gt 1 ] && launch=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$1")
  out=$(RSS_DIR="$work" "${launch[@]}" "$work/rank.sh" "$build/tapelm" "${args[@]}" --data "$work/text.txt" \
          --out "$work/run" --set shard="$2" --set moments="${3:-f32}" --set recompute="${4:-none}" 2>&1)
  est=$(echo "$out" | grep -o 'memory estimate[a-z ]* [0-9.]* [KMG]B' | head -1 | grep -o '[0-9.]* [KMG]B')
  rss=""; ratio=""
  for f in "$work"/rss.*; do
    kib=$(cat "$f")
    rss+="${rss:+, }$(awk -v k="$kib" 'BEGIN { printf "%.2f GB", k * 1024 / 1e9 }')"
    ratio+="${ratio:+, }$(awk -v k="$kib" -v e="$est" 'BEGIN { split(e, a, " "); m = a[2] == "GB" ? 2^30 : a[2] == "MB" ? 2^20 : 2^10; printf "%.3f", a[1] * m / (k * 1024) }')"
  done
  echo "| $1 rank$([ "$1" -gt 1 ] && echo s), shard $2$([ -n "${3:-}" ] && echo ", moments $3")$([ -n "${4:-}" ] && echo ", recompute $4") | $est | $rss | $ratio |"
  echo "$out" | grep -E '^(step 2/2|uptrained)' | head -2 >&2
done
rm -rf "$work/run" "$work/source"
