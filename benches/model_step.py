#!/usr/bin/env python3
"""Benchmark: forward + backward of a model preset in PyTorch eager (transformers'
LlamaForCausalLM, sdpa attention, fp32, CPU), the reference for
`cargo run --release --example model_step -- PRESET SEQ BATCH ITERS`.

Usage: .venv/bin/python benches/model_step.py [PRESET] [SEQ] [BATCH] [ITERS]  (small 256 4 5)
"""
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import LlamaForCausalLM  # noqa: E402

from bench_train import load_preset  # noqa: E402


def main():
    preset, seq, batch, iters = (sys.argv[1:] + ["small", "256", "4", "5"][len(sys.argv) - 1:])[:4]
    seq, batch, iters = int(seq), int(batch), int(iters)
    config = load_preset(preset)
    model = LlamaForCausalLM(config).float().train()
    tokens = torch.randint(0, config.vocab_size, (batch, seq))
    n = sum(p.numel() for p in model.parameters())
    print(f"{preset}: {n / 1e6:.1f}M parameters, T={seq}, M={batch}, fp32 CPU, "
          f"{torch.get_num_threads()} threads")

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()

    step()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    print(f"pytorch eager: median {statistics.median(times) * 1e3:.1f} ms over {iters} steps")


if __name__ == "__main__":
    main()
