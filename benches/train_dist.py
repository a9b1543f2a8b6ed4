#!/usr/bin/env python3
"""Benchmark: training tokens/s of flotilla's DDP and FSDP against PyTorch's, on CPU, in one
invocation, on the same config: a model preset (conf/model/PRESET.yaml as a transformers
LlamaForCausalLM), sequence length T, micro-batch M, global batch G (sequences per optimizer
step over all ranks), fp32, the same threads per rank (OMP_NUM_THREADS, 1 by default: 2
ranks on 2 cores).

Sides, each training the same random token stream (forward + backward + gradient
all-reduce/reduce-scatter + clipping + AdamW):
  flotilla 1 rank          `flotilla train trainer/dist=none`
  flotilla DDP             `flotilla train trainer/dist=ddp` as N ranks (torchrun variables)
  flotilla FULL_SHARD      `flotilla train trainer/dist=fsdp` (FULL_SHARD, one unit per block)
  pytorch 1 process        this script's worker without a process group
  pytorch DDP (gloo)       `torchrun --nproc_per_node=N` + DistributedDataParallel
  pytorch FSDP2 (gloo)     `torchrun --nproc_per_node=N` + fully_shard on each decoder layer
                           and the root (torch.distributed.fsdp.fully_shard)

flotilla's figures are its `tokens_per_s` column of metrics.csv (global: all ranks' tokens
over the step time); PyTorch's are G×T over rank 0's step time (the step ends with the loss
all-reduce, as flotilla's does). Each side reports the median over STEPS steps after WARMUP
warm-up steps.

Usage: .venv/bin/python benches/train_dist.py [--preset small] [--seq 128] [--micro 2]
       [--global-batch 4] [--nproc 2] [--steps 8] [--warmup 2] [--threads 1]
       [--only flotilla,pytorch] [--timeout S] [--retries R] [--flotilla BIN] [--no-build]
"""
import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench_train import (  # noqa: E402
    BETAS, CLIP, EPS, LR, ROOT, WD, build_flotilla, flotilla_train_cmd, load_preset,
    read_flotilla_metrics,
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# flotilla


def run_flotilla(args, tokens_path, run_dir, mode, world):
    steps = args.warmup + args.steps
    cmd = flotilla_train_cmd(args.flotilla, run_dir, mode=mode, world=world, preset=args.preset,
                             tokens_path=tokens_path, seq=args.seq, steps=steps,
                             global_batch=args.global_batch, micro=args.micro)
    if mode == "fsdp":
        cmd.append("trainer.dist.sharding_strategy=FULL_SHARD")
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                   RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), FLOTILLA_LOG="warn")
        log = open(f"{run_dir}.rank{r}.log", "w")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for r, (p, log) in enumerate(procs):
        try:
            code = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            sys.exit(f"flotilla {mode} on {world} rank(s) did not finish in {args.timeout} s")
        if code != 0:
            failed.append(r)
        log.close()
    if failed:
        for r in failed:
            sys.stderr.write(open(f"{run_dir}.rank{r}.log").read())
        sys.exit(f"flotilla {mode} on {world} rank(s) failed (ranks {failed})")
    return read_flotilla_metrics(run_dir, steps, args.warmup)


# ---------------------------------------------------------------------------------------------
# PyTorch (this script, run by torchrun with --worker, or directly for one process)


def worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    import faulthandler
    # A hung worker prints every thread's stack and exits instead of hanging the benchmark.
    faulthandler.dump_traceback_later(args.worker_timeout, exit=True)
    torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import datetime
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    config = load_preset(args.preset)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().train()
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
        inner = model.module
    elif args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        inner = model
    else:
        inner = model
    params = list(model.parameters())
    opt = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )
    ids = np.fromfile(args.tokens, dtype="<u2").astype(np.int64)
    stream = torch.from_numpy(ids)
    t, g, m = args.seq, args.global_batch, args.micro
    per_rank = g // world
    n_micro = per_rank // m
    rates, losses = [], []
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss_sum = 0.0
        for k in range(n_micro):
            first = s * g + rank * per_rank + k * m
            # flotilla's `tokens` windows: input rows[i*T .. i*T+T], labels shifted by one.
            x = torch.stack([stream[i * t: i * t + t] for i in range(first, first + m)])
            y = torch.stack([stream[i * t + 1: i * t + t + 1] for i in range(first, first + m)])
            last = k == n_micro - 1
            # No gradient reduction before the last micro-batch (as flotilla's DDP and FSDP).
            ctx = model.no_sync() if args.mode == "ddp" and not last else contextlib.nullcontext()
            if args.mode == "fsdp2":
                model.set_requires_gradient_sync(last)
            with ctx:
                logits = model(input_ids=x).logits
                # Mean over the rank's micro-batches; DDP and FSDP2 average over ranks.
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) / n_micro
                loss.backward()
            loss_sum += loss.item() / world
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        metric = torch.tensor([loss_sum])
        if world > 1:
            dist.all_reduce(metric)
        dt = time.perf_counter() - t0
        losses.append(metric.item())
        if s >= args.warmup:
            rates.append(g * t / dt)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"rates": rates, "losses": losses, "params": sum(
                p.numel() for p in inner.parameters())}, f)
    if world > 1:
        dist.barrier()
    # Tearing down DDP/gloo objects when worker() returns sometimes never finishes here (both
    # workers idle in futex waits after rank 0 wrote its results): skip the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_torch(args, tokens_path, out, mode, world):
    common = ["--worker", "--mode", mode, "--preset", args.preset, "--seq", str(args.seq),
              "--micro", str(args.micro), "--global-batch", str(args.global_batch),
              "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--threads", str(args.threads), "--tokens", tokens_path, "--out", out,
              "--worker-timeout", str(args.timeout)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    if world == 1:
        cmd = [sys.executable, os.path.abspath(__file__)] + common
    else:
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [torchrun, f"--nproc_per_node={world}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", os.path.abspath(__file__)] + common
    # Should a world hang anyway, each worker dumps its stacks and exits after --timeout s, and
    # the run is retried.
    for attempt in range(1 + args.retries):
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=args.timeout + 60)
            break
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            print(f"  pytorch {mode} on {world} rank(s): no result after {args.timeout + 60:.0f} s "
                  f"(attempt {attempt + 1}); stderr tail:\n{err[-3000:]}", flush=True)
    else:
        sys.exit(f"pytorch {mode} on {world} rank(s) did not finish")
    if p.returncode != 0:
        sys.exit(f"pytorch {mode} on {world} rank(s) failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    with open(out) as f:
        r = json.load(f)
    return r["rates"], r["losses"]


# ---------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per rank (OMP_NUM_THREADS)")
    p.add_argument("--timeout", type=float, default=180,
                   help="seconds a PyTorch worker may run before it dumps its stacks and exits")
    p.add_argument("--retries", type=int, default=2, help="re-runs of a PyTorch world that hangs")
    p.add_argument("--only", default="flotilla,pytorch", help="sides to run")
    p.add_argument("--flotilla", default=os.path.join(ROOT, "target", "release", "flotilla"),
                   help="the flotilla binary (default: target/release/flotilla, built first)")
    p.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    # Worker (torchrun) mode.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-timeout", type=float, default=600, help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    n = args.nproc
    for w in (1, n):
        if args.global_batch % (w * args.micro):
            sys.exit(f"--global-batch {args.global_batch} must split into micro-batches of "
                     f"{args.micro} on {w} rank(s)")
    sides = set(args.only.split(","))
    if "flotilla" in sides and not args.no_build:
        build_flotilla()
    import numpy as np
    from transformers import LlamaForCausalLM

    config = load_preset(args.preset)
    n_params = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    steps = args.warmup + args.steps
    print(f"{args.preset}: {n_params / 1e6:.1f}M parameters, T={args.seq}, M={args.micro}, "
          f"G={args.global_batch} sequences/step ({args.global_batch * args.seq} tokens), fp32, "
          f"CPU ({os.cpu_count()} cores), {args.threads} thread(s) per rank; median tokens/s "
          f"of {args.steps} steps after {args.warmup} warm-up steps", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        ids = rng.integers(0, config.vocab_size, steps * args.global_batch * args.seq + 1)
        tokens_path = os.path.join(tmp, "tokens.bin")
        ids.astype("<u2").tofile(tokens_path)
        plan = []
        if "flotilla" in sides:
            plan += [("flotilla 1 rank", "flotilla", "none", 1),
                     ("flotilla DDP", "flotilla", "ddp", n),
                     ("flotilla FULL_SHARD", "flotilla", "fsdp", n)]
        if "pytorch" in sides:
            plan += [("pytorch 1 process", "pytorch", "none", 1),
                     ("pytorch DDP (gloo)", "pytorch", "ddp", n),
                     ("pytorch FSDP2 (gloo)", "pytorch", "fsdp2", n)]
        for i, (name, side, mode, world) in enumerate(plan):
            t0 = time.perf_counter()
            if side == "flotilla":
                rates, losses = run_flotilla(args, tokens_path, os.path.join(tmp, f"run{i}"), mode, world)
            else:
                rates, losses = run_torch(args, tokens_path, os.path.join(tmp, f"out{i}.json"), mode, world)
            results.append((name, world, statistics.median(rates), losses))
            print(f"  {name:<22} {world} rank(s): {statistics.median(rates):8.0f} tokens/s "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    print()
    print(f"{'':24}{'ranks':>6}{'tokens/s':>10}{'ms/step':>10}{'vs 1 rank':>11}"
          f"{'first loss':>12}{'last loss':>11}")
    base = {}
    for name, world, rate, losses in results:
        side = name.split()[0]
        if world == 1:
            base[side] = rate
        ms = args.global_batch * args.seq / rate * 1e3
        speedup = f"{rate / base[side]:.2f}x" if side in base else "-"
        print(f"{name:24}{world:>6}{rate:10.0f}{ms:10.1f}{speedup:>11}{losses[0]:12.4f}{losses[-1]:11.4f}")
    by = {name: rate for name, _, rate, _ in results}
    pairs = [("flotilla 1 rank", "pytorch 1 process"), ("flotilla DDP", "pytorch DDP (gloo)"),
             ("flotilla FULL_SHARD", "pytorch FSDP2 (gloo)")]
    for a, b in pairs:
        if a in by and b in by:
            print(f"ratio {a} / {b}: {by[a] / by[b]:.2f}x")


if __name__ == "__main__":
    main()
