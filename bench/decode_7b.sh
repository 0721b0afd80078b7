#!/usr/bin/env bash
# Sampling from a Llama-2-7B-shaped model (bench/make_synthetic_hf's defaults: 32 layers, d 4096,
# 32 heads, SwiGLU 11008, vocabulary 32000, BF16 safetensors; random weights, byte-level vocabulary
# from bench/byte_vocab.py) on a machine where its 27 GB of float32 do not fit: tapelm's `sample`
# with the matrices kept in bf16 and in q8_0 (read once: StreamedModel::keep_blocks), and as it ran
# before (`--stream`: every block read from the file and widened to float32 for every token),
# beside llama.cpp on the same model exported to GGUF by tapelm (bf16, and q8_0 with the same
# blocks tapelm multiplies). tapelm's figure is the `ms a token` its sample prints (the tokens
# after the first, greedy, prompt "ROMEO:"); llama.cpp's is bench/llama_cpp_decode.cpp's mean step
# after a prefill of CONTEXT - STEPS tokens, batch 1, its default f16 cache. Both on 2 threads,
# alternating run by run, REPS rounds. Prints JSON lines; bench/decode_7b_report.py makes the table.
#
#   mkdir /tmp/nlc && (cd /tmp/nlc && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install \
#       node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1)
#   env -u OPENBLAS_CORETYPE bash bench/decode_7b.sh WORK NODE_MODULES [REPS (3)] > bench/DECODE_7B.jsonl
#
# Needs a build with -DTAPELM_BENCH=ON (make_synthetic_hf) and about 35 GB of disk in WORK (the
# model, kept there for the next run, and its two GGUF files).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$1
modules=$2
reps=${3:-3}
T=build/tapelm
tokens=17      # tapelm: 16 timed tokens after the first
context=64     # llama.cpp: 48 prompt tokens, then
steps=16       # 16 timed steps
dir="$work/llama2-7b"
mkdir -p "$work"
[ -f "$dir/config.json" ] || build/make_synthetic_hf --out "$dir" >&2
[ -f "$dir/vocab.json" ] || python3 bench/byte_vocab.py "$dir" --ids 32000
for dt in bf16 q8_0; do
  [ -f "$work/7b-$dt.gguf" ] || $T export --checkpoint "$dir" --format gguf --dtype $dt --out "$work/7b-$dt.gguf" >&2
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
libs=$(bash bench/build_llama_cpp_decode.sh "$modules" "$tmp")
system=$($T inspect --system)
bw=$(sed -n 's/^memory bandwidth \([0-9.]*\) GB\/s.*/\1/p' <<< "$system")
cpu=$(sed -n 's/^cpu //p' <<< "$system" | head -1)  # not "cpu peak"
commit=$(git describe --always --dirty)

# tapelm sample: WEIGHTS [--stream] -> one JSON line from the timing line it prints
tapelm_run() {
  local weights=$1 extra=${2:-} n=$tokens
  [ -n "$extra" ] && n=3  # streamed: seconds a token
  local t0 t1
  t0=$(date +%s.%N)
  $T --threads 2 sample --checkpoint "$dir" --weights "$weights" $extra --greedy --prompt "ROMEO:" --tokens $n > /dev/null 2> "$tmp/err"
  t1=$(date +%s.%N)
  python3 - "$tmp/err" "$weights" "${extra:+streamed}" "$t0" "$t1" "$bw" "$cpu" "$commit" <<'EOF'
import json, re, sys
err, weights, streamed, t0, t1, bw, cpu, commit = sys.argv[1:]
text = open(err).read()
m = re.search(r"(\d+) tokens: model ready in ([0-9.]+) s, prompt of (\d+) tokens and the first token ([0-9.]+) s, then ([0-9.]+) ms a token", text)
if not m:
    sys.exit("tapelm sample printed no timing line:\n" + text)
print(json.dumps({"impl": "tapelm", "weights": weights, "mode": "streamed" if streamed else "kept",
                  "tokens": int(m[1]), "ready_s": float(m[2]), "first_token_s": float(m[4]), "ms_per_token": float(m[5]),
                  "wall_s": round(float(t1) - float(t0), 2), "bandwidth_gb_s": float(bw), "cpu": cpu, "commit": commit}))
EOF
}

for ((r = 1; r <= reps; r++)); do
  for dt in bf16 q8_0; do
    tapelm_run $dt
    "$tmp/lcd" "$libs" "$work/7b-$dt.gguf" $context $steps 1 2 1 f16 |
      python3 -c "import json,sys; d=json.load(sys.stdin); d.update(impl='llama.cpp', weights='$dt', mode='mmap', ms_per_token=d['step_ms']); print(json.dumps(d))"
  done
  tapelm_run f32 --stream
done
