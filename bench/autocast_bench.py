"""
autocast_bench.py -- the PyTorch reference's training benchmark (../shared/reference/bench.py) with
its forward under torch.autocast("cpu", dtype=torch.bfloat16): PyTorch's bf16 mixed precision, the
peer of `tapelm bench --precision bf16` (bench/compare.sh's -bf16 rows).

Everything else is bench.py's: the same model, batch, AdamW step, warm-up, timing and JSON line
(with "autocast": "bf16" added). Autocast wraps the forward and the loss only, as PyTorch's
documentation prescribes; the backward runs outside it, in the dtypes the forward chose. Master
weights, gradients and optimizer state stay float32, as in tapelm's bf16.

Usage: /usr/bin/python3 bench/autocast_bench.py --reference-dir ../shared/reference [bench.py's options]
"""
import argparse
import contextlib
import io
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--reference-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                            "..", "..", "shared", "reference"))
    a, rest = ap.parse_known_args()
    ref = os.path.abspath(a.reference_dir)
    if not os.path.isfile(os.path.join(ref, "bench.py")):
        sys.exit(f"autocast_bench.py: {ref}/bench.py not found (--reference-dir)")
    if "--mode" in rest and rest[rest.index("--mode") + 1] != "train":
        sys.exit("autocast_bench.py: only --mode train (bf16 decoding is not PyTorch's autocast use)")
    sys.path.insert(0, ref)
    import torch
    import bench  # the reference's benchmark module: its main() looks train_step up at call time

    def autocast_train_step(model, opt, x, y, clip=1.0):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    bench.train_step = autocast_train_step
    sys.argv = [sys.argv[0]] + rest
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main()
    res = json.loads(out.getvalue().strip().splitlines()[-1])
    res["autocast"] = "bf16"
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
