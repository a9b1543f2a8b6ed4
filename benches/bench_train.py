"""Shared by the training benchmarks (train_step.py, train_dist.py): the optimiser settings
both sides use, a model preset as a transformers config, the `flotilla train` command line on
a token file, and reading flotilla's per-step figures back from metrics.csv."""
import csv
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def load_preset(name):
    """conf/model/NAME.yaml as a transformers LlamaConfig."""
    import yaml
    from transformers import LlamaConfig

    with open(os.path.join(ROOT, "conf", "model", f"{name}.yaml")) as f:
        m = yaml.safe_load(f)
    rope = {"rope_type": "default", "rope_theta": m["rope_theta"]}
    if m.get("rope_scaling"):
        rope = {**m["rope_scaling"], "rope_theta": m["rope_theta"]}
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "tie_word_embeddings", "initializer_range"]
    return LlamaConfig(**{k: m[k] for k in keys}, rope_parameters=rope)


def build_flotilla():
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "flotilla"], cwd=ROOT,
                   check=True)


def flotilla_train_cmd(binary, run_dir, *, mode, world, preset, tokens_path, seq, steps,
                       global_batch, micro):
    """`flotilla train` on a uint16 token file in order, with the shared optimiser settings,
    constant LR, no evaluation and no intermediate checkpoints."""
    return [
        binary, "train", "--run-dir", run_dir,
        f"trainer/dist={mode}", f"compute.tasks_per_node={world}", f"model={preset}",
        "data=tokens", f"data.path={tokens_path}", "data.token_dtype=uint16",
        f"data.seq_len={seq}", "data.shuffle=false",
        f"trainer.max_steps={steps}", f"trainer.global_batch_size={global_batch}",
        f"trainer.micro_batch_size={micro}", f"trainer.lr={LR}", "trainer.min_lr=0.0",
        "trainer.warmup_steps=0", "trainer.schedule=constant", f"trainer.weight_decay={WD}",
        f"trainer.betas=[{BETAS[0]},{BETAS[1]}]", f"trainer.eps={EPS}",
        f"trainer.grad_clip={CLIP}", "trainer.precision=32-true", "trainer.device=cpu",
        "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.resume=never",
        "trainer.log_every=1000000", "trainer.activation_checkpointing=false",
    ]


def read_flotilla_metrics(run_dir, steps, warmup):
    """(tokens/s of the steps after `warmup`, loss of every step) from RUN_DIR/metrics.csv."""
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == steps, (len(rows), steps)
    return [float(r["tokens_per_s"]) for r in rows[warmup:]], [float(r["loss"]) for r in rows]


def torch_train_steps(model, params, stream, seq, micro, steps, warmup):
    """PyTorch eager steps on consecutive windows of STREAM (forward, cross-entropy, backward,
    clip_grad_norm_, AdamW over PARAMS with decay on tensors of dim >= 2): (tokens/s of the
    steps after WARMUP, loss of every step)."""
    import time

    import torch

    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )
    t, m = seq, micro
    rates, losses = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        first = s * m
        x = torch.stack([stream[k * t: k * t + t] for k in range(first, first + m)])
        y = torch.stack([stream[k * t + 1: k * t + t + 1] for k in range(first, first + m)])
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if s >= warmup:
            rates.append(m * t / (time.perf_counter() - t0))
    return rates, losses


def vm_hwm_mib():
    """This process's resident high-water mark, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def flotilla_step_peak_mib(stderr):
    """The training steps' peak host RSS flotilla reports (`peak host RSS by phase`), in MiB."""
    m = re.search(r"peak host RSS by phase:.*?\bstep (\d+) MiB", stderr)
    return float(m.group(1)) if m else float("nan")


def side_result(cmd, what):
    """Runs CMD (a benchmark's other side, in a fresh process) and returns the JSON object of
    its last line of output, exiting with WHAT and its stderr if it failed."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{what} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])
