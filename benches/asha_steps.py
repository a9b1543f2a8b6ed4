#!/usr/bin/env python3
"""Benchmark: asynchronous successive halving against no pruning, on a learning-curve objective.

Each trial is a user program (run by `flotilla run -m` as the task of its job) that logs, at
steps 1..S, loss(step) = f(x, y) + 10 / step + noise, with f the Branin function and seeded
noise; the study's objective is the last logged loss. For each seed the same random-sampler
study (n_trials, max_parallel) runs twice: `flotilla.sweeper.pruner=asha` and no pruner. The
table prints, over the seeds, the median best objective, the median total steps run (the rows of
every trial's metrics.csv) and their ratio.

Usage: python3 benches/asha_steps.py [--binary target/release/flotilla] [--seeds 10]
       [--trials 16] [--steps 30] [--parallel 4]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OBJECTIVE = r'''import math, os, random, sys, time
x, y, steps, seed = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
a, b, c, r, s, t = 1, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
f = a * (y - b * x * x + c * x - r) ** 2 + s * (1 - t) * math.cos(x) + s
rng = random.Random(hash((x, y, seed)))
with open(os.path.join(os.environ["FLOTILLA_JOB_DIR"], "metrics.csv"), "w") as out:
    out.write("step,loss\n")
    for i in range(1, steps + 1):
        out.write(f"{i},{f + 10.0 / i + rng.gauss(0, 0.5)!r}\n")
        out.flush()
        time.sleep(0.05)
'''

CONFIG = """x: 0.0
y: 0.0
steps: 30
seed: 0
flotilla:
  task:
    command: [python3, objective.py, '${x}', '${y}', '${steps}', '${seed}']
  sweeper:
    sampler: random
    params:
      x: interval(-5, 10)
      y: interval(0, 15)
"""


def study(binary, work, seed, trials, steps, parallel, pruner):
    name = f"s{seed}_{'asha' if pruner else 'none'}"
    args = [
        binary, "run", "-m", f"flotilla.sweep.dir={name}", f"steps={steps}", f"seed={seed}",
        f"flotilla.sweeper.seed={seed}", f"flotilla.sweeper.n_trials={trials}",
        f"flotilla.sweeper.max_parallel={parallel}",
    ]
    if pruner:
        args += ["flotilla.sweeper.pruner=asha", "flotilla.sweeper.min_resource=2"]
    subprocess.run(args, cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = json.load(open(os.path.join(work, name, "study.json")))
    best = min(t["value"] for t in data["trials"] if t["state"] == "COMPLETE")
    total = 0
    for t in data["trials"]:
        with open(os.path.join(work, name, str(t["number"]), "metrics.csv")) as f:
            total += sum(1 for _ in f) - 1
    pruned = sum(t["state"] == "PRUNED" for t in data["trials"])
    return best, total, pruned


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "target/release/flotilla"))
    # The studies run in a scratch directory: the binary is named by its absolute path.
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--trials", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--parallel", type=int, default=4)
    a = p.parse_args()
    a.binary = os.path.abspath(a.binary)
    rows = {True: [], False: []}
    with tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(work, "conf"))
        with open(os.path.join(work, "conf", "config.yaml"), "w") as f:
            f.write(CONFIG)
        with open(os.path.join(work, "objective.py"), "w") as f:
            f.write(OBJECTIVE)
        for seed in range(a.seeds):
            for pruner in (True, False):
                rows[pruner].append(study(a.binary, work, seed, a.trials, a.steps, a.parallel, pruner))
    print(f"{a.seeds} seeds, random sampler, {a.trials} trials x {a.steps} steps, {a.parallel} at once")
    print(f"{'pruner':<8} {'median best':>12} {'median steps':>13} {'median pruned':>14}")
    med = {}
    for pruner in (True, False):
        best = statistics.median(r[0] for r in rows[pruner])
        steps = statistics.median(r[1] for r in rows[pruner])
        pruned = statistics.median(r[2] for r in rows[pruner])
        med[pruner] = (best, steps)
        print(f"{'asha' if pruner else 'none':<8} {best:>12.4f} {steps:>13.0f} {pruned:>14.1f}")
    print(f"steps with asha / without: {med[True][1] / med[False][1]:.2f}")
    worse = sum(1 for w, wo in zip(rows[True], rows[False]) if w[0] > wo[0] + 1.0)
    print(f"seeds where asha's best is worse by more than 1.0 (the noise is 0.5): {worse} of {a.seeds}")


if __name__ == "__main__":
    main()
