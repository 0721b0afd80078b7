#!/usr/bin/env python3
"""Tables of bench/llama_cpp_decode.sh's JSON lines: per (batch, context, KV) the median step time
of each engine, weights and KV cache that ran (medians of the repetitions, with min–max), the
ratios the targets name, and MQA's speed-up over MHA per configuration.

    python3 bench/llama_cpp_decode_report.py [--plot OUT.png] FILE [FILE ...]

Several files make one grid: a row of a later file (a re-run, ROWS="16 256") replaces the same
row of an earlier one. --plot also draws the step time against the KV heads, a panel per batch and
context (GQA's Fig. 6 for this grid): every engine's median with its min–max, and for tapelm's
q8_0 the time the step's bytes take at the bandwidth `inspect --system` measured (its
`bandwidth_limit_pct`); a last panel has MHA's step over MQA's per row, each engine's and the bytes'.
OUT must not exist: the figure is drawn beside it and linked into place, never over a file.

Ratios are llama.cpp's step time over tapelm's (above 1: tapelm faster). Targets: with f32
weights, tapelm within 20 % of llama.cpp with its default f16 cache (ratio >= 1/1.2); with q8_0
weights and an f16 cache, within 15 % of llama.cpp's q8_0 with the same cache (ratio >= 1/1.15).
"""
import json
import os
import subprocess
import sys
import tempfile

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


def read(paths):
    runs = {}
    for path in paths:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            sys.exit(f"{path}: cannot read ({e.strerror if isinstance(e, OSError) else 'not UTF-8 text'})")
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
                key = (d["impl"], d.get("dtype", "f32"), d.get("kv_cache", "f16"))
                runs[(d.get("batch", 1), d["context"], d["KV"], key)] = d
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"{path}:{n}: not a line of llama_cpp_decode.sh ({type(e).__name__}: {e})")
    return runs


def gq(text):
    """text as a gnuplot single-quoted string"""
    return "'" + text.replace("'", "''") + "'"


def plot(runs, out):
    """The grid as a gnuplot figure at out (which must not exist)."""
    if os.path.lexists(out):
        sys.exit(f"{out}: exists; name a new file for the figure")
    shapes = sorted({k[:2] for k in runs})
    engines = [k for k in NAMES if any(r[3] == k for r in runs)]
    q8 = ("tapelm", "q8_0", "f16")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        sys.exit(f"{out}: its folder {folder} does not exist")
    layout = (len(shapes) + 1 + 2) // 3  # rows of three panels: one per shape, and the ratios
    script = [f"set terminal pngcairo noenhanced size 1500,{450 * layout} font 'sans,10'", "set output OUT",
              f"set multiplot layout {layout},3 title 'Decoding step against KV heads (8 query heads; median, min-max)'",
              "set logscale x 2", "set xrange [11:0.72]", "set xtics ('8 (MHA)' 8, '4' 4, '2' 2, '1 (MQA)' 1)",
              "set yrange [0:*]", "set offsets 0, 0, graph 0.4, 0", "set grid", "set key top right", "set xlabel 'KV heads'", "set ylabel 'ms per step'"]
    styles = ["lc rgb '#1f77b4' pt 7", "lc rgb '#d62728' pt 5", "lc rgb '#2ca02c' pt 9", "lc rgb '#9467bd' pt 11",
              "lc rgb '#ff7f0e' pt 13", "lc rgb '#8c564b' pt 3", "lc rgb '#17becf' pt 1"]
    for b, c in shapes:
        blocks, plots = [], []
        for i, e in enumerate(engines):
            pts = [(kv, runs[(b, c, kv, e)]) for kv in (8, 4, 2, 1) if (b, c, kv, e) in runs]
            if not pts:
                continue
            name = f"$d{b}_{c}_{i}"
            blocks.append(f"{name} << EOD\n" + "".join(f"{kv} {d['step_ms']} {d['step_ms_min']} {d['step_ms_max']}\n"
                                                       for kv, d in pts) + "EOD")
            plots.append(f"{name} using 1:2:3:4 with yerrorlines lw 2 {styles[i % len(styles)]} title {gq(NAMES[e])}")
            floor = [(kv, d["step_ms"] * d["bandwidth_limit_pct"] / 100) for kv, d in pts
                     if e == q8 and "bandwidth_limit_pct" in d]
            if floor:
                blocks.append(f"{name}f << EOD\n" + "".join(f"{kv} {ms}\n" for kv, ms in floor) + "EOD")
                plots.append(f"{name}f using 1:2 with lines dt 2 lw 1.5 {styles[i % len(styles)]} "
                             "title 'its bytes at the measured bandwidth'")
        script += blocks + [f"set title {gq(f'batch {b}, {c} tokens')}", "plot " + ", ".join(plots)]
    # the last panel: MHA's step over MQA's per row, each engine's and that of tapelm's q8_0 bytes
    cols, rows = engines + ["bytes"], []
    for b, c in shapes:
        row = []
        for e in cols:
            w = q8 if e == "bytes" else e
            mha, mqa = runs.get((b, c, 8, w)), runs.get((b, c, 1, w))
            if not (mha and mqa) or (e == "bytes" and not ("bandwidth_limit_pct" in mha and "bandwidth_limit_pct" in mqa)):
                row.append("NaN")
            elif e == "bytes":
                row.append(f"{mha['step_ms'] * mha['bandwidth_limit_pct'] / (mqa['step_ms'] * mqa['bandwidth_limit_pct']):.4f}")
            else:
                row.append(f"{mha['step_ms'] / mqa['step_ms']:.4f}")
        rows.append(f"\"b{b} {c}\" " + " ".join(row))
    titles = [NAMES[e] for e in engines] + ["tapelm q8_0's bytes (MHA / MQA)"]
    script += ["$ratio << EOD", *rows, "EOD", "unset logscale x", "set offsets 0, 0, graph 0.05, 0", "set xrange [*:*]", "set xtics auto", "set yrange [0:*]",
               "set style data histograms", "set style histogram clustered gap 1", "set style fill solid 0.8 border -1",
               "set title 'MHA step / MQA step'", "set xlabel 'batch, context'", "set ylabel 'speed-up of MQA over MHA'",
               "set key top left",
               "plot " + ", ".join(f"$ratio using {i + 2}:xtic(1) {styles[i % len(styles)].split(' pt')[0]} title {gq(t)}"
                                   for i, t in enumerate(titles))]
    script.append("unset multiplot")
    fd, drawn = tempfile.mkstemp(suffix=".png", prefix=".decode_plot_", dir=folder)
    os.close(fd)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(drawn, 0o666 & ~mask)  # as any file the user writes, not mkstemp's 0600
    try:
        text = "\n".join(script).replace("set output OUT", "set output " + gq(drawn)) + "\n"
        try:
            r = subprocess.run(["gnuplot"], input=text, text=True, capture_output=True)
        except FileNotFoundError:
            sys.exit("gnuplot is not installed (apt-get install -y gnuplot-nox)")
        if r.returncode != 0:
            sys.exit("gnuplot failed: " + " ".join(r.stderr.split())[-300:])
        os.link(drawn, out)  # fails, rather than replaces, when out has appeared meanwhile
    except FileExistsError:
        sys.exit(f"{out}: exists; name a new file for the figure")
    except OSError as e:
        sys.exit(f"{out}: cannot place the figure ({e.strerror})")
    finally:
        os.unlink(drawn)  # the temporary file this function made


def main(paths, out=None):
    runs = read(paths)
    if out:
        plot(runs, out)
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
    args = sys.argv[1:]
    out = None
    if args[:1] == ["--plot"]:
        if len(args) < 2:
            sys.exit("--plot needs a file name for the figure")
        out, args = args[1], args[2:]
    main(args or ["bench/LLAMA_CPP_DECODE.jsonl"], out)
