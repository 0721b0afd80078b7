#!/usr/bin/env python3
"""Tables of bench/llama_cpp_decode.sh's JSON lines: per (batch, context, KV) the step time of
tapelm (f32 weights and cache) and of llama.cpp with f32 weights and its default f16 cache, f32
weights and an f32 cache (tapelm's bytes, but off llama.cpp's fast path), and q8_0 weights;
llama.cpp f32 (default cache) against tapelm; MQA's speed-up over MHA per engine.

    python3 bench/llama_cpp_decode_report.py bench/LLAMA_CPP_DECODE.jsonl
"""
import json
import sys


def main(path):
    runs = {}
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        who = "tapelm" if d["impl"] == "tapelm" else f"llama {d['dtype']}/{d.get('kv_cache', 'f16')}"
        runs[(d.get("batch", 1), d["context"], d["KV"], who)] = d
    shapes = sorted({k[:3] for k in runs}, key=lambda s: (s[0], s[1], -s[2]))
    cols = ["tapelm", "llama f32/f16", "llama f32/f32", "llama q8_0/f16"]

    def cell(d):
        if not d:
            return "—"
        return f"{d['step_ms']:.2f} ({d['step_ms_min']:.2f}–{d['step_ms_max']:.2f})"

    print("| batch | context | KV | tapelm f32 ms/step | llama.cpp f32 ms/step (f16 cache, its default) | "
          "llama.cpp / tapelm speed | within 20 %? | llama.cpp f32, f32 cache | llama.cpp q8_0, f16 cache |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    met = total = 0
    for s in shapes:
        t, l = runs.get(s + ("tapelm",)), runs.get(s + ("llama f32/f16",))
        ratio = l["step_ms"] / t["step_ms"] if t and l else None
        ok = None
        if ratio is not None:
            ok = ratio >= 1 / 1.2  # tapelm's step at most 1.2x llama.cpp's
            total += 1
            met += ok
        print(f"| {s[0]} | {s[1]} | {s[2]} | {cell(t)} | {cell(l)} | "
              f"{'—' if ratio is None else f'{ratio:.2f}'} | {'—' if ok is None else ('yes' if ok else '**no**')} | "
              f"{cell(runs.get(s + ('llama f32/f32',)))} | {cell(runs.get(s + ('llama q8_0/f16',)))} |")
    print(f"\ntapelm within 20 % of llama.cpp with f32 weights (its default f16 cache): {met} of {total} rows\n")
    print("| batch | context | MQA / MHA speed-up: tapelm | llama.cpp f32 (f16 cache) | f32, f32 cache | q8_0 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for b, c in sorted({s[:2] for s in shapes}):
        out = []
        for w in cols:
            mha, mqa = runs.get((b, c, 8, w)), runs.get((b, c, 1, w))
            out.append(f"{mha['step_ms'] / mqa['step_ms']:.2f}×" if mha and mqa else "—")
        print(f"| {b} | {c} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/LLAMA_CPP_DECODE.jsonl")
