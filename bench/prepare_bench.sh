#!/usr/bin/env bash
# The corpora benchmark: `tapelm prepare` of a 1 GB text against sentencepiece's own spm_encode,
# and the peak RSS of `prepare` and of `train` on that corpus against tinyshakespeare's.
#
#   bash bench/prepare_bench.sh [WORK_DIR]     (default: bench/out/corpora; needs ~4 GB of disk)
#
# The 1 GB text is the bundled tinyshakespeare concatenated 940 times. Peak RSS is /usr/bin/time -v's
# "Maximum resident set size". Writes WORK_DIR/results.json and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench/out/corpora}
mkdir -p "$work"
tapelm=build/tapelm
[ -x "$tapelm" ] || { echo "build tapelm first (scripts/build.sh)"; exit 1; }
command -v spm_encode >/dev/null || { echo "spm_encode missing: apt-get install -y sentencepiece"; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time missing: apt-get install -y time"; exit 1; }

copies=${COPIES:-940}  # COPIES=3 for a quick check of the script
big=$work/big.txt
want=$((copies * $(stat -c %s corpora/tinyshakespeare.txt)))
if [ ! -f "$big" ] || [ "$(stat -c %s "$big")" -ne "$want" ]; then
  : > "$big.tmp"
  for _ in $(seq "$copies"); do cat corpora/tinyshakespeare.txt >> "$big.tmp"; done
  mv "$big.tmp" "$big"
fi
bytes=$(stat -c %s "$big")

rss_kb() { grep "Maximum resident set size" "$1" | awk '{print $NF}'; }
wall_s() { grep "Elapsed (wall clock)" "$1" | awk '{print $NF}' | awk -F: '{ if (NF == 3) print $1*3600+$2*60+$3; else print $1*60+$2 }'; }

# 1. prepare the 1 GB text: a BPE tokenizer of 4096 pieces trained on the default 100 MB sample
/usr/bin/time -v "$tapelm" prepare --text "$big" --out "$work/big" --tokenizer bpe --vocab-size 4096 \
  --val-fraction 0.001 > "$work/prepare.out" 2> "$work/prepare.time"
cat "$work/prepare.out"
prep_rate=$(sed -n 's/.*encoded at \([0-9.]*\) MB\/s.*/\1/p' "$work/prepare.out")

# 2. spm_encode with the same model on the first 100 MB of the same text (one thread, line by line;
#    its MB/s is what it would take for the whole text)
head -c 100000000 "$big" > "$work/head100.txt"
/usr/bin/time -v spm_encode --model="$work/big/tokenizer.model" --output_format=id < "$work/head100.txt" \
  > /dev/null 2> "$work/spm.time"
spm_s=$(wall_s "$work/spm.time")
spm_mb=$(stat -c %s "$work/head100.txt")
spm_rate=$(awk -v s="$spm_s" -v b="$spm_mb" 'BEGIN { printf "%.2f", b / 1e6 / s }')
rm -f "$work/head100.txt"

# 3. train the same model for the same steps on tinyshakespeare's shards (same tokenizer) and on the 1 GB corpus's.
#    Both val splits hold at least 32 windows, so the closing evaluation runs full batches of 32 on
#    both (a val split of a few windows would run smaller batches and peak lower).
"$tapelm" prepare --text corpora/tinyshakespeare.txt --out "$work/small" --tokenizer-model "$work/big/tokenizer.model" \
  --val-fraction 0.05 --quiet > /dev/null
for c in small big; do
  rm -rf "$work/run_$c"
  /usr/bin/time -v "$tapelm" train --config configs/llama_bpe.json --set max_iters=50 --set eval_iters=2 \
    --set eval_interval=50 --data "$work/$c" --out "$work/run_$c" --quiet > /dev/null 2> "$work/train_$c.time"
done

cat > "$work/results.json" <<JSON
{"text_bytes": $bytes,
 "prepare": {"encode_mb_per_s": $prep_rate, "user_s": $(grep "User time" "$work/prepare.time" | awk '{print $NF}'), "wall_s": $(wall_s "$work/prepare.time"), "peak_rss_kb": $(rss_kb "$work/prepare.time")},
 "spm_encode": {"bytes": $spm_mb, "user_s": $(grep "User time" "$work/spm.time" | awk '{print $NF}'), "mb_per_s": $spm_rate, "wall_s": $spm_s, "peak_rss_kb": $(rss_kb "$work/spm.time")},
 "train_peak_rss_kb": {"tinyshakespeare": $(rss_kb "$work/train_small.time"), "1gb": $(rss_kb "$work/train_big.time")},
 "train_shard_bytes": {"tinyshakespeare": $(du -cb "$work"/small/train_*.bin | tail -1 | cut -f1), "1gb": $(du -cb "$work"/big/train_*.bin | tail -1 | cut -f1)}}
JSON
cat "$work/results.json"
