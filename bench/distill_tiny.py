#!/usr/bin/env python3
"""Distillation during uptraining on the `tiny` study: which λ and temperature, and how much it keeps.

Pretrains the `tiny` sweep preset's MHA model once (train/study/sweep/plan.cpp: 4 layers, 4 heads,
d 128, 1000 steps, seed 1337), then for each KV count (GQA-2, MQA) and seed (the sweep's 1, 2, 3)
uptrains it with the best conversion (`aligned-fit`) at α = 0.05 — plainly, and with `--distill`
at every λ, T and attention weight β given (`--distill-attention`: each block's attention output
against the teacher's) — and evaluates each result on the whole val split (`uptrain` does). Reports
the mean val loss over seeds per setting, its difference from plain uptraining seed by seed
(mean and sd of the paired differences), and the MHA model's own loss.

Compute is not equal across rows: a distilled step also runs the teacher's forward (about a third
of a training step); the sweep's equal-compute accounting is separate.
Writes bench/DISTILL.md (or --out) and every run to the .jsonl beside it. Run from the repository
root after `bash scripts/build.sh`:
    python3 bench/distill_tiny.py [--lambdas 0.5,1] [--temperatures 1,2,4] [--attention 0,1] [--seeds 1,2,3]
"""
import argparse
import datetime
import json
import os
import statistics
import tempfile

import uptrain_study as study

TINY = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "max_iters": 1000,
        "warmup_iters": 100, "learning_rate": 1e-3, "min_lr": 1e-4, "eval_interval": 250, "eval_iters": 20,
        "log_interval": 100, "beta2": 0.99, "weight_decay": 0.1, "grad_clip": 1.0, "checkpoint_interval": 250}


def write_report(args, rows, settings, seeds, kvs, commit, system, mha_loss):
    """A row per setting: val loss per KV count (mean over seeds) and, paired by seed, the
    difference from plain uptraining and from the MHA model given the same setting."""
    H = max(kvs)
    name = {H: "MHA (unconverted)", 1: "MQA"}
    md = ["# Distillation during uptraining on the `tiny` study", "",
          f"`python3 bench/distill_tiny.py --kv {args.kv} --lambdas {args.lambdas} --temperatures {args.temperatures} "
          + (f"--attention {args.attention} " if args.attention != "0" else "") + f"--seeds {args.seeds}` ({datetime.date.today().isoformat()}, commit {commit}). Machine: {system}.", "",
          f"The `tiny` MHA model (val loss {mha_loss:.4f}, 1000 steps) converted by `aligned-fit` and uptrained "
          "α = 0.05 (50 steps, seeds as the sweep's); the MHA row uptrains the MHA model itself the same way (the "
          "study's \"MHA + α\"). Val loss on the whole val split, mean over seeds; Δ plain = distilled − plain and "
          "Δ MHA = this KV count − MHA under the same setting, both paired by seed (mean ± sd). A distilled step "
          "also runs the teacher's forward: rows of different settings are not at equal compute.", "",
          "β weighs the per-layer attention-output term (0: off).", "",
          "| KV heads | λ | T | β | val loss | Δ plain | Δ MHA |", "|---|---:|---:|---:|---:|---:|---:|"]

    def pick(kv, s):
        return {r["seed"]: r["val_loss"] for r in rows if r["kv"] == kv and
                (r["lambda"] == 0 if s is None else (r["lambda"], r["temperature"], r.get("attention", 0.0)) == s)}

    def paired(a, b):
        d = [a[k] - b[k] for k in a if k in b]
        return f"{statistics.mean(d):+.4f} ± {study.sd(d):.4f}" if d else "–"

    for kv in kvs:
        for s in settings:
            got = pick(kv, s)
            if not got:
                continue
            lam, temp, beta = ("0 (plain)", "–", "–") if s is None else (f"{s[0]:g}", f"{s[1]:g}", f"{s[2]:g}")
            md.append(f"| {name.get(kv, f'GQA-{kv}')} | {lam} | {temp} | {beta} | {statistics.mean(got.values()):.4f} | "
                      f"{'–' if s is None else paired(got, pick(kv, None))} | {'–' if kv == H else paired(got, pick(H, s))} |")
    with open(args.out, "w") as f:
        f.write("\n".join(md) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lambdas", default="0.5,1")
    ap.add_argument("--temperatures", default="1,2,4")
    ap.add_argument("--attention", default="0", help="weights β of the attention-output term (0: off)")
    ap.add_argument("--kv", default="4,2,1", help="KV head counts; 4 (the MHA model's own) uptrains it unconverted")
    study.add_report_args(ap, "DISTILL.md")
    args = ap.parse_args()
    commit = study.commit(args.commit)
    system = study.machine()
    settings = [None] + [(float(l), float(t), float(b)) for l in args.lambdas.split(",")
                         for t in args.temperatures.split(",") for b in args.attention.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    kvs = [int(k) for k in args.kv.split(",")]
    raw = os.path.splitext(args.out)[0] + ".jsonl"
    rows = []
    if args.report_only:
        rows = study.saved_rows(args, commit)
        write_report(args, rows, settings, seeds, kvs, commit, system, rows[0]["mha"])
        return
    with tempfile.TemporaryDirectory() as work:
        mha, mha_loss = study.pretrain(TINY, work)
        for kv in kvs:
            for seed in seeds:
                for s in settings:
                    flags = []
                    if s:
                        flags = ["--distill", "--distill-lambda", str(s[0]), "--distill-temperature", str(s[1])]
                        if s[2] > 0:
                            flags += ["--distill-attention", str(s[2])]
                    loss, converted = study.uptrain(mha, kv, seed, os.path.join(work, f"up-{kv}-{seed}-{len(rows)}"), *flags)
                    r = {"kv": kv, "seed": seed, "lambda": s[0] if s else 0, "temperature": s[1] if s else None,
                         "attention": s[2] if s else 0.0, "val_loss": loss, "converted": converted, "mha": mha_loss,
                         "commit": commit}
                    print(json.dumps(r), flush=True)
                    rows.append(r)
                    with open(raw, "a") as f:
                        f.write(json.dumps(r) + "\n")
    write_report(args, rows, settings, seeds, kvs, commit, system, mha_loss)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
