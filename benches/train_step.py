#!/usr/bin/env python3
"""Benchmark: tokens/s of one training step (forward + backward + grad clipping + AdamW),
flotilla against PyTorch eager, in one invocation, on the same config: a model preset
(conf/model/PRESET.yaml), sequence length T, micro-batch M (one micro-batch per step), fp32,
CPU, the same thread count.

flotilla runs as `flotilla train` (release build) on a random uint16 token file with
`data=tokens data.shuffle=false`, no evaluation and no intermediate checkpoints; its per-step
`tokens_per_s` column of metrics.csv is read back. PyTorch eager runs transformers'
LlamaForCausalLM (sdpa attention) with the same initialisation scheme, the same batches,
torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW (decay on tensors of dim >= 2). Each side
reports the median tokens/s over STEPS steps after WARMUP warm-up steps (over all rounds
with --repeat, which alternates the two sides).

Usage: .venv/bin/python benches/train_step.py [--preset small] [--seq 256] [--micro 4]
       [--steps 10] [--warmup 3] [--threads N] [--repeat R] [--flotilla BIN] [--no-build]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from bench_train import (  # noqa: E402
    ROOT, build_flotilla, flotilla_train_cmd, load_preset, read_flotilla_metrics,
    torch_train_steps,
)


def run_flotilla(args, tokens_path, run_dir):
    steps = args.warmup + args.steps
    cmd = flotilla_train_cmd(args.flotilla, run_dir, mode="none", world=1, preset=args.preset,
                             tokens_path=tokens_path, seq=args.seq, steps=steps,
                             global_batch=args.micro, micro=args.micro)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               FLOTILLA_LOG="warn")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"flotilla train failed ({out.returncode}):\n{out.stderr}")
    return read_flotilla_metrics(run_dir, steps, args.warmup)


def run_torch(args, config, stream):
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().train()
    return torch_train_steps(model, list(model.parameters()), stream, args.seq, args.micro,
                             args.warmup + args.steps, args.warmup)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeat", type=int, default=1,
                   help="alternating rounds of both sides; medians over all their steps")
    p.add_argument("--flotilla", default=os.path.join(ROOT, "target", "release", "flotilla"),
                   help="the flotilla binary (default: target/release/flotilla, built first)")
    p.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    if not args.no_build:
        build_flotilla()
    config = load_preset(args.preset)
    n_params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        ids = rng.integers(0, config.vocab_size, steps * args.micro * args.seq + 1)
        tokens_path = os.path.join(tmp, "tokens.bin")
        ids.astype("<u2").tofile(tokens_path)
        stream = torch.from_numpy(ids.astype(np.int64))
        print(f"{args.preset}: {n_params / 1e6:.1f}M parameters, T={args.seq}, M={args.micro}, "
              f"fp32, CPU, {args.threads} threads; median of {args.steps} steps after "
              f"{args.warmup} warm-up steps x {args.repeat} rounds (forward + backward + "
              f"clip + AdamW)", flush=True)
        fl_rates, pt_rates = [], []
        for r in range(args.repeat):
            # Alternating rounds spread a varying machine load over both sides.
            rates, fl_losses = run_flotilla(args, tokens_path, os.path.join(tmp, f"run{r}"))
            fl_rates += rates
            rates, pt_losses = run_torch(args, config, stream)
            pt_rates += rates
            if args.repeat > 1:
                print(f"round {r}: flotilla {statistics.median(fl_rates[-args.steps:]):.0f}, "
                      f"pytorch eager {statistics.median(pt_rates[-args.steps:]):.0f} tokens/s",
                      flush=True)
    fl, pt = statistics.median(fl_rates), statistics.median(pt_rates)
    print(f"{'':16}{'tokens/s':>10}{'ms/step':>10}{'first loss':>12}{'last loss':>11}")
    for name, r, losses in [("flotilla", fl, fl_losses), ("pytorch eager", pt, pt_losses)]:
        ms = args.micro * args.seq / r * 1e3
        print(f"{name:16}{r:10.0f}{ms:10.1f}{losses[0]:12.4f}{losses[-1]:11.4f}")
    print(f"ratio flotilla / pytorch eager: {fl / pt:.2f}x")


if __name__ == "__main__":
    main()
