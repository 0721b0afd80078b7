#!/usr/bin/env python3
"""bf16 training against f32 at the same steps and seeds: the quality half of mixed precision.

For every preset and seed it trains the sweep preset's MHA model (train/study/sweep/plan.cpp:
`tiny` is nanoGPT's CPU model for 1000 steps, `small` the 8-head model of the study) once per
precision, the precisions alternating run by run, one run at a time on all threads:
  build/tapelm train --config PRESET.json --set seed=S --precision P --quiet
then evaluates the final weights in f32 on the whole val split (`tapelm eval --json`), and reports
per preset: the f32-evaluated val loss per precision over seeds (mean, sd), bf16 - f32 seed by
seed and its mean, and the run's own closing loss (evaluated in its precision, as nanoGPT
evaluates under its autocast context); the .jsonl also keeps each run's median tokens/s (speed
belongs to bench/compare.sh: these runs may share the machine).

`bf16-emulated` computes bf16's numbers on any CPU (autograd/autocast.h): the quality it measures
is bf16's, its speed is not. Writes bench/PRECISION.md (or --out) and every run to the .jsonl
beside it. Run from the repository root after `bash scripts/build.sh`:
    python3 bench/precision_quality.py [--presets tiny,small] [--seeds 1,2,3] [--bf16 bf16-emulated]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The pretraining configs of the sweep presets (train/study/sweep/plan.cpp, sweep_preset).
COMMON = {"beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "checkpoint_interval": 250,
          "warmup_iters": 100, "learning_rate": 1e-3, "min_lr": 1e-4, "max_iters": 1000, "log_interval": 100}
PRESETS = {
    "tiny": dict(COMMON, n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, eval_interval=250, eval_iters=20),
    "small": dict(COMMON, n_layer=4, n_head=8, n_embd=256, block_size=128, batch_size=16, eval_interval=300, eval_iters=10),
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + p.stderr.strip())
    return p.stdout


def one_run(tapelm, preset, seed, precision, corpus, work):
    cfg = os.path.join(work, preset + ".json")
    with open(cfg, "w") as f:
        json.dump(PRESETS[preset], f)
    out = os.path.join(work, f"{preset}-{precision}-{seed}")
    run([tapelm, "train", "--config", cfg, "--data", corpus, "--out", out, "--set", f"seed={seed}",
         "--precision", precision, "--quiet"])
    with open(os.path.join(out, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    ev = json.loads(run([tapelm, "eval", "--checkpoint", os.path.join(out, "checkpoint.h5"), "--data", corpus,
                         "--split", "val", "--json"]).strip().splitlines()[-1])
    speeds = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r]
    return {"preset": preset, "seed": seed, "precision": precision, "steps": recs[-1]["step"],
            "val_loss_f32_eval": ev["loss"], "val_loss_own": recs[-1]["val_loss_full"],
            "tokens_per_s": statistics.median(speeds) if speeds else None}


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def report(rows, args, system):
    md = ["# bf16 training against f32: quality at the same steps and seeds", "",
          f"`python3 bench/precision_quality.py --presets {args.presets} --seeds {args.seeds} --bf16 {args.bf16}` "
          f"({datetime.date.today().isoformat()}, commit {args.commit}). Machine: {system}.", "",
          "Each preset's MHA model (the sweep's pretraining run) trained once per precision and seed, the precisions "
          "alternating; val loss of the final weights evaluated in f32 on the whole val split (`tapelm eval`). "
          "`own` is the run's closing loss evaluated in its own precision. The target (issue: bf16 training) is "
          "|bf16 − f32| < 0.01.", "",
          "| preset | seed | f32 | " + args.bf16 + " | difference | " + args.bf16 + " (own) |",
          "|---|---:|---:|---:|---:|---:|"]
    summary = []
    for preset in args.presets.split(","):
        diffs, a_all, b_all = [], [], []
        for seed in [int(s) for s in args.seeds.split(",")]:
            a = next(r for r in rows if r["preset"] == preset and r["seed"] == seed and r["precision"] == "f32")
            b = next(r for r in rows if r["preset"] == preset and r["seed"] == seed and r["precision"] == args.bf16)
            d = b["val_loss_f32_eval"] - a["val_loss_f32_eval"]
            diffs.append(d)
            a_all.append(a["val_loss_f32_eval"])
            b_all.append(b["val_loss_f32_eval"])
            md.append(f"| {preset} | {seed} | {a['val_loss_f32_eval']:.4f} | {b['val_loss_f32_eval']:.4f} | {d:+.4f} | "
                      f"{b['val_loss_own']:.4f} |")
        ok = abs(statistics.mean(diffs)) < 0.01 and max(abs(x) for x in diffs) < 0.01
        summary.append(f"- **{preset}**: f32 {statistics.mean(a_all):.4f} ± {sd(a_all):.4f}, {args.bf16} "
                       f"{statistics.mean(b_all):.4f} ± {sd(b_all):.4f} (mean ± sd over {len(diffs)} seeds); "
                       f"bf16 − f32 {statistics.mean(diffs):+.4f} on average, from {min(diffs):+.4f} to {max(diffs):+.4f}: "
                       f"target {'met' if ok else 'not met'}.")
    md += [""] + summary + [""]
    return "\n".join(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--bf16", default="bf16-emulated", choices=["bf16", "bf16-emulated"])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "PRECISION.md"))
    ap.add_argument("--report-only", action="store_true",
                    help="write the report from the .jsonl's rows of the current commit (or --commit) without training")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    tapelm = os.environ.get("TAPELM", os.path.join(ROOT, "build", "tapelm"))
    corpus = os.path.join(ROOT, "corpora", "tinyshakespeare.txt")
    args.commit = args.commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                                text=True).stdout.strip() or "unknown"
    system = run([tapelm, "inspect", "--system"]).strip().splitlines()
    system = "; ".join(line for line in system if line.startswith(("cpu ", "simd ", "threads ")))
    rows = []
    raw = os.path.splitext(args.out)[0] + ".jsonl"
    if args.report_only:
        with open(raw) as f:
            rows = [r for r in map(json.loads, f) if r.get("commit") == args.commit]
        with open(args.out, "w") as f:
            f.write(report(rows, args, system))
        print("wrote", args.out)
        return
    with tempfile.TemporaryDirectory() as work:
        k = 0
        for preset in args.presets.split(","):
            if preset not in PRESETS:
                sys.exit(f"unknown preset {preset} (tiny, small)")
            for seed in [int(s) for s in args.seeds.split(",")]:
                order = ["f32", args.bf16] if k % 2 == 0 else [args.bf16, "f32"]
                k += 1
                for p in order:
                    r = one_run(tapelm, preset, seed, p, corpus, work)
                    r["commit"] = args.commit
                    print(json.dumps(r), flush=True)
                    rows.append(r)
                    with open(raw, "a") as f:
                        f.write(json.dumps(r) + "\n")
    with open(args.out, "w") as f:
        f.write(report(rows, args, system))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
