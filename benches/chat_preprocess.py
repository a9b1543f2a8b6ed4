#!/usr/bin/env python3
"""Benchmark: chat-data preprocessing (render with the chat template, tokenize, assistant-only loss
mask), Hugging Face `datasets` + `transformers` side by side with flotilla's `data=chat`.

Usage:
  .venv/bin/python benches/chat_preprocess.py --generate N OUT.jsonl [--seed S]
      writes N synthetic conversations: 1-4 user/assistant turns, a system prompt in about a third
      of them, messages of 20-400 words (log-uniform, so most are short and a few long), made of
      English sentences with some numbers, lists and code. The same N and seed give the same file.
  .venv/bin/python benches/chat_preprocess.py --hf TOKENIZER_DIR DATA.jsonl
      datasets.Dataset.from_json(DATA).map(fn, num_proc=os.cpu_count()), where fn does what
      tests/oracle/chat_oracle.py does under --train-on assistant (apply_chat_template, tokenize
      with offsets, the assistant mask rule); prints conversations/s and tokens/s. The datasets
      cache goes to a fresh temporary directory, so every run is cold.
  .venv/bin/python benches/chat_preprocess.py --flotilla FLOTILLA_BIN TOKENIZER_DIR DATA.jsonl
      times `FLOTILLA_BIN data show --num 0 --format json data=chat data.path=DATA
      data.tokenizer=TOKENIZER_DIR data.seq_len=4096 model.vocab_size=1024
      model.max_position_embeddings=4096`, first after deleting
      <dirname(DATA)>/.flotilla-cache/ (cold), then again with the cache in place (warm).
  .venv/bin/python benches/chat_preprocess.py --compare FLOTILLA_BIN TOKENIZER_DIR DATA.jsonl
      both of the above, then a Markdown table (seconds, conversations/s, tokens/s, speed-up over
      Hugging Face) to paste into benches/results/chat-preprocess-<date>.md.

The tiny tokenizers come from tests/oracle/make_chat_tokenizers.py, e.g.
  .venv/bin/python tests/oracle/make_chat_tokenizers.py /tmp/chat-tok
  .venv/bin/python benches/chat_preprocess.py --generate 200000 /tmp/chat-bench/data.jsonl
  .venv/bin/python benches/chat_preprocess.py --hf /tmp/chat-tok/qwen2.5 /tmp/chat-bench/data.jsonl

`datasets` is not a dependency of the rest of the Python tooling; --hf and --compare need it:
  .venv/bin/python -m pip install datasets

Token counts of the flotilla side are read from its JSON output when it has a field named like a
token or conversation count (see flotilla_counts); otherwise conversations are the file's lines
and tokens/s is left blank.
"""

import argparse
import datetime
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE_DIR = os.path.join(ROOT, "tests", "oracle")

# ---------------------------------------------------------------- synthetic conversations

WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this from
or had by word but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat room friend began
idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain
girl usual young ready above ever red list though feel talk bird soon body dog family direct pose
leave song measure door product black short numeral class wind question happen complete ship area
half rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest
correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot
system busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran
check game shape equate hot miss brought heat snow tire bring yes distant fill east paint language
among
""".split()

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful assistant. Answer briefly and say when you are not sure.",
    "You are a patient teacher who explains each step.",
    "You write clear, correct code and explain it in plain words.",
    "You are a travel guide. Keep answers practical.",
]


def sentence(rng):
    n = rng.randint(5, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.15:
        words.insert(rng.randrange(len(words)), str(rng.choice([2, 3, 7, 10, 12, 42, 100, 365, 2024])))
    if rng.random() < 0.2 and n > 8:
        words[rng.randrange(1, n - 2)] += ","
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", "!"])


def passage(rng, n_words):
    """About n_words words: paragraphs of sentences, now and then a list or a code block."""
    parts, count = [], 0
    while count < n_words:
        r = rng.random()
        if r < 0.08:
            items = [f"{i + 1}. {sentence(rng)}" for i in range(rng.randint(2, 5))]
            block = "\n".join(items)
        elif r < 0.12:
            name = rng.choice(WORDS)
            block = f"```python\ndef {name}(x):\n    return x * {rng.randint(2, 9)}\n```"
        else:
            block = " ".join(sentence(rng) for _ in range(rng.randint(1, 4)))
        parts.append(block)
        count += len(block.split())
    return "\n\n".join(parts)


def message_words(rng):
    # log-uniform on [20, 400]: median ~90 words, mean ~127
    return int(round(math.exp(rng.uniform(math.log(20), math.log(400)))))


def conversation(rng):
    messages = []
    if rng.random() < 0.35:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": passage(rng, message_words(rng))})
        messages.append({"role": "assistant", "content": passage(rng, message_words(rng))})
    return {"messages": messages}


def generate(n, out, seed):
    rng = random.Random(seed)
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    start = time.perf_counter()
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(json.dumps(conversation(rng), ensure_ascii=False) + "\n")
    size = os.path.getsize(out)
    print(f"wrote {n} conversations ({size / 2**20:.1f} MiB) to {out} in {time.perf_counter() - start:.1f} s")


# ---------------------------------------------------------------- Hugging Face side

_TOK = {}


def _tokenizer(tok_dir):
    if tok_dir not in _TOK:
        from transformers import AutoTokenizer

        _TOK[tok_dir] = AutoTokenizer.from_pretrained(tok_dir)
    return _TOK[tok_dir]


def hf_example(example, tok_dir):
    """One conversation as the oracle (and flotilla) handle it under train_on=assistant."""
    if ORACLE_DIR not in sys.path:
        sys.path.insert(0, ORACLE_DIR)
    import chat_oracle as co

    tok = _tokenizer(tok_dir)
    messages = example["messages"]
    try:
        text = co.render(tok, messages, False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        spans, how = co.assistant_spans(tok, messages, text, co.added_spans(tok, ids, offsets), "assistant")
    except co.ConversationError as e:
        return {"input_ids": [], "trained": [], "n_tokens": 0, "error": str(e)}
    trained = (co.overlap_mask if how == "markers" else co.trained_mask)(offsets, spans)
    return {"input_ids": ids, "trained": trained, "n_tokens": len(ids), "error": ""}


def need_datasets():
    try:
        import datasets  # noqa: F401
    except ImportError:
        sys.exit(
            "chat_preprocess: the Hugging Face side needs the `datasets` package, which is not installed.\n"
            "Install it with:  .venv/bin/python -m pip install datasets"
        )


def run_hf(tok_dir, data):
    need_datasets()
    import datasets
    import transformers

    datasets.disable_progress_bars()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _tokenizer(tok_dir)  # fail early on a bad directory
    nproc = os.cpu_count() or 1
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "trained": datasets.Sequence(datasets.Value("int8")),
            "n_tokens": datasets.Value("int64"),
            "error": datasets.Value("string"),
        }
    )
    cache = tempfile.mkdtemp(prefix="chat-bench-hf-", dir=os.path.dirname(os.path.abspath(data)))
    try:
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        ds = datasets.Dataset.from_json(data, cache_dir=cache)
        t1 = time.perf_counter()
        out = ds.map(
            hf_example,
            fn_kwargs={"tok_dir": tok_dir},
            num_proc=nproc,
            remove_columns=ds.column_names,
            features=features,
            load_from_cache_file=False,
        )
        t2 = time.perf_counter()
        cpu = cpu_seconds() - cpu0
        tokens = sum(out["n_tokens"])
        errors = sum(1 for e in out["error"] if e)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    res = {
        "name": f"Hugging Face (datasets {datasets.__version__}, transformers {transformers.__version__}, "
        f"num_proc={nproc})",
        "seconds": t2 - t0,
        "cpu_seconds": cpu,
        "load_seconds": t1 - t0,
        "map_seconds": t2 - t1,
        "conversations": len(out),
        "tokens": tokens,
        "errors": errors,
    }
    print(
        f"hf: {res['conversations']} conversations, {tokens} tokens, {errors} rejected; "
        f"from_json {res['load_seconds']:.1f} s + map {res['map_seconds']:.1f} s = {res['seconds']:.1f} s; "
        f"{res['conversations'] / res['seconds']:.0f} conversations/s, {tokens / res['seconds']:.0f} tokens/s; "
        f"{cpu:.1f} CPU s"
    )
    return res


# ---------------------------------------------------------------- flotilla side

COUNT_KEYS = {
    "conversations": ("conversations", "num_conversations", "records", "num_records", "examples", "rows"),
    "tokens": ("tokens", "num_tokens", "total_tokens", "n_tokens"),
}


def flotilla_counts(stdout):
    """Conversation and token counts from `data show --format json` output, when it has fields
    named like them (searched at any depth of the last JSON value printed)."""
    value = None
    try:
        value = json.loads(stdout)
    except json.JSONDecodeError:
        for line in reversed(stdout.strip().splitlines()):
            try:
                value = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    found = {}

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                for what, names in COUNT_KEYS.items():
                    if k in names and isinstance(x, int) and what not in found:
                        found[what] = x
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(value)
    return found.get("conversations"), found.get("tokens")


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def run_flotilla(binary, tok_dir, data):
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        sys.exit(f"chat_preprocess: {binary} is not an executable file")
    cache = os.path.join(os.path.dirname(os.path.abspath(data)), ".flotilla-cache")
    cmd = [
        binary,
        "data",
        "show",
        "--num",
        "0",
        "--format",
        "json",
        "data=chat",
        f"data.path={os.path.abspath(data)}",
        f"data.tokenizer={os.path.abspath(tok_dir)}",
        # conversations up to 4096 tokens; a model whose vocabulary and positions fit them
        "data.seq_len=4096",
        "model.vocab_size=1024",
        "model.max_position_embeddings=4096",
    ]
    lines = count_lines(data)
    results = []
    for label in ("cold", "warm"):
        if label == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        secs = time.perf_counter() - t0
        cpu = cpu_seconds() - cpu0
        if proc.returncode != 0:
            sys.exit(f"chat_preprocess: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        conversations, tokens = flotilla_counts(proc.stdout)
        res = {
            "name": f"flotilla data=chat, {label} cache",
            "seconds": secs,
            "cpu_seconds": cpu,
            "conversations": conversations if conversations is not None else lines,
            "tokens": tokens,
        }
        tok_s = f"{tokens / secs:.0f} tokens/s" if tokens is not None else "tokens/s n/a (no token count in the output)"
        print(f"flotilla ({label}): {res['conversations']} conversations in {secs:.2f} s; "
              f"{res['conversations'] / secs:.0f} conversations/s, {tok_s}; {cpu:.1f} CPU s")
        results.append(res)
    return results


# ---------------------------------------------------------------- report

def table(rows, baseline):
    out = [
        "| pipeline | wall s | CPU s | conversations/s | tokens/s | speed-up (wall) | speed-up (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        tokens = r["tokens"] if r["tokens"] is not None else baseline["tokens"]
        out.append(
            f"| {r['name']} | {r['seconds']:.2f} | {r['cpu_seconds']:.1f} | "
            f"{r['conversations'] / r['seconds']:,.0f} | {tokens / r['seconds']:,.0f} | "
            f"{baseline['seconds'] / r['seconds']:.1f}x | "
            f"{baseline['cpu_seconds'] / max(r['cpu_seconds'], 1e-9):.1f}x |"
        )
    return "\n".join(out)


def cpu_seconds():
    """User + system CPU time of this process and of its children that have been waited for
    (datasets' worker processes, the flotilla process): the work done, whatever else the machine
    is running, where wall time depends on how many cores were free."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def machine():
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return f"{os.cpu_count()} {platform.machine()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


def compare(binary, tok_dir, data):
    hf = run_hf(tok_dir, data)
    fl = run_flotilla(binary, tok_dir, data)
    print()
    print(f"Chat preprocessing, {datetime.date.today().isoformat()}: {hf['conversations']} conversations "
          f"({os.path.getsize(data) / 2**20:.0f} MiB) of {os.path.basename(data)}, tokenizer "
          f"{os.path.basename(os.path.normpath(tok_dir))}, assistant-only mask. Machine: {machine()}.")
    if any(r["tokens"] is None for r in fl):
        print("(flotilla's output has no token count: its tokens/s uses the Hugging Face total.)")
    print()
    print(table([hf] + fl, hf))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--generate", nargs=2, metavar=("N", "OUT"))
    g.add_argument("--hf", nargs=2, metavar=("TOKENIZER_DIR", "DATA"))
    g.add_argument("--flotilla", nargs=3, metavar=("FLOTILLA_BIN", "TOKENIZER_DIR", "DATA"))
    g.add_argument("--compare", nargs=3, metavar=("FLOTILLA_BIN", "TOKENIZER_DIR", "DATA"))
    ap.add_argument("--seed", type=int, default=0, help="for --generate (default 0)")
    args = ap.parse_args()
    if args.generate:
        n, out = args.generate
        try:
            n = int(n)
        except ValueError:
            sys.exit(f"chat_preprocess: --generate N: not a number: {n}")
        generate(n, out, args.seed)
        return
    for d in [(args.hf or args.flotilla or args.compare)[-2]]:
        if not os.path.isfile(os.path.join(d, "tokenizer.json")):
            sys.exit(f"chat_preprocess: {d} is not a tokenizer directory (no tokenizer.json)")
    data = (args.hf or args.flotilla or args.compare)[-1]
    if not os.path.isfile(data):
        sys.exit(f"chat_preprocess: no data file {data}")
    if args.hf:
        run_hf(*args.hf)
    elif args.flotilla:
        run_flotilla(*args.flotilla)
    else:
        compare(*args.compare)


if __name__ == "__main__":
    main()
