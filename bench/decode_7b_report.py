"""The table of bench/decode_7b.sh's JSON lines: ms a token, median (min-max) over the rounds, for
each engine, weight type and file; the bandwidth floor (the bytes of the matrices one token reads,
at the STREAM triad rate `inspect --system` measured) and each run's multiple of it; llama.cpp's
time over tapelm's on the same file, round by round; the seconds before tapelm's first token and
each run's peak RSS (the mapped file's pages included).

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
    runs.setdefault((r["impl"], r["weights"], r.get("source", ""), r["mode"]), []).append(r)
bw = statistics.median(r["bandwidth_gb_s"] for r in rows if "bandwidth_gb_s" in r)
first = next(r for r in rows if r["impl"] == "tapelm")
print(f"cpu {first['cpu'].splitlines()[0]}, tapelm at {first['commit']}, STREAM triad {bw} GB/s; "
      f"{len(runs[next(iter(runs))])} rounds\n")
print("| engine | weights | file | ms a token: median (min-max) | × floor (floor ms) | llama.cpp / tapelm, by round "
      "| first token after (s) | peak RSS GB |")
print("|---|---|---|---:|---:|---|---:|---:|")


def ms(rs):
    return [r["ms_per_token"] for r in rs]


for key, rs in sorted(runs.items(), key=lambda kv: (kv[0][1] != "bf16", kv[0][1], kv[0][2] != "gguf", kv[0][0] != "tapelm")):
    impl, w, source, mode = key
    v = ms(rs)
    m = statistics.median(v)
    floor = matrices * bytes_per_value[w] / (bw * 1e9) * 1e3
    ratio = ""
    peer = runs.get(("llama.cpp", w, source, "mmap"))
    if impl == "tapelm" and peer:
        ratio = ", ".join(f"{a / b:.2f}" for a, b in zip(ms(peer), v))
    ready = ""
    if impl == "tapelm":
        ready = f"{statistics.median(r['ready_s'] + r['first_token_s'] for r in rs):.1f}"
    rss = statistics.median(r["peak_rss_gb"] for r in rs)
    print(f"| {impl} | {w} | {source} | {m:.0f} ({min(v):.0f}-{max(v):.0f}) | {m / floor:.2f} ({floor:.0f}) | {ratio} | {ready} | {rss:.1f} |")
