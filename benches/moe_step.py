#!/usr/bin/env python3
"""Benchmark: a mixture of experts' training step on CPU, flotilla against transformers, and
the sparse MLP's cost against a dense model of the same active parameters.

Builds two random models with transformers (no download) and saves them:

* `moe`: Qwen3MoeForCausalLM, hidden 256, 4 layers, 8 heads (2 KV), vocabulary 4096, 8 experts
  of width 256 a layer, 2 a token (renormalised);
* `dense`: Qwen3ForCausalLM of the same shape whose MLP has width 512 = 2 x 256: each token
  meets the same MLP parameters as in `moe` (the active parameters), without routing.

For each, the median time of forward + backward (fp32, CPU) over ITERS steps of BATCH
sequences of SEQ tokens: transformers (its own loss, `.backward()`) and flotilla
(`cargo run --release -p flotilla-train --example model_step -- DIR SEQ BATCH ITERS`, whose
`units` row is the trainer's unit-by-unit engine). Prints tokens/s and the ratios.

Usage: .venv/bin/python benches/moe_step.py [SEQ] [BATCH] [ITERS]   (256 4 5)
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
             tie_word_embeddings=False)


def models():
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **SHAPE, intermediate_size=512, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=256, norm_topk_prob=True))
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if name.endswith("gate.weight"):  # Qwen3-MoE's routers start at zero
                p.normal_(0.0, 0.02)
    dense = Qwen3ForCausalLM(Qwen3Config(**SHAPE, intermediate_size=512))
    return {"moe": moe, "dense": dense}


def transformers_ms(models, seq, batch, iters):
    """Median step time of each model, the models' steps interleaved so that a burst of other
    work on the machine falls on both."""
    tokens = torch.randint(0, SHAPE["vocab_size"], (batch, seq))

    def step(model):
        model.zero_grad(set_to_none=True)
        model(input_ids=tokens, labels=tokens).loss.backward()

    times = {name: [] for name in models}
    for name, model in models.items():
        step(model.float().train())
    for _ in range(iters):
        for name, model in models.items():
            t = time.perf_counter()
            step(model)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def flotilla_ms(directory, seq, batch, iters):
    out = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "-p", "flotilla-train", "--example",
         "model_step", "--", directory, str(seq), str(batch), str(iters)],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    found = dict(re.findall(r"^(whole|units): median ([0-9.]+) ms", out, re.M))
    return float(found["whole"]), float(found["units"])


def main():
    seq, batch, iters = (int(a) for a in (sys.argv[1:] + ["256", "4", "5"][len(sys.argv) - 1:])[:3])
    tokens = seq * batch
    print(f"T={seq}, M={batch}, fp32 CPU, {torch.get_num_threads()} threads, "
          f"median of {iters} steps (forward + backward)\n")
    rows = {}
    built = models()
    theirs = transformers_ms(built, seq, batch, iters)
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in built.items():
            directory = os.path.join(tmp, name)
            model.save_pretrained(directory)
            n = sum(p.numel() for p in model.parameters())
            whole, units = flotilla_ms(directory, seq, batch, iters)
            rows[name] = (n, theirs[name], whole, units)
    print("| model | parameters | transformers | flotilla (one graph) | flotilla (units) "
          "| flotilla units / transformers |")
    print("|---|---|---|---|---|---|")
    for name, (n, theirs, whole, units) in rows.items():
        print(f"| {name} | {n / 1e6:.1f}M | {theirs:.1f} ms ({tokens / theirs * 1e3:.0f} tok/s) "
              f"| {whole:.1f} ms | {units:.1f} ms ({tokens / units * 1e3:.0f} tok/s) "
              f"| {units / theirs:.2f}x |")
    print()
    for i, who in ((1, "transformers"), (3, "flotilla (units)")):
        print(f"{who}: the sparse step costs {rows['moe'][i] / rows['dense'][i]:.2f}x "
              f"the dense step of the same active parameters")


if __name__ == "__main__":
    main()
