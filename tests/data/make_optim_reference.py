"""Writes optim_reference.h5: PyTorch's optimizers run on the gqa fixture's parameters and gradients.

Run with Debian's interpreter (python3-torch 1.13.1, python3-h5py) from any directory:
    /usr/bin/python3 tests/data/make_optim_reference.py

Each run starts from fixtures/gqa.h5:/model/* with the gradients /expected/grad/* put back on
every step (the same gradients each time), parameters grouped as gpt.py's configure_optimizer:
weight decay on >= 2-D parameters only.

  /adamw   3 x (clip_grad_norm_(1.0), AdamW(lr=1e-3, betas=(0.9, 0.99), eps=1e-8, wd=0.1) step)
  /sgd     3 x SGD(lr=0.1, momentum=0.9, nesterov=True, wd=0.01) step, no clipping

Layout: /<run>/model/<name>, /<run>/<state key>/<name> (exp_avg, exp_avg_sq | momentum_buffer),
attrs step and the hyper-parameters; /adamw attr grad_norm = the total norms clip_grad_norm_
returned before each step (float32 values, stored as float64).
"""
import os

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "gqa.h5")
OUT = os.path.join(HERE, "optim_reference.h5")
STEPS = 3


def load():
    with h5py.File(FIXTURE, "r") as f:
        names = sorted(f["model"].keys())
        params = {k: torch.nn.Parameter(torch.from_numpy(f["model"][k][()])) for k in names}
        grads = {k: torch.from_numpy(f["expected"]["grad"][k][()]) for k in names}
    for k in names:
        assert params[k].dtype == torch.float32 and grads[k].shape == params[k].shape, k
    return names, params, grads


def groups(names, params, wd):
    decay = [params[k] for k in names if params[k].dim() >= 2]
    no_decay = [params[k] for k in names if params[k].dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def run(opt_name):
    names, params, grads = load()
    norms = []
    if opt_name == "adamw":
        hp = dict(lr=1e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
        opt = torch.optim.AdamW(groups(names, params, hp["weight_decay"]), lr=hp["lr"],
                                betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"], foreach=False)
        keys = ["exp_avg", "exp_avg_sq"]
    else:
        hp = dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True)
        opt = torch.optim.SGD(groups(names, params, hp["weight_decay"]), lr=hp["lr"],
                              momentum=hp["momentum"], dampening=hp["dampening"],
                              nesterov=hp["nesterov"], foreach=False)
        keys = ["momentum_buffer"]
    for _ in range(STEPS):
        for k in names:
            params[k].grad = grads[k].clone()
        if opt_name == "adamw":
            norms.append(float(torch.nn.utils.clip_grad_norm_([params[k] for k in names], 1.0)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    out = {"model": {k: params[k].detach().numpy().copy() for k in names}}
    for key in keys:
        out[key] = {k: opt.state[params[k]][key].numpy().copy() for k in names}
    return hp, out, norms


def main():
    torch.set_num_threads(1)
    with h5py.File(OUT, "w") as f:
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["fixture"] = "fixtures/gqa.h5"
        for opt_name in ("adamw", "sgd"):
            hp, out, norms = run(opt_name)
            g = f.create_group(opt_name)
            g.attrs["step"] = STEPS
            for k, v in hp.items():
                g.attrs[k] = int(v) if isinstance(v, bool) else v
            if norms:
                g.attrs["grad_norm"] = np.array(norms, dtype=np.float64)
            for sub, tensors in out.items():
                for k, v in tensors.items():
                    g.create_dataset(f"{sub}/{k}", data=v.astype(np.float32))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
