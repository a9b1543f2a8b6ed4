"""What packing chat data buys, and what keeping packed conversations apart costs.

Makes the chat example of the README (examples/chat/make_example.py: a tiny random Llama with a
ChatML tokenizer and 2000 short conversations), then trains it for STEPS steps three ways with
`flotilla run` (2 local DDP ranks): unpacked (one conversation per window), packed with
`data.packed_attention=window` (causal over the window) and packed with the default
`data.packed_attention=conversation` (positions restart, block-diagonal mask). Prints, per way,
the median step time and the real (non-padding) tokens per second, from each run's metrics.csv
and the data's own counts.

    .venv/bin/python benches/packed_attention.py [--flotilla target/release/flotilla]
        [--seq-len 256] [--steps 100] [--workdir DIR]
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WAYS = [
    ("unpacked", ["data.packing=false"]),
    ("packed, attention over the window", ["data.packing=true", "data.packed_attention=window"]),
    ("packed, each conversation alone", ["data.packing=true"]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flotilla", default=os.path.join(ROOT, "target/release/flotilla"))
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="packed-attention-")
    example = os.path.join(work, "chat")
    if not os.path.exists(os.path.join(example, "chats.jsonl")):
        subprocess.run([sys.executable, os.path.join(ROOT, "examples/chat/make_example.py"), example],
                       check=True)
    print(f"chat example, T={args.seq_len}, {args.steps} steps, global batch 32, 2 DDP ranks on CPU")
    print(f"{'':36} {'examples':>8} {'tokens/example':>14} {'ms/step':>8} {'real tokens/s':>13} {'final loss':>10}")
    for name, extra in WAYS:
        run_dir = os.path.join(work, "run-" + re.sub(r"\W+", "-", name))
        cmd = [args.flotilla, "run", f"model.init_from={example}/base", "data=chat",
               f"data.path={example}/chats.jsonl", f"data.seq_len={args.seq_len}",
               f"trainer.max_steps={args.steps}", "trainer.warmup_steps=10",
               "trainer.eval_every=0", "trainer.checkpoint_every=0",
               f"flotilla.run.dir={run_dir}", *extra]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
        m = re.search(r"in (\d+) examples, (\d+) tokens", out.stderr + out.stdout)
        examples, tokens = int(m.group(1)), int(m.group(2))
        rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
        elapsed = [float(r["elapsed_s"]) for r in rows]
        steps = [b - a for a, b in zip(elapsed, elapsed[1:])][10:]
        step_s = statistics.median(steps)
        per_example = tokens / examples
        real = 32 * per_example / step_s
        print(f"{name:36} {examples:>8} {per_example:>14.1f} {1000 * step_s:>8.1f} {real:>13.0f} "
              f"{float(rows[-1]['loss']):>10.4f}")
        print(f"  {' '.join(cmd[1:])}")


if __name__ == "__main__":
    main()
