#!/usr/bin/env python3
"""all_reduce bus bandwidth of torch.distributed's gloo backend on CPU, measured the way
`flotilla bench comm` measures it, optionally side by side with flotilla.

Each rank times every iteration between a barrier and the end of the collective; per
iteration the slowest rank counts, and the median over iterations is reported with
nccl-tests' definitions: algbw = bytes / time, busbw = algbw * 2(n-1)/n for all_reduce.
Each rank gets its share of the cores (torch threads = cores / nprocs), as flotilla's ranks do.

    .venv/bin/python benches/comm_gloo.py                       # gloo only, JSON
    .venv/bin/python benches/comm_gloo.py --flotilla target/release/flotilla --repeat 3
                                                                # + flotilla and the ratio

Output: {"results": [{"op", "bytes", "time_s", "algbw_gbps", "busbw_gbps"}, ...]} for gloo;
with --flotilla, a table of both and the ratio flotilla/gloo of busbw per size, then one JSON
object {"gloo": {...}, "flotilla": {...}, "ratio": [{"bytes", "ratio"}]}.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"


def parse_size(s):
    s = s.strip()
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
             "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
    i = len(s)
    while i > 0 and not s[i - 1].isdigit():
        i -= 1
    return int(s[:i]) * units[s[i:].lower()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, sizes, iters, warmup, out_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    results = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        buf = torch.ones(n, dtype=torch.float32)
        times = []
        for i in range(warmup + iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times.append(dt)
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # slowest rank per iteration
        time_s = statistics.median(t.tolist())
        algbw = n * 4 / time_s / 1e9
        busbw = algbw * 2 * (world - 1) / world
        results.append({"op": "all_reduce", "bytes": n * 4, "time_s": time_s,
                        "algbw_gbps": algbw, "busbw_gbps": busbw})
        del buf
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"backend": "gloo", "nprocs": world, "dtype": "f32", "iters": iters,
                       "results": results}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_gloo(args, sizes):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "gloo.json")
        mp.spawn(worker, args=(args.nprocs, free_port(), sizes, args.iters, args.warmup, out),
                 nprocs=args.nprocs, join=True)
        with open(out) as f:
            return json.load(f)


def run_flotilla(args):
    cmd = [args.flotilla, "bench", "comm", "--nprocs", str(args.nprocs), "--backend", "cpu",
           "--op", "all_reduce", "--sizes", args.sizes, "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--format", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    lines = [l for l in out.stdout.splitlines() if l.strip().startswith("{")]
    return json.loads(lines[-1])


def combine(runs):
    """Per size, the run with the median time among repeated runs."""
    out = []
    for rows in zip(*[r["results"] for r in runs]):
        rows = sorted(rows, key=lambda x: x["time_s"])
        out.append(rows[len(rows) // 2])
    merged = dict(runs[0])
    merged["results"] = out
    merged["repeats"] = len(runs)
    return merged


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=1,
                   help="alternate the runs this many times and keep, per size, the median run "
                        "(steadier numbers on a shared machine)")
    p.add_argument("--flotilla", metavar="BIN", help="also run `BIN bench comm` and print the ratio")
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]

    if not args.flotilla:
        print(json.dumps(combine([run_gloo(args, sizes) for _ in range(args.repeat)])))
        return
    gloo_runs, flo_runs = [], []
    for i in range(args.repeat):
        # Alternate which goes first so slow drifts of the machine hit both alike.
        if i % 2 == 0:
            gloo_runs.append(run_gloo(args, sizes))
            flo_runs.append(run_flotilla(args))
        else:
            flo_runs.append(run_flotilla(args))
            gloo_runs.append(run_gloo(args, sizes))
    gloo, flo = combine(gloo_runs), combine(flo_runs)
    by_bytes = {r["bytes"]: r for r in flo["results"]}
    ratios = []
    print(f"# all_reduce, {args.nprocs} ranks on CPU, f32, median of {args.iters} iterations "
          f"(slowest rank), median of {args.repeat} alternating runs; busbw in GB/s")
    print(f"{'bytes':>12} {'gloo_us':>10} {'flotilla_us':>12} {'gloo_busbw':>11} "
          f"{'flotilla_busbw':>15} {'ratio':>7}")
    for g in gloo["results"]:
        f = by_bytes.get(g["bytes"])
        if f is None:
            continue
        ratio = f["busbw_gbps"] / g["busbw_gbps"]
        ratios.append({"bytes": g["bytes"], "ratio": ratio})
        print(f"{g['bytes']:>12} {g['time_s'] * 1e6:>10.1f} {f['time_s'] * 1e6:>12.1f} "
              f"{g['busbw_gbps']:>11.3f} {f['busbw_gbps']:>15.3f} {ratio:>7.2f}")
    print(json.dumps({"gloo": gloo, "flotilla": flo, "ratio": ratios}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
