"""
Turns bench/contention.sh's JSON lines into bench/CONTENTION.md's table: per program and setting,
the median tokens/s quiet and beside one busy process over the rounds, and the loaded/quiet
ratio (the median of the rounds' own ratios, each round's two runs being neighbours in time, with
their range).

    python3 bench/contention_report.py bench/CONTENTION.jsonl
"""
import json
import statistics
import sys


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    keys = []
    for r in rows:
        k = (r["who"], r["setting"])
        if k not in keys:
            keys.append(k)
    rounds = sorted({r["round"] for r in rows})
    print(f"Rounds: {len(rounds)}; each figure a run's median tokens/s; quiet and loaded runs of a round are neighbours.\n")
    print("| program | setting | quiet tok/s (median) | loaded tok/s (median) | loaded / quiet, median of rounds [range] |")
    print("|---|---|---:|---:|---:|")
    for who, setting in keys:
        q = {r["round"]: r["tok_s"] for r in rows if (r["who"], r["setting"], r["load"]) == (who, setting, 0)}
        l = {r["round"]: r["tok_s"] for r in rows if (r["who"], r["setting"], r["load"]) == (who, setting, 1)}
        ratios = [l[k] / q[k] for k in q if k in l]
        print(f"| {who} | {setting} | {statistics.median(q.values()):,.0f} | {statistics.median(l.values()):,.0f} | "
              f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] |")


if __name__ == "__main__":
    main()
