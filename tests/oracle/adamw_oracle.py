"""Oracle for flotilla's AdamW and gradient clipping (crates/flotilla-train/tests/train_optim.rs).

Reads a safetensors file with parameters `p.{i}` and per-step gradients `g.{k}.{i}`, runs
torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW (weight decay only on tensors with
dim >= 2, as two param groups) for every step with the given learning rates, and writes the
final parameters `p.{i}`, moments `exp_avg.{i}`/`exp_avg_sq.{i}` and the pre-clip norms
`norms` to the output safetensors file. MODE `single` (the default) runs torch's single-tensor
paths (`foreach=False`), `fused` its fused AdamW (`fused=True`) and foreach clipping.

usage: adamw_oracle.py IN OUT LRS(comma) BETA1 BETA2 EPS WD CLIP [MODE]
"""
import sys

import torch
from safetensors.torch import load_file, save_file


def main():
    src, dst, lrs, b1, b2, eps, wd, clip = sys.argv[1:9]
    fused = (sys.argv[9:10] or ["single"])[0] == "fused"
    kind = {"fused": True} if fused else {"foreach": False}
    lrs = [float(x) for x in lrs.split(",")]
    b1, b2, eps, wd, clip = map(float, (b1, b2, eps, wd, clip))
    t = load_file(src)
    n = len([k for k in t if k.startswith("p.")])
    params = [torch.nn.Parameter(t[f"p.{i}"].clone()) for i in range(n)]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lrs[0], betas=(b1, b2), eps=eps, **kind,
    )
    norms = []
    for k, lr in enumerate(lrs):
        for i, p in enumerate(params):
            p.grad = t[f"g.{k}.{i}"].clone()
        if clip > 0:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip, foreach=fused)))
        else:
            norms.append(0.0)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    out = {"norms": torch.tensor(norms, dtype=torch.float64)}
    for i, p in enumerate(params):
        out[f"p.{i}"] = p.detach().clone()
        st = opt.state[p]
        out[f"exp_avg.{i}"] = st["exp_avg"].clone()
        out[f"exp_avg_sq.{i}"] = st["exp_avg_sq"].clone()
    save_file(out, dst)


if __name__ == "__main__":
    main()
