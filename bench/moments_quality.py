#!/usr/bin/env python3
"""AdamW's moments in bfloat16 (`moments: bf16`) against float32, on the `small` study.

The issue's protocol: the `small` sweep preset's MHA model (4 layers, 8 heads, d 256, T 128,
1000 steps, seed 1337, float32) converted to GQA-2 by aligned-fit and uptrained α = 0.05 (50
steps) with seeds 1, 2, 3, with float32 and with bf16 moments (`--set moments=bf16`):
  uptrain              with the preset's beta2 0.99;
  uptrain-beta2-0.999  with beta2 0.999, where v's per-step increment (0.1 % of it) is below
                       bf16's half-gap and only the stochastic rounding keeps it.
Optional, longer (about 13 min a run on 2 Zen 3 cores): `train` and `train-beta2-0.999` train the
preset from scratch with each seed.
Each run's loss is on the whole val split. Reports, per setting, the mean and sample sd over seeds
of each, their difference paired by seed, and whether |mean difference| is within one seed-sd of the
float32 runs (the issue's bar for offering a smaller optimizer state).

Writes bench/MOMENTS.md (or --out) and every run to the .jsonl beside it. Run from the repository
root after `bash scripts/build.sh`:
    python3 bench/moments_quality.py [--seeds 1,2,3] [--settings uptrain,uptrain-beta2-0.999,train,train-beta2-0.999]
"""
import argparse
import datetime
import json
import os
import statistics
import tempfile

import uptrain_study as study

SMALL = {"n_layer": 4, "n_head": 8, "n_embd": 256, "block_size": 128, "batch_size": 16, "max_iters": 1000,
         "warmup_iters": 100, "learning_rate": 1e-3, "min_lr": 1e-4, "eval_interval": 300, "eval_iters": 10,
         "log_interval": 100, "beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "checkpoint_interval": 250}
MOMENTS = ("f32", "bf16")


def write_report(args, rows, commit, system):
    md = ["# AdamW's moments in bfloat16 against float32 (`moments: bf16`)", "",
          f"`python3 bench/moments_quality.py --seeds {args.seeds}` ({datetime.date.today().isoformat()}, commit {commit}). "
          f"Machine: {system}.", "",
          "`moments: bf16` keeps AdamW's two moments in bfloat16, 4 bytes a trained parameter instead of 8; each "
          "step computes them in float32 from the stored ones and rounds them back stochastically "
          "(autograd/kernels/optim.h). `uptrain` converts the `small` sweep preset's MHA model (4 layers, 8 heads, "
          "d 256, T 128, batch 16, 1000 steps, seed 1337, float32) to GQA-2 by `aligned-fit` and uptrains it "
          "α = 0.05 (50 steps) with the preset's beta2 0.99, or with beta2 0.999 (`-beta2-0.999`: v's increment "
          "below bf16's half-gap, kept only by the stochastic rounding); `train` trains the preset from scratch. Val loss on the whole val split; mean ± sample sd over the seeds; Δ = bf16 − f32 "
          "paired by seed (mean ± sd); within = |mean Δ| ≤ the f32 runs' seed-sd.", "",
          "| setting | f32 val loss | bf16 val loss | Δ bf16 − f32 | within one seed-sd |", "|---|---:|---:|---:|---|"]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        by = {m: {r["seed"]: r["val_loss"] for r in rows if r["setting"] == setting and r["moments"] == m} for m in MOMENTS}
        seeds = sorted(set(by["f32"]) & set(by["bf16"]))
        if not seeds:
            continue
        f, b = [by["f32"][s] for s in seeds], [by["bf16"][s] for s in seeds]
        d = [y - x for x, y in zip(f, b)]
        md.append(f"| {setting} | {statistics.mean(f):.4f} ± {study.sd(f):.4f} | {statistics.mean(b):.4f} ± {study.sd(b):.4f} | "
                  f"{statistics.mean(d):+.4f} ± {study.sd(d):.4f} | {'yes' if abs(statistics.mean(d)) <= study.sd(f) else 'no'} |")
    md += ["", "Runs, seed by seed:", "", "| setting | seed | f32 | bf16 |", "|---|---:|---:|---:|"]
    for setting in dict.fromkeys(r["setting"] for r in rows):
        for s in sorted({r["seed"] for r in rows if r["setting"] == setting}):
            v = {r["moments"]: r["val_loss"] for r in rows if r["setting"] == setting and r["seed"] == s}
            md.append(f"| {setting} | {s} | {v.get('f32', float('nan')):.4f} | {v.get('bf16', float('nan')):.4f} |")
    with open(args.out, "w") as f:
        f.write("\n".join(md) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="uptrain,uptrain-beta2-0.999")
    study.add_report_args(ap, "MOMENTS.md")
    args = ap.parse_args()
    commit = study.commit(args.commit)
    system = study.machine()
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = args.settings.split(",")
    raw = os.path.splitext(args.out)[0] + ".jsonl"
    rows = []
    if args.report_only:
        rows = study.saved_rows(args, commit)
        write_report(args, rows, commit, system)
        return

    def keep(r):
        r["commit"] = commit
        print(json.dumps(r), flush=True)
        rows.append(r)
        with open(raw, "a") as f:
            f.write(json.dumps(r) + "\n")

    with tempfile.TemporaryDirectory() as work:
        for setting in settings:
            if not setting.startswith("train"):
                continue
            for seed in seeds:
                for m in MOMENTS:
                    cfg = dict(SMALL, seed=seed, moments=m)
                    if setting == "train-beta2-0.999":
                        cfg["beta2"] = 0.999
                    d = os.path.join(work, f"{setting}-{seed}-{m}")
                    os.makedirs(d)
                    keep({"setting": setting, "seed": seed, "moments": m, "val_loss": study.pretrain(cfg, d)[1]})
        ups = [s for s in settings if s.startswith("uptrain")]
        if ups:
            mha, _ = study.pretrain(SMALL, work)
            for setting in ups:
                for seed in seeds:
                    for m in MOMENTS:
                        sets = ["--set", "moments=" + m] + (["--set", "beta2=0.999"] if setting.endswith("0.999") else [])
                        loss, converted = study.uptrain(mha, 2, seed, os.path.join(work, f"{setting}-{seed}-{m}"), *sets)
                        keep({"setting": setting, "seed": seed, "moments": m, "val_loss": loss, "converted": converted})
    write_report(args, rows, commit, system)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
