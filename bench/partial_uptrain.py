#!/usr/bin/env python3
"""Partial uptraining on the `small` study: how much of full uptraining's recovery `--train attention`
and `--train kv` keep.

Pretrains the `small` sweep preset's MHA model once (train/study/sweep/plan.cpp: 4 layers, 8 heads,
d 256, T 128, 1000 steps, seed 1337), then for each KV count and seed (the sweep's 1, 2, 3) converts it
by `aligned-fit` and uptrains it α = 0.05 (50 steps) with `--train all`, `attention` and `kv`, each
evaluated on the whole val split (`uptrain` does). Reports per setting the mean val loss over seeds,
its difference from `all` paired by seed, the share of all's recovery kept — (converted − this) /
(converted − all), seed by seed. Speed and memory are bench/partial_train.sh's (GPT-2-small's shape):
these runs may share the machine, their losses do not depend on it.

Writes bench/PARTIAL_UPTRAIN.md (or --out) and every run to the .jsonl beside it. Run from the
repository root after `bash scripts/build.sh`:
    python3 bench/partial_uptrain.py [--kv 2,1] [--seeds 1,2,3]
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
SETTINGS = ("all", "attention", "kv")


def write_report(args, rows, kvs, commit, system, mha_loss):
    name = {1: "MQA"}
    md = ["# Partial uptraining on the `small` study: `uptrain --train all | attention | kv`", "",
          f"`python3 bench/partial_uptrain.py --kv {args.kv} --seeds {args.seeds}` ({datetime.date.today().isoformat()}, "
          f"commit {commit}). Machine: {system}.", "",
          f"The `small` MHA model (8 heads, val loss {mha_loss:.4f}, 1000 steps) converted by `aligned-fit` and uptrained "
          "α = 0.05 (50 steps, seeds as the sweep's), training every parameter (`all`), the attention projections "
          "(`attention`: q, k, v and output) or only the key and value projections the conversion made (`kv`); "
          "the other parameters stay as converted. Val loss on the whole val split, mean over seeds; Δ all = this − "
          "all, paired by seed (mean ± sd); kept = (converted − this) / (converted − all), the share of full "
          "uptraining's recovery, seed by seed (mean ± sd). Step time and memory: bench/PARTIAL_TRAIN.md.", "",
          "| KV heads | trains | converted | val loss | Δ all | kept |", "|---|---|---:|---:|---:|---:|"]

    def pick(kv, t, key="val_loss"):
        return {r["seed"]: r[key] for r in rows if r["kv"] == kv and r["train"] == t}

    for kv in kvs:
        base = pick(kv, "all")
        conv = pick(kv, "all", "converted")
        for t in SETTINGS:
            got = pick(kv, t)
            if not got:
                continue
            d = [got[s] - base[s] for s in got if s in base]
            kept = [(conv[s] - got[s]) / (conv[s] - base[s]) for s in got if s in base and conv[s] != base[s]]
            md.append(f"| {name.get(kv, f'GQA-{kv}')} | {t} | {statistics.mean(conv.values()):.4f} | "
                      f"{statistics.mean(got.values()):.4f} | "
                      f"{'–' if t == 'all' else f'{statistics.mean(d):+.4f} ± {study.sd(d):.4f}'} | "
                      f"{'1' if t == 'all' else f'{statistics.mean(kept):.2f} ± {study.sd(kept):.2f}'} |")
    with open(args.out, "w") as f:
        f.write("\n".join(md) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv", default="2,1", help="KV head counts of the conversions")
    study.add_report_args(ap, "PARTIAL_UPTRAIN.md")
    args = ap.parse_args()
    commit = study.commit(args.commit)
    system = study.machine()
    seeds = [int(s) for s in args.seeds.split(",")]
    kvs = [int(k) for k in args.kv.split(",")]
    raw = os.path.splitext(args.out)[0] + ".jsonl"
    rows = []
    if args.report_only:
        rows = study.saved_rows(args, commit)
        write_report(args, rows, kvs, commit, system, rows[0]["mha"])
        return
    with tempfile.TemporaryDirectory() as work:
        mha, mha_loss = study.pretrain(SMALL, work)
        for kv in kvs:
            for seed in seeds:
                for t in SETTINGS:
                    loss, converted = study.uptrain(mha, kv, seed, os.path.join(work, f"up-{kv}-{seed}-{t}"), "--train", t)
                    r = {"kv": kv, "seed": seed, "train": t, "val_loss": loss, "converted": converted, "mha": mha_loss,
                         "commit": commit}
                    print(json.dumps(r), flush=True)
                    rows.append(r)
                    with open(raw, "a") as f:
                        f.write(json.dumps(r) + "\n")
    write_report(args, rows, kvs, commit, system, mha_loss)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
