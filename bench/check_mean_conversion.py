#!/usr/bin/python3
"""Checks a `mean` conversion of an HF model directory against the definition, reading the
safetensors files itself (not through tapelm): for the given blocks, each new K/V head is the
mean of its group's r = KV/G consecutive heads' rows, rounded to the output's dtype; every other
tensor is the source's, byte for byte.

  bench/check_mean_conversion.py SRC_DIR OUT_DIR [--blocks 0 15 31]

Needs numpy (Debian's python3-numpy). The mean is formed in float64, rounded to float32 and then to the output's dtype; tapelm
sums in float32, so an element may differ by one unit in the last place of bf16 where the float32
sums differ. The script reports how many elements are equal and fails on any larger
difference, on a tensor missing, or on another tensor that differs.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


class Dir:
    def __init__(self, path):
        self.path = path
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                wm = json.load(f)["weight_map"]
        else:
            wm = None
        self.headers = {}
        self.where = {}
        files = sorted(set(wm.values())) if wm else ["model.safetensors"]
        for name in files:
            p = os.path.join(path, name)
            with open(p, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                h = json.loads(f.read(n))
            h.pop("__metadata__", None)
            for k, v in h.items():
                self.where[k] = (p, 8 + n, v)
        with open(os.path.join(path, "config.json")) as f:
            self.config = json.load(f)

    def raw(self, name):
        p, base, v = self.where[name]
        b, e = v["data_offsets"]
        with open(p, "rb") as f:
            f.seek(base + b)
            return v["dtype"], v["shape"], f.read(e - b)

    def f64(self, name):
        dtype, shape, b = self.raw(name)
        if dtype == "BF16":  # the upper half of a float32
            x = (np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F16":
            x = np.frombuffer(b, dtype=np.float16).astype(np.float32)
        else:
            x = np.frombuffer(b, dtype=np.float32)
        return dtype, x.astype(np.float64).reshape(shape)


def round_to(dtype, x):
    """float64 -> float32 -> the dtype (round to nearest even), as float64."""
    f = x.astype(np.float32)
    if dtype == "F32":
        return f.astype(np.float64)
    if dtype == "F16":
        return f.astype(np.float16).astype(np.float64)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000  # bf16's round to nearest even on the dropped half
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def ulp_bf16(x):
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(x), 1e-30))) - 7)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--blocks", type=int, nargs="+", default=[0, 15, 31])
    a = ap.parse_args()
    src, out = Dir(a.src), Dir(a.out)
    kv_from = src.config.get("num_key_value_heads", src.config["num_attention_heads"])
    kv = out.config["num_key_value_heads"]
    hd = src.config["hidden_size"] // src.config["num_attention_heads"]
    r = kv_from // kv
    print(f"{a.src}: {kv_from} kv heads -> {a.out}: {kv}, groups of {r}, head size {hd}")
    bad = 0
    for l in a.blocks:
        for proj in ("k_proj", "v_proj"):
            name = f"model.layers.{l}.self_attn.{proj}.weight"
            _, w = src.f64(name)
            dtype, got = out.f64(name)
            want = round_to(dtype, w.reshape(kv, r, hd, -1).mean(axis=1).reshape(kv * hd, -1))
            if tuple(got.shape) != tuple(want.shape):
                print(f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
                bad += 1
                continue
            diff = np.abs(got - want)
            equal = int((diff == 0).sum())
            tol = ulp_bf16(want) if dtype == "BF16" else np.zeros_like(want)
            worst = float((diff / ulp_bf16(want)).max())
            ok = bool((diff <= tol).all())
            bad += not ok
            print(f"{name}: {equal}/{diff.size} elements equal, worst {worst:.2f} ulp of bf16 -> {'ok' if ok else 'FAIL'}")
        for name in sorted(k for k in src.where if k.startswith(f"model.layers.{l}.") and "k_proj" not in k and "v_proj" not in k):
            same = src.raw(name)[2] == out.raw(name)[2]
            bad += not same
            print(f"{name}: {'the same bytes' if same else 'DIFFERS'}")
    for name in sorted(k for k in src.where if not k.startswith("model.layers.")):
        same = src.raw(name)[2] == out.raw(name)[2]
        bad += not same
        print(f"{name}: {'the same bytes' if same else 'DIFFERS'}")
    print("all checked tensors match the definition" if bad == 0 else f"{bad} tensors do not match")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
