"""Writes a byte-level vocab.json and an empty merges.txt into a model directory, for the
synthetic models of bench/convert_streamed.sh and bench/eval_memory.sh: GPT-2's bytes-to-characters
table (ids 0-255), then, with --ids N, pairs of those characters as unreachable ids up to N (a GGUF
file carries the model's whole vocabulary).

    python3 bench/byte_vocab.py DIR [--ids 32000]
"""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--ids", type=int, default=256)
args = ap.parse_args()
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + len(cs) - 188)
m = dict(zip(bs, cs))
v = {chr(m[b]): b for b in range(256)}
pairs = (chr(m[a]) + chr(m[b]) for a in range(256) for b in range(256))
while len(v) < args.ids:
    v.setdefault(next(pairs), len(v))
json.dump(v, open(args.dir + "/vocab.json", "w"))
open(args.dir + "/merges.txt", "w").write("#version: 0.2\n")
