#!/usr/bin/env bash
# Decoding where the KV cache matters, tapelm against the PyTorch reference, side by side:
# a 6-layer, 8-head, d-512 RoPE model (rmsnorm, swiglu, vocab 512; random weights) with KV heads
# 8, 4, 2, 1, at contexts 256, 1024, 4096 (batch 1) and 256, 1024 (batch 16). Each row prefills
# context - STEPS tokens, then times STEPS greedy steps at the context; the two implementations
# run alternately, row by row. Prints one JSON line per run (tapelm: bench --mode decode --json;
# PyTorch: bench/decode_ref.py) to stdout.
#
#   bash bench/decode.sh [STEPS (128)] [ITERS (2)] > bench/DECODE.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-128}
ITERS=${2:-2}
ROWS=("1 256" "1 1024" "1 4096" "16 256" "16 1024")
for row in "${ROWS[@]}"; do
  read -r B C <<< "$row"
  P=$((C - STEPS))
  for KV in 8 4 2 1; do
    build/tapelm bench --mode decode --json --set n_layer=6 --set n_head=8 --set n_kv_head=$KV --set n_embd=512 \
      --set block_size=4096 --set pos=rope --set norm=rmsnorm --set mlp=swiglu --set vocab_size=512 \
      --batch "$B" --prompt "$P" --context "$C" --iters "$ITERS" --warmup 1 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin); d['impl']='tapelm'; d.pop('step_times'); d.pop('prefill_times'); print(json.dumps(d))"
    /usr/bin/python3 bench/decode_ref.py --layers 6 --heads 8 --kv-heads $KV --dim 512 --block 4096 --vocab 512 \
      --batch "$B" --prompt "$P" --context "$C" --iters "$ITERS" --warmup 1
  done
done
