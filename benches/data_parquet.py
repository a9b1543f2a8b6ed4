#!/usr/bin/env python3
"""Benchmark: chat data from Parquet at scale -- flotilla's `data=chat` on a Parquet file of N
conversations (peak resident memory, wall and CPU time of a cold preparation), and Hugging Face
`datasets.Dataset.from_parquet(...).map(...)` with transformers on the same records.

Usage:
  .venv/bin/python benches/data_parquet.py --generate N OUT.parquet [--words LO HI] [--seed S]
      N synthetic conversations of benches/chat_preprocess.py (1-4 turns, a system prompt in
      about a third), each message of LO-HI words (log-uniform; default 20-400 as there),
      written as JSON lines and converted by pyarrow into a Parquet file (snappy, row groups of
      64k) with a list<struct<role, content>> `messages` column.
  .venv/bin/python benches/data_parquet.py --flotilla FLOTILLA_TRAIN TOKENIZER_DIR DATA.parquet [--warm]
      `FLOTILLA_TRAIN data show --num 0 --format json data=chat data.path=DATA ...` with the
      cache beside DATA removed first (cold); prints wall s, CPU s (user + system of the
      process) and its peak RSS (ru_maxrss), from wait4. With --warm, the same command again
      on the cache the cold run wrote (read, not prepared), measured the same way.
  .venv/bin/python benches/data_parquet.py --hf TOKENIZER_DIR DATA.parquet
      datasets.Dataset.from_parquet(DATA).map(fn, num_proc=os.cpu_count()) with fn
      benches/chat_preprocess.py's (apply_chat_template, tokenize with offsets, the assistant
      mask rule, as tests/oracle/chat_oracle.py does); prints wall s and CPU s of this process
      and its workers.

The tiny tokenizers come from tests/oracle/make_chat_tokenizers.py. Record the commands and
figures in benches/results/data-parquet-<date>.md.
"""

import argparse
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chat_preprocess as cp  # noqa: E402


def generate(n, out, words, seed):
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    lo, hi = words
    cp.message_words = lambda rng: int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out))) as tmp:
        jsonl = os.path.join(tmp, "data.jsonl")
        rng = random.Random(seed)
        with open(jsonl, "w", encoding="utf-8") as f:
            for _ in range(n):
                f.write(json.dumps(cp.conversation(rng), ensure_ascii=False) + "\n")
        table = pj.read_json(jsonl, read_options=pj.ReadOptions(block_size=64 << 20))
        pq.write_table(table, out, row_group_size=65536, compression="snappy")
    print(f"wrote {n} conversations ({os.path.getsize(out) / 2**20:.1f} MiB) to {out}")


def run_flotilla(binary, tok_dir, data, warm=False):
    cache = os.path.join(os.path.dirname(os.path.abspath(data)), ".flotilla-cache")
    shutil.rmtree(cache, ignore_errors=True)
    cmd = [
        binary, "data", "show", "--num", "0", "--format", "json", "data=chat",
        f"data.path={os.path.abspath(data)}", f"data.tokenizer={os.path.abspath(tok_dir)}",
        "data.seq_len=4096", "model.vocab_size=1024", "model.max_position_embeddings=4096",
    ]
    for label in ["cold", "warm"] if warm else ["cold"]:
        time_child(cmd, label)


def time_child(cmd, label):
    """Runs `cmd` (a `data show` of the summary only) and prints its times and peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=os.path.dirname(HERE), stdout=out, stderr=err)
        # wait4's rusage is this child's alone (RUSAGE_CHILDREN keeps the largest peak of every
        # child waited for: the cold run's when this is the warm one).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        secs = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"data_parquet: {' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    summary = json.loads(stdout)["summary"]
    print(
        f"flotilla ({label}): {summary['examples']} conversations, {summary['tokens']} tokens in "
        f"{secs:.1f} s; {cpu:.1f} CPU s ({cpu / summary['examples'] * 1e3:.3f} CPU ms per "
        f"conversation); peak RSS {usage.ru_maxrss / 2**20:.2f} GiB (KiB: {usage.ru_maxrss})"
    )


def run_hf(tok_dir, data):
    cp.need_datasets()
    import datasets
    import transformers

    datasets.disable_progress_bars()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cp._tokenizer(tok_dir)
    nproc = os.cpu_count() or 1
    features = datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "trained": datasets.Sequence(datasets.Value("int8")),
        "n_tokens": datasets.Value("int64"),
        "error": datasets.Value("string"),
    })
    cache = tempfile.mkdtemp(prefix="parquet-bench-hf-", dir=os.path.dirname(os.path.abspath(data)))
    try:
        cpu0 = cp.cpu_seconds()
        t0 = time.perf_counter()
        ds = datasets.Dataset.from_parquet(data, cache_dir=cache)
        out = ds.map(cp.hf_example, fn_kwargs={"tok_dir": tok_dir}, num_proc=nproc,
                     remove_columns=ds.column_names, features=features,
                     load_from_cache_file=False)
        secs = time.perf_counter() - t0
        cpu = cp.cpu_seconds() - cpu0
        tokens = sum(out["n_tokens"])
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(
        f"hf (datasets {datasets.__version__}, transformers {transformers.__version__}, "
        f"num_proc={nproc}): {len(out)} conversations, {tokens} tokens in {secs:.1f} s; "
        f"{cpu:.1f} CPU s ({cpu / len(out) * 1e3:.3f} CPU ms per conversation)"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--generate", nargs=2, metavar=("N", "OUT"))
    g.add_argument("--flotilla", nargs=3, metavar=("FLOTILLA_TRAIN", "TOKENIZER_DIR", "DATA"))
    g.add_argument("--hf", nargs=2, metavar=("TOKENIZER_DIR", "DATA"))
    ap.add_argument("--words", nargs=2, type=int, default=[20, 400], metavar=("LO", "HI"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm", action="store_true", help="with --flotilla: a second, warm run")
    a = ap.parse_args()
    if a.generate:
        generate(int(a.generate[0]), a.generate[1], a.words, a.seed)
    elif a.flotilla:
        run_flotilla(*a.flotilla, warm=a.warm)
    else:
        run_hf(*a.hf)


if __name__ == "__main__":
    main()
