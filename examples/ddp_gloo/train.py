"""A plain PyTorch DDP script (gloo, CPU) that flotilla runs as the task of every rank.

Nothing here knows about flotilla except two conventions:
  * the process group is joined from the environment (env://: MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE), which flotilla sets for every rank, locally as on SLURM;
  * outputs go to FLOTILLA_JOB_DIR (the job's own directory; the current directory when run by
    hand), so `flotilla report` and `flotilla status` find them.

It fits a tiny linear regression on a seeded synthetic dataset: every step takes one global
batch, each rank computes the loss on its share, DDP averages the gradients, and rank 0 appends
`step,loss` (the loss averaged over the ranks) to metrics.csv. Every rank writes
seen_rank<R>.json: the variables it was started with, its arguments, the result of an
all_reduce and the final weights (equal on every rank).

On SIGUSR2 (SLURM sends it before the time limit; flotilla forwards it) every rank stops after
the current step, rank 0 saves checkpoint.pt in the job directory and the program exits 0;
flotilla requeues the job and the next start resumes from that checkpoint.

By hand: torchrun --nproc-per-node 2 train.py --lr 0.1 --steps 5
(`--step-seconds 1` makes it slow enough to try `kill -USR2` on its ranks.)
"""

import argparse
import csv
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# What a rank of a flotilla job is told (absent ones are recorded as null).
ENV_VARS = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "FLOTILLA_JOB_DIR",
    "FLOTILLA_CONFIG", "FLOTILLA_JOB_NUM", "FLOTILLA_SWEEP_DIR", "SLURM_JOB_ID",
    "SLURM_PROCID", "SLURM_RESTART_COUNT",
]

NUM_SAMPLES = 256
DIM = 4
TRUE_WEIGHT = [1.5, -2.0, 0.5, 3.0]
TRUE_BIAS = 0.25

stop_requested = False


def on_usr2(signum, frame):
    global stop_requested
    stop_requested = True


def make_data(seed):
    """The dataset: y = X w + b + noise, the same on every rank for a given seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_SAMPLES, DIM, generator=g)
    w = torch.tensor(TRUE_WEIGHT).unsqueeze(1)
    y = x @ w + TRUE_BIAS + 0.05 * torch.randn(NUM_SAMPLES, 1, generator=g)
    return x, y


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(DIM, 1)


def global_batch(x, y, step, batch_size):
    """The batch of `step` (all ranks together); rank r trains on rows r, r + world, ..."""
    lo = (step * batch_size) % NUM_SAMPLES
    return x[lo:lo + batch_size], y[lo:lo + batch_size]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="sleep this long in every step (to try SIGUSR2 by hand)")
    return p.parse_args(argv)


def main():
    args = parse_args()
    signal.signal(signal.SIGUSR2, on_usr2)
    out_dir = os.environ.get("FLOTILLA_JOB_DIR", os.getcwd())

    # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE come from the launcher.
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # A collective whose result is known: the sum of rank + 1 over the ranks.
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    expected = world * (world + 1) / 2
    if total.item() != expected:
        sys.exit(f"rank {rank}: all_reduce gave {total.item()}, expected {expected}")

    x, y = make_data(args.seed)
    model = DDP(make_model(args.seed))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    # Resume after a requeue: the checkpoint rank 0 saved when it was told to stop.
    ckpt_path = os.path.join(out_dir, "checkpoint.pt")
    start = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"]
        print(f"rank {rank}: resuming from {ckpt_path} at step {start}", flush=True)

    metrics = None
    if rank == 0:
        path = os.path.join(out_dir, "metrics.csv")
        fresh = start == 0 or not os.path.exists(path)
        metrics = open(path, "w" if fresh else "a", newline="")
        writer = csv.writer(metrics)
        if fresh:
            writer.writerow(["step", "loss"])

    stopped_at = None
    for step in range(start, args.steps):
        # Stop together: a rank that got the signal tells the others.
        flag = torch.tensor([1.0 if stop_requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            stopped_at = step
            break
        xb, yb = global_batch(x, y, step, args.batch_size)
        opt.zero_grad()
        loss = F.mse_loss(model(xb[rank::world]), yb[rank::world])
        loss.backward()  # DDP averages the gradients over the ranks
        opt.step()
        if args.step_seconds > 0:
            time.sleep(args.step_seconds)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world
        if metrics is not None:
            writer.writerow([step, f"{mean_loss.item():.9g}"])
            metrics.flush()
            print(f"step {step}: loss {mean_loss.item():.6f}", flush=True)

    if stopped_at is not None:
        if rank == 0:
            tmp = ckpt_path + ".tmp"
            torch.save({"step": stopped_at, "model": model.module.state_dict(),
                        "opt": opt.state_dict()}, tmp)
            os.replace(tmp, ckpt_path)
            print(f"stopped by SIGUSR2 at step {stopped_at}; saved {ckpt_path}", flush=True)
        dist.barrier()

    seen = {
        "rank": rank,
        "world_size": world,
        "host": socket.gethostname(),
        "env": {k: os.environ.get(k) for k in ENV_VARS},
        "args": vars(args),
        "argv": sys.argv,
        "cwd": os.getcwd(),
        "allreduce_sum": total.item(),
        "stopped_at": stopped_at,
        "weight": model.module.weight.detach().flatten().tolist(),
        "bias": model.module.bias.detach().item(),
    }
    with open(os.path.join(out_dir, f"seen_rank{rank}.json"), "w") as f:
        json.dump(seen, f, indent=2)
    if metrics is not None:
        metrics.close()
    # Every rank is done with the collectives before any tears the group down, and DDP's reducer
    # (which holds the group and its gloo threads) goes first: otherwise a rank can abort at exit
    # ("terminate called without an active exception").
    dist.barrier()
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's worker threads can still be finishing
    # there, and a rank then aborts after its work is done ("terminate called without an active
    # exception"), which fails the whole job. Everything is written and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
