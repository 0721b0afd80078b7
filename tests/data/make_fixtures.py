"""
Writes extra parity fixtures with the PyTorch reference's own exporter, for configurations the six
public fixtures do not cover (odd head counts and sizes, a single head, every norm/pos/mlp/bias/tie
combination, longer blocks, ignored targets).

    /usr/bin/python3 tests/data/make_fixtures.py REFERENCE_DIR tests/data/fixtures

REFERENCE_DIR holds gpt.py and export.py (the project's shared reference); needs python3-torch
and python3-h5py.
"""
import os
import sys

sys.path.insert(0, os.path.abspath(sys.argv[1]))
from export import export  # noqa: E402
from gpt import GPTConfig  # noqa: E402

EXTRA = [
    # name, config, batch, seed, ignore_last
    ("extra_h6kv3_odd", dict(n_layer=3, n_head=6, n_kv_head=3, n_embd=36, block_size=9, mlp_hidden=50), 3, 21, False),
    ("extra_rope_layernorm_bias_mqa", dict(n_layer=2, n_head=4, n_kv_head=1, n_embd=32, block_size=16, pos="rope",
                                           bias=True, tie_embeddings=False), 2, 22, True),
    ("extra_swiglu_rms_learned_tied", dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, block_size=16, mlp="swiglu",
                                           norm="rmsnorm", mlp_hidden=40), 2, 23, False),
    ("extra_single_head", dict(n_layer=1, n_head=1, n_kv_head=1, n_embd=16, block_size=5), 4, 24, True),
    ("extra_h8kv2_long", dict(n_layer=1, n_head=8, n_kv_head=2, n_embd=64, block_size=48, pos="rope",
                              norm="rmsnorm", mlp="swiglu", mlp_hidden=96, bias=True), 3, 25, True),
]


def main():
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for name, extra, batch, seed, ign in EXTRA:
        cfg = GPTConfig(**{"vocab_size": 65, **extra})
        loss = export(os.path.join(out, name + ".h5"), cfg, batch, seed, (), ign)
        print(f"{name}.h5  loss {loss:.6f}")


if __name__ == "__main__":
    main()
