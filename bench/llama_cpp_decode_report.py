#!/usr/bin/env python3
"""Tables of bench/llama_cpp_decode.sh's JSON lines: per (batch, context, KV) the median step time
of each engine, weights and KV cache that ran (medians of the repetitions, with min–max), the
ratios the targets name, and MQA's speed-up over MHA per configuration.

    python3 bench/llama_cpp_decode_report.py bench/LLAMA_CPP_DECODE.jsonl

Ratios are llama.cpp's step time over tapelm's (above 1: tapelm faster). Targets: with f32
weights, tapelm within 20 % of llama.cpp with its default f16 cache (ratio >= 1/1.2); with q8_0
weights and an f16 cache, within 15 % of llama.cpp's q8_0 with the same cache (ratio >= 1/1.15).
"""
import json
import sys

NAMES = {
    ("tapelm", "f32", "f32"): "tapelm f32",
    ("tapelm", "q8_0", "f16"): "tapelm q8_0, f16 cache",
    ("tapelm", "q8_0", "q8"): "tapelm q8_0, q8 cache",
    ("llama.cpp", "f32", "f16"): "llama.cpp f32 (f16 cache, its default)",
    ("llama.cpp", "f32", "f32"): "llama.cpp f32, f32 cache",
    ("llama.cpp", "q8_0", "f16"): "llama.cpp q8_0, f16 cache",
    ("llama.cpp", "q8_0", "q8_0"): "llama.cpp q8_0, q8_0 cache",
}
# (tapelm run, llama.cpp run, tolerance): the ratio must reach 1 / tolerance
TARGETS = [(("tapelm", "f32", "f32"), ("llama.cpp", "f32", "f16"), 1.2),
           (("tapelm", "q8_0", "f16"), ("llama.cpp", "q8_0", "f16"), 1.15)]


def main(path):
    runs = {}
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        key = (d["impl"], d.get("dtype", "f32"), d.get("kv_cache", "f16"))
        runs[(d.get("batch", 1), d["context"], d["KV"], key)] = d
    shapes = sorted({k[:3] for k in runs}, key=lambda s: (s[0], s[1], -s[2]))
    cols = [k for k in NAMES if any(s + (k,) in runs for s in shapes)]

    def cell(d):
        return "—" if not d else f"{d['step_ms']:.2f} ({d['step_ms_min']:.2f}–{d['step_ms_max']:.2f})"

    targets = [t for t in TARGETS if t[0] in cols and t[1] in cols]
    head = ["batch", "context", "KV"] + [NAMES[c] + " ms/step" for c in cols]
    head += [f"{NAMES[l]} / {NAMES[t]}" for t, l, _ in targets]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    met = [0] * len(targets)
    total = [0] * len(targets)
    for s in shapes:
        row = [str(s[0]), str(s[1]), str(s[2])] + [cell(runs.get(s + (c,))) for c in cols]
        for i, (t, l, tol) in enumerate(targets):
            a, b = runs.get(s + (t,)), runs.get(s + (l,))
            if not (a and b):
                row.append("—")
                continue
            r = b["step_ms"] / a["step_ms"]
            ok = r >= 1 / tol
            total[i] += 1
            met[i] += ok
            row.append(f"{r:.2f}" + ("" if ok else " **miss**"))
        print("| " + " | ".join(row) + " |")
    print()
    for i, (t, l, tol) in enumerate(targets):
        print(f"- {NAMES[t]} within {round((tol - 1) * 100)} % of {NAMES[l]}: {met[i]} of {total[i]} rows")
    bw = [(s, runs[s + (("tapelm", "q8_0", "f16"),)]) for s in shapes if s[0] == 1 and s + (("tapelm", "q8_0", "f16"),) in runs]
    if bw:
        print("- tapelm q8_0 with an f16 cache at batch 1, share of the memory-bandwidth limit: " +
              ", ".join(f"{s[1]} tokens KV {s[2]}: {d['bandwidth_limit_pct']:.0f} %" for s, d in bw if "bandwidth_limit_pct" in d))
    print()
    print("| batch | context | " + " | ".join(f"MQA / MHA: {NAMES[c]}" for c in cols) + " |")
    print("|---:|---:|" + "---:|" * len(cols))
    for b, c in sorted({s[:2] for s in shapes}):
        out = []
        for w in cols:
            mha, mqa = runs.get((b, c, 8, w)), runs.get((b, c, 1, w))
            out.append(f"{mha['step_ms'] / mqa['step_ms']:.2f}×" if mha and mqa else "—")
        print(f"| {b} | {c} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/LLAMA_CPP_DECODE.jsonl")
