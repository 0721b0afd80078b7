"""What the uptraining studies run from bench/ share (distill_tiny.py, partial_uptrain.py): the
tapelm binary and corpus they use, running a command, the sample sd, the commit and machine lines of
a report, pretraining the MHA model once, and one uptraining run's result.
"""
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAPELM = os.environ.get("TAPELM", os.path.join(ROOT, "build", "tapelm"))
CORPUS = os.path.join(ROOT, "corpora", "tinyshakespeare.txt")
# the line `tapelm uptrain` ends with
DONE = re.compile(r"val loss ([0-9.]+) \(converted, before uptraining: ([0-9.]+)\)")


def run(cmd):
    """The command's stdout; its stderr and the end of the study when it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + p.stderr.strip())
    return p.stdout


def sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def commit(given=""):
    """The commit a report names: the given one, else HEAD's short hash."""
    return given or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True).stdout.strip() or "unknown"


def machine():
    """`tapelm inspect --system`'s cpu, simd and threads lines, joined."""
    return "; ".join(line for line in run([TAPELM, "inspect", "--system"]).splitlines()
                     if line.startswith(("cpu ", "simd ", "threads ")))


def add_report_args(ap, report):
    """The flags every study takes: --seeds, --out (bench/<report> by default), --report-only, --commit."""
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", report))
    ap.add_argument("--report-only", action="store_true",
                    help="write the report from the .jsonl's rows of --commit (a comma list: runs of several commits)")
    ap.add_argument("--commit", default="")


def saved_rows(args, commit):
    """With --report-only: the rows of the given commits in the .jsonl beside --out."""
    with open(os.path.splitext(args.out)[0] + ".jsonl") as f:
        return [r for r in map(json.loads, f) if r["commit"] in commit.split(",")]


def pretrain(config, work):
    """Trains the MHA model of `config` (a dict) in work/mha; its checkpoint and whole-val-split loss."""
    cfg = os.path.join(work, "mha.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    mha = os.path.join(work, "mha")
    run([TAPELM, "train", "--config", cfg, "--data", CORPUS, "--out", mha, "--quiet"])
    checkpoint = os.path.join(mha, "checkpoint.h5")
    loss = json.loads(run([TAPELM, "eval", "--checkpoint", checkpoint, "--data", CORPUS, "--split", "val",
                           "--json"]).strip().splitlines()[-1])["loss"]
    return checkpoint, loss


def uptrain(checkpoint, kv, seed, out, *flags):
    """`tapelm uptrain` by aligned-fit at α 0.05: (val loss after, val loss of the converted model)."""
    m = DONE.search(run([TAPELM, "uptrain", "--from", checkpoint, "--kv-heads", str(kv), "--method", "aligned-fit",
                         "--fraction", "0.05", "--seed", str(seed), "--data", CORPUS, "--out", out, "--quiet", *flags]))
    return float(m.group(1)), float(m.group(2))
