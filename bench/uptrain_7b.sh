#!/usr/bin/env bash
# Llama-2-7B's shape (32 layers, d 4096, 32 heads, SwiGLU 11008, vocab 32000; synthetic bf16
# weights, context 512) converted to GQA-4 by mean and uptrained with `uptrain --train kv` in one
# process, its activations recomputed block by block: the frozen block weights are held in bf16
# from the conversion on (frozen_weights auto), so the float32 model is never whole. Under
# /usr/bin/time: peak RSS, tokens/s and the loss curve, as bench/uptrain_1p3b.sh, whose run this is.
# The source takes 13.5 GB of disk and the checkpoint (float32 weights, AdamW's state of K and V) 24.3 GB.
#
#   bench/uptrain_7b.sh [WORK_DIR (/tmp/uptrain_7b)]
#   # FRACTION (0.0075: 3 steps), EVAL_TOKENS (512) and SET as bench/uptrain_1p3b.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE="--layers 32 --d 4096 --heads 32 --kv 32 --hidden 11008" MODEL=llama2-7b RECOMPUTE=blocks \
  FRACTION=${FRACTION:-0.0075} EVAL_TOKENS=${EVAL_TOKENS:-512} exec bench/uptrain_1p3b.sh kv "${1:-/tmp/uptrain_7b}"
