"""Oracle for flotilla's single-process fp32 training loop (tests/train_trainer.rs).

Loads the initial weights (a Hugging Face directory written by flotilla's save_hf) with
transformers, replays the exact micro-batches flotilla trained on (`x.{step}.{k}` input ids,
`y.{step}.{k}` already-shifted labels, `tok.{step}` labelled tokens of the global batch), and
trains with the same formulas: loss = sum cross-entropy / global tokens accumulated over
micro-batches, torch.nn.utils.clip_grad_norm_, torch.optim.AdamW with weight decay only on
tensors of dim >= 2, and the warmup + cosine/linear/constant schedule. Prints a JSON list of
[loss, grad_norm, lr] per step.

usage: train_oracle.py MODEL_DIR BATCHES STEPS LR MIN_LR WARMUP SCHEDULE WD BETA1 BETA2 EPS CLIP
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM


def lr_at(step, lr, min_lr, warmup, max_steps, schedule):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min((step - warmup) / max(1, max_steps - 1 - warmup), 1.0)
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))
    return lr + (min_lr - lr) * p


def main():
    a = sys.argv[1:]
    model_dir, batches, steps = a[0], a[1], int(a[2])
    lr, min_lr, warmup = float(a[3]), float(a[4]), int(a[5])
    schedule, wd, b1, b2, eps, clip = a[6], float(a[7]), float(a[8]), float(a[9]), float(a[10]), float(a[11])
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.float32, attn_implementation="eager"
    )
    model.train()
    data = load_file(batches)
    params = list(model.parameters())
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr, betas=(b1, b2), eps=eps, foreach=False,
    )
    rows = []
    for s in range(steps):
        tokens = float(data[f"tok.{s}"].item())
        loss_total = 0.0
        k = 0
        while f"x.{s}.{k}" in data:
            x, y = data[f"x.{s}.{k}"], data[f"y.{s}.{k}"]
            logits = model(input_ids=x).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                ignore_index=-100, reduction="sum",
            ) / tokens
            loss.backward()
            loss_total += loss.item()
            k += 1
        if clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, clip, foreach=False))
        else:
            norm = float(torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in params if p.grad is not None])))
        step_lr = lr_at(s, lr, min_lr, warmup, steps, schedule)
        for g in opt.param_groups:
            g["lr"] = step_lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        rows.append([loss_total, norm, step_lr])
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
