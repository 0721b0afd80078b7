"""
PyTorch's side of bench/decode.sh: the reference model (gpt.py in REFERENCE_DIR, default
../shared/reference) decoding at a serving shape, timed as `tapelm bench --mode decode` times it:
`batch` sequences, a random prompt of `prompt` tokens prefilled in one forward (gpt.py's
decode_step with t = prompt), then greedy steps of one token per sequence until the cache holds
`context` positions. Random weights (timing does not depend on them). Prints one JSON line with the
median prefill time and the median mean time of a decoding step over the timed iterations.

    /usr/bin/python3 bench/decode_ref.py --layers 6 --heads 8 --kv-heads 1 --dim 512 --block 4096 \
        --batch 16 --prompt 512 --context 1024 [--threads 2] [--iters 3] [--warmup 1] [--reference DIR]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reference", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                                                        "reference"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--block", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=1)
    ap.add_argument("--context", type=int, default=None)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.reference))
    from gpt import GPT, GPTConfig  # noqa: E402
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    ctx = a.context or a.block
    cfg = GPTConfig(vocab_size=a.vocab, block_size=a.block, n_layer=a.layers, n_head=a.heads, n_kv_head=a.kv_heads,
                    n_embd=a.dim, norm="rmsnorm", pos="rope", mlp="swiglu", bias=False, dropout=0.0)
    model = GPT(cfg).eval()
    prompt = torch.randint(a.vocab, (a.batch, a.prompt))
    prefill, steps = [], []
    with torch.no_grad():
        for it in range(a.warmup + a.iters):
            cache = model.alloc_kv_cache(a.batch, ctx)
            t0 = time.perf_counter()
            logits = model.decode_step(prompt, cache, 0)
            t1 = time.perf_counter()
            for pos in range(a.prompt, ctx):
                nxt = torch.argmax(logits[:, -1, :] if logits.dim() == 3 else logits, dim=-1, keepdim=True)
                logits = model.decode_step(nxt, cache, pos)
            t2 = time.perf_counter()
            if it >= a.warmup:
                prefill.append(t1 - t0)
                steps.append((t2 - t1) / (ctx - a.prompt))
    step = statistics.median(steps)
    print(json.dumps({"impl": "pytorch", "KV": a.kv_heads, "batch": a.batch, "prompt": a.prompt, "context": ctx,
                      "prefill_ms": 1e3 * statistics.median(prefill), "step_ms": 1e3 * step,
                      "step_ms_min": 1e3 * min(steps), "step_ms_max": 1e3 * max(steps),
                      "us_per_token": 1e6 * step / a.batch, "tokens_per_s": a.batch / step, "threads": a.threads,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
