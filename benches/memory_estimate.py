#!/usr/bin/env python3
"""Benchmark: flotilla's per-GPU memory estimate beside the two estimators people use today.

For each shipped model preset (tiny, small, llama-1b, llama-8b) on one node of 8 H100s,
bf16-mixed, micro batch 1 of min(4096, max_position_embeddings) tokens, global batch 8:

- flotilla (`flotilla plan --memory --format json`), under DDP and under FSDP FULL_SHARD with
  sharded checkpoints: the classic model states (parameters + gradients + AdamW moments, each
  at its largest) and the whole peak per GPU (with compute copies, DDP buckets or FSDP
  buffers, activations, logits, loss, workspaces, CUDA context and allocator margin) and when
  the peak happens;
- `accelerate estimate-memory`'s numbers (accelerate's own `gather_data` on an empty model
  of the same `LlamaConfig`, so no Hub download): "Training using Adam" for bfloat16 and
  float32, which is the largest of its model / gradients / optimizer / step figures, not their
  sum, and counts no activations; without accelerate installed, its documented formula
  (float32: 4 x fp32 size; bf16: 2 x fp32 size);
- DeepSpeed's `estimate_zero2_model_states_mem_needs` and `estimate_zero3_model_states_mem_needs`
  formulas (written out below, no offload, 8 GPUs on 1 node): model states only.

Usage: .venv/bin/python benches/memory_estimate.py [--binary target/release/flotilla]
(the default is the newer of target/release/flotilla and target/debug/flotilla)
"""
import argparse
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ["tiny", "small", "llama-1b", "llama-8b"]
GPUS = 8
GIB = 2**30


def preset(name):
    with open(os.path.join(ROOT, "conf", "model", f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def params_and_largest_layer(m):
    """Total parameters (tied weights once) and DeepSpeed's largest layer (the largest module's
    own parameters: the embedding or the LM head)."""
    h, inter, vocab = m["hidden_size"], m["intermediate_size"], m["vocab_size"]
    kv = m["num_key_value_heads"] * (h // m["num_attention_heads"])
    layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h
    embed = vocab * h
    total = m["num_hidden_layers"] * layer + embed + (0 if m["tie_word_embeddings"] else embed) + h
    return total, max(embed, h * inter)


def deepspeed_zero2(total_params, gpus_per_node=GPUS, num_nodes=1):
    """deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs, no offload:
    (cpu_mem, gpu_mem)."""
    total_gpus = num_nodes * gpus_per_node
    gpu_mem = 4 * total_params + int(16 * total_params / total_gpus)
    cpu_mem = total_params * 4 * gpus_per_node * 1.5
    return int(cpu_mem), int(gpu_mem)


def deepspeed_zero3(total_params, largest_layer_params, gpus_per_node=GPUS, num_nodes=1):
    """deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs, no offload,
    zero_init: (cpu_mem, gpu_mem)."""
    total_gpus = num_nodes * gpus_per_node
    largest_layer_memory = 4 * largest_layer_params
    gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
    cpu_mem = largest_layer_params * 4 * gpus_per_node * 1.5
    return int(cpu_mem), int(gpu_mem)


def accelerate_training(m):
    """accelerate estimate-memory's "Training using Adam" for (bfloat16, float32), in bytes, and
    where it came from: the steps of its `gather_data` (an empty model, `calculate_maximum_sizes`,
    `estimate_training_usage`, the largest stage) on a local `LlamaConfig` instead of a Hub
    repository."""
    try:
        import accelerate
        from accelerate import init_empty_weights
        from accelerate.commands.estimate import estimate_training_usage
        from accelerate.utils import calculate_maximum_sizes
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        total, _ = params_and_largest_layer(m)
        fp32 = 4 * total
        return 2 * fp32, 4 * fp32, "its formula (accelerate not installed)"
    fields = {k: v for k, v in m.items() if k not in ("name", "init_from")}
    with init_empty_weights():
        model = LlamaForCausalLM(LlamaConfig(**fields))
    total_size, _ = calculate_maximum_sizes(model)
    usage = {d: max(estimate_training_usage(total_size, d).values()) for d in ("bfloat16", "float32")}
    return usage["bfloat16"], usage["float32"], f"accelerate {accelerate.__version__}"


def flotilla(binary, name, m, dist):
    seq = min(4096, m["max_position_embeddings"])
    args = [
        binary, "plan", "--memory", "--format", "json", "--config-dir", os.path.join(ROOT, "conf"),
        f"model={name}", "compute=slurm", "compute.gpu_type=h100", "trainer.device=cuda",
        "data=tokens", "data.path=/data/train.bin", "data.token_dtype=uint32", f"data.seq_len={seq}",
        "trainer.precision=bf16-mixed", "trainer.micro_batch_size=1", "trainer.global_batch_size=8",
    ] + dist
    out = subprocess.run(args, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    mem = json.loads(out)["jobs"][0]["memory"]
    states = {"params", "grads", "optimizer"}
    model_states = sum(t["bytes"] for t in mem["terms"] if t["term"] in states)
    return seq, model_states, mem["peak_bytes"], mem["peak_phase"], mem["fits"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    built = [os.path.join(ROOT, "target", p, "flotilla") for p in ("release", "debug")]
    built = [b for b in built if os.path.exists(b)]
    default = max(built, key=os.path.getmtime) if built else "flotilla"
    parser.add_argument("--binary", default=default, help="the newer of release and debug builds")
    args = parser.parse_args()

    rows = []
    source = None
    for name in PRESETS:
        m = preset(name)
        total, largest = params_and_largest_layer(m)
        acc_bf16, acc_fp32, source = accelerate_training(m)
        _, z2 = deepspeed_zero2(total)
        _, z3 = deepspeed_zero3(total, largest)
        seq, ddp_states, ddp_peak, ddp_phase, ddp_fits = flotilla(args.binary, name, m, ["trainer/dist=ddp"])
        _, fs_states, fs_peak, fs_phase, fs_fits = flotilla(
            args.binary, name, m, ["trainer/dist=fsdp", "trainer.dist.state_dict_type=sharded"]
        )
        rows.append((name, total, seq, acc_bf16, acc_fp32, z2, z3, ddp_states, ddp_peak, ddp_phase,
                     ddp_fits, fs_states, fs_peak, fs_phase, fs_fits))

    g = lambda b: f"{b / GIB:.2f}"
    fit = lambda f: "fits" if f else "OOM"
    print(f"Per GPU, GiB. 1 node x {GPUS} H100 (79.6 GiB), bf16-mixed, micro batch 1, global batch 8.")
    print(f"accelerate: {source}; DeepSpeed: the estimate_zero2/zero3 formulas, no offload.")
    print()
    print("| preset | params | seq | accelerate bf16 (Adam) | accelerate fp32 (Adam) | DeepSpeed ZeRO-2 | "
          "DeepSpeed ZeRO-3 | flotilla DDP params+grads+AdamW | flotilla DDP peak | "
          "flotilla FULL_SHARD params+grads+AdamW | flotilla FULL_SHARD peak |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, total, seq, ab, af, z2, z3, ds, dp, dph, df, fs, fp, fph, ff) in rows:
        print(f"| {name} | {total / 1e6:,.1f}M | {seq} | {g(ab)} | {g(af)} | {g(z2)} | {g(z3)} | "
              f"{g(ds)} | {g(dp)} ({dph}, {fit(df)}) | {g(fs)} | {g(fp)} ({fph}, {fit(ff)}) |")


if __name__ == "__main__":
    sys.exit(main())
