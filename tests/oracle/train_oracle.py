"""Oracle for flotilla's single-process fp32 training loop.

Two modes, one training loop: loss = sum cross-entropy / labelled tokens of the global batch,
accumulated over micro-batches; torch.nn.utils.clip_grad_norm_ (norm reported before
clipping); torch.optim.AdamW with weight decay only on tensors of dim >= 2; the warmup +
cosine/linear/constant schedule of issue 4. Both print a JSON list of [loss, grad_norm, lr]
per step as the last line of stdout.

- replay (crates/flotilla-train/tests/train_trainer.rs): loads the initial weights (an HF
  directory written by flotilla's save_hf) and replays the exact micro-batches flotilla trained
  on (`x.{step}.{k}` input ids, `y.{step}.{k}` shifted labels, `tok.{step}` labelled tokens of
  the global batch).

    train_oracle.py MODEL_DIR BATCHES STEPS LR MIN_LR WARMUP SCHEDULE WD BETA1 BETA2 EPS CLIP

- tokens (tests/train_oracle.rs): independent of flotilla. Creates the initial weights with
  transformers (a seeded random LlamaForCausalLM, `save_pretrained` into OUT/init) and a flat
  little-endian uint16 token file (OUT/tokens.bin), then trains on batches cut from that file by
  the `kind: tokens`, `shuffle: false` contract: sample k is tokens[k*T : k*T+T] with labels
  tokens[k*T+1 : k*T+T+1]; step s uses samples s*G .. s*G+G-1 in micro-batches of M.

    train_oracle.py tokens OUT STEPS T G M LR MIN_LR WARMUP SCHEDULE WD BETA1 BETA2 EPS CLIP
"""
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def lr_at(step, lr, min_lr, warmup, max_steps, schedule):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = min((step - warmup) / max(1, max_steps - 1 - warmup), 1.0)
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))
    return lr + (min_lr - lr) * p


def train(model, steps, step_batches, hp):
    """step_batches(s) -> (labelled tokens of the global batch, [(inputs, labels), ...])."""
    lr, min_lr, warmup, schedule, wd, b1, b2, eps, clip = hp
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr, betas=(b1, b2), eps=eps, foreach=False,
    )
    # A mixture of experts with output_router_logits: its load-balancing loss (transformers'
    # aux_loss of each micro-batch, over all its tokens) times router_aux_loss_coef, averaged
    # over the step's micro-batches, joins the loss; the row then ends with that mean.
    aux_coef = (getattr(model.config, "router_aux_loss_coef", 0.0)
                if getattr(model.config, "output_router_logits", False) else None)
    rows = []
    for s in range(steps):
        tokens, micro = step_batches(s)
        loss_total = 0.0
        aux_total = 0.0
        for x, y in micro:
            out = model(input_ids=x, output_router_logits=aux_coef is not None)
            logits = out.logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                ignore_index=-100, reduction="sum",
            ) / tokens
            differentiated = loss
            if aux_coef is not None:
                differentiated = loss + aux_coef * out.aux_loss / len(micro)
                aux_total += out.aux_loss.item() / len(micro)
            differentiated.backward()
            loss_total += loss.item()
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
        rows.append([loss_total, norm, step_lr] + ([aux_total] if aux_coef is not None else []))
    return rows


def hyper(a):
    """LR MIN_LR WARMUP SCHEDULE WD BETA1 BETA2 EPS CLIP."""
    return (float(a[0]), float(a[1]), int(a[2]), a[3], float(a[4]), float(a[5]), float(a[6]),
            float(a[7]), float(a[8]))


def replay(a):
    model_dir, batches, steps = a[0], a[1], int(a[2])
    # Any family, as its directory's config.json says; eager attention (Gemma 2's soft-capped
    # scores exist only there).
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    data = load_file(batches)

    def step_batches(s):
        micro = []
        while f"x.{s}.{len(micro)}" in data:
            k = len(micro)
            micro.append((data[f"x.{s}.{k}"], data[f"y.{s}.{k}"]))
        return float(data[f"tok.{s}"].item()), micro

    return train(model, steps, step_batches, hyper(a[3:]))


def tokens_mode(a):
    out, steps, seq, gbs, mbs = a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4])
    vocab = 64
    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    init = LlamaForCausalLM(config).float()
    init.save_pretrained(os.path.join(out, "init"))

    # A learnable stream: mostly next = 5*prev + 3 (mod vocab), sometimes a random id. Three
    # spare ids after the last whole window check that the tail is dropped.
    rng = np.random.default_rng(0)
    n = steps * gbs * seq + 1 + 3
    ids = np.empty(n, dtype=np.int64)
    ids[0] = 1
    noise = rng.random(n) < 0.2
    rand = rng.integers(0, vocab, n)
    for i in range(1, n):
        ids[i] = rand[i] if noise[i] else (5 * ids[i - 1] + 3) % vocab
    path = os.path.join(out, "tokens.bin")
    ids.astype("<u2").tofile(path)

    stream = torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))
    model = LlamaForCausalLM.from_pretrained(
        os.path.join(out, "init"), torch_dtype=torch.float32, attn_implementation="eager"
    )

    def sample(k):
        return stream[k * seq: k * seq + seq], stream[k * seq + 1: k * seq + seq + 1]

    def step_batches(s):
        micro = []
        for first in range(s * gbs, s * gbs + gbs, mbs):
            xs, ys = zip(*(sample(k) for k in range(first, first + mbs)))
            micro.append((torch.stack(xs), torch.stack(ys)))
        return float(gbs * seq), micro

    return train(model, steps, step_batches, hyper(a[5:]))


def main():
    a = sys.argv[1:]
    rows = tokens_mode(a[1:]) if a[0] == "tokens" else replay(a)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
