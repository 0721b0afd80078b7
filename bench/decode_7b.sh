#!/usr/bin/env bash
# Sampling from a Llama-2-7B-shaped model (bench/make_synthetic_hf's defaults: 32 layers, d 4096,
# 32 heads, SwiGLU 11008, vocabulary 32000, BF16 safetensors; random weights, byte-level vocabulary
# from bench/byte_vocab.py) on a machine where its 27 GB of float32 do not fit, exported to GGUF by
# tapelm in bf16 and in q8_0: tapelm's `sample` and llama.cpp run the same two files, both mapping
# the matrices from them (tapelm: StreamedModel::keep_blocks, the file's bytes mapped, not copied);
# tapelm also from the HF directory (its BF16 safetensors, mapped alike). tapelm's figure is the
# `ms a token` its sample prints (the tokens after the first, greedy, prompt "ROMEO:"), with the
# seconds before the first token ("model ready"); llama.cpp's is bench/llama_cpp_decode.cpp's mean
# step after a prefill of CONTEXT - STEPS tokens, batch 1, its default f16 cache. Both on 2
# threads, alternating run by run, REPS rounds; each run's peak RSS (file pages mapped included)
# from /usr/bin/time. Prints JSON lines; bench/decode_7b_report.py makes the table.
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

# tapelm sample: MODEL SOURCE -> one JSON line from the lines it prints (--weights auto: the
# file's own bf16 or q8_0)
tapelm_run() {
  local model=$1 source=$2 t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f %M -o "$tmp/rss" $T --threads 2 sample --checkpoint "$model" --greedy --prompt "ROMEO:" --tokens $tokens > /dev/null 2> "$tmp/err"
  t1=$(date +%s.%N)
  python3 - "$tmp/err" "$source" "$t0" "$t1" "$bw" "$cpu" "$commit" "$(cat "$tmp/rss")" <<'EOF'
import json, re, sys
err, source, t0, t1, bw, cpu, commit, rss_kb = sys.argv[1:]
text = open(err).read()
m = re.search(r"(\d+) tokens: model ready in ([0-9.]+) s, prompt of (\d+) tokens and the first token ([0-9.]+) s, then ([0-9.]+) ms a token", text)
held = re.search(r"with its matrices in (\w+) \(([0-9.]+ \w+), ([0-9.]+ \w+) of it mapped", text)
if not m or not held:
    sys.exit("tapelm sample printed no timing or memory line:\n" + text)
print(json.dumps({"impl": "tapelm", "weights": held[1], "mode": "mapped", "source": source, "held": held[2], "mapped": held[3],
                  "tokens": int(m[1]), "ready_s": float(m[2]), "first_token_s": float(m[4]), "ms_per_token": float(m[5]),
                  "wall_s": round(float(t1) - float(t0), 2), "peak_rss_gb": round(int(rss_kb) * 1024 / 1e9, 2),
                  "bandwidth_gb_s": float(bw), "cpu": cpu, "commit": commit}))
EOF
}

for ((r = 1; r <= reps; r++)); do
  for dt in bf16 q8_0; do
    tapelm_run "$work/7b-$dt.gguf" gguf
    /usr/bin/time -f %M -o "$tmp/rss" "$tmp/lcd" "$libs" "$work/7b-$dt.gguf" $context $steps 1 2 1 f16 > "$tmp/out"
    python3 - "$tmp/out" "$tmp/rss" $dt <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d.update(impl="llama.cpp", weights=sys.argv[3], mode="mmap", source="gguf", ms_per_token=d["step_ms"],
         peak_rss_gb=round(int(open(sys.argv[2]).read()) * 1024 / 1e9, 2))
print(json.dumps(d))
EOF
  done
  tapelm_run "$dir" hf
done
