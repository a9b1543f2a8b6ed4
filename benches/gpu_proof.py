#!/usr/bin/env python3
"""GPU proof: flotilla's training step, parallel strategies, LoRA, generation, out-of-memory
message, speed, memory and collectives on one GPU, each against PyTorch on the same device, in
one script whose subcommands append their figures to one Markdown file.

Subcommands (each under ~9 minutes on an H200):

- correctness: 2 optimizer steps (2 micro-batches each) of a small Llama preset (`small`;
  `tiny` with --tiny) in flotilla (`flotilla train`, model.init_from a transformers-made
  initial model, `data=tokens data.shuffle=false`) and in PyTorch (transformers'
  LlamaForCausalLM, SDPA, the same batches, clipping and AdamW) on --device, for every
  `trainer.precision` (32-true, bf16-mixed, bf16-true, 16-mixed): loss and grad norm of each
  step and the weights' update (final/ minus the initial weights) compared with a tolerance per
  precision. Mixed precision on the PyTorch side follows flotilla's definition: a compute copy
  of the fp32 masters in bf16/fp16, its gradients accumulated in fp32 (16-mixed: dynamic loss
  scaling from 65536); bf16-true: bf16 weights and AdamW state, fp32 gradients. A reduced
  precision passes when its difference is within the stated tolerance or at most twice
  PyTorch's own difference between that precision and 32-true. Then, in flotilla at 32-true,
  `trainer/dist=ddp` and `trainer/dist=fsdp` with every sharding strategy at world size 1 with
  `trainer.dist.process_group=always` (a process group of one: every collective runs through
  NCCL on the GPU) against `trainer/dist=none`; one LoRA step (`peft=lora` from a PEFT-made adapter with a
  non-zero B) against PEFT; the host's waits for the GPU per training step (at most one, its
  figures read together: `FLOTILLA_CUDA_SYNC_DEBUG=warn`, runs of 2 and 6 steps at bf16-mixed and
  16-mixed); a sparse layer's experts as grouped products against one product per expert
  (`flotilla bench experts`, a Qwen3-30B-A3B layer in bf16); `flotilla generate` greedy ids on --device against the CPU and
  against transformers' `generate` on --device (a tiny model trained briefly on the built-in
  arithmetic data); and a job far too large for the GPU (llama-1b, micro batch 64 x 2048,
  bf16-mixed, `compute.check_memory=false`) run to its out-of-memory failure, with `plan --memory`'s
  estimate for it: its message is recorded (a missing step or `plan --memory` hint is a
  finding, not a failure).
- speed: llama-1b (`tiny` with --tiny), bf16-mixed, T=2048 (64), the largest micro batch of
  16, 8, 4, 2, 1 (8, 4) that flotilla fits: tokens/s and MFU of flotilla, PyTorch eager
  (autocast bf16, fp32 masters, AdamW, clipping) and `torch.compile` of the same model on the
  same batch shape, each in its own process, timed after warm-up (CUDA events); peak memory
  (nvidia-smi sampled for all three, `torch.cuda.max_memory_allocated` and reserved for PyTorch)
  against `flotilla plan --memory`'s estimate. MFU uses 6N + 12·L·d·T FLOPs per token (N: the
  matmul parameters, the LM head included) over the H200 datasheet's 989 TFLOP/s dense bf16.
- comm: `flotilla bench comm --nprocs 1 --backend nccl` for every collective (`--backend cpu`
  with --device cpu).

With `--device cpu --tiny` every subcommand runs on a CPU with tiny sizes; the parts that need
CUDA (16-mixed, the host-sync count, the out-of-memory job, NCCL, GPU memory) are skipped with the reason recorded.
A failed comparison prints FAIL with its numbers; the script exits 1 after writing everything.

Running it on a GPU machine with torch 2.11.0 but no Rust toolchain. On the build machine, from
the repository root (the stripped binaries and the commit go in the git-ignored `.gpu/`):

    cargo build --release && mkdir -p .gpu && strip -o .gpu/flotilla target/release/flotilla && strip -o .gpu/flotilla-train target/release/flotilla-train && git describe --always --dirty --abbrev=40 > .gpu/commit

On the GPU machine, from the repository root with `.gpu/` carried along:

    SP=$(python3 -c 'import torch,os;print(os.path.dirname(os.path.dirname(torch.__file__)))'); export LD_LIBRARY_PATH=$SP/torch/lib:$(ls -d $SP/nvidia/*/lib $SP/nvidia/cu13/lib 2>/dev/null | tr '\\n' ':')
    python3 benches/gpu_proof.py correctness --flotilla-dir .gpu; python3 benches/gpu_proof.py speed --flotilla-dir .gpu; python3 benches/gpu_proof.py comm --flotilla-dir .gpu

(one subcommand per command where a command is limited to 10 minutes). Without LD_LIBRARY_PATH
the script sets the same path itself for the binaries it starts.

Writes: sections appended to --out (default benches/results/gpu-<YYYY-MM-DD>.md), each with
the device, versions (torch, CUDA, driver, flotilla's commit), every command run with the tail
of its output, and the tables; scratch files in a temporary directory, removed at the end.

Usage: python3 benches/gpu_proof.py {correctness,speed,comm} [--device cuda|cpu] [--tiny]
       [--flotilla-dir DIR] [--out FILE] [--keep]
"""
import argparse
import copy
import datetime
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import transformers  # noqa: E402

from bench_train import (  # noqa: E402
    BETAS, CLIP, EPS, LR, ROOT, WD, flotilla_train_cmd, load_preset,
)

PRECISIONS = ["32-true", "bf16-mixed", "bf16-true", "16-mixed"]
SHARDING = ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]
COMPUTE = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16,
           "16-mixed": torch.float16}
# Relative tolerances (loss, grad norm, weight update) of flotilla against PyTorch per precision.
TOL = {"32-true": (1e-4, 1e-3, 1e-2), "bf16-mixed": (2e-2, 5e-2, 0.25),
       "bf16-true": (2e-2, 5e-2, 0.25), "16-mixed": (5e-3, 2e-2, 0.25)}
TOL_DIST = (1e-5, 1e-4, 1e-3)  # DDP/FSDP at world size 1 against no parallelism, 32-true
transformers.utils.logging.disable_progress_bar()
PEAK_BF16 = 989e12  # H200 SXM datasheet, dense bf16 (a measured large GEMM does about 790e12)


class Proof:
    """The section being written: commands with their output, tables, findings, failures."""

    def __init__(self, args, title):
        self.args, self.lines, self.failed, self.t0 = args, [], [], time.time()
        self.cmds = []
        self.tmp = tempfile.mkdtemp(prefix="gpu-proof-")
        self.env = binary_env()
        self.lines += [f"## {title} ({args.device}{', tiny' if args.tiny else ''}) — "
                       f"{datetime.datetime.now().isoformat(timespec='seconds')}", ""]
        self.lines += environment(args) + [""]

    def say(self, *text):
        for t in text:
            print(t, flush=True)
            self.lines.append(t)

    def local(self, text):
        """TEXT with the scratch directory, the repository and this Python shown as
        placeholders."""
        return (text.replace(self.tmp, "$TMP").replace(sys.executable, "python3")
                .replace(ROOT + os.sep, ""))

    def run(self, cmd, timeout=600, env=None, tail=25):
        """Runs CMD (a list) from the repository root; records it and its output's tail."""
        shown = self.local(" ".join(c if re.fullmatch(r"[\w@%+=:,./\[\]-]+", c) else repr(c)
                                    for c in cmd))
        print(f"$ {shown}", flush=True)
        t = time.time()
        try:
            out = subprocess.run(cmd, cwd=ROOT, env=env or self.env, capture_output=True,
                                 text=True, timeout=timeout)
            rc, text = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            text = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
                errors="replace")
        lines = text.rstrip().splitlines()
        body = self.local("\n".join(lines[-tail:]) if tail else "")
        self.cmds += ["```", f"$ {shown}", f"# exit {rc}, {time.time() - t:.1f} s"] + (
            [body] if body else []) + ["```", ""]
        return rc, text

    def check(self, what, ok, detail):
        status = "PASS" if ok else "FAIL"
        if not ok:
            self.failed.append(what)
        self.say(f"| {what} | {status} | {detail} |")

    def finish(self):
        self.say("", f"**{len(self.failed)} failed**" + (": " + ", ".join(self.failed)
                                                          if self.failed else "") +
                 f"; {time.time() - self.t0:.0f} s.", "")
        self.lines += ["<details><summary>Commands run, with the tail of their output "
                       "($TMP: a scratch directory)</summary>", ""]
        self.lines += self.cmds + ["</details>", ""]
        out = self.args.out
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "a") as f:
            f.write("\n".join(self.lines) + "\n")
        print(f"appended to {out}")
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return 1 if self.failed else 0


def binary_env():
    """The environment of the flotilla binaries: this Python's torch/lib and nvidia/*/lib first
    on LD_LIBRARY_PATH (what the GPU recipe exports), FLOTILLA_LOG=info."""
    sp = os.path.dirname(os.path.dirname(torch.__file__))
    libs = [os.path.join(sp, "torch", "lib")] + sorted(glob.glob(os.path.join(sp, "nvidia", "*",
                                                                              "lib")))
    have = os.environ.get("LD_LIBRARY_PATH", "")
    extra = [p for p in libs if os.path.isdir(p) and p not in have.split(":")]
    return dict(os.environ, LD_LIBRARY_PATH=":".join(extra + ([have] if have else [])),
                FLOTILLA_LOG="info")


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                              cwd=ROOT).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def environment(args):
    import transformers
    if args.device.startswith("cuda") and torch.cuda.is_available():
        dev = torch.cuda.get_device_name(torch.device(args.device))
        driver = sh(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    else:
        cpu = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
               if line.startswith("model name")]
        dev = f"CPU: {cpu[0] if cpu else '?'} x {os.cpu_count()}"
        driver = "-"
    commit_file = os.path.join(args.flotilla_dir, "commit")
    commit = (open(commit_file).read().strip() if os.path.exists(commit_file)
              else sh(["git", "describe", "--always", "--dirty", "--abbrev=40"]) or "unknown")
    try:
        import peft
        peft_v = peft.__version__
    except ImportError:
        peft_v = "not installed"
    version = sh([os.path.join(args.flotilla_dir, "flotilla"), "--version"])
    return [f"- device: {dev}", f"- torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"driver {driver}, transformers {transformers.__version__}, peft {peft_v}, "
            f"Python {sys.version.split()[0]}",
            f"- {version or 'flotilla ?'}, commit {commit}, binaries in "
            f"`{os.path.relpath(args.flotilla_dir, ROOT)}`",
            f"- command: `{' '.join(['python3', 'benches/gpu_proof.py'] + sys.argv[1:])}`"]


# ---------------------------------------------------------------- correctness: the two sides

def flotilla_cmd(p, run_dir, preset, tokens, seq, steps, gbs, mbs, device, precision, extra=()):
    """`flotilla train` with bench_train's optimiser settings, on DEVICE at PRECISION."""
    cmd = flotilla_train_cmd(os.path.join(p.args.flotilla_dir, "flotilla"), run_dir, mode="none",
                             world=1, preset=preset, tokens_path=tokens, seq=seq, steps=steps,
                             global_batch=gbs, micro=mbs)
    subs = {"trainer.precision": precision, "trainer.device": device}
    cmd = [f"{c.split('=')[0]}={subs[c.split('=')[0]]}" if c.split("=")[0] in subs else c
           for c in cmd]
    extra = list(extra)
    keys = {e.split("=")[0] for e in extra}
    return [c for c in cmd if c.split("=")[0] not in keys] + extra


def read_metrics(run_dir):
    import csv
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        return [(float(r["loss"]), float(r["grad_norm"])) for r in csv.DictReader(f)]


def read_weights(path):
    from safetensors.torch import load_file
    return {k: v.double() for k, v in load_file(path).items()}


def torch_steps(init_dir, stream, seq, gbs, mbs, steps, precision, device, adapter=None):
    """PyTorch's steps on DEVICE: ([(loss, grad_norm)], {name: weight}) (adapter weights with
    ADAPTER)."""
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(init_dir, dtype=torch.float32,
                                             attn_implementation="sdpa").to(device)
    if adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    if precision == "bf16-true":
        model = model.to(torch.bfloat16)
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    # bf16-mixed: compute copies in bf16, as flotilla's (FSDP's MixedPrecision); 16-mixed:
    # autocast over the fp32 weights, whose fp32 residual stream flotilla keeps too.
    mixed = precision == "bf16-mixed"
    autocast = precision == "16-mixed"
    comp = copy.deepcopy(model).to(COMPUTE[precision]) if mixed else model
    cparams = [q for q in comp.parameters() if q.requires_grad]
    opt = torch.optim.AdamW([{"params": [q for q in params if q.dim() >= 2], "weight_decay": WD},
                             {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    scale = 65536.0 if precision == "16-mixed" else 1.0
    rows = []
    for s in range(steps):
        if mixed:
            with torch.no_grad():
                for c, m in zip(cparams, params):
                    c.copy_(m)
        acc = [torch.zeros_like(q, dtype=torch.float32) for q in params]
        total = 0.0
        for first in range(s * gbs, s * gbs + gbs, mbs):
            ks = range(first, first + mbs)
            x = torch.stack([stream[k * seq: k * seq + seq] for k in ks]).to(device)
            y = torch.stack([stream[k * seq + 1: k * seq + seq + 1] for k in ks]).to(device)
            with torch.autocast(torch.device(device).type, dtype=torch.float16,
                                enabled=autocast):
                logits = comp(input_ids=x).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     y.reshape(-1), reduction="sum") / (gbs * seq)
            (loss * scale).backward()
            total += loss.item()
            for a, c in zip(acc, cparams):
                a += c.grad.float()
                c.grad = None
        for a in acc:
            a /= scale
        norm = float(torch.sqrt(sum((a.double() ** 2).sum() for a in acc)))
        if math.isfinite(norm):
            coef = min(1.0, CLIP / (norm + 1e-6))
            for q, a in zip(params, acc):
                q.grad = (a * coef).to(q.dtype)
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:  # a skipped 16-mixed step: the scale halves
            scale /= 2
        rows.append((total, norm))
    if adapter:
        from peft import get_peft_model_state_dict
        weights = get_peft_model_state_dict(model)
    else:
        weights = model.state_dict()
    return rows, {k: v.detach().double().cpu() for k, v in weights.items()}


def update_rel(w0, wa, wb):
    """||(wa - w0) - (wb - w0)|| / ||wb - w0|| over the tensors of W0 (one missing: inf)."""
    num = den = 0.0
    for k in w0:
        if k not in wa or k not in wb:
            return float("inf")
        num += float(((wa[k] - wb[k]) ** 2).sum())
        den += float(((wb[k] - w0[k]) ** 2).sum())
    return math.sqrt(num / den) if den > 0 else float("inf")


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def diffs(rows_a, rows_b, w0, wa, wb):
    """(max rel loss diff, max rel grad-norm diff, update rel diff)."""
    if len(rows_a) != len(rows_b):
        return (float("inf"),) * 3
    return (max(rel(a[0], b[0]) for a, b in zip(rows_a, rows_b)),
            max(rel(a[1], b[1]) for a, b in zip(rows_a, rows_b)), update_rel(w0, wa, wb))


def fmt(d):
    return "loss {:.2e}, grad norm {:.2e}, update {:.2e}".format(*d)


def correctness(p):
    a = p.args
    cuda = a.device.startswith("cuda")
    preset, seq, gbs, mbs, steps = ("tiny", 16, 4, 2, 2) if a.tiny else ("small", 256, 8, 4, 2)
    from transformers import LlamaForCausalLM
    config = load_preset(preset)
    torch.manual_seed(0)
    init = os.path.join(p.tmp, "init")
    LlamaForCausalLM(config).save_pretrained(init)
    w0 = read_weights(os.path.join(init, "model.safetensors"))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, min(config.vocab_size, 65536), steps * gbs * seq + 1)
    tokens = os.path.join(p.tmp, "tokens.bin")
    ids.astype("<u2").tofile(tokens)
    stream = torch.from_numpy(ids.astype(np.int64))
    dev = "cuda" if cuda else "cpu"
    base = [f"model.init_from={init}"]

    def flotilla(name, precision, extra=()):
        run_dir = os.path.join(p.tmp, name)
        rc, out = p.run(flotilla_cmd(p, run_dir, preset, tokens, seq, steps, gbs, mbs, dev,
                                     precision, base + list(extra)))
        if rc != 0:
            return None, None, out
        return read_metrics(run_dir), os.path.join(run_dir, "final"), out

    p.say(f"{preset} ({sum(v.numel() for v in w0.values()) / 1e6:.2f}M parameters), T={seq}, "
          f"{steps} steps of global batch {gbs} in micro-batches of {mbs}, lr {LR}, AdamW "
          f"betas {BETAS} eps {EPS} weight decay {WD} (dim >= 2), clip {CLIP}, on {a.device}. "
          "Relative differences: the largest over steps of loss and grad norm; the weights' "
          "update as ||Δflotilla − Δpytorch|| / ||Δpytorch|| over all tensors.", "")
    p.say("| check | result | figures |", "|---|---|---|")
    findings = []
    ref32 = None
    results = {}
    for precision in PRECISIONS:
        if precision == "16-mixed" and not cuda:
            findings.append("16-mixed skipped: fp16 training is checked on CUDA only")
            continue
        rows, final, out = flotilla(f"prec-{precision}", precision)
        pt_rows, pt_w = torch_steps(init, stream, seq, gbs, mbs, steps, precision, dev)
        if precision == "32-true":
            ref32 = (pt_rows, pt_w)
        if rows is None:
            p.check(f"step at {precision}", False, "flotilla train failed: " +
                    out.strip().splitlines()[-1][:300] if out.strip() else "no output")
            continue
        fl_w = read_weights(os.path.join(final, "model.safetensors"))
        results[precision] = (rows, fl_w)
        d = diffs(rows, pt_rows, w0, fl_w, pt_w)
        tol = TOL[precision]
        own = diffs(pt_rows, ref32[0], w0, pt_w, ref32[1]) if precision != "32-true" else None
        ok = all(x <= t or (own is not None and x <= 2 * o) for x, t, o in
                 zip(d, tol, own or (0, 0, 0)))
        detail = (f"flotilla losses {[round(r[0], 5) for r in rows]}, pytorch "
                  f"{[round(r[0], 5) for r in pt_rows]}; grad norms "
                  f"{[round(r[1], 5) for r in rows]} vs {[round(r[1], 5) for r in pt_rows]}; "
                  f"diff {fmt(d)} (tol {tol[0]:g}, {tol[1]:g}, {tol[2]:g}")
        detail += f", or 2x pytorch's own {precision} vs 32-true: {fmt(own)})" if own else ")"
        p.check(f"step at {precision}", ok, detail)

    # DDP and FSDP at world size 1 against no parallelism (flotilla both sides, 32-true).
    if "32-true" in results:
        rows0, w_none = results["32-true"]
        # `process_group=always`: a group of one rank, so that every collective of DDP and
        # FSDP (and the host-scalar reductions) runs through NCCL on --device (the CPU backend
        # with --device cpu).
        always = ["trainer.dist.process_group=always"]
        for name, extra in [("ddp", ["trainer/dist=ddp"] + always)] + [
                (f"fsdp {s}", ["trainer/dist=fsdp", f"trainer.dist.sharding_strategy={s}"] + always)
                for s in SHARDING]:
            rows, final, out = flotilla(name.replace(" ", "-"), "32-true", extra)
            if rows is None:
                p.check(f"{name} vs none", False, "flotilla train failed: " +
                        out.strip().splitlines()[-1][:300])
                continue
            mode = re.search(r"training \S+ on \S+ \(([^)]*)\)", out)
            d = diffs(rows, rows0, w0, read_weights(os.path.join(final, "model.safetensors")),
                      w_none)
            p.check(f"{name} vs none (world size 1, 32-true)",
                    all(x <= t for x, t in zip(d, TOL_DIST)),
                    f"{fmt(d)} (tol {TOL_DIST}); flotilla says: "
                    f"{mode.group(1) if mode else '?'}")

    lora_step(p, preset, init, tokens, stream, seq, gbs, mbs, steps, dev, flotilla)
    host_syncs_check(p, cuda, findings, preset, tokens, seq, gbs, mbs, base)
    packed_attention_check(p, cuda, findings)
    experts_check(p)
    generate_check(p, cuda, findings)
    oom_check(p, cuda, findings)
    p.say("", "Findings:", "") if findings else None
    for f in findings:
        p.say(f"- {f}")


def lora_step(p, preset, init, tokens, stream, seq, gbs, mbs, steps, dev, flotilla):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        p.say("| LoRA step | SKIPPED | peft is not installed |")
        return
    from transformers import LlamaForCausalLM
    # The config's LoRA group is `peft` (conf/peft/lora.yaml), not `model.lora`.
    adapter = os.path.join(p.tmp, "adapter")
    torch.manual_seed(1)
    model = get_peft_model(LlamaForCausalLM.from_pretrained(init, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=False, task_type="CAUSAL_LM"))
    model.save_pretrained(adapter)
    a0 = read_weights(os.path.join(adapter, "adapter_model.safetensors"))
    rows, final, out = flotilla("lora", "32-true", ["peft=lora", f"peft.init_from={adapter}",
                                                    "peft.r=8", "peft.alpha=16"])
    pt_rows, pt_w = torch_steps(init, stream, seq, gbs, mbs, steps, "32-true", dev, adapter)
    if rows is None:
        p.check("LoRA step vs PEFT", False, "flotilla train failed: " +
                out.strip().splitlines()[-1][:300])
        return
    fl_w = read_weights(os.path.join(final, "adapter_model.safetensors"))
    d = diffs(rows, pt_rows, a0, fl_w, pt_w)
    same_keys = set(fl_w) == set(pt_w)
    p.check("LoRA step vs PEFT (r 8, q_proj v_proj, B non-zero, 32-true)",
            same_keys and all(x <= t for x, t in zip(d, TOL["32-true"])),
            f"{fmt(d)}; losses {[round(r[0], 5) for r in rows]} vs "
            f"{[round(r[0], 5) for r in pt_rows]}; adapter keys "
            f"{'equal' if same_keys else 'differ: ' + str(sorted(set(fl_w) ^ set(pt_w))[:4])}")


SYNC_WARNING = "called a synchronizing CUDA operation"


def host_syncs_check(p, cuda, findings, preset, tokens, seq, gbs, mbs, base):
    """A training step makes the host wait for the GPU once (its figures, read together after
    the update is queued): with FLOTILLA_CUDA_SYNC_DEBUG=warn libtorch warns at every such
    wait, and two runs that differ by 4 steps (bf16-mixed, and 16-mixed, whose found-inf flag
    is read with the rest) must differ by at most 4 warnings. Start-up and the end (final/)
    are the same in both and cancel."""
    if not cuda:
        findings.append("host syncs per step: libtorch's CUDA sync debug mode, checked on a GPU")
        return
    env = dict(p.env, FLOTILLA_CUDA_SYNC_DEBUG="warn")

    def warnings(name, precision, steps):
        run_dir = os.path.join(p.tmp, name)
        rc, out = p.run(flotilla_cmd(p, run_dir, preset, tokens, seq, steps, gbs, mbs, "cuda",
                                     precision, base + [f"trainer.max_steps={steps}"]),
                        env=env, tail=4)
        # The rank's stdout and stderr as the launcher keeps them (rank 0's is also echoed to
        # the console: counted once, from its file when there is one).
        logs = [open(f, errors="replace").read()
                for f in glob.glob(os.path.join(run_dir, "**", "rank_*.log"), recursive=True)]
        return rc, sum(text.count(SYNC_WARNING) for text in (logs or [out]))

    for precision in ("bf16-mixed", "16-mixed"):
        (rc1, short), (rc2, long) = (warnings(f"syncs-{precision}-{n}", precision, n)
                                     for n in (2, 6))
        what = f"host waits per training step ({precision})"
        if rc1 != 0 or rc2 != 0:
            p.check(what, False, f"flotilla train failed (exit {rc1}, {rc2})")
            continue
        per_step = (long - short) / 4
        p.check(what, per_step <= 1.0,
                f"{short} sync warnings in 2 steps, {long} in 6: {per_step:.2f} per step "
                "(at most 1: the step's figures)")


def bench_json(p, what, args):
    """`flotilla bench ARGS`' JSON object, or None with check WHAT failed on its error."""
    rc, out = p.run([os.path.join(p.args.flotilla_dir, "flotilla"), "bench"] + args, tail=3)
    line = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not line:
        p.check(what, False, f"flotilla bench {args[0]} failed: " +
                (out.strip().splitlines() or ["no output"])[-1][:300])
        return None
    return json.loads(line[-1])


def packed_attention_check(p, cuda, findings):
    """Packed rows on a GPU in half precision take flash attention by the sequences' bounds
    (a CUDA-only kernel): `flotilla bench attention` compares it with the masked path on the
    same bf16 inputs (outputs and input gradients), with and without a sliding window."""
    if not cuda:
        findings.append("packed attention by sequence bounds: a CUDA kernel, checked on a GPU")
        return
    for window in ([], ["--window", "1024"]):
        what = "packed attention by bounds = masked" + (" (window 1024)" if window else "")
        c = bench_json(p, what, ["attention", "--device", p.args.device, "--repeat", "3"] + window)
        if c is None:
            continue
        p.check(what, c["output"] < 2e-2 and c["gradients"] < 3e-2,
                f"bf16, 2 x 4096 tokens in {c['sequences']} sequences (longest "
                f"{c['max_len']}), 32 heads over 8: output {c['output']:.2e}, gradients "
                f"{c['gradients']:.2e} (tol 2e-2, 3e-2); forward+backward "
                f"{c['time_flash'] * 1e3:.2f} ms by bounds, {c['time_masked'] * 1e3:.2f} ms "
                "masked")


SHAPE_30B_A3B = "4096 tokens, 128 experts of 768 over 2048, 8 a token"


def experts_check(p):
    """A sparse layer's experts as grouped products (`torch._grouped_mm`: CUTLASS's grouped GEMM
    in bf16 on a Hopper GPU) against one product per expert on the same routed rows:
    `flotilla bench experts` at a Qwen3-30B-A3B layer's shape (a small one with --tiny)."""
    a = p.args
    shape = (["--tokens", "256", "--hidden", "64", "--inter", "32", "--experts", "16",
              "--top-k", "4"] if a.tiny else [])
    what = "experts: grouped products = one product per expert"
    c = bench_json(p, what, ["experts", "--device", a.device, "--dtype", "bfloat16",
                             "--repeat", "3"] + shape)
    if c is None:
        return
    p.check(what, c["output"] < 2e-2 and c["gradients"] < 3e-2,
            f"bf16, {'256 tokens, 16 experts' if a.tiny else SHAPE_30B_A3B}"
            f" ({c['unchosen_experts']} unchosen): output {c['output']:.2e}, gradients "
            f"{c['gradients']:.2e} (tol 2e-2, 3e-2); forward+backward "
            f"{c['time_grouped'] * 1e3:.2f} ms grouped, {c['time_per_expert'] * 1e3:.2f} ms "
            "per expert")


def generate_check(p, cuda, findings):
    a = p.args
    dev = "cuda" if cuda else "cpu"
    steps = 8 if a.tiny else 300
    run_dir = os.path.join(p.tmp, "arith")
    batch = ["trainer.global_batch_size=8", "trainer.micro_batch_size=8"] if a.tiny else []
    rc, out = p.run([os.path.join(a.flotilla_dir, "flotilla"), "train", "--run-dir", run_dir,
                     "trainer/dist=none", "compute.tasks_per_node=1", f"trainer.max_steps={steps}",
                     "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.resume=never",
                     f"trainer.device={dev}"] + batch)
    if rc != 0:
        p.check("generate: greedy ids", False, "training the arithmetic model failed")
        return
    final = os.path.join(run_dir, "final")
    prompts = ["786+893=", "12+34=", "500+499="]

    def gen(device, prompt):
        rc, out = p.run([os.path.join(a.flotilla_dir, "flotilla"), "generate", final,
                         "--prompt", prompt, "--max-new-tokens", "12", "--device", device,
                         "--dtype", "float32", "--format", "json"], tail=3)
        line = [ln for ln in out.splitlines() if ln.startswith("{")]
        return json.loads(line[-1]) if rc == 0 and line else None

    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(final, dtype=torch.float32).to(dev).eval()
    hf.generation_config.eos_token_id = None
    for prompt in prompts:
        g_dev, g_cpu = gen(a.device, prompt), gen("cpu", prompt)
        if g_dev is None or g_cpu is None:
            p.check(f"generate {prompt!r}", False, "flotilla generate failed")
            continue
        n = len(g_dev["output_ids"])
        with torch.no_grad():
            ids = torch.tensor([g_dev["prompt_ids"]], device=dev)
            hf_ids = hf.generate(ids, do_sample=False, max_new_tokens=n,
                                 pad_token_id=0)[0, ids.shape[1]:].tolist()
        ok = g_dev["output_ids"] == g_cpu["output_ids"] == hf_ids
        p.check(f"generate {prompt!r} greedy on {a.device} = CPU = transformers", ok,
                f"{a.device} {g_dev['output_ids']} ({g_dev['text']!r}), cpu "
                f"{g_cpu['output_ids']}, transformers on {dev} {hf_ids}")
    if not cuda:
        findings.append("generate: --device cpu compares the CPU with itself; the device check "
                        "needs a GPU")


def oom_check(p, cuda, findings):
    a = p.args
    over = ["model=llama-1b", "data.seq_len=2048", "trainer.micro_batch_size=64",
            "trainer.global_batch_size=64", "trainer.precision=bf16-mixed", "compute.gpu_type=h200"]
    tokens = os.path.join(p.tmp, "oom.bin")
    np.zeros(64 * 2048 * 2 + 1, dtype="<u2").tofile(tokens)
    common = ["trainer/dist=none", "compute.tasks_per_node=1", "data=tokens",
              f"data.path={tokens}", "data.token_dtype=uint16", "trainer.device=cuda"]
    rc, out = p.run([os.path.join(a.flotilla_dir, "flotilla"), "plan", "--memory"] + common +
                    over, tail=30)
    peak = re.search(r"peak per GPU: (.*)", out)
    p.say(f"| plan --memory of the too-large job | {'PASS' if peak else 'FAIL'} | "
          f"{peak.group(1) if peak else 'no estimate printed'} |")
    if not peak:
        p.failed.append("plan --memory of the too-large job")
    if not cuda:
        findings.append("out-of-memory job skipped: it needs a CUDA device")
        return
    run_dir = os.path.join(p.tmp, "oom")
    rc, out = p.run([os.path.join(a.flotilla_dir, "flotilla"), "train", "--run-dir", run_dir] +
                    common + over + ["trainer.max_steps=2", "trainer.eval_every=0",
                                     "trainer.checkpoint_every=0", "trainer.resume=never",
                                     "compute.check_memory=false"], timeout=400, tail=12)
    err = [ln for ln in out.splitlines() if "memory" in ln.lower()]
    msg = err[-1].strip() if err else out.strip().splitlines()[-1] if out.strip() else ""
    p.check("too-large job exits non-zero", rc not in (0, "timeout"), f"exit {rc}")
    step = re.search(r"\bstep \d+", msg)
    hint = "plan --memory" in out
    p.say(f"| out-of-memory message | {'as documented' if step and hint else 'FINDING'} | "
          f"`{msg[:400]}` |")
    if not (step and hint):
        findings.append("the out-of-memory message " + ("does not name the step"
                        if not step else "") + (" and " if not step and not hint else "") +
                        ("does not point at `plan --memory`" if not hint else ""))


# ---------------------------------------------------------------- speed

def flops_per_token(config, seq):
    """6N + 12·L·d·T (PaLM, appendix B): N the matmul parameters, the LM head included."""
    h, v, i, L = (config.hidden_size, config.vocab_size, config.intermediate_size,
                  config.num_hidden_layers)
    hd = h // config.num_attention_heads
    kv = config.num_key_value_heads * hd
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i
    n = L * per_layer + v * h
    return 6 * n + 12 * L * h * seq, n


class GpuSampler:
    """The GPU's used memory (nvidia-smi, every 100 ms) while a side runs: peak minus idle."""

    def __init__(self, device):
        self.idx = device.split(":")[1] if ":" in device else "0"
        self.base = self._once()
        self.peak, self.proc = self.base, None

    def _once(self):
        out = sh(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                  "-i", self.idx])
        return int(out) if out.isdigit() else None

    def __enter__(self):
        if self.base is not None:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                 "-i", self.idx, "-lms", "100"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            if line.strip().isdigit():
                self.peak = max(self.peak, int(line))

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def mib(self):
        return None if self.base is None else self.peak - self.base


def torch_speed_side(a):
    """One PyTorch side in this process; prints its figures as JSON."""
    from transformers import LlamaForCausalLM
    config = load_preset(a.preset)
    dev = torch.device(a.device)
    torch.manual_seed(0)
    with dev:
        model = LlamaForCausalLM(config).float().train()
    fwd = torch.compile(model) if a.compile else model
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [q for q in params if q.dim() >= 2], "weight_decay": WD},
                             {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    gen = torch.Generator(device=dev).manual_seed(0)
    vocab = min(config.vocab_size, 65536)
    cuda = dev.type == "cuda"
    times, losses, first = [], [], None
    try:
        for s in range(a.warmup + a.steps):
            xy = torch.randint(0, vocab, (a.micro, a.seq + 1), device=dev, generator=gen)
            t0 = time.perf_counter()
            if cuda:
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                ev[0].record()
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = fwd(input_ids=xy[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     xy[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if cuda:
                ev[1].record()
                torch.cuda.synchronize()
                dt = ev[0].elapsed_time(ev[1]) / 1e3
            else:
                dt = time.perf_counter() - t0
            if s == 0:
                first = dt
            if s >= a.warmup:
                times.append(dt)
    except torch.OutOfMemoryError as e:
        print(json.dumps({"oom": True, "error": str(e).splitlines()[0]}))
        return
    res = {"tokens_per_s": a.micro * a.seq / statistics.median(times), "first_step_s": first,
           "loss_first": losses[0], "loss_last": losses[-1]}
    if cuda:
        res["max_allocated_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        res["max_reserved_mib"] = torch.cuda.max_memory_reserved(dev) / 2**20
    else:
        res["max_rss_mib"] = [int(ln.split()[1]) / 1024 for ln in open("/proc/self/status")
                              if ln.startswith("VmHWM:")][0]
    print(json.dumps(res))


def speed(p):
    a = p.args
    cuda = a.device.startswith("cuda")
    if a.tiny:
        preset, seq, micros, steps, warmup = "tiny", 64, [8, 4], 5, 2
    else:
        preset, seq, micros, steps, warmup = "llama-1b", 2048, [16, 8, 4, 2, 1], 10, 3
    config = load_preset(preset)
    fpt, n = flops_per_token(config, seq)
    p.say(f"{preset}: {n / 1e9:.3f}B matmul parameters, {fpt / 1e9:.2f} GFLOP per token "
          f"(6N + 12·L·d·T, T={seq}); bf16-mixed; median of {steps} steps after {warmup} "
          f"warm-up steps; MFU against {PEAK_BF16 / 1e12:.0f} TFLOP/s (H200 datasheet, dense "
          "bf16)" + ("" if cuda else "; on a CPU the MFU column means nothing") + ".", "")
    rows, chosen = [], None
    for m in micros:
        if time.time() - p.t0 > a.budget_s:
            p.say(f"- out of time before micro batch {m}")
            break
        tokens = os.path.join(p.tmp, f"tok{m}.bin")
        ids = np.random.default_rng(0).integers(0, min(config.vocab_size, 65536),
                                                (warmup + steps) * m * seq + 1)
        ids.astype("<u2").tofile(tokens)
        plan_args = ["trainer/dist=none", "compute.tasks_per_node=1", f"model={preset}",
                     "data=tokens", f"data.path={tokens}", "data.token_dtype=uint16",
                     f"data.seq_len={seq}", f"trainer.micro_batch_size={m}",
                     f"trainer.global_batch_size={m}", "trainer.precision=bf16-mixed",
                     "trainer.device=cuda", "compute.gpu_type=h200"]
        rc, out = p.run([os.path.join(a.flotilla_dir, "flotilla"), "plan", "--memory",
                         "--format", "json"] + plan_args, tail=0)
        try:
            mem = json.loads(out[out.index("{"):])["jobs"][0]["memory"]
            est = f"{mem['peak_bytes'] / 2**30:.2f} GiB at {mem['peak_phase']}"
        except (ValueError, KeyError, IndexError):
            est = "?"
        run_dir = os.path.join(p.tmp, f"speed{m}")
        cmd = flotilla_cmd(p, run_dir, preset, tokens, seq, warmup + steps, m, m,
                           "cuda" if cuda else "cpu", "bf16-mixed",
                           ["compute.check_memory=false"])
        with GpuSampler(a.device) if cuda else _Null() as smp:
            rc, out = p.run(cmd, timeout=300)
        if rc != 0:
            oom = "out of memory" in out
            p.say(f"- flotilla, micro batch {m}: exit {rc}" + (" (out of memory)" if oom else ""))
            if not oom:
                p.failed.append(f"flotilla speed run at micro batch {m}")
                break
            continue
        import csv
        with open(os.path.join(run_dir, "metrics.csv")) as f:
            rates = [float(r["tokens_per_s"]) for r in csv.DictReader(f)][warmup:]
        rss = re.search(r"peak host RSS by phase:.*", out)
        fl_mem = (f"{smp.mib()} MiB (nvidia-smi)" if cuda else
                  (rss.group(0)[:120] if rss else "-"))
        rows.append(("flotilla", m, statistics.median(rates), fl_mem, est))
        chosen = m
        break
    if chosen is None:
        p.check("speed: flotilla ran at some micro batch", False, f"none of {micros}")
        return
    for name, comp in [("pytorch eager", False), ("torch.compile", True)]:
        # The same micro batch as flotilla's; a smaller one only where PyTorch runs out.
        for m in micros[micros.index(chosen):]:
            if time.time() - p.t0 > a.budget_s:
                p.say(f"- {name}: skipped at micro batch {m}, out of time")
                break
            cmd = [sys.executable, os.path.abspath(__file__), "_torch_speed", "--device",
                   a.device, "--preset", preset, "--seq", str(seq), "--micro", str(m),
                   "--steps", str(steps), "--warmup", str(warmup)] + (
                       ["--compile"] if comp else [])
            with GpuSampler(a.device) if cuda else _Null() as smp:
                rc, out = p.run(cmd, timeout=420, tail=8)
            res = [ln for ln in out.splitlines() if ln.startswith("{")]
            r = json.loads(res[-1]) if res else {}
            if rc != 0 or not res or r.get("oom"):
                last = res[-1] if res else (out.strip().splitlines() or [""])[-1]
                p.say(f"- {name}: failed at micro batch {m} (exit {rc}): {last[:300]}")
                if r.get("oom"):
                    continue
                break
            mem = (f"{smp.mib()} MiB (nvidia-smi); max allocated {r['max_allocated_mib']:.0f} "
                   f"MiB, reserved {r['max_reserved_mib']:.0f} MiB" if cuda else
                   f"process peak RSS {r['max_rss_mib']:.0f} MiB")
            if comp:
                mem += f"; first step (compilation) {r['first_step_s']:.1f} s"
            rows.append((name, m, r["tokens_per_s"], mem, ""))
            break
    p.say("", "| side | micro batch | tokens/s | MFU | peak memory | plan --memory estimate |",
          "|---|---|---|---|---|---|")
    for name, m, tps, mem, est in rows:
        p.say(f"| {name} | {m} x {seq} | {tps:,.0f} | {100 * tps * fpt / PEAK_BF16:.1f}% | "
              f"{mem} | {est} |")
    if len(rows) > 1:
        p.say("", "flotilla / " + ", flotilla / ".join(
            f"{r[0]}: {rows[0][2] / r[2]:.2f}x" for r in rows[1:]))


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# ---------------------------------------------------------------- comm

def comm(p):
    a = p.args
    cuda = a.device.startswith("cuda")
    backend = "nccl" if cuda else "cpu"
    if not cuda:
        p.say("- NCCL skipped: it needs CUDA devices; the CPU backend runs instead.")
    sizes = "4K,64K,1M" if a.tiny else "4K,64K,1M,16M,64M,256M,1G"
    p.say("", "| op | bytes | time | algbw GB/s | busbw GB/s |", "|---|---|---|---|---|")
    table = []
    for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]:
        rc, out = p.run([os.path.join(a.flotilla_dir, "flotilla"), "bench", "comm", "--nprocs",
                         "1", "--backend", backend, "--op", op, "--sizes", sizes, "--format",
                         "json"], timeout=240, tail=6)
        try:
            res = json.loads(out[out.index("{"):out.rindex("}") + 1])["results"]
        except (ValueError, KeyError):
            res = None
        if rc != 0 or not res:
            table.append(f"| {op} | FAIL: exit {rc} | | | |")
            p.failed.append(f"bench comm {op}")
            continue
        for r in res:
            table.append(f"| {r['op']} | {r['bytes']} | {r['time_s'] * 1e6:.1f} µs | "
                         f"{r['algbw_gbps']:.2f} | {r['busbw_gbps']:.2f} |")
    p.say(*table)
    p.say("", "At world size 1 the bus bandwidth of all_reduce, all_gather and reduce_scatter "
          "is 0 by nccl-tests' definition (a factor (n−1)/n); the time and algorithm bandwidth "
          "are one rank's own copy.")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_torch_speed":
        q = argparse.ArgumentParser()
        for k in ["device", "preset"]:
            q.add_argument(f"--{k}")
        for k in ["seq", "micro", "steps", "warmup"]:
            q.add_argument(f"--{k}", type=int)
        q.add_argument("--compile", action="store_true")
        return torch_speed_side(q.parse_args(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["correctness", "speed", "comm"])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (for a CPU)")
    ap.add_argument("--flotilla-dir", default=os.path.join(ROOT, "target", "release"),
                    help="the directory holding flotilla and flotilla-train")
    ap.add_argument("--out", default=os.path.join(
        ROOT, "benches", "results", f"gpu-{datetime.date.today().isoformat()}.md"))
    ap.add_argument("--budget-s", type=float, default=510,
                    help="speed: skip what would start after this many seconds")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args()
    a.flotilla_dir = os.path.abspath(a.flotilla_dir)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("CUDA is not available to this torch; use --device cpu --tiny")
    torch.manual_seed(0)
    p = Proof(a, {"correctness": "GPU proof: correctness", "speed": "GPU proof: speed",
                  "comm": "GPU proof: collectives"}[a.command])
    {"correctness": correctness, "speed": speed, "comm": comm}[a.command](p)
    sys.exit(p.finish())


if __name__ == "__main__":
    main()
