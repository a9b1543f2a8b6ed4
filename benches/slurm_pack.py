#!/usr/bin/env python3
"""Benchmark: a sweep of short jobs on the test Slurm, packed (`compute.pack`) vs one allocation
per job (a job array).

A project whose job is the user's own program, a Python script that sleeps `--job-seconds`
(1 s) and writes metrics.csv, is swept over `--jobs` (32) values of x with 1 CPU and 1 (fake)
GPU per job, twice per repeat: `compute.pack=4` (allocations of 4 slots, each running the jobs
as job steps) and `compute.pack=1` (a job array, one allocation per job). The wall time runs from
`flotilla run` until `flotilla status` shows every job COMPLETED; the table also gives the
allocations that ran jobs and the jobs' own busy time (the sum of their run times
divided by the node's 4 GPUs) as the floor.

Needs the test cluster up (`scripts/slurm-cluster-start.sh`, one node, 4 CPUs, 4 fake GPUs);
on a shared machine wrap the run in `flock /tmp/slurm-dev.lock`.

Usage: flock /tmp/slurm-dev.lock python3 benches/slurm_pack.py [--binary target/debug/flotilla]
       [--jobs 32] [--job-seconds 1] [--repeats 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = """import os, sys, time
start = time.time()
time.sleep(float(sys.argv[2]))
d = os.environ["FLOTILLA_JOB_DIR"]
with open(os.path.join(d, "metrics.csv"), "w") as f:
    f.write(f"step,loss\\n0,{int(sys.argv[1]) * 3}\\n")
with open(os.path.join(d, "ran"), "w") as f:
    f.write(f"{start} {time.time()}\\n")
"""

CONFIG = """x: 0
compute:
  launcher: slurm
  gpus_per_node: 1
  cpus_per_task: 1
  timeout_min: 10
  pack: {pack}
flotilla:
  task:
    command: [python3, job.py, '${{x}}', '{seconds}']
"""


def status(binary, sweep):
    out = subprocess.run(
        [binary, "status", "--format", "json", sweep], capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"flotilla status failed: {out.stderr}")
    return json.loads(out.stdout)


def one_sweep(binary, root, pack, jobs, seconds, tag):
    proj = os.path.join(root, f"proj-{pack}-{tag}")
    os.makedirs(os.path.join(proj, "conf"))
    with open(os.path.join(proj, "job.py"), "w") as f:
        f.write(JOB)
    with open(os.path.join(proj, "conf", "config.yaml"), "w") as f:
        f.write(CONFIG.format(pack=pack, seconds=seconds))
    sweep = os.path.join(root, f"sweep-{pack}-{tag}")
    start = time.perf_counter()
    out = subprocess.run(
        [binary, "run", "-m", f"x=range(0,{jobs})", f"flotilla.sweep.dir={sweep}"],
        cwd=proj,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"flotilla run failed: {out.stdout}{out.stderr}")
    while True:
        st = status(binary, sweep)
        states = [j["state"] for j in st["jobs"]]
        if all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN") for s in states):
            break
        time.sleep(0.2)
    wall = time.perf_counter() - start
    bad = [j for j in st["jobs"] if j["state"] != "COMPLETED"]
    if bad:
        sys.exit(f"jobs did not complete: {json.dumps(bad, indent=1)}")
    allocations = {j["job_id"] for j in st["jobs"]}
    busy = 0.0
    for j in st["jobs"]:
        with open(os.path.join(j["dir"], "ran")) as f:
            a, b = map(float, f.read().split())
            busy += b - a
    return wall, len(allocations), busy


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/debug/flotilla"))
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--job-seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "is UP" not in ping.stdout:
        sys.exit("the test cluster is not up: start it with scripts/slurm-cluster-start.sh")
    node = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %c CPUs %G"], capture_output=True, text=True
    ).stdout.strip()
    rows = {1: [], 4: []}
    with tempfile.TemporaryDirectory(prefix="flotilla-pack-bench") as root:
        for r in range(args.repeats):
            for pack in (4, 1):
                wall, allocs, busy = one_sweep(
                    args.binary, root, pack, args.jobs, args.job_seconds, r
                )
                rows[pack].append((wall, allocs, busy))
                print(f"repeat {r}: pack={pack}: {wall:.1f} s, {allocs} allocation(s)", flush=True)
    print()
    print(f"node: {node}; {args.jobs} jobs of {args.job_seconds:g} s (python3 sleep), "
          f"1 CPU + 1 GPU each; {args.repeats} repeats; binary {os.path.relpath(args.binary, ROOT)}")
    print()
    print("| submission | allocations that ran jobs | wall (median) | all walls | jobs' busy time / 4 GPUs |")
    print("|---|---|---|---|---|")
    for pack, label in ((1, "one allocation per job (job array)"), (4, "packed, compute.pack=4")):
        walls = [w for w, _, _ in rows[pack]]
        allocs = sorted({a for _, a, _ in rows[pack]})
        floor = statistics.median(b for _, _, b in rows[pack]) / 4
        print(f"| {label} | {', '.join(map(str, allocs))} | {statistics.median(walls):.1f} s | "
              f"{', '.join(f'{w:.1f}' for w in walls)} s | {floor:.1f} s |")
    speedup = statistics.median(w for w, _, _ in rows[1]) / statistics.median(
        w for w, _, _ in rows[4]
    )
    print(f"\npacked is {speedup:.1f}x faster")


if __name__ == "__main__":
    main()
