#!/usr/bin/env bash
# Hugging Face in and out, end to end (docs/guide/huggingface.md): a llama-layout and a
# GPT-2-layout model trained by tapelm on tinyshakespeare with a 512-piece BPE tokenizer, exported
# as HF model directories, imported back, the study run on the imported llama model
# (sweep --from), its best GQA conversion uptrained and exported, and the exports' greedy text
# printed by tapelm and, when llama2.c and nanoGPT checkouts are given, by their own model code
# (tests/fixtures/hf/hf_greedy.py) for comparison.
#
#   bash scripts/demo_hf.sh OUT [LLAMA2C_DIR NANOGPT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: demo_hf.sh OUT [LLAMA2C_DIR NANOGPT_DIR]}
L2C=${2:-}
NGPT=${3:-}
T=build/tapelm
PROMPT="ROMEO:"
N=40
mkdir -p "$OUT"
[ -f "$OUT/data/meta.json" ] || $T prepare --text corpora/tinyshakespeare.txt --out "$OUT/data" --tokenizer bpe --vocab-size 512 --quiet
# the training keys the imported (weights-only) model needs for uptraining and the study
python3 -c "import json,sys; c=json.load(open('configs/hf_llama.json')); print(json.dumps({k: v for k, v in c.items() if k in ('batch_size','max_iters','learning_rate','min_lr','warmup_iters','beta2','weight_decay','grad_clip','eval_interval','eval_iters','log_interval','checkpoint_interval','seed')}))" > "$OUT/train.json"
for arch in llama gpt2; do
  [ -f "$OUT/$arch/checkpoint.h5" ] || $T train --config configs/hf_$arch.json --data "$OUT/data" --out "$OUT/$arch"
  $T export --checkpoint "$OUT/$arch/checkpoint.h5" --format hf --out "$OUT/hf_$arch"
  $T import --format hf --model "$OUT/hf_$arch" --out "$OUT/imported_$arch.h5"
done
# the study on the imported model: every calibrated method against mean pooling, no from-scratch rows
$T sweep --preset tiny --from "$OUT/imported_llama.h5" --config "$OUT/train.json" --data "$OUT/data" \
    --methods mean,fit,aligned-fit --out "$OUT/sweep"
# the best conversion to 2 KV heads, uptrained with the study's headline alpha, exported as HF (bf16)
$T uptrain --from "$OUT/imported_llama.h5" --config "$OUT/train.json" --kv-heads 2 --method aligned-fit \
    --fraction 0.05 --data "$OUT/data" --out "$OUT/gqa"
$T export --checkpoint "$OUT/gqa/checkpoint.h5" --format hf --dtype bf16 --out "$OUT/hf_gqa"
$T import --format hf --model "$OUT/hf_gqa" --out "$OUT/imported_gqa.h5"
for m in llama gpt2 gqa; do
  echo "== $m: tapelm sample --greedy"
  $T sample --checkpoint "$OUT/imported_$m.h5" --greedy --prompt "$PROMPT" --tokens $N | tee "$OUT/$m.tapelm.txt"
  if [ -n "$L2C" ]; then
    echo "== $m: the HF export run by $( [ $m = gpt2 ] && echo nanoGPT || echo llama2.c )'s model.py"
    /usr/bin/python3 tests/fixtures/hf/hf_greedy.py "$L2C" "$NGPT" "$OUT/hf_$m" "$PROMPT" $N | tee "$OUT/$m.reference.txt"
    cmp "$OUT/$m.tapelm.txt" "$OUT/$m.reference.txt" && echo "== $m: identical"
  fi
done
