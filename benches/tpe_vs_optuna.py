#!/usr/bin/env python3
"""Benchmark: flotilla's TPE sampler against the real optuna package's TPESampler (the oracle)
at equal budget, on seeded synthetic objectives, with random search as the floor.

flotilla runs in process through the `tpe_objectives` example
(crates/flotilla-study/examples/tpe_objectives.rs: `cargo run --release -p flotilla-study
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
study is the best value found. Part 1's table: median and interquartile range over the seeds,
then per objective flotilla's median minus optuna's with a 95% bootstrap interval (the two
use different random streams, so seeds are not paired): "at least as good" when the
difference is <= 0, "within noise" when the interval holds 0, else "WORSE" (exit status 1).

Part 2 takes the random numbers out: for a fixed history (34 trials of noisy_quadratic with
COMPLETE, PRUNED and RUNNING ones; 30 COMPLETE trials of discrete; for the multivariate sampler,
29 trials of branin_lr, the last 3 RUNNING), both samplers propose the next trial once per seed
(`--draws` seeds), and the proposal distributions are printed side by side (quantiles of each
numerical param with the two-sample Kolmogorov-Smirnov distance, frequencies of a
categorical's choices). `--parity-only` runs this part alone.

With `--parallel P` it instead measures trials in flight on `branin_lr` (Branin over x1, x2
plus (log10 lr + 3)^2, lr log-uniform in [1e-5, 1]; minimum 0.397887):

* through the real CLI: for each of `--seeds` seeds, `flotilla run -m` with
  `flotilla.sweeper.sampler=tpe`, `n_trials` = budget, `max_parallel` 1 and P, each trial a
  user program (the task of its job) that sleeps a random 0.05 - 0.25 s, so trials in flight
  end out of order, and logs the objective to its metrics.csv; beside it optuna's sequential
  TPESampler and optuna with P trials in flight (ask/tell, optuna's constant liar, the oldest
  trial told first) on the same objective in process; both univariate (flotilla's default,
  optuna `multivariate=False`) and multivariate (`flotilla.sweeper.multivariate=true`,
  optuna 5's default). The verdict: flotilla's median best with P in flight within 1.25x of
  optuna's sequential one for flotilla's default (univariate) sampler; the multivariate ratio
  is printed too (over a handful of seeds a median moves by more than that: see the next part).
* in process, over `--sim-seeds` seeds (the CLI's few seeds leave the medians noisy): the
  `tpe_objectives` example's studies with P in flight (the oldest trial ending first) against
  one at a time, the same for optuna; here both modes must be within 1.25x of optuna's
  sequential median (exit status 1 otherwise).

Each ratio of medians is printed with a 95% bootstrap interval (the seeds of each side
resampled on their own), and in process flotilla's sequential median against optuna's too.

Usage: .venv/bin/python benches/tpe_vs_optuna.py [--seeds 100] [--budget 40] [--draws 2000]
           [--parity-only]
       .venv/bin/python benches/tpe_vs_optuna.py --parallel 4 --seeds 7 --budget 30
           [--sim-seeds 400] [--binary target/release/flotilla]
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


EXAMPLE = ["cargo", "run", "--quiet", "--release", "-p", "flotilla-study", "--example", "tpe_objectives", "--"]


def run_flotilla(seeds, budget):
    cmd = EXAMPLE + ["--seeds", str(seeds), "--budget", str(budget), "--samplers", "tpe,tpe-mv,random"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    names = {"tpe": "flotilla tpe (univariate)", "tpe-mv": "flotilla tpe (multivariate)", "random": "flotilla random"}
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        r["sampler"] = names[r["sampler"]]
        rows.append(r)
    return rows


def median_diff_ci(a, b, n_boot=4000):
    """Median of a minus median of b, and its 95% bootstrap interval (a, b resampled apart)."""
    rng = np.random.RandomState(0)
    a, b = np.asarray(a), np.asarray(b)
    boots = [
        np.median(a[rng.randint(len(a), size=len(a))]) - np.median(b[rng.randint(len(b), size=len(b))])
        for _ in range(n_boot)
    ]
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(np.median(a) - np.median(b)), float(lo), float(hi)


def median_ratio_ci(a, b, n_boot=4000):
    """median(a) / median(b) with a 95% bootstrap interval (seeds resampled independently: the
    two samplers' random streams differ, so their seeds are not paired)."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(a), np.asarray(b)
    ratios = [np.median(rng.choice(a, a.size)) / np.median(rng.choice(b, b.size)) for _ in range(n_boot)]
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return np.median(a) / np.median(b), lo, hi


def histories():
    """The fixed histories of part 2, as (objective, optuna distributions, trials) with trials
    in flotilla's Trial JSON (internal representations)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    rng = np.random.RandomState(7)
    quad = []
    for i in range(34):
        lr = 10 ** rng.uniform(-5, 0)
        opt = int(rng.randint(3))
        v = (math.log10(lr) + 3) ** 2 + list(OFFSETS.values())[opt] + rng.uniform(-0.1, 0.1)
        state = "RUNNING" if i in (30, 33) else ("PRUNED" if i in (5, 12) else "COMPLETE")
        quad.append({
            "number": i, "params": {"lr": lr, "opt": float(opt)}, "state": state,
            "value": v if state == "COMPLETE" else None,
            "intermediate": {"10": v + 1.0} if state == "PRUNED" else {},
        })
    disc = []
    for i in range(30):
        w = min(max(int(round(math.exp(rng.uniform(math.log(15.5), math.log(1024.5))))), 16), 1024)
        layers = int(rng.randint(1, 13))
        d = round(int(rng.randint(0, 11)) * 0.05, 10)
        v = (math.log2(w) - 8) ** 2 / 4 + (layers - 7) ** 2 / 10 + 10 * (d - 0.2) ** 2
        disc.append({"number": i, "params": {"width": float(w), "layers": float(layers), "dropout": d},
                     "state": "COMPLETE", "value": v, "intermediate": {}})
    # branin_lr for the multivariate sampler: 29 trials, the last three in flight.
    blr = []
    for i in range(29):
        x1, x2, lr = rng.uniform(-5, 10), rng.uniform(0, 15), 10 ** rng.uniform(-5, 0)
        state = "RUNNING" if i >= 26 else "COMPLETE"
        blr.append({"number": i, "params": {"x1": x1, "x2": x2, "lr": lr}, "state": state,
                    "value": branin_lr(x1, x2, lr) if state == "COMPLETE" else None, "intermediate": {}})
    return [
        ("noisy_quadratic", {"lr": FloatDistribution(1e-5, 1, log=True),
                             "opt": CategoricalDistribution(list(OFFSETS))}, quad, False),
        ("discrete", {"width": IntDistribution(16, 1024, log=True), "layers": IntDistribution(1, 12),
                      "dropout": FloatDistribution(0.0, 0.5, step=0.05)}, disc, False),
        ("branin_lr", {"x1": FloatDistribution(-5, 10), "x2": FloatDistribution(0, 15),
                       "lr": FloatDistribution(1e-5, 1, log=True)}, blr, True),
    ]


def optuna_proposals(dists, history, draws, multivariate=False):
    import optuna
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    states = {"RUNNING": TrialState.RUNNING, "PRUNED": TrialState.PRUNED, "COMPLETE": TrialState.COMPLETE}
    out = {k: [] for k in dists}
    for seed in range(draws):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, multivariate=multivariate))
        for h in history:
            ext = {k: dists[k].to_external_repr(v) for k, v in h["params"].items()}
            study.add_trial(create_trial(
                params=ext, distributions=dists, value=h["value"], state=states[h["state"]],
                intermediate_values={int(k): v for k, v in h["intermediate"].items()},
            ))
        trial = study.ask(dists)
        for k in dists:
            out[k].append(dists[k].to_internal_repr(trial.params[k]))
    return out


def ks_distance(a, b):
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical
    distribution functions."""
    a, b = np.sort(a), np.sort(b)
    xs = np.concatenate([a, b])
    fa = np.searchsorted(a, xs, side="right") / a.size
    fb = np.searchsorted(b, xs, side="right") / b.size
    return float(np.max(np.abs(fa - fb)))


def proposal_parity(draws):
    import tempfile

    print(f"## Proposal distributions for a fixed history ({draws} seeds each; branin_lr: "
          "multivariate, 3 trials in flight)")
    print()
    # Above this KS distance the two samples differ at the 5% level (equal sizes).
    ks_critical = 1.358 * math.sqrt(2 / draws)
    print(f"| objective | param | sampler | q5 | q25 | median | q75 | q95 | KS distance (5%: {ks_critical:.3f}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    freq_lines = []
    for objective, dists, history, multivariate in histories():
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(history, f)
            path = f.name
        cmd = EXAMPLE + ["--propose", objective, "--history", path, "--draws", str(draws),
                         "--samplers", "tpe-mv" if multivariate else "tpe"]
        ours = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout)
        os.unlink(path)
        theirs = optuna_proposals(dists, history, draws, multivariate)
        for param in dists:
            if param == "opt":
                for name, vals in [("flotilla", ours[param]), ("optuna", theirs[param])]:
                    counts = {c: int(sum(1 for v in vals if int(v) == i)) for i, c in enumerate(OFFSETS)}
                    freq_lines.append(f"{objective} {param} {name}: {counts}")
                continue
            ks = ks_distance(ours[param], theirs[param])
            for name, vals in [("flotilla", ours[param]), ("optuna", theirs[param])]:
                v = np.log10(vals) if param == "lr" else np.asarray(vals)
                q = np.percentile(v, [5, 25, 50, 75, 95])
                label = "log10 lr" if param == "lr" else param
                print(f"| {objective} | {label} | {name} | " + " | ".join(f"{x:.4g}" for x in q)
                      + (f" | {ks:.4f} |" if name == "optuna" else " | |"))
    print()
    for line in freq_lines:
        print(line)


def branin_lr(x1, x2, lr):
    return branin(x1, x2) + (math.log10(lr) + 3.0) ** 2


BRANIN_LR_PROGRAM = r'''import math, os, random, sys, time
x1, x2, lr = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
b, c, t = 5.1 / (4 * math.pi ** 2), 5 / math.pi, 1 / (8 * math.pi)
f = (x2 - b * x1 * x1 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10 + (math.log10(lr) + 3) ** 2
time.sleep(random.uniform(0.05, 0.25))
with open(os.path.join(os.environ["FLOTILLA_JOB_DIR"], "metrics.csv"), "w") as out:
    out.write(f"step,loss\n0,{f!r}\n")
'''

BRANIN_LR_CONFIG = """x1: 0.0
x2: 0.0
lr: 0.001
flotilla:
  task:
    command: [python3, objective.py, '${x1}', '${x2}', '${lr}']
  sweeper:
    sampler: tpe
    metric: loss
    direction: minimize
    params:
      x1: interval(-5, 10)
      x2: interval(0, 15)
      lr: tag(log, interval(1e-5, 1))
"""


def cli_study(binary, work, seed, budget, parallel, multivariate):
    name = f"s{seed}_p{parallel}_{'mv' if multivariate else 'uv'}"
    env = dict(os.environ)
    if not os.path.exists(os.path.join(os.path.dirname(binary), "flotilla-train")):
        # `run` checks that the training task exists before it starts anything, even when the
        # jobs run a user program; these never start it.
        env.setdefault("FLOTILLA_TRAIN_BINARY", "/bin/true")
    subprocess.run(
        [binary, "run", "-m", f"flotilla.sweep.dir={name}", f"flotilla.sweeper.seed={seed}",
         f"flotilla.sweeper.n_trials={budget}", f"flotilla.sweeper.max_parallel={parallel}",
         f"flotilla.sweeper.multivariate={'true' if multivariate else 'false'}"],
        cwd=work, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    data = json.load(open(os.path.join(work, name, "study.json")))
    values = [t["value"] for t in data["trials"] if t["state"] == "COMPLETE"]
    if len(values) != budget:
        sys.exit(f"{name}: {len(values)} of {budget} trials completed")
    return min(values)


def optuna_in_flight(seed, budget, parallel, multivariate):
    """optuna's best on branin_lr with `parallel` trials asked before the oldest is told."""
    import collections

    import optuna
    from optuna.distributions import FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    dists = {"x1": FloatDistribution(-5, 10), "x2": FloatDistribution(0, 15),
             "lr": FloatDistribution(1e-5, 1, log=True)}
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed, multivariate=multivariate))
    in_flight, asked, best = collections.deque(), 0, math.inf
    while asked < budget or in_flight:
        if asked < budget and len(in_flight) < parallel:
            in_flight.append(study.ask(dists))
            asked += 1
            continue
        trial = in_flight.popleft()
        value = branin_lr(trial.params["x1"], trial.params["x2"], trial.params["lr"])
        best = min(best, value)
        study.tell(trial, value)
    return best


def parallel_main(args):
    import tempfile

    import optuna

    binary = os.path.abspath(args.binary)
    p = args.parallel
    modes = [(False, "univariate"), (True, "multivariate")]
    print(f"branin_lr, {args.budget} trials per study, {p} in flight against one at a time; "
          f"optuna {optuna.__version__}")
    print()
    print(f"## Through the CLI: `flotilla run -m`, a user program per trial, seeds 0..{args.seeds - 1}")
    print()
    rows = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        os.makedirs(os.path.join(work, "conf"))
        with open(os.path.join(work, "conf", "config.yaml"), "w") as f:
            f.write(BRANIN_LR_CONFIG)
        with open(os.path.join(work, "objective.py"), "w") as f:
            f.write(BRANIN_LR_PROGRAM)
        for mv, mode in modes:
            for seed in range(args.seeds):
                for par in (1, p):
                    rows.setdefault((mode, f"flotilla, {par} in flight"), []).append(
                        cli_study(binary, work, seed, args.budget, par, mv))
                for par in (1, p):
                    rows.setdefault((mode, f"optuna, {par} in flight"), []).append(
                        optuna_in_flight(seed, args.budget, par, mv))
    t_cli = time.perf_counter() - t0
    print("| mode | sampler | median best | best per seed |")
    print("|---|---|---|---|")
    ok = True
    verdicts = []
    for _, mode in modes:
        for name in [f"flotilla, 1 in flight", f"flotilla, {p} in flight", "optuna, 1 in flight",
                     f"optuna, {p} in flight"]:
            best = rows[(mode, name)]
            print(f"| {mode} | {name} | {np.median(best):.4f} | "
                  + " ".join(f"{b:.3f}" for b in best) + " |")
        ratio, lo, hi = median_ratio_ci(rows[(mode, f"flotilla, {p} in flight")], rows[(mode, "optuna, 1 in flight")])
        verdict = "within 1.25x" if ratio <= 1.25 else "NOT within 1.25x"
        if mode == "univariate":
            # flotilla's default sampler: what a `max_parallel: 4` TPE study runs.
            ok = ok and ratio <= 1.25
        verdicts.append(f"{mode}: flotilla with {p} in flight / optuna sequential = {ratio:.3f} ({verdict}; "
                        f"95% bootstrap interval {lo:.2f} .. {hi:.2f})")
    print()
    for v in verdicts:
        print(v)
    print(f"({t_cli:.0f} s)")
    if args.sim_seeds > 0:
        print()
        print(f"## In process: seeds 0..{args.sim_seeds - 1} (the oldest trial in flight ends first)")
        print()
        print("| mode | sampler | median best | IQR (q25 - q75) | mean |")
        print("|---|---|---|---|---|")
        sim_verdicts = []
        for mv, mode in modes:
            results = []
            for par in (1, p):
                cmd = EXAMPLE + ["--seeds", str(args.sim_seeds), "--budget", str(args.budget),
                                 "--objective", "branin_lr", "--parallel", str(par),
                                 "--samplers", "tpe-mv" if mv else "tpe"]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
                results.append((f"flotilla, {par} in flight", [json.loads(l)["best"] for l in out.splitlines()]))
            for par in (1, p):
                results.append((f"optuna, {par} in flight",
                                [optuna_in_flight(s, args.budget, par, mv) for s in range(args.sim_seeds)]))
            for name, best in results:
                q25, q50, q75 = np.percentile(best, [25, 50, 75])
                print(f"| {mode} | {name} | {q50:.4f} | {q25:.4f} - {q75:.4f} | {np.mean(best):.4f} |")
            best_of = dict(results)
            medians = {name: np.median(best) for name, best in results}
            ratio, lo, hi = median_ratio_ci(best_of[f"flotilla, {p} in flight"], best_of["optuna, 1 in flight"])
            seq, seq_lo, seq_hi = median_ratio_ci(best_of["flotilla, 1 in flight"], best_of["optuna, 1 in flight"])
            ok = ok and ratio <= 1.25
            sim_verdicts.append(
                f"{mode}: flotilla with {p} in flight / optuna sequential = {ratio:.3f} "
                f"({'within 1.25x' if ratio <= 1.25 else 'NOT within 1.25x'}; 95% bootstrap interval "
                f"{lo:.2f} .. {hi:.2f}); optuna with {p} in "
                f"flight / optuna sequential = {medians[f'optuna, {p} in flight'] / medians['optuna, 1 in flight']:.3f}; "
                f"flotilla sequential / optuna sequential = {seq:.3f} ({seq_lo:.2f} .. {seq_hi:.2f})")
        print()
        for v in sim_verdicts:
            print(v)
    sys.exit(0 if ok else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--parallel", type=int, default=0, help="measure P trials in flight instead")
    ap.add_argument("--sim-seeds", type=int, default=400)
    ap.add_argument("--parity-only", action="store_true",
                    help="only the proposal distributions for fixed histories (part 2)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/flotilla"))
    args = ap.parse_args()
    if args.seeds < 1 or args.budget < 1:
        sys.exit("--seeds and --budget must be positive")
    if args.parallel > 0:
        parallel_main(args)
    if args.parity_only:
        proposal_parity(args.draws)
        sys.exit(0)

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
    print("| objective | flotilla vs optuna | median difference | 95% bootstrap interval | verdict |")
    print("|---|---|---|---|---|")
    ok = True
    for objective in ["branin", "noisy_quadratic", "discrete"]:
        for ours, theirs, label in [
            ("flotilla tpe (univariate)", "optuna tpe (multivariate=False)", "univariate"),
            ("flotilla tpe (multivariate)", "optuna tpe (default: multivariate)", "multivariate"),
        ]:
            a = [r["best"] for r in rows if r["objective"] == objective and r["sampler"] == ours]
            b = [r["best"] for r in rows if r["objective"] == objective and r["sampler"] == theirs]
            d, lo, hi = median_diff_ci(a, b)
            if d <= 0:
                verdict = "at least as good"
            elif lo <= 0:
                verdict = "within noise"
            else:
                verdict = "WORSE"
                ok = False
            print(f"| {objective} | {label} | {d:+.4f} | {lo:+.4f} .. {hi:+.4f} | {verdict} |")
    print()
    if args.draws > 0:
        proposal_parity(args.draws)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
