"""The table of bench/decode_7b.sh's JSON lines: ms a token, median (min-max) over the rounds, for
each engine and weight type; the bandwidth floor (the bytes of the matrices one token reads, at the
STREAM triad rate `inspect --system` measured) and each run's multiple of it; llama.cpp's time over
tapelm's at the same weights.

    python3 bench/decode_7b_report.py bench/DECODE_7B.jsonl
"""
import json
import statistics
import sys

# Llama-2-7B's shape (make_synthetic_hf's defaults): what a token reads is every block's matrices
# and the output head; the embedding gives one row.
L, d, hidden, vocab = 32, 4096, 11008, 32000
matrices = L * (4 * d * d + 3 * d * hidden) + vocab * d
bytes_per_value = {"f32": 4.0, "bf16": 2.0, "q8_0": 34 / 32}

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
runs = {}
for r in rows:
    runs.setdefault((r["impl"], r["weights"], r["mode"]), []).append(r["ms_per_token"])
bw = statistics.median(r["bandwidth_gb_s"] for r in rows if "bandwidth_gb_s" in r)
first = next(r for r in rows if r["impl"] == "tapelm")
print(f"cpu {first['cpu'].splitlines()[0]}, tapelm at {first['commit']}, STREAM triad {bw} GB/s; {len(runs[next(iter(runs))])} rounds\n")
print("| engine | weights | how | ms a token: median (min-max) | bytes a token | bandwidth floor ms | multiple of the floor | llama.cpp / tapelm |")
print("|---|---|---|---:|---:|---:|---:|---:|")
med = {k: statistics.median(v) for k, v in runs.items()}
for (impl, w, mode), v in sorted(runs.items(), key=lambda kv: (kv[0][1] != "bf16", kv[0][1], kv[0][0] != "tapelm", kv[0][2])):
    b = matrices * bytes_per_value[w]
    floor = b / (bw * 1e9) * 1e3
    m = med[(impl, w, mode)]
    ratio = ""
    if impl == "tapelm" and mode == "kept" and ("llama.cpp", w, "mmap") in med:
        ratio = f"{med[('llama.cpp', w, 'mmap')] / m:.2f}"
    print(f"| {impl} | {w} | {mode} | {m:.0f} ({min(v):.0f}-{max(v):.0f}) | {b / 1e9:.2f} GB | {floor:.0f} | {m / floor:.2f} | {ratio} |")
