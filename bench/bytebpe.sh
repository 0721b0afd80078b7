#!/usr/bin/env bash
# Byte-level BPE encoding speed: `tapelm prepare --tokenizer-model vocab.json` (GPT-2's vocabulary
# and merges) against OpenAI's tiktoken (npm, its Rust encoder as WASM, "gpt2" encoding) on the
# same text, run alternately REPS times. tapelm is timed as the whole prepare command (reading,
# 2 encoding threads, writing shards and meta.json) by /usr/bin/time; tiktoken as its encode call
# alone. Both must give the same token count (prepare's minus its one BOS). Prints one JSON line
# per run.
#
#   mkdir /tmp/tok && (cd /tmp/tok && npm install --ignore-scripts tiktoken@1.0.22)
#   bash bench/bytebpe.sh /tmp/tok/node_modules [COPIES (8)] [REPS (5)] > bench/BYTEBPE.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
modules=$1
copies=${2:-8}
reps=${3:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for _ in $(seq "$copies"); do cat corpora/tinyshakespeare.txt >> "$work/text.txt"; done
cp tests/fixtures/bytebpe/vocab.json tests/fixtures/bytebpe/merges.txt "$work/"
bytes=$(stat -c %s "$work/text.txt")
for rep in $(seq "$reps"); do
  rm -rf "$work/c"
  /usr/bin/time -f "%e %U %S" -o "$work/time" build/tapelm prepare --text "$work/text.txt" --out "$work/c" \
    --tokenizer-model "$work/vocab.json" --val-fraction 0.01 --quiet > /dev/null
  read -r wall user sys < "$work/time"
  tokens=$(python3 -c "import json; m=json.load(open('$work/c/meta.json')); print(m['train']['tokens'] + m['val']['tokens'] - 1)")
  echo "{\"impl\": \"tapelm\", \"rep\": $rep, \"bytes\": $bytes, \"tokens\": $tokens, \"wall_s\": $wall, \"cpu_s\": $(python3 -c "print($user + $sys)")}"
  node bench/tiktoken_encode.mjs "$modules" "$work/text.txt" | python3 -c "import json,sys; d=json.load(sys.stdin); d['rep']=$rep; print(json.dumps(d))"
done
