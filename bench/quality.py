#!/usr/bin/env python3
"""Quality of nanoGPT's CPU example (configs/baby.json) over several seeds, tapelm against PyTorch.

For every seed it trains, two runs at a time and one thread each so both programs see the same
load:
  tapelm        build/tapelm --threads 1 train --config configs/baby.json --set seed=S
                then `tapelm eval --json` on the whole val split
  PyTorch       bench/ref_train.py --seed S  (the reference model in nanoGPT's train.py loop,
                evaluated on the whole val split the same way)
  PyTorch, the experiment `--no-decay-embeddings` (nanoGPT's code before February 2023, which left
                the embeddings out of weight decay), unless --no-variant

and reports, per program: the whole-split val loss over seeds (mean, standard deviation, range,
how many seeds reach <= 1.90), the 20-batch estimate nanoGPT itself prints, the wall time, and
tapelm - PyTorch with a 95 % confidence interval (Welch).

Writes the section between <!-- quality:begin --> and <!-- quality:end --> of bench/RESULTS.md
(appended if absent) and every run to bench/QUALITY.jsonl. Run from the repository root after
`bash scripts/build.sh`:
    python3 bench/quality.py [--seeds 1337,1,2,...] [--iters 2000] [--jobs 2]
"""
import argparse
import concurrent.futures
import datetime
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BAR = 1.90
PYTHON = "/usr/bin/python3"  # Debian's python3-torch


def run(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {tail[0]}")
    return p.stdout


def tapelm_run(a, seed, tmp):
    out = os.path.join(tmp, f"tapelm-{seed}")
    t0 = time.time()
    run([a.binary, "--threads", "1", "train", "--config", a.config, "--set", f"seed={seed}",
         "--set", f"max_iters={a.iters}", "--set", f"lr_decay_iters={a.iters}",
         "--data", a.data, "--out", out, "--quiet"], a.timeout)
    secs = time.time() - t0
    whole = json.loads(run([a.binary, "--threads", "1", "eval", "--checkpoint", os.path.join(out, "checkpoint.h5"),
                            "--data", a.data, "--json"], a.timeout))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    shutil.rmtree(out, ignore_errors=True)
    return {"program": "tapelm", "seed": seed, "val_loss": whole["loss"], "val_loss_20": last["val_loss"],
            "seconds": round(secs, 1)}


def torch_run(a, seed, variant):
    cmd = [PYTHON, "bench/ref_train.py", a.reference, a.data, "--threads", "1", "--seed", str(seed),
           "--iters", str(a.iters)]
    if variant:
        cmd.append("--no-decay-embeddings")
    r = json.loads(run(cmd, a.timeout).strip().splitlines()[-1])
    return {"program": "pytorch-no-decay-emb" if variant else "pytorch", "seed": seed, "val_loss": r["val_loss"],
            "val_loss_20": r["val_loss_20"], "seconds": r["seconds"]}


def summary(rows):
    v = [r["val_loss"] for r in rows]
    return {"n": len(v), "mean": statistics.mean(v), "sd": statistics.stdev(v) if len(v) > 1 else float("nan"),
            "min": min(v), "max": max(v), "reach": sum(x <= BAR for x in v),
            "est_mean": statistics.mean(r["val_loss_20"] for r in rows),
            "est_reach": sum(r["val_loss_20"] <= BAR for r in rows),
            "secs": statistics.median(r["seconds"] for r in rows)}


def t_quantile_975(df):
    """Student t 97.5 % quantile (Cornish-Fisher expansion about the normal; < 1e-3 off for df >= 3)."""
    z = 1.959963984540054
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3


def welch(x, y):
    """Mean difference x - y and its 95 % confidence half-width (Welch-Satterthwaite)."""
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    return statistics.mean(x) - statistics.mean(y), t_quantile_975(df) * math.sqrt(vx + vy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1337,1,2,3,4,5,6,7,8,9")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    ap.add_argument("--no-variant", action="store_true", help="skip the PyTorch no-decay-embeddings experiment")
    ap.add_argument("--binary", default="build/tapelm")
    ap.add_argument("--config", default="configs/baby.json")
    ap.add_argument("--data", default="corpora/tinyshakespeare.txt")
    ap.add_argument("--reference", default="../shared/reference")
    ap.add_argument("--results", default="bench/RESULTS.md")
    ap.add_argument("--raw", default="bench/QUALITY.jsonl")
    ap.add_argument("--plot", default="docs/baby_seeds.png", help="gnuplot figure of every run ('' for none)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    ap.add_argument("--from-raw", action="store_true",
                    help="run nothing: report the newest batch of runs in --raw again (section and plot)")
    a = ap.parse_args()
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"quality.py: error: --seeds must be integers separated by commas, got {a.seeds!r}")
    if len(seeds) < 2:
        sys.exit("quality.py: error: --seeds needs at least two seeds for a spread")
    for path, what in ((a.binary, "--binary"), (a.config, "--config"), (a.data, "--data"),
                       (os.path.join(a.reference, "gpt.py"), "--reference"), (PYTHON, "python")):
        if not os.path.exists(path):
            sys.exit(f"quality.py: error: {what}: {path} not found")
    if not a.from_raw and subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        sys.exit(f"quality.py: error: {PYTHON} cannot import torch (apt-get install -y python3-torch)")

    if a.from_raw:
        rows, stamp, iters = load_raw(a.raw)
        seeds = list(dict.fromkeys(r["seed"] for r in rows))
    else:
        rows = run_all(a, seeds)
        stamp, iters = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), a.iters
        with open(a.raw, "a", encoding="utf-8") as f:
            for r in sorted(rows, key=lambda r: (r["program"], seeds.index(r["seed"]))):
                f.write(json.dumps({**r, "iters": a.iters, "date": stamp}) + "\n")
    report(a, rows, seeds, stamp, iters)


def load_raw(path):
    try:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"quality.py: error: --raw {path}: {e}")
    if not rows:
        sys.exit(f"quality.py: error: --raw {path}: no runs")
    stamp = rows[-1]["date"]
    rows = [r for r in rows if r["date"] == stamp]
    return rows, stamp, rows[0]["iters"]


def run_all(a, seeds):
    tasks = []  # interleaved, so both programs run under the same load
    for s in seeds:
        tasks.append(("tapelm", s))
        tasks.append(("pytorch", s))
        if not a.no_variant:
            tasks.append(("variant", s))
    rows = []
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="tapelm-quality-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = {}
        for kind, s in tasks:
            if kind == "tapelm":
                f = pool.submit(tapelm_run, a, s, tmp)
            else:
                f = pool.submit(torch_run, a, s, kind == "variant")
            futs[f] = (kind, s)
        for i, f in enumerate(concurrent.futures.as_completed(futs), 1):
            kind, s = futs[f]
            try:
                r = f.result()
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                for g in futs:
                    g.cancel()
                sys.exit(f"quality.py: error: {kind} seed {s}: {e}")
            rows.append(r)
            el = time.time() - t_start
            eta = el / i * (len(tasks) - i)
            print(f"[{i}/{len(tasks)}] {r['program']:<22} seed {s:>5}: whole val {r['val_loss']:.4f}, "
                  f"20-batch {r['val_loss_20']:.4f}, {r['seconds']:.0f} s   (elapsed {el / 60:.0f} min, "
                  f"ETA {eta / 60:.0f} min)", flush=True)
    return rows


def report(a, rows, seeds, stamp, iters):
    progs = [p for p in ("tapelm", "pytorch", "pytorch-no-decay-emb") if any(r["program"] == p for r in rows)]
    by = {p: sorted((r for r in rows if r["program"] == p), key=lambda r: seeds.index(r["seed"])) for p in progs}
    sm = {p: summary(by[p]) for p in progs}
    names = {"tapelm": "tapelm", "pytorch": "PyTorch reference",
             "pytorch-no-decay-emb": "PyTorch, embeddings not decayed (experiment)"}
    lines = ["<!-- quality:begin -->", "## Quality: nanoGPT's CPU example over seeds", "",
             f"`python3 bench/quality.py --seeds {','.join(map(str, seeds))} --iters {iters}` on {stamp}, "
             f"this machine ({os.cpu_count()} cores; {a.jobs} runs at once, 1 thread each, "
             "so the wall times are for comparing runs here, not for speed: see the tables above). "
             f"`configs/baby.json` (L4 H4 d128 T64 B12, {iters} iterations). *Whole val split*: `tapelm eval` "
             "and `bench/ref_train.py` over non-overlapping windows of 64 (111,488 positions). "
             "*20-batch estimate*: the mean over 20 batches of 12 random val windows at the last step, the "
             "figure nanoGPT prints (tapelm's trainer draws its windows once per run, nanoGPT anew each time).",
             "", "| | seeds | whole val split: mean ± sd | range | ≤ 1.90 | 20-batch estimate: mean | ≤ 1.90 | "
             "median wall time |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in progs:
        s = sm[p]
        lines.append(f"| {names[p]} | {s['n']} | {s['mean']:.4f} ± {s['sd']:.4f} | {s['min']:.4f}–{s['max']:.4f} | "
                     f"{s['reach']} of {s['n']} | {s['est_mean']:.4f} | {s['est_reach']} of {s['n']} | {s['secs']:.0f} s |")
    lines += ["", "Per seed, whole val split (20-batch estimate):", "",
              "| seed | " + " | ".join(names[p] for p in progs) + " |", "|---:|" + "---:|" * len(progs)]
    for s in seeds:
        cells = []
        for p in progs:
            r = next((r for r in by[p] if r["seed"] == s), None)
            cells.append(f"{r['val_loss']:.4f} ({r['val_loss_20']:.4f})" if r else "–")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("")
    if "pytorch" in sm and sm["tapelm"]["n"] > 1 and sm["pytorch"]["n"] > 1:
        d, h = welch([r["val_loss"] for r in by["tapelm"]], [r["val_loss"] for r in by["pytorch"]])
        lines.append(f"tapelm − PyTorch on the whole split: {d:+.4f} ± {h:.4f} (95 % interval, Welch), "
                     + ("no difference at this resolution." if abs(d) <= h else "a difference."))
    if "pytorch-no-decay-emb" in sm:
        d, h = welch([r["val_loss"] for r in by["pytorch-no-decay-emb"]], [r["val_loss"] for r in by["pytorch"]])
        lines.append(f"Embeddings left out of weight decay − today's nanoGPT rule (PyTorch): {d:+.4f} ± {h:.4f}.")
    if a.plot:
        draw(by, names, a.plot, iters)
        lines += ["", f"![val loss over seeds]({os.path.relpath(a.plot, os.path.dirname(a.results) or '.')})"]
    lines.append("<!-- quality:end -->")
    section = "\n".join(lines) + "\n"
    print("\n" + section)

    text = open(a.results, encoding="utf-8").read() if os.path.exists(a.results) else ""
    if "<!-- quality:begin -->" in text and "<!-- quality:end -->" in text:
        head, rest = text.split("<!-- quality:begin -->", 1)
        tail = rest.split("<!-- quality:end -->", 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + section
    tmp_path = a.results + ".tmp"
    with open(tmp_path, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp_path, a.results)
    print(f"wrote {a.results}" + ("" if a.from_raw else f" and appended {len(rows)} runs to {a.raw}")
          + (f"; plot {a.plot}" if a.plot else ""))


def draw(by, names, png, iters):
    """One column of dots per program (a dot per seed), its mean as a bar, and the 1.90 bar."""
    if not shutil.which("gnuplot"):
        print("quality.py: gnuplot not found, no plot (apt-get install -y gnuplot-nox)", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory(prefix="tapelm-quality-plot-") as tmp:
        dat = os.path.join(tmp, "runs.dat")
        with open(dat, "w", encoding="utf-8") as f:
            for i, p in enumerate(by):
                for j, r in enumerate(by[p]):
                    f.write(f"{i + 1 + 0.3 * (j / max(1, len(by[p]) - 1) - 0.5):.4f} {r['val_loss']:.6f} {r['val_loss_20']:.6f}\n")
                f.write("\n\n")
        means = "".join(f"set arrow from {i + 0.6},{statistics.mean(r['val_loss'] for r in by[p]):.6f} to "
                        f"{i + 1.4},{statistics.mean(r['val_loss'] for r in by[p]):.6f} nohead lw 2 lc rgb '#333333'\n"
                        for i, p in enumerate(by))
        tics = ", ".join(f"\"{names[p].replace(' (experiment)', '')}\" {i + 1}" for i, p in enumerate(by))
        script = (f"set terminal pngcairo size 900,520 font 'sans,11'\nset output '{png}'\n"
                  f"set title \"nanoGPT's CPU example, {iters} iterations: val loss over seeds\"\n"
                  f"set ylabel 'val loss'\nset xrange [0.4:{len(by) + 0.6}]\nset xtics ({tics})\n"
                  "set grid ytics\nset key top right\n" + means +
                  f"set arrow from 0.4,{BAR} to {len(by) + 0.6},{BAR} nohead dt 2 lw 2 lc rgb '#cc0000'\n"
                  f"set label 'the bar, 1.90' at 0.45,{BAR - 0.002} tc rgb '#cc0000'\n"
                  f"plot '{dat}' using 1:2 with points pt 7 ps 1.3 lc rgb '#1f77b4' title 'whole val split, one per seed (black line: mean)', "
                  f"'' using ($1+0.04):3 with points pt 6 ps 1.1 lc rgb '#ff7f0e' title '20-batch estimate'\n")
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w", encoding="utf-8") as f:
            f.write(script)
        p = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"quality.py: gnuplot failed: {p.stderr.strip()[:300]}", file=sys.stderr)


if __name__ == "__main__":
    main()
