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
import yaml  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    preset, seq, batch, iters = (sys.argv[1:] + ["small", "256", "4", "5"][len(sys.argv) - 1:])[:4]
    seq, batch, iters = int(seq), int(batch), int(iters)
    with open(os.path.join(ROOT, "conf", "model", f"{preset}.yaml")) as f:
        m = yaml.safe_load(f)
    rope = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    if m.get("rope_scaling"):
        rope = {**m["rope_scaling"], "rope_theta": m["rope_theta"]}
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "tie_word_embeddings", "initializer_range"]
    config = LlamaConfig(**{k: m[k] for k in keys}, rope_parameters=rope)
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
