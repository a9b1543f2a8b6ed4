#!/usr/bin/env python3
"""Benchmark: flotilla's TPE sampler against the real optuna package's TPESampler (the oracle)
at equal budget, on seeded synthetic objectives, with random search as the floor.

flotilla runs in process through the `tpe_objectives` example
(crates/flotilla-launch/examples/tpe_objectives.rs: `cargo run --release -p flotilla-launch
--example tpe_objectives`); optuna runs the same objectives here, with the same noise (a
function of the seed and the trial number), one trial at a time, `n_trials` = budget:

* branin: x1 in [-5, 10], x2 in [0, 15] (minimum 0.397887);
* noisy_quadratic: (log10 lr + 3)^2 + offset(opt) + U[-0.1, 0.1) noise, lr log-uniform in
  [1e-5, 1], opt in {adam: 0, rmsprop: 0.3, sgd: 1};
* discrete: (log2 width - 8)^2/4 + (layers - 7)^2/10 + 10 (dropout - 0.2)^2, width a log int in
  [16, 1024], layers an int in [1, 12], dropout in [0, 0.5] step 0.05 (minimum 0).

Samplers: flotilla `tpe` (univariate, the default) and `tpe-mv` (multivariate=True);
optuna `TPESampler(seed=s, multivariate=False)` and `TPESampler(seed=s)` (optuna 5's default,
multivariate for one objective); `random` for both. Every study minimises; the figure per
study is the best value found. The table: median and interquartile range over the seeds.

Usage: .venv/bin/python benches/tpe_vs_optuna.py [--seeds 30] [--budget 40]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASK = (1 << 64) - 1
OFFSETS = {"adam": 0.0, "rmsprop": 0.3, "sgd": 1.0}


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def noise(seed, number):
    u = (splitmix64(((seed << 32) ^ number) & MASK) >> 11) * (1.0 / (1 << 53))
    return 0.2 * (u - 0.5)


def branin(x1, x2):
    b = 5.1 / (4.0 * math.pi * math.pi)
    c = 5.0 / math.pi
    t = 1.0 / (8.0 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - 6.0) ** 2 + 10.0 * (1.0 - t) * math.cos(x1) + 10.0


def objectives(seed):
    def f_branin(trial):
        x1 = trial.suggest_float("x1", -5, 10)
        x2 = trial.suggest_float("x2", 0, 15)
        return branin(x1, x2)

    def f_quadratic(trial):
        lr = trial.suggest_float("lr", 1e-5, 1, log=True)
        opt = trial.suggest_categorical("opt", ["adam", "rmsprop", "sgd"])
        return (math.log10(lr) + 3.0) ** 2 + OFFSETS[opt] + noise(seed, trial.number)

    def f_discrete(trial):
        width = trial.suggest_int("width", 16, 1024, log=True)
        layers = trial.suggest_int("layers", 1, 12)
        dropout = trial.suggest_float("dropout", 0.0, 0.5, step=0.05)
        return (math.log2(width) - 8.0) ** 2 / 4.0 + (layers - 7.0) ** 2 / 10.0 + 10.0 * (dropout - 0.2) ** 2

    return {"branin": f_branin, "noisy_quadratic": f_quadratic, "discrete": f_discrete}


def run_optuna(seeds, budget):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    samplers = {
        "optuna tpe (multivariate=False)": lambda s: optuna.samplers.TPESampler(seed=s, multivariate=False),
        "optuna tpe (default: multivariate)": lambda s: optuna.samplers.TPESampler(seed=s),
        "optuna random": lambda s: optuna.samplers.RandomSampler(seed=s),
    }
    rows = []
    for seed in range(seeds):
        for objective, f in objectives(seed).items():
            for name, make in samplers.items():
                study = optuna.create_study(direction="minimize", sampler=make(seed))
                study.optimize(f, n_trials=budget)
                rows.append({"sampler": name, "objective": objective, "seed": seed, "best": study.best_value})
    return rows, optuna.__version__


def run_flotilla(seeds, budget):
    cmd = [
        "cargo", "run", "--quiet", "--release", "-p", "flotilla-launch", "--example", "tpe_objectives", "--",
        "--seeds", str(seeds), "--budget", str(budget), "--samplers", "tpe,tpe-mv,random",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    names = {"tpe": "flotilla tpe (univariate)", "tpe-mv": "flotilla tpe (multivariate)", "random": "flotilla random"}
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        r["sampler"] = names[r["sampler"]]
        rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--budget", type=int, default=40)
    args = ap.parse_args()
    if args.seeds < 1 or args.budget < 1:
        sys.exit("--seeds and --budget must be positive")

    t0 = time.perf_counter()
    rows = run_flotilla(args.seeds, args.budget)
    t_flotilla = time.perf_counter() - t0
    t0 = time.perf_counter()
    optuna_rows, version = run_optuna(args.seeds, args.budget)
    t_optuna = time.perf_counter() - t0
    rows += optuna_rows

    order = [
        "flotilla tpe (univariate)", "optuna tpe (multivariate=False)",
        "flotilla tpe (multivariate)", "optuna tpe (default: multivariate)",
        "flotilla random", "optuna random",
    ]
    print(f"budget {args.budget} trials, seeds 0..{args.seeds - 1}, optuna {version}; "
          f"flotilla {t_flotilla:.1f} s (incl. cargo), optuna {t_optuna:.1f} s")
    print()
    print("| objective | sampler | median best | IQR (q25 - q75) |")
    print("|---|---|---|---|")
    medians = {}
    for objective in ["branin", "noisy_quadratic", "discrete"]:
        for sampler in order:
            best = [r["best"] for r in rows if r["objective"] == objective and r["sampler"] == sampler]
            q25, q50, q75 = np.percentile(best, [25, 50, 75])
            medians[(objective, sampler)] = q50
            print(f"| {objective} | {sampler} | {q50:.4f} | {q25:.4f} - {q75:.4f} |")
    print()
    ok = True
    for objective in ["branin", "noisy_quadratic", "discrete"]:
        for ours, theirs in [
            ("flotilla tpe (univariate)", "optuna tpe (multivariate=False)"),
            ("flotilla tpe (multivariate)", "optuna tpe (default: multivariate)"),
        ]:
            a, b = medians[(objective, ours)], medians[(objective, theirs)]
            verdict = "at least as good" if a <= b else "WORSE"
            ok &= a <= b
            print(f"{objective}: {ours} {a:.4f} vs {theirs} {b:.4f}: {verdict}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
