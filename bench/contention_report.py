"""
Turns bench/contention.sh's JSON lines into bench/CONTENTION.md's table: per program and setting,
the median tokens/s quiet, beside one busy process (hog) and beside a second copy of itself (pair),
and each load's ratio to quiet: the median of the rounds' own ratios (a round's quiet and loaded
runs are neighbours in time), with their range. For the pair, a round's ratio is each copy's
tokens/s over that round's quiet run (one of two cores each: 0.5 is the ideal), and both copies
count. Where the runs recorded how tapelm's threads waited (its `default` reads the load at
start-up), a line per setting and load says which waits its runs had.

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
    print(f"Rounds: {len(rounds)}; each figure a run's median tokens/s; a round's quiet and loaded runs are neighbours.\n")
    print("| program | setting | quiet tok/s | hog: tok/s | hog / quiet [range] | pair: tok/s per copy | pair / quiet, per copy [range] |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for who, setting in keys:
        def by(load):
            out = {}
            for r in rows:
                if (r["who"], r["setting"], r["load"]) == (who, setting, load):
                    out.setdefault(r["round"], []).append(r["tok_s"])
            return out
        q, h = by("quiet"), by("hog")
        p = by("pair")
        for k, v in by("pair2").items():
            p.setdefault(k, []).extend(v)
        hr = [h[k][0] / q[k][0] for k in q if k in h]
        pr = [x / q[k][0] for k in q if k in p for x in p[k]]
        med = lambda d: statistics.median([x for v in d.values() for x in v])
        print(f"| {who} | {setting} | {med(q):,.0f} | {med(h):,.0f} | {statistics.median(hr):.2f} [{min(hr):.2f}–{max(hr):.2f}] | "
              f"{med(p):,.0f} | {statistics.median(pr):.2f} [{min(pr):.2f}–{max(pr):.2f}] |")
    waits = [r for r in rows if "omp_wait" in r and r["setting"] == "default"]
    if waits:
        print()
        for load in ("quiet", "hog", "pair"):
            seen = {}
            for r in waits:
                if r["load"] == load or (load == "pair" and r["load"] == "pair2"):
                    w = r["omp_wait"].split(":")[0].split(" (")[0]
                    seen[w] = seen.get(w, 0) + 1
            print(f"- tapelm default, {load}: " + ", ".join(f"{n} run{'s' if n > 1 else ''} {w}" for w, n in seen.items()))


if __name__ == "__main__":
    main()
