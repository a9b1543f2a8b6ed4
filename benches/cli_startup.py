#!/usr/bin/env python3
"""Benchmark: what a login node pays for the `flotilla` CLI, side by side with hydra-core.

Each row runs a command as a fresh process several times and prints the median wall time and the
largest peak RSS (the child's ru_maxrss):

- `flotilla --version`, `flotilla compose` of the shipped conf/, a 10,000-job
  `flotilla plan -m --format json`, and `flotilla compose` of a "billion laughs" YAML (9 levels of
  anchors x 9 aliases; refused);
- hydra-core composing the same conf/ in a fresh `python` process (import, initialize, compose,
  print), the thing a Hydra user waits for at every launch.

It also reports whether the binary links libtorch, libc10 or a CUDA library (readelf -d).

Usage: .venv/bin/python benches/cli_startup.py [--binary target/release/flotilla] [--repeats 10]
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONF = os.path.join(ROOT, "conf")
SWEEP = ["+bench_a=range(0,100)", "+bench_b=range(0,100)"]

HYDRA_COMPOSE = f"""
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
with initialize_config_dir(config_dir={CONF!r}, version_base=None):
    print(OmegaConf.to_yaml(compose(config_name="config")))
"""


def billion_laughs(path):
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, 10):
        lines.append(f"lol{level}: &lol{level} [" + ", ".join([f"*lol{level - 1}"] * 9) + "]")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def measure(cmd, repeats, expect_ok=True):
    """Median wall seconds and the largest peak RSS in MiB over `repeats` fresh processes."""
    walls, rss = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = proc.communicate()
        walls.append(time.perf_counter() - start)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss.append(usage.ru_maxrss / 1024)
        if expect_ok and proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-2000:]}")
        if not expect_ok and proc.returncode == 0:
            sys.exit(f"{' '.join(cmd)} was expected to fail")
    return statistics.median(walls), max(rss), proc.returncode, err.decode().strip()


def measure_isolated(cmd, repeats, expect_ok=True):
    """measure() in a fresh Python child, so ru_maxrss belongs to these commands alone."""
    code = (
        "import sys, json; sys.path.insert(0, %r); import cli_startup as b; "
        "print(json.dumps(b.measure(%r, %d, %r)))" % (os.path.dirname(__file__), cmd, repeats, expect_ok)
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    import json

    return json.loads(out.strip().splitlines()[-1])


def linked_heavy_libraries(binary):
    out = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True).stdout
    needed = [l.split("[")[1].rstrip("]") for l in out.splitlines() if "(NEEDED)" in l]
    heavy = [n for n in needed if any(k in n for k in ("torch", "c10", "cuda", "nccl", "cudart"))]
    return needed, heavy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "flotilla"))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-hydra", action="store_true")
    args = ap.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"{args.binary} not found: build it with `cargo build --release`")
    needed, heavy = linked_heavy_libraries(args.binary)
    print(f"binary: {args.binary} ({os.path.getsize(args.binary) / 2**20:.1f} MiB)")
    print(f"NEEDED: {', '.join(needed)}")
    print(f"links libtorch/libc10/CUDA: {'yes: ' + ', '.join(heavy) if heavy else 'no'}")
    print()
    tmp = tempfile.mkdtemp()
    bomb_dir = os.path.join(tmp, "bomb")
    os.makedirs(bomb_dir)
    billion_laughs(os.path.join(bomb_dir, "config.yaml"))
    rows = [
        ("flotilla --version", [args.binary, "--version"], args.repeats, True),
        ("flotilla compose (shipped conf)", [args.binary, "compose", "--config-dir", CONF], args.repeats, True),
        (
            "flotilla plan -m --format json (10,000 jobs)",
            [args.binary, "plan", "-m", "--format", "json", "--config-dir", CONF, *SWEEP],
            max(3, args.repeats // 3),
            True,
        ),
        ("flotilla compose (billion laughs, refused)", [args.binary, "compose", "--config-dir", bomb_dir], 3, False),
    ]
    python = os.path.join(ROOT, ".venv", "bin", "python")
    if not args.no_hydra and os.path.exists(python):
        rows.append(("hydra-core compose (shipped conf, fresh python)", [python, "-c", HYDRA_COMPOSE], 3, True))
    print(f"{'command':52} {'median wall':>12} {'peak RSS':>10}")
    for name, cmd, repeats, ok in rows:
        wall, rss, code, err = measure_isolated(cmd, repeats, ok)
        note = f"  exit {code}: {err.splitlines()[-1][:90]}" if not ok else ""
        print(f"{name:52} {wall * 1000:9.1f} ms {rss:7.1f} MiB{note}")


if __name__ == "__main__":
    main()
