"""
Turns bench/decode.sh's JSON lines into bench/DECODE.md's table: per (batch, context, KV) row,
tapelm's and PyTorch's time per decoding step, their ratio, tapelm's tokens/s and its share of the
memory-bandwidth limit (against the best triad of all runs, and against the run's own), and per (batch, context) the MQA-over-MHA speed-up against what the bytes
read per step predict.

    python3 bench/decode_report.py bench/DECODE.jsonl
"""
import json
import sys


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    t = {(r["batch"], r["context"], r["KV"]): r for r in rows if r.get("impl") == "tapelm"}
    # the machine's bandwidth: the best triad any run measured (one run's own figure moves with
    # whatever else the machine is doing at that moment)
    bw = max(r["memory_bandwidth_bytes_per_s"] for r in t.values())
    print(f"Memory bandwidth (best STREAM triad of the {len(t)} tapelm runs): {bw / 1e9:.1f} GB/s\n")
    p = {(r["batch"], r["context"], r["KV"]): r for r in rows if r.get("impl") == "pytorch"}
    print("| batch | context | KV | tapelm ms/step [min–max] | PyTorch ms/step | tapelm / PyTorch speed | tapelm tokens/s | "
          "bytes/step | % of bandwidth limit (best triad) | (the run's own triad) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(t, key=lambda k: (k[0], k[1], -k[2])):
        a, b = t[key], p.get(key)
        ratio = f"{b['step_ms'] / a['step_ms']:.2f}×" if b else "—"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {a['step_ms']:.3f} [{a['step_ms_min']:.3f}–{a['step_ms_max']:.3f}] | "
              f"{b['step_ms']:.3f} |" if b else "| — |", end="")
        own = a["memory_bandwidth_bytes_per_s"]
        print(f" {ratio} | {a['tokens_per_s']:.0f} | {a['bytes_per_step'] / 1e6:.1f} MB | {100 * a['bytes_per_step'] / bw / (a['step_ms'] / 1e3):.0f}% | "
              f"{100 * a['bytes_per_step'] / own / (a['step_ms'] / 1e3):.0f}% of {own / 1e9:.0f} GB/s |")
    print()
    print("| batch | context | MQA / MHA speed-up, tapelm | PyTorch | predicted by bytes per step |")
    print("|---:|---:|---:|---:|---:|")
    for (bt, c) in sorted({(k[0], k[1]) for k in t}):
        if (bt, c, 8) in t and (bt, c, 1) in t:
            mha, mqa = t[(bt, c, 8)], t[(bt, c, 1)]
            pr = p.get((bt, c, 8)), p.get((bt, c, 1))
            ps = f"{pr[0]['step_ms'] / pr[1]['step_ms']:.2f}×" if all(pr) else "—"
            print(f"| {bt} | {c} | {mha['step_ms'] / mqa['step_ms']:.2f}× | {ps} | "
                  f"{mha['bytes_per_step'] / mqa['bytes_per_step']:.2f}× |")


if __name__ == "__main__":
    main()
