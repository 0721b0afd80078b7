"""
GEMM throughput through tapelm's one BLAS call site (kern::sgemm) against calling OpenBLAS's
cblas_sgemm directly, for the shapes of a `mid` training step (build/bench_gemm, Google Benchmark).
Prints a markdown table of median GFLOP/s over repetitions and the overhead in percent.

    python3 bench/gemm_overhead.py [--reps 5] [--min-time 0.2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--min-time", type=float, default=0.2)
a = ap.parse_args()
exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench_gemm")
out = subprocess.run([exe, "--benchmark_format=json", f"--benchmark_repetitions={a.reps}",
                      f"--benchmark_min_time={a.min_time}"], capture_output=True, text=True, check=True).stdout
runs = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
rates = {}
for b in runs:
    name, shape, threads = b["name"].split("/")[:3]
    rates.setdefault((int(shape), int(threads), b["label"]), {}).setdefault(name, []).append(b["GFLOP/s"] / 1e9)
print("| shape (M×N×K) | threads | OpenBLAS direct GFLOP/s | through kern::sgemm | overhead |")
print("|---|---|---|---|---|")
worst = []
for (shape, threads, label), r in sorted(rates.items()):
    d, t = statistics.median(r["openblas_direct"]), statistics.median(r["tapelm_sgemm"])
    worst.append(100 * (d - t) / d)
    print(f"| {label} | {threads} | {d:.1f} | {t:.1f} | {100 * (d - t) / d:+.1f} % |")
print(f"\nmedian overhead {statistics.median(worst):+.1f} %, largest {max(worst):+.1f} % "
      f"(medians of {a.reps} repetitions; negative: faster through tapelm, i.e. noise)", file=sys.stderr)
