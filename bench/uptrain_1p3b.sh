#!/usr/bin/env bash
# The scale issue's headline shape on one machine: a 1.3 B-parameter MHA model of
# Sheared-LLaMA-1.3B's shape (Llama architecture, 24 layers, d 2048, 16 heads, SwiGLU 5504, vocab
# 32000; synthetic bf16 weights from bench/make_synthetic_hf, context 512 so that a step is 512
# tokens), converted to GQA-4 by mean and uptrained 20 steps (fraction 0.05 of max_iters 400,
# batch 1) with `uptrain --train TRAIN`, under /usr/bin/time: peak RSS, tokens/s and the loss
# curve (RUN/metrics.jsonl). The corpus: tinyshakespeare in blank-line-separated documents, with
# TOKENIZER (a tokenizer.json or .model of at most 32000 ids; default: the char tokenizer, whose
# ids are as good for timing and memory).
#
#   bench/uptrain_1p3b.sh [TRAIN (attention)] [WORK_DIR (/tmp/uptrain_1p3b)]
#   # BUILD=build by default (needs -DTAPELM_BENCH=ON for make_synthetic_hf); OPENBLAS_CORETYPE is unset
#   # SET="key=value ..." adds --set overrides (e.g. frozen_weights=f32) and names the run after them;
#   # FRACTION (0.05) and EVAL_TOKENS (0: the whole val split) shorten a run
#   # SHAPE="make_synthetic_hf flags" and MODEL (its directory's name) another shape (bench/uptrain_7b.sh);
#   # RECOMPUTE (none; blocks for TRAIN all) and KV (4) the run's
set -euo pipefail
cd "$(dirname "$0")/.."
train=${1:-attention}
work=${2:-/tmp/uptrain_1p3b}
build=${BUILD:-build}
unset OPENBLAS_CORETYPE TAPELM_BLAS_CORE
mkdir -p "$work"
model=${MODEL:-sheared}
# shellcheck disable=SC2086  # SHAPE is a list of flags
[ -f "$work/$model/config.json" ] || "$build/make_synthetic_hf" --out "$work/$model" ${SHAPE:---layers 24 --d 2048 --heads 16 --kv 16 --hidden 5504} \
  --vocab 32000 --ctx 512 --dtype bf16
if [ ! -f "$work/corpus/meta.json" ]; then
  tok=()
  [ -n "${TOKENIZER:-}" ] && tok=(--tokenizer-model "$TOKENIZER")
  "$build/tapelm" prepare --quiet --text corpora/tinyshakespeare.txt --out "$work/corpus" --doc-sep $'\n\n' "${tok[@]}"
fi
# every parameter trained: activations recomputed block by block (16 bytes a parameter leave little room)
recompute=${RECOMPUTE:-none}
[ "$train" = all ] && recompute=blocks
cat >"$work/cfg_$train.json" <<EOF
{"batch_size": 1, "block_size": 512, "max_iters": 400, "learning_rate": 3e-4, "min_lr": 3e-5, "warmup_iters": 4,
 "lr_decay_iters": 400, "eval_iters": 2, "eval_interval": 1000, "log_interval": 1, "checkpoint_interval": 1000,
 "dropout": 0.0, "grad_clip": 1.0, "recompute": "$recompute"}
EOF
"$build/tapelm" inspect --system | grep -E '^(cpu|simd|threads)'
sets=() name=$train
for kv in ${SET:-}; do sets+=(--set "$kv"); name+="_${kv//[^A-Za-z0-9]/_}"; done
[ -n "${EVAL_TOKENS:-}" ] && sets+=(--set "final_eval_tokens=$EVAL_TOKENS")
rm -rf "$work/run_$name"  # this script's own run directory
/usr/bin/time -v "$build/tapelm" uptrain --from "$work/$model" --config "$work/cfg_$train.json" --kv-heads "${KV:-4}" --method mean \
  --fraction "${FRACTION:-0.05}" --train "$train" --data "$work/corpus" --out "$work/run_$name" "${sets[@]}" 2>"$work/time_$name.txt"
grep -E 'Maximum resident|Elapsed' "$work/time_$name.txt"
