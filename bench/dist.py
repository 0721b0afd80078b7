#!/usr/bin/env python3
"""Data-parallel training on this machine and what the gradient all-reduce costs on a cluster.

1. `mid` (L6 H8 KV8 d256 T128, batch 32 per rank) training throughput, in alternating rounds:
     1 rank  x 2 threads     tapelm --threads 2 train ...
     2 ranks x 1 thread      mpirun -np 2 --bind-to core tapelm --threads 1 train ...
     1 rank  x 2 threads, batch 64 (the same global batch as two ranks; informative)
   tokens/s = median over the run's logged intervals (the first, warm-up interval dropped), then
   the median over rounds; for two ranks also the share of wall time spent in the all-reduce.
2. For every benchmark configuration: parameters and the measured 2-thread step time
   (`tapelm bench --mode train`), the bytes a ring all-reduce moves per rank and step,
   2 * params * 4 * (N - 1) / N, and the time that takes at 10 and 100 Gbit/s for N = 8 and 64,
   against the step's compute (no overlap of communication with backward is assumed).

Writes the section between <!-- mpi:begin --> and <!-- mpi:end --> of bench/RESULTS.md (appended
if absent) and the raw runs to bench/DIST.jsonl. Run from the repository root after
`bash scripts/build.sh`:  python3 bench/dist.py [--rounds 3] [--steps 40]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {  # name: (layers, heads, kv heads, d, T, batch) as in bench/compare.sh
    "baby": (4, 4, 4, 128, 64, 12),
    "mid-kv8": (6, 8, 8, 256, 128, 32),
    "mid-kv2": (6, 8, 2, 256, 128, 32),
    "mid-kv1": (6, 8, 1, 256, 128, 32),
    "nano": (6, 6, 6, 384, 256, 64),
}


def sets(name, batch=None):
    L, H, KV, d, T, B = CONFIGS[name]
    kv = dict(vocab_size=65, n_layer=L, n_head=H, n_kv_head=KV, n_embd=d, block_size=T, batch_size=batch or B)
    return [w for k, v in kv.items() for w in ("--set", f"{k}={v}")]


def run(cmd, env=None, timeout=1800):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"dist.py: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return p.stdout, time.time() - t0


def train_rate(binary, mpirun, setting, steps, batch, rnd):
    d = tempfile.mkdtemp(prefix="tapelm_dist_")
    try:
        L, H, KV, dm, T, _ = CONFIGS["mid-kv8"]
        cfg = dict(vocab_size=65, n_layer=L, n_head=H, n_kv_head=KV, n_embd=dm, block_size=T, batch_size=batch,
                   max_iters=steps, log_interval=5, eval_interval=10**6, eval_iters=1, checkpoint_interval=10**6,
                   learning_rate=6e-4, min_lr=6e-5, warmup_iters=10, lr_decay_iters=steps, dropout=0.0)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        common = ["train", "--config", os.path.join(d, "config.json"), "--data", "corpora/tinyshakespeare.txt",
                  "--out", os.path.join(d, "run")]
        if setting == "2r1t":
            cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "core", "-np", "2",
                   binary, "--threads", "1"] + common
        else:
            cmd = [binary, "--threads", "2"] + common
        out, wall = run(cmd)
        recs = [json.loads(l) for l in open(os.path.join(d, "run", "metrics.jsonl")) if l.strip()]
        rates = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r][1:]
        m = re.search(r"gradient all-reduce: ([\d.]+)s, ([\d.]+)% of the wall time", out)
        rec = {"setting": setting, "batch_per_rank": batch, "round": rnd, "wall_s": round(wall, 2),
               "tok_s": statistics.median(rates), "intervals": rates, "cmd": " ".join(cmd).replace(d, "RUN_DIR"),
               "allreduce_pct": float(m.group(2)) if m else None}
        return rec
    finally:
        shutil.rmtree(d, ignore_errors=True)


def step_time(binary, name):
    out, _ = run([binary, "--threads", "2", "bench", "--mode", "train", "--iters", "5", "--warmup", "1", "--json"]
                 + sets(name))
    j = json.loads(out.strip().splitlines()[-1])
    return j["params"], j["median_s"], j["tokens_per_iter"]


def fmt_s(s):
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/tapelm")
    ap.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--results", default="bench/RESULTS.md")
    ap.add_argument("--raw", default="bench/DIST.jsonl")
    a = ap.parse_args()

    runs = []
    settings = [("1r2t", 32), ("2r1t", 32), ("1r2t", 64)]
    for rnd in range(1, a.rounds + 1):
        for setting, batch in settings:
            rec = train_rate(a.binary, a.mpirun, setting, a.steps, batch, rnd)
            runs.append(rec)
            extra = f", all-reduce {rec['allreduce_pct']:.1f}% of wall" if rec["allreduce_pct"] is not None else ""
            print(f"round {rnd} {setting} batch {batch}: {rec['tok_s']:.0f} tok/s{extra}", flush=True)

    def med(setting, batch, key="tok_s"):
        return statistics.median(r[key] for r in runs if r["setting"] == setting and r["batch_per_rank"] == batch)

    one, two, one64 = med("1r2t", 32), med("2r1t", 32), med("1r2t", 64)
    share = med("2r1t", 32, "allreduce_pct")
    costs = {name: step_time(a.binary, name) for name in CONFIGS}

    when = time.strftime("%Y-%m-%d")
    lines = ["<!-- mpi:begin -->", "## Data-parallel training (MPI)", "",
             f"`python3 bench/dist.py --rounds {a.rounds} --steps {a.steps}` ({when}; {a.rounds} alternating rounds, "
             "median of the logged intervals after the first, then of the rounds).", "",
             "### `mid` (KV 8) training on this machine (2 cores)", "",
             "| setting | windows per step | tokens/s | vs 1 rank × 2 threads |", "|---|---:|---:|---:|",
             f"| 1 rank × 2 threads, batch 32 | 32 | {one:,.0f} | 1.00× |",
             f"| 2 ranks × 1 thread, batch 32 per rank | 64 | {two:,.0f} | {two / one:.2f}× |",
             f"| 1 rank × 2 threads, batch 64 (same global batch) | 64 | {one64:,.0f} | {one64 / one:.2f}× |", "",
             f"Two ranks spent {share:.1f} % of their wall time in the gradient all-reduce (shared memory, "
             "including waiting for the slower rank).", "",
             "### What the all-reduce would cost on a cluster", "",
             "Ring all-reduce of float32 gradients: each rank sends and receives 2·P·4·(N−1)/N bytes per "
             "step. Compute is this machine's measured 2-thread step (`tapelm bench --mode train`, batch as in "
             "the benchmarks, per rank); communication is not overlapped with backward, so its share of the "
             "step is comm / (comm + compute). Shares above 50 % (communication dominates) are in bold; the last "
             "column is the link speed below which communication takes longer than compute.", "",
             "| config | params | compute/step | N | bytes/rank/step | 10 Gbit/s | share | 100 Gbit/s | share "
             "| comm = compute at |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, (P, t_step, tok) in costs.items():
        for N in (8, 64):
            nbytes = 2 * P * 4 * (N - 1) / N
            cells = []
            for gbit in (10, 100):
                t = nbytes / (gbit * 1e9 / 8)
                sh = t / (t + t_step)
                cells += [fmt_s(t), f"**{100 * sh:.0f} %**" if sh > 0.5 else f"{100 * sh:.0f} %"]
            even = nbytes * 8 / t_step / 1e9
            lines.append(f"| {name} | {P / 1e6:.2f}M | {fmt_s(t_step)} | {N} | {nbytes / 1e6:.1f} MB | "
                         + " | ".join(cells) + f" | {even:.2f} Gbit/s |")
    lines += ["", "Bandwidth only: latency (≈ 2·(N−1) messages per all-reduce) adds to these figures for "
              "small models. Gradient bucketing overlapped with backward would hide up to one backward pass "
              "of this time; tapelm sends one flat buffer after backward.", "<!-- mpi:end -->"]
    section = "\n".join(lines) + "\n"

    text = open(a.results).read() if os.path.exists(a.results) else ""
    if "<!-- mpi:begin -->" in text and "<!-- mpi:end -->" in text:
        head, rest = text.split("<!-- mpi:begin -->", 1)
        tail = rest.split("<!-- mpi:end -->", 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(a.results, "w") as f:
        f.write(text)
    with open(a.raw, "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
        for name, (P, t_step, tok) in costs.items():
            f.write(json.dumps({"config": name, "params": P, "step_s": t_step, "tokens_per_step": tok}) + "\n")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
