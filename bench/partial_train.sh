#!/usr/bin/env bash
# Training only part of a model (the `trainable` key, `uptrain --train`): peak RSS and step time of
# `tapelm bench --mode train` on GPT-2-small's shape (12 layers, d 768, 12 heads, vocab 50257,
# T 512, batch 4) for trainable all, attention and kv, stored and with recompute blocks; the
# settings alternate (all, attention, kv, all, ...) for REPS rounds, so that drift of the machine
# falls on each alike. Prints one Markdown row a setting: median step time with its spread over
# the rounds, the ratio to `all` paired by round, and the largest peak RSS.
#
#   bench/partial_train.sh [REPS (3)]   # BUILD=build by default; OPENBLAS_CORETYPE is unset
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
build=${BUILD:-build}
unset OPENBLAS_CORETYPE TAPELM_BLAS_CORE
shape=(--set n_layer=12 --set n_head=12 --set n_embd=768 --set vocab_size=50257 --set block_size=512 --set batch_size=4
       --set dropout=0)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tapelm" inspect --system | grep -E '^(cpu|simd|threads)'
for r in $(seq "$reps"); do
  for rc in none blocks; do
    for t in all attention kv; do
      /usr/bin/time -f "%M" -o "$tmp/rss" "$build/tapelm" bench --mode train "${shape[@]}" --set "trainable=$t" \
        --set "recompute=$rc" --iters 3 --warmup 1 --json >"$tmp/out"
      echo "{\"round\": $r, \"recompute\": \"$rc\", \"trainable\": \"$t\", \"rss_kib\": $(cat "$tmp/rss"), \"bench\": $(cat "$tmp/out")}" >>"$tmp/runs.jsonl"
    done
  done
done
cat "$tmp/runs.jsonl" >&2
/usr/bin/python3 - "$tmp/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| recompute | trainable | step (median of rounds) | spread (min–max) | step / all's, paired by round | peak RSS |")
print("|---|---|---:|---:|---:|---:|")
for rc in ("none", "blocks"):
    base = {r["round"]: r["bench"]["median_s"] for r in runs if r["recompute"] == rc and r["trainable"] == "all"}
    for t in ("all", "attention", "kv"):
        rs = [r for r in runs if r["recompute"] == rc and r["trainable"] == t]
        s = [r["bench"]["median_s"] for r in rs]
        ratios = [r["bench"]["median_s"] / base[r["round"]] for r in rs]
        print(f"| {rc} | {t} | {statistics.median(s):.2f} s | {min(s):.2f}–{max(s):.2f} s | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | {max(r['rss_kib'] for r in rs) / 2**20:.2f} GiB |")
PY
