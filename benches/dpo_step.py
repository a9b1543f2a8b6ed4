#!/usr/bin/env python3
"""Benchmark: one DPO step on CPU, flotilla against TRL's DPOTrainer on the same base and pairs,
full fine-tuning and LoRA, with each step's peak host memory.

The base is the `small` preset's shape (conf/model/small.yaml) saved by transformers with a
word-level tokenizer and a chat template; the pairs are conversations whose prompt and each
completion fill exactly SEQ tokens, so neither side pads. Both sides train in fp32 with the
same AdamW settings, constant learning rate and gradient clipping, M pairs per step (2M
sequences), the reference being a frozen copy of the base (full) or the base with the adapters
off (LoRA r=R on q_proj, v_proj). ms/step: the median over STEPS steps after WARMUP (flotilla:
from metrics.csv's tokens/s, 2M x SEQ tokens a step; TRL: between its step-end callbacks).
Peak MiB: flotilla's own high-water mark of the training steps (`peak host RSS by phase`); TRL's
process high-water mark after training minus before it (a fresh process per side and mode).

Usage: .venv/bin/python benches/dpo_step.py [--seq 256] [--micro 4] [--r 16] [--steps 8]
       [--warmup 2] [--threads N] [--flotilla BIN] [--no-build]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from bench_train import (  # noqa: E402
    BETAS, CLIP, EPS, LR, ROOT, build_flotilla, flotilla_step_peak_mib, load_preset, side_result,
    vm_hwm_mib,
)

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
SPECIAL = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>"]


def make(out, args, pairs):
    """The base and PAIRS pairs whose every sequence is exactly SEQ tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    config = load_preset("small")
    config.tie_word_embeddings = False
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(os.path.join(out, "base"))
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for i in range(len(SPECIAL), config.vocab_size):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", additional_special_tokens=SPECIAL[3:])
    fast.chat_template = TEMPLATE
    fast.save_pretrained(os.path.join(out, "base"))
    rng = random.Random(0)
    words = lambda n: " ".join(f"t{rng.randrange(len(SPECIAL), config.vocab_size)}" for _ in range(n))  # noqa: E731
    # <|user|> P </s> <|assistant|> C </s>: P + C + 4 tokens.
    prompt_len = args.seq // 2
    completion = args.seq - prompt_len - 4
    with open(os.path.join(out, "pairs.jsonl"), "w") as f:
        for _ in range(pairs):
            f.write(json.dumps({
                "prompt": [{"role": "user", "content": words(prompt_len)}],
                "chosen": [{"role": "assistant", "content": words(completion)}],
                "rejected": [{"role": "assistant", "content": words(completion)}],
            }) + "\n")


def run_flotilla(args, out, lora):
    steps = args.warmup + args.steps
    run_dir = os.path.join(out, "lora" if lora else "full")
    cmd = [
        args.flotilla, "train", "--run-dir", run_dir,
        f"model.init_from={os.path.join(out, 'base')}", "objective=dpo", "data=preference",
        f"data.path={os.path.join(out, 'pairs.jsonl')}", f"data.seq_len={args.seq}",
        "data.shuffle=false", "trainer/dist=none", "compute.tasks_per_node=1",
        f"trainer.max_steps={steps}", f"trainer.global_batch_size={args.micro}",
        f"trainer.micro_batch_size={args.micro}", f"trainer.lr={LR}", "trainer.warmup_steps=0",
        "trainer.schedule=constant", "trainer.weight_decay=0.0",
        f"trainer.betas=[{BETAS[0]},{BETAS[1]}]", f"trainer.eps={EPS}",
        f"trainer.grad_clip={CLIP}", "trainer.precision=32-true", "trainer.device=cpu",
        "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.resume=never",
        "trainer.log_every=1000000",
    ]
    if lora:
        cmd += ["peft=lora", f"peft.r={args.r}", f"peft.alpha={2 * args.r}", "peft.dropout=0.0"]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               FLOTILLA_LOG="info")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"flotilla train failed ({done.returncode}):\n{done.stderr}")
    import csv
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    tokens = 2 * args.micro * args.seq
    ms = [tokens / float(r["tokens_per_s"]) * 1e3 for r in rows[args.warmup:]]
    return ms, [float(r["loss"]) for r in rows], flotilla_step_peak_mib(done.stderr)


def trl_side(args, out, lora):
    """One TRL run in this (fresh) process: JSON of ms per step, losses and peak MiB."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    torch.set_num_threads(args.threads)
    base = os.path.join(out, "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    data = datasets.load_dataset("json", data_files=os.path.join(out, "pairs.jsonl"),
                                 split="train")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_config = None
    if lora:
        from peft import LoraConfig
        peft_config = LoraConfig(r=args.r, lora_alpha=2 * args.r, lora_dropout=0.0,
                                 target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")

    class Times(TrainerCallback):
        def __init__(self):
            self.ends, self.losses = [], []

        def on_step_end(self, *a, **k):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    times = Times()
    config = DPOConfig(
        output_dir=os.path.join(out, "trl"), report_to=[], use_cpu=True, bf16=False,
        per_device_train_batch_size=args.micro, max_steps=args.warmup + args.steps,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=BETAS[0], adam_beta2=BETAS[1], adam_epsilon=EPS, max_grad_norm=CLIP,
        logging_steps=1, save_strategy="no", max_length=args.seq, dataloader_drop_last=True,
        disable_tqdm=True,
    )
    trainer = DPOTrainer(model=model, args=config, train_dataset=data,
                         processing_class=tokenizer, peft_config=peft_config, callbacks=[times])
    before = vm_hwm_mib()
    start = time.perf_counter()
    trainer.train()
    ends = [start] + times.ends
    ms = [(b - a) * 1e3 for a, b in zip(ends, ends[1:])][args.warmup:]
    print(json.dumps({"ms": ms, "losses": times.losses, "peak_mib": vm_hwm_mib() - before}))


def run_trl(args, out, lora):
    cmd = [sys.executable, os.path.abspath(__file__), "--trl-side", "lora" if lora else "full",
           "--dir", out, "--seq", str(args.seq), "--micro", str(args.micro), "--r", str(args.r),
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(args.threads)]
    r = side_result(cmd, "TRL side")
    return r["ms"], r["losses"], r["peak_mib"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--flotilla", default=os.path.join(ROOT, "target", "release", "flotilla"))
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--trl-side", choices=["full", "lora"], help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.trl_side:
        trl_side(args, args.dir, args.trl_side == "lora")
        return
    if not args.no_build:
        build_flotilla()
    steps = args.warmup + args.steps
    print(f"small preset shape, T={args.seq} per sequence, M={args.micro} pairs (2M sequences) "
          f"a step, fp32, CPU, {args.threads} threads; LoRA r={args.r} alpha={2 * args.r} on "
          f"q_proj,v_proj; median of {args.steps} steps after {args.warmup} warm-up steps",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as out:
        make(out, args, steps * args.micro)
        for lora in (False, True):
            mode = "LoRA" if lora else "full"
            ms, losses, peak = run_flotilla(args, out, lora)
            rows.append((f"flotilla {mode}", statistics.median(ms), losses, peak))
            ms, losses, peak = run_trl(args, out, lora)
            rows.append((f"trl {mode}", statistics.median(ms), losses, peak))
    print(f"{'':16}{'ms/step':>10}{'pairs/s':>10}{'first loss':>12}{'last loss':>11}"
          f"{'step peak MiB':>15}")
    for name, ms, losses, peak in rows:
        print(f"{name:16}{ms:10.1f}{args.micro / ms * 1e3:10.2f}{losses[0]:12.4f}"
              f"{losses[-1]:11.4f}{peak:15.0f}")
    print(f"DPO step: flotilla / trl time, full {rows[0][1] / rows[1][1]:.2f}x, LoRA "
          f"{rows[2][1] / rows[3][1]:.2f}x; flotilla peak LoRA / full "
          f"{rows[2][3] / rows[0][3]:.2f}x, trl {rows[3][3] / rows[1][3]:.2f}x")


if __name__ == "__main__":
    main()
