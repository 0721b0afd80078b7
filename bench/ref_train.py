"""
Trains the PyTorch reference model (../shared/reference/gpt.py) with nanoGPT's train.py loop on a
text corpus, then evaluates the whole val split in non-overlapping windows of block_size, the way
`tapelm eval` does, so the two programs' quality can be compared on equal terms.

    /usr/bin/python3 bench/ref_train.py REFERENCE_DIR corpora/tinyshakespeare.txt [--iters 2000] [--seed 1337]

Prints one JSON line: {"val_loss": ..., "val_loss_20": ..., "val_loss_20_sd": ..., "seconds": ..., ...}.
val_loss is the whole val split; val_loss_20 is nanoGPT's own estimate (the mean over 20 batches of
12 random val windows, drawn from the run's continuing RNG stream, as its estimate_loss does at the
last step), and val_loss_20_sd the standard deviation of that estimate over 50 further draws.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("reference")
ap.add_argument("text")
ap.add_argument("--iters", type=int, default=2000)
ap.add_argument("--seed", type=int, default=1337)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--no-decay-embeddings", action="store_true",
                help="leave the token and position embeddings out of weight decay, as nanoGPT's code did "
                     "before February 2023 (an experiment; tapelm follows today's nanoGPT and the spec)")
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.reference))
from gpt import GPT, GPTConfig, train_step  # noqa: E402

torch.manual_seed(a.seed)
torch.set_num_threads(a.threads)
text = open(a.text, encoding="utf-8").read()
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(len(data) * 0.9)
train, val = data[:n], data[n:]
B, T = 12, 64
cfg = GPTConfig(vocab_size=len(chars), block_size=T, n_layer=4, n_head=4, n_kv_head=4, n_embd=128)
model = GPT(cfg)
opt = model.configure_optimizer(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
if a.no_decay_embeddings:
    emb = {id(p) for n, p in model.named_parameters() if n.endswith(("wte.weight", "wpe.weight"))}
    decay = [p for p in opt.param_groups[0]["params"] if id(p) not in emb]
    keep = [p for p in opt.param_groups[0]["params"] if id(p) in emb]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": opt.param_groups[1]["params"] + keep, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8)


def lr_at(it, lr=1e-3, min_lr=1e-4, warmup=100, decay=2000):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    r = (it - warmup) / (decay - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)


t0 = time.time()
for it in range(a.iters):
    for g in opt.param_groups:
        g["lr"] = lr_at(it, decay=a.iters)
    ix = torch.randint(len(train) - T, (B,))
    x = torch.stack([train[i:i + T] for i in ix])
    y = torch.stack([train[i + 1:i + 1 + T] for i in ix])
    loss = train_step(model, opt, x, y, 1.0)
    if it % 500 == 0:
        print(f"step {it} loss {loss:.4f}", file=sys.stderr)
secs = time.time() - t0
model.eval()
starts = list(range(0, len(val) - T, T))
tot, cnt = 0.0, 0
with torch.no_grad():
    for i in range(0, len(starts), 64):
        s = starts[i:i + 64]
        x = torch.stack([val[j:j + T] for j in s])
        y = torch.stack([val[j + 1:j + 1 + T] for j in s])
        _, l = model(x, y)
        tot += l.item() * len(s)
        cnt += len(s)


def estimate20():
    ls = []
    with torch.no_grad():
        for _ in range(20):
            ix = torch.randint(len(val) - T, (B,))
            x = torch.stack([val[i:i + T] for i in ix])
            y = torch.stack([val[i + 1:i + 1 + T] for i in ix])
            ls.append(model(x, y)[1].item())
    return sum(ls) / len(ls)


first = estimate20()
more = [estimate20() for _ in range(50)]
mean = sum(more) / len(more)
sd = math.sqrt(sum((v - mean) ** 2 for v in more) / (len(more) - 1))
print(json.dumps({"val_loss": tot / cnt, "val_loss_20": round(first, 4), "val_loss_20_sd": round(sd, 4),
                  "seconds": round(secs, 1), "iters": a.iters, "seed": a.seed,
                  "no_decay_embeddings": a.no_decay_embeddings}))
