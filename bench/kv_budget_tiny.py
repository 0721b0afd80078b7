#!/usr/bin/env python3
"""Where a budget of KV heads should go, on the `tiny` study's model: every allocation against the one
`convert --kv-budget` picks.

Pretrains the `tiny` sweep preset's MHA model once (train/study/sweep/plan.cpp: 4 layers, 4 heads,
d 128, 1000 steps, seed 1337), then for each method converts it to every allocation of counts
dividing 4 (1, 2, 4) per layer that spends the budget exactly (GQA-2's: 8 heads), and evaluates each
on the whole val split at α = 0; and converts it once more with `--kv-budget` (each layer alone
converted to each count, the calibration windows' loss less the source's, the least-cost
allocation by dynamic programming: train/study/convert/budget.h). Every conversion calibrates on
16,384 tokens of the train split (seed 0), as `uptrain` and the sweep do. Writes bench/KV_BUDGET.md
(or --out) and every conversion to the .jsonl beside it. Run from the repository root after
`bash scripts/build.sh`:
    python3 bench/kv_budget_tiny.py [--methods mean,aligned-fit] [--budget 8]
"""
import argparse
import datetime
import itertools
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "max_iters": 1000,
        "warmup_iters": 100, "learning_rate": 1e-3, "min_lr": 1e-4, "eval_interval": 250, "eval_iters": 20,
        "log_interval": 100, "beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "checkpoint_interval": 250}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + p.stderr.strip())
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="mean,aligned-fit")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "KV_BUDGET.md"))
    args = ap.parse_args()
    tapelm = os.environ.get("TAPELM", os.path.join(ROOT, "build", "tapelm"))
    corpus = os.path.join(ROOT, "corpora", "tinyshakespeare.txt")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    system = "; ".join(line for line in run([tapelm, "inspect", "--system"]).splitlines() if line.startswith(("cpu ", "simd ")))
    layers, heads = TINY["n_layer"], TINY["n_head"]
    counts = [g for g in range(1, heads + 1) if heads % g == 0]
    allocations = [a for a in itertools.product(counts, repeat=layers) if sum(a) == args.budget]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        cfg = os.path.join(work, "tiny.json")
        with open(cfg, "w") as f:
            json.dump(TINY, f)
        run([tapelm, "train", "--config", cfg, "--data", corpus, "--out", os.path.join(work, "mha"), "--quiet"])
        mha = os.path.join(work, "mha", "checkpoint.h5")
        out = os.path.join(work, "c.h5")

        def val_loss():
            return json.loads(run([tapelm, "eval", "--checkpoint", out, "--data", corpus, "--split", "val", "--json"])
                              .strip().splitlines()[-1])["loss"]

        for m in args.methods.split(","):
            base = [tapelm, "convert", "--from", mha, "--method", m, "--calib", corpus, "--out", out]
            for a in allocations:
                run(base + ["--kv-heads", ",".join(map(str, a))])
                rows.append({"method": m, "heads": list(a), "picked": False, "val_loss": val_loss(), "commit": commit})
                print(json.dumps(rows[-1]), flush=True)
            run(base + ["--kv-budget", str(args.budget)])
            picked = json.loads(run([tapelm, "inspect", out]).split("config ", 1)[1].splitlines()[0])["n_kv_head"]
            picked = picked if isinstance(picked, list) else [picked] * layers
            rows.append({"method": m, "heads": picked, "picked": True, "val_loss": val_loss(), "commit": commit})
            print(json.dumps(rows[-1]), flush=True)
    with open(os.path.splitext(args.out)[0] + ".jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = ["# A budget of KV heads over the layers, on the `tiny` study's model", "",
          f"`python3 bench/kv_budget_tiny.py --methods {args.methods} --budget {args.budget}` "
          f"({datetime.date.today().isoformat()}, commit {commit}). Machine: {system}.", "",
          f"The `tiny` MHA model ({layers} layers, {heads} heads) converted at α = 0 to every allocation of "
          f"{', '.join(map(str, counts))} heads per layer that spends {args.budget} heads; val loss on the whole val "
          "split. `--kv-budget` is the allocation `convert --kv-budget` picks (measured per-layer costs, "
          "train/study/convert/budget.h).", "",
          "| method | uniform | best allocation | `--kv-budget` picks | rank of its pick |", "|---|---|---|---|---|"]
    for m in args.methods.split(","):
        mine = sorted((r for r in rows if r["method"] == m and not r["picked"]), key=lambda r: r["val_loss"])
        pick = next(r for r in rows if r["method"] == m and r["picked"])
        uniform = next((r for r in mine if len(set(r["heads"])) == 1), None)
        rank = 1 + sum(r["val_loss"] < pick["val_loss"] - 1e-9 for r in mine)
        fmt = lambda r: ",".join(map(str, r["heads"])) + f": {r['val_loss']:.4f}"
        md.append(f"| {m} | {fmt(uniform) if uniform else '–'} | {fmt(mine[0])} | {fmt(pick)} | {rank} of {len(mine)} |")
    md += ["", "Every allocation (val loss):", "", "| method | heads per layer | val loss |", "|---|---|---|"]
    md += [f"| {r['method']} | {','.join(map(str, r['heads']))} | {r['val_loss']:.4f} |"
           for r in sorted(rows, key=lambda r: (r["method"], r["val_loss"])) if not r["picked"]]
    with open(args.out, "w") as f:
        f.write("\n".join(md) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
