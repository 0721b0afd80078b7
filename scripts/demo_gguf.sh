#!/usr/bin/env bash
# GGUF end to end (docs/guide/gguf.md): a llama-style MHA model trained by tapelm
# on tinyshakespeare with a 512-piece BPE tokenizer (configs/hf_llama.json: 4 layers, 4 heads,
# d 128), converted to GQA (2 KV heads) and MQA (1) by aligned-fit and uptrained for 5 % of its
# steps, each exported to GGUF (f32 and q8_0) and run by llama.cpp itself (npm's node-llama-cpp,
# tests/fixtures/gguf/llama_cpp_oracle.mjs) beside `tapelm sample --greedy`.
#
#   mkdir /tmp/nlc && (cd /tmp/nlc && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install \
#       node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1)
#   bash scripts/demo_gguf.sh OUT /tmp/nlc/node_modules
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: demo_gguf.sh OUT NODE_MODULES}
MODULES=${2:?usage: demo_gguf.sh OUT NODE_MODULES}
T=build/tapelm
PROMPT="ROMEO:"
N=40
mkdir -p "$OUT"
[ -f "$OUT/data/meta.json" ] || $T prepare --text corpora/tinyshakespeare.txt --out "$OUT/data" --tokenizer bpe --vocab-size 512 --quiet
[ -f "$OUT/mha/checkpoint.h5" ] || $T train --config configs/hf_llama.json --data "$OUT/data" --out "$OUT/mha" --quiet
for kv in 2 1; do
  [ -f "$OUT/kv$kv/checkpoint.h5" ] || $T uptrain --from "$OUT/mha/checkpoint.h5" --kv-heads $kv --method aligned-fit \
      --fraction 0.05 --data "$OUT/data" --out "$OUT/kv$kv" --quiet
done
files=()
for m in mha kv2 kv1; do
  for dt in f32 q8_0; do
    $T export --checkpoint "$OUT/$m/checkpoint.h5" --format gguf --dtype $dt --out "$OUT/${m}_$dt.gguf"
    files+=("$OUT/${m}_$dt.gguf")
  done
done
node tests/fixtures/gguf/llama_cpp_oracle.mjs "$MODULES" "$OUT/llama_cpp.json" $N "$PROMPT" "${files[@]}" > /dev/null
for m in mha kv2 kv1; do
  tapelm_text=$($T sample --checkpoint "$OUT/$m/checkpoint.h5" --greedy --prompt "$PROMPT" --tokens $N 2>/dev/null)
  echo "== $m: tapelm sample --greedy"
  echo "$tapelm_text"
  for dt in f32 q8_0; do
    llama_text=$(python3 -c "import json,sys; print(sys.argv[1] + json.load(open(sys.argv[2]))['models'][sys.argv[3]]['text'])" \
      "$PROMPT" "$OUT/llama_cpp.json" "${m}_$dt.gguf")
    if [ "$llama_text" = "$tapelm_text" ]; then echo "== $m: llama.cpp ($dt) prints the same text"
    else echo "== $m: llama.cpp ($dt) differs:"; echo "$llama_text"; fi
  done
done
