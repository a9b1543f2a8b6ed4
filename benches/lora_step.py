#!/usr/bin/env python3
"""Benchmark: one LoRA training step of a model preset on CPU, flotilla against the same step
in PyTorch + PEFT (eager), side by side in one command; and the step's peak host memory with
LoRA against full fine-tuning, on both sides.

Both sides train the preset (conf/model/PRESET.yaml) in fp32 on the same random token batches
of M x T tokens (one micro-batch per step) with the same AdamW settings and gradient clipping:
flotilla as `flotilla train ... peft=lora peft.r=R peft.alpha=2R` (the default
target_modules, [q_proj, v_proj]); PyTorch as transformers' LlamaForCausalLM wrapped by
peft.get_peft_model(LoraConfig(r=R, lora_alpha=2R, target_modules=[q_proj, v_proj])), AdamW
over the trainable parameters. tokens/s: the median over STEPS steps after WARMUP. Peak host
memory of the step: flotilla's own measure (`peak host RSS by phase`, the training steps
alone); PyTorch's process high-water mark after the steps minus before the first step (a
fresh process per side and mode).

Usage: .venv/bin/python benches/lora_step.py [--preset small] [--seq 256] [--micro 4] [--r 16]
       [--steps 10] [--warmup 3] [--threads N] [--flotilla BIN] [--no-build]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_train import (  # noqa: E402
    ROOT, build_flotilla, flotilla_step_peak_mib, flotilla_train_cmd, load_preset,
    read_flotilla_metrics, side_result, torch_train_steps, vm_hwm_mib,
)


def run_flotilla(args, tokens_path, run_dir, lora):
    steps = args.warmup + args.steps
    cmd = flotilla_train_cmd(args.flotilla, run_dir, mode="none", world=1, preset=args.preset,
                             tokens_path=tokens_path, seq=args.seq, steps=steps,
                             global_batch=args.micro, micro=args.micro)
    if lora:
        cmd += ["peft=lora", f"peft.r={args.r}", f"peft.alpha={2 * args.r}"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               FLOTILLA_LOG="info")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"flotilla train failed ({out.returncode}):\n{out.stderr}")
    rates, losses = read_flotilla_metrics(run_dir, steps, args.warmup)
    return rates, losses, flotilla_step_peak_mib(out.stderr)


def torch_side(args, lora):
    """One side of PyTorch in this (fresh) process: JSON of rates, losses and peak MiB."""
    from transformers import LlamaForCausalLM
    torch.set_num_threads(args.threads)
    config = load_preset(args.preset)
    steps = args.warmup + args.steps
    rng = np.random.default_rng(0)
    stream = torch.from_numpy(
        rng.integers(0, config.vocab_size, steps * args.micro * args.seq + 1).astype(np.int64))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().train()
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.r, lora_alpha=2 * args.r,
                                                 target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    before = vm_hwm_mib()
    rates, losses = torch_train_steps(model, params, stream, args.seq, args.micro, steps,
                                      args.warmup)
    print(json.dumps({"rates": rates, "losses": losses, "peak_mib": vm_hwm_mib() - before}))


def run_torch(args, lora):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-side", "lora" if lora else "full",
           "--preset", args.preset, "--seq", str(args.seq), "--micro", str(args.micro),
           "--r", str(args.r), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads)]
    r = side_result(cmd, "pytorch side")
    return r["rates"], r["losses"], r["peak_mib"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--flotilla", default=os.path.join(ROOT, "target", "release", "flotilla"))
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--torch-side", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_side:
        torch_side(args, args.torch_side == "lora")
        return
    if not args.no_build:
        build_flotilla()
    config = load_preset(args.preset)
    steps = args.warmup + args.steps
    print(f"{args.preset}, T={args.seq}, M={args.micro}, fp32, CPU, {args.threads} threads; "
          f"LoRA r={args.r} alpha={2 * args.r} on q_proj,v_proj; median of {args.steps} steps "
          f"after {args.warmup} warm-up steps", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        ids = rng.integers(0, config.vocab_size, steps * args.micro * args.seq + 1)
        tokens_path = os.path.join(tmp, "tokens.bin")
        ids.astype("<u2").tofile(tokens_path)
        for lora in (True, False):
            mode = "LoRA" if lora else "full"
            rates, losses, peak = run_flotilla(args, tokens_path, os.path.join(tmp, mode), lora)
            rows.append((f"flotilla {mode}", statistics.median(rates), losses, peak))
            rates, losses, peak = run_torch(args, lora)
            rows.append((f"pytorch+peft {mode}" if lora else f"pytorch {mode}",
                         statistics.median(rates), losses, peak))
    print(f"{'':20}{'tokens/s':>10}{'ms/step':>10}{'first loss':>12}{'last loss':>11}"
          f"{'step peak MiB':>15}")
    for name, r, losses, peak in rows:
        ms = args.micro * args.seq / r * 1e3
        print(f"{name:20}{r:10.0f}{ms:10.1f}{losses[0]:12.4f}{losses[-1]:11.4f}{peak:15.0f}")
    print(f"LoRA step: flotilla / pytorch+peft {rows[0][1] / rows[1][1]:.2f}x; "
          f"flotilla step time LoRA / full {rows[2][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
