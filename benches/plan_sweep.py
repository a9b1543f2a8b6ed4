#!/usr/bin/env python3
"""Benchmark: `flotilla plan -m` of a 10,000-job sweep over the default conf/, side by side with
hydra-core composing the same tree.

flotilla is timed end to end (process start, composition of every job, JSON of every job's
config written to a pipe). Hydra is timed composing a sample of the same jobs through its
compose API in one process (`initialize_config_dir` once, then `compose()` per job, the per-job
work of a Hydra multirun), and its per-job cost is extrapolated to the whole sweep.

Usage: .venv/bin/python benches/plan_sweep.py [--binary target/release/flotilla] [--hydra-sample 300]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = ["+bench_a=range(0,100)", "+bench_b=range(0,100)"]


def time_flotilla(binary, repeats):
    cmd = [binary, "plan", "-m", "--format", "json", "--config-dir", os.path.join(ROOT, "conf"), *SWEEP]
    walls = []
    jobs = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        walls.append(time.perf_counter() - start)
        jobs = len(json.loads(out)["jobs"])
    return jobs, walls


def time_hydra(sample):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    jobs = [[f"+bench_a={a}", f"+bench_b={b}"] for a in range(100) for b in range(100)]
    step = max(1, len(jobs) // sample)
    picked = jobs[::step][:sample]
    with initialize_config_dir(config_dir=os.path.join(ROOT, "conf"), version_base=None):
        compose(config_name="config", overrides=picked[0])  # warm-up
        start = time.perf_counter()
        for overrides in picked:
            cfg = compose(config_name="config", overrides=overrides)
            json.dumps(OmegaConf.to_container(cfg, resolve=False))
        wall = time.perf_counter() - start
    return len(picked), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "flotilla"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hydra-sample", type=int, default=300)
    args = ap.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"{args.binary} not found: build it with `cargo build --release`")

    jobs, walls = time_flotilla(args.binary, args.repeats)
    f_wall = statistics.median(walls)
    f_per_job = f_wall / jobs
    n, h_wall = time_hydra(args.hydra_sample)
    h_per_job = h_wall / n
    print(f"sweep: {' '.join(SWEEP)}  ({jobs} jobs)")
    print(f"flotilla plan -m: {f_wall:.3f} s wall (median of {args.repeats}; min {min(walls):.3f} s), {f_per_job * 1e6:.1f} us/job")
    print(f"hydra-core compose: {h_wall:.3f} s for {n} jobs, {h_per_job * 1e6:.1f} us/job, {h_per_job * jobs:.1f} s extrapolated to {jobs} jobs")
    print(f"per-job speed-up: {h_per_job / f_per_job:.0f}x")


if __name__ == "__main__":
    main()
