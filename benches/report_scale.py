#!/usr/bin/env python3
"""Benchmark: `flotilla status` and `flotilla report` on a generated sweep of many jobs.

The sweep is written the way a real one is: `flotilla run -m --dry-run` composes and prepares
every job of the shipped config (`trainer.lr` x `seed`, so each job directory has its
config.yaml, overrides.yaml, meta.json and logs/, and sweep.json its plan), then each job gets
what the built-in trainer leaves behind: a metrics.csv in the trainer's columns (`--steps` rows,
an evaluation every `--eval-every` steps), a final/ directory, and its COMPLETED record with
its wall time in sweep.json. The dry run needs the task binary to exist, not to run: the
variable FLOTILLA_TRAIN_BINARY points it at /bin/true.

Each command then runs `--repeat` times on the warm sweep (the first run reads the files into
the page cache), its output to /dev/null, the binaries taking turns run after run; the table
prints the median and the fastest wall time and the median CPU time (user + system) per
command for each binary given, with `--before` the ratios of the median wall times and of the
median CPU times before / after, and the load average at the start and at the end.

Usage: .venv/bin/python benches/report_scale.py [--binary target/release/flotilla]
       [--before OLD_BINARY] [--lrs 100] [--seeds 100] [--steps 50] [--eval-every 10]
       [--repeat 5] [--keep DIR]
"""
import argparse
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = "step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc\n"


def prepare(binary, sweep, lrs, seeds):
    lr_values = ",".join(f"{(k + 1) * 1e-4:.4g}" for k in range(lrs))
    env = dict(os.environ, FLOTILLA_TRAIN_BINARY="/bin/true")
    t0 = time.perf_counter()
    subprocess.run(
        [binary, "run", "-m", "--dry-run", f"trainer.lr={lr_values}", f"seed=range(0,{seeds})",
         f"flotilla.sweep.dir={sweep}"],
        cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def metrics_csv(rng, lr, steps, eval_every):
    """A trainer's metrics.csv: the loss falls at a rate set by the learning rate, with noise."""
    rate = 0.02 + 40 * lr
    lines = [HEADER]
    for step in range(steps):
        loss = 2.0 + 3.0 * math.exp(-rate * step) + rng.gauss(0, 0.05)
        row = [str(step), repr(loss), repr(abs(rng.gauss(1, 0.2))), repr(lr), "12000", repr(0.1 * (step + 1))]
        if (step + 1) % eval_every == 0:
            ev = loss + 0.1 + rng.gauss(0, 0.02)
            row += [repr(ev), repr(math.exp(ev)), repr(max(0.0, min(1.0, 1.2 - ev / 4)))]
        else:
            row += ["", "", ""]
        lines.append(",".join(row) + "\n")
    return "".join(lines)


def finish_jobs(sweep, steps, eval_every):
    """Writes what the trainer leaves in each job directory, and marks the jobs COMPLETED."""
    plan_path = os.path.join(sweep, "sweep.json")
    plan = json.load(open(plan_path))
    rng = random.Random(0)
    for job in plan["jobs"]:
        d = os.path.join(sweep, job["dir"])
        lr = float(next(o for o in job["overrides"] if o.startswith("trainer.lr=")).split("=", 1)[1])
        with open(os.path.join(d, "metrics.csv"), "w") as f:
            f.write(metrics_csv(rng, lr, steps, eval_every))
        os.makedirs(os.path.join(d, "final"), exist_ok=True)
        with open(os.path.join(d, "final", "config.json"), "w") as f:
            f.write("{}\n")
        job["state"] = "COMPLETED"
        job["wall_s"] = round(0.1 * steps + rng.random(), 3)
    with open(plan_path, "w") as f:
        json.dump(plan, f, indent=2)
    return len(plan["jobs"])


def run_once(cmd):
    """The wall time and the CPU time (user + system, all threads) of one run of `cmd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def timed(cmds, repeat):
    """For each of `cmds` (the same command of each binary), the median and fastest wall time
    of `repeat` runs and their median CPU time: on a machine shared with other work the CPU
    time is the steadier figure, and with 2 cores the wall time of an idle machine is at least
    half of it. The binaries take turns, run after run, so that both see the same load; a
    binary that fails the command gets `None`."""
    ok = []
    for cmd in cmds:
        try:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            ok.append(True)
        except subprocess.CalledProcessError:
            ok.append(False)
    runs = [([], []) for _ in cmds]
    for _ in range(repeat):
        for i, cmd in enumerate(cmds):
            if ok[i]:
                wall, cpu = run_once(cmd)
                runs[i][0].append(wall)
                runs[i][1].append(cpu)
    return [
        (statistics.median(w), min(w), statistics.median(c)) if ok[i] else None
        for i, (w, c) in enumerate(runs)
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "target/release/flotilla"))
    p.add_argument("--before", help="another flotilla binary to time on the same sweep")
    p.add_argument("--lrs", type=int, default=100)
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--keep", help="write the sweep here (kept) instead of a scratch directory")
    a = p.parse_args()
    binaries = [("after", os.path.abspath(a.binary))]
    if a.before:
        binaries.insert(0, ("before", os.path.abspath(a.before)))

    scratch = None
    if a.keep:
        base = os.path.abspath(a.keep)
        os.makedirs(base, exist_ok=True)
    else:
        scratch = tempfile.mkdtemp()
        base = scratch
    try:
        sweep = os.path.join(base, "sweep")
        if os.path.exists(sweep):
            shutil.rmtree(sweep)
        load_start = os.getloadavg()
        t_prepare = prepare(binaries[-1][1], sweep, a.lrs, a.seeds)
        n = finish_jobs(sweep, a.steps, a.eval_every)
        print(f"{n} jobs ({a.lrs} trainer.lr x {a.seeds} seed), {a.steps} metrics rows each "
              f"(eval every {a.eval_every}); prepared by `run -m --dry-run` in {t_prepare:.1f} s")
        html = os.path.join(base, "report.html")
        commands = [
            ("status", ["status", sweep]),
            ("report", ["report", sweep]),
            ("report --format json", ["report", sweep, "--format", "json"]),
            ("report --group-by seed", ["report", sweep, "--group-by", "seed"]),
            ("report --html", ["report", sweep, "--html", html]),
        ]
        results = {}
        for name, args in commands:
            timings = timed([[binary] + args for _, binary in binaries], a.repeat)
            for (label, _), t in zip(binaries, timings):
                results[(label, name)] = t
        for label, binary in binaries:
            subprocess.run([binary, "report", sweep, "--html", html], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            results[(label, "html bytes")] = os.path.getsize(html)
            os.remove(html)
        cols = " | ".join(f"{label}: wall median (fastest), CPU" for label, _ in binaries)
        print()
        print(f"| command | {cols} |" + (" before / after: wall, CPU |" if a.before else ""))
        print("|---|" + "---|" * len(binaries) + ("---|" if a.before else ""))
        for name, _ in commands:
            cells = []
            for label, _ in binaries:
                r = results[(label, name)]
                cells.append("unsupported" if r is None else f"{r[0]:.3f} s ({r[1]:.3f} s), {r[2]:.3f} s")
            line = f"| {name} | " + " | ".join(cells) + " |"
            if a.before:
                b, f = results[("before", name)], results[("after", name)]
                line += f" {b[0] / f[0]:.2f}x, {b[2] / f[2]:.2f}x |" if b and f else " - |"
            print(line)
        sizes = ", ".join(
            f"{label} {results[(label, 'html bytes')] / 1e6:.2f} MB"
            for label, _ in binaries if (label, "html bytes") in results
        )
        print()
        print(f"HTML page: {sizes}")
        print(f"load average (1, 5, 15 min) at the start: {tuple(round(x, 2) for x in load_start)}, "
              f"at the end: {tuple(round(x, 2) for x in os.getloadavg())}")
    finally:
        if scratch:
            shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
