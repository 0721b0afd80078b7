#!/usr/bin/env bash
# What converting K/V heads costs where the keys are normalised (the families issue): three models
# of one shape trained alike on tinyshakespeare — q/k without a norm (Llama's), RMS-normalised per
# head (Qwen3's qk_norm "head") and over the whole projection (OLMo-2's qk_norm "all") — each
# converted from 8 KV heads to 4, 2 and 1 by mean and by first, no uptraining, and evaluated on the
# validation split. The cost is each conversion's validation loss minus its own MHA model's.
#
#   bash bench/qk_norm_conversion.sh OUT [SEEDS]       # writes OUT/results.csv and OUT/QK_NORM.md lines
set -euo pipefail
out=${1:?usage: qk_norm_conversion.sh OUT [SEEDS]}
seeds=${2:-"1 2 3"}
cd "$(dirname "$0")/.."
T=${TAPELM:-build/tapelm}
mkdir -p "$out"
[ -d "$out/data" ] || $T prepare --text corpora/tinyshakespeare.txt --out "$out/data" --tokenizer bpe --vocab-size 512 --quiet
echo "qk_norm,seed,method,kv,val_loss" > "$out/results.csv"
for qk in none head all; do
  for seed in $seeds; do
    run="$out/${qk}_s$seed"
    cat > "$out/${qk}_s$seed.json" <<JSON
{"n_layer": 4, "n_embd": 192, "n_head": 8, "mlp_hidden": 512, "block_size": 128, "batch_size": 16, "max_iters": 1000,
 "learning_rate": 0.002, "warmup_iters": 100, "eval_iters": 20, "eval_interval": 500, "seed": $seed, "norm": "rmsnorm",
 "pos": "rope", "mlp": "swiglu", "tie_embeddings": false, "qk_norm": "$qk"}
JSON
    [ -f "$run/checkpoint.h5" ] || $T train --config "$out/${qk}_s$seed.json" --data "$out/data" --out "$run" --quiet
    mha=$($T eval --checkpoint "$run/checkpoint.h5" --data "$out/data" --split val --json | sed 's/.*"loss": *\([0-9.e+-]*\).*/\1/')
    echo "$qk,$seed,mha,8,$mha" >> "$out/results.csv"
    for method in mean first; do
      for kv in 4 2 1; do
        $T convert --from "$run/checkpoint.h5" --kv-heads $kv --method $method --out "$run/${method}_$kv.h5" > /dev/null
        loss=$($T eval --checkpoint "$run/${method}_$kv.h5" --data "$out/data" --split val --json | sed 's/.*"loss": *\([0-9.e+-]*\).*/\1/')
        echo "$qk,$seed,$method,$kv,$loss" >> "$out/results.csv"
        echo "qk_norm $qk seed $seed $method KV $kv: $loss (MHA $mha)"
      done
    done
  done
done

# The table: each conversion's loss minus its own MHA model's, mean ± sd over the seeds.
python3 - "$out/results.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
mha = {(r["qk_norm"], r["seed"]): float(r["val_loss"]) for r in rows if r["method"] == "mha"}
cost = {}
for r in rows:
    if r["method"] != "mha":
        cost.setdefault((r["method"], r["kv"], r["qk_norm"]), []).append(float(r["val_loss"]) - mha[(r["qk_norm"], r["seed"])])
norms = ["none", "head", "all"]
print("| method | KV | " + " | ".join(f"qk_norm {n}" for n in norms) + " |")
print("|---|---:|" + "---:|" * len(norms))
for method in ["mean", "first"]:
    for kv in ["4", "2", "1"]:
        cells = []
        for n in norms:
            v = cost.get((method, kv, n), [])
            cells.append(f"+{statistics.mean(v):.3f} ± {statistics.stdev(v):.3f}" if len(v) > 1 else (f"+{v[0]:.3f}" if v else ""))
        print(f"| {method} | {kv} | " + " | ".join(cells) + " |")
print("\nMHA validation loss: " + ", ".join(
    f"{n} {statistics.mean([v for (q, s), v in mha.items() if q == n]):.4f}" for n in norms if any(q == n for q, _ in mha)))
PY
