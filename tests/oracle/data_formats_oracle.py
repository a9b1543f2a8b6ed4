"""Writes the data files of crates/flotilla-train/tests/data_formats.rs with the real writers, and
what transformers makes of the records, in one Python start-up.

usage: data_formats_oracle.py OUTDIR

OUTDIR/tok/llama3/         the tiny Llama 3.1 tokenizer of make_chat_tokenizers.py
OUTDIR/conv.jsonl          twelve conversations ({role, content} messages; one turn with a
                           `name` key, so Arrow's message struct has a field that is null
                           elsewhere)
OUTDIR/conv.parquet        the same, written by pyarrow (snappy, nested list<struct> column)
OUTDIR/hub/                the Hub's layout: data/train-0000{0,1}-of-00002.parquet (7 + 5
                           records), data/test-00000-of-00001.parquet (2 other ones), README.md
OUTDIR/saved/              datasets.Dataset.save_to_disk of the twelve
OUTDIR/saved_dict/         datasets.DatasetDict({train: twelve, test: two}).save_to_disk
OUTDIR/pc_chat.parquet     conversational prompt-completion records
OUTDIR/pc_text.jsonl       standard (string) prompt-completion records
OUTDIR/alpaca.jsonl        Alpaca records (one with an empty input)
OUTDIR/mix_a.jsonl, mix_b.parquet   40 and 20 records whose texts name their source and index
OUTDIR/corrupt.parquet     conv.parquet cut in half
OUTDIR/wrong_type.parquet  `messages` as an int64 column
OUTDIR/unknown.jsonl       records with no known format's keys
OUTDIR/preference.jsonl    {prompt, chosen, rejected} records

The last line of output is JSON: for each prompt-completion record, transformers' ids of
apply_chat_template(prompt + completion) (conversational) or tokenizer(prompt + completion +
eos) (standard), and the length of the prefix they share with the prompt's ids (rendered with
add_generation_prompt=True, or tokenizer(prompt)) -- the tokens TRL's completion_only_loss leaves
out; for each Alpaca record, the ids of its conversation (user: instruction + "\\n\\n" + input,
assistant: output).
"""

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import make_chat_tokenizers as mct  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."}],
    [{"role": "system", "content": "Answer in one sentence."},
     {"role": "user", "content": "How many days are in a week?"},
     {"role": "assistant", "content": "There are seven days in a week."}],
    [{"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Hi. What can I do for you?"},
     {"role": "user", "content": "Tell me a short story."},
     {"role": "assistant", "content": "A small robot\nlearned to paint the sea."}],
    [{"role": "user", "content": "Wie spät ist es? ☕"},
     {"role": "assistant", "content": "Zeit für Kaffee — immer."}],
    [{"role": "user", "content": "2 + 2 = ?", "name": "student"},
     {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Name three colours."},
     {"role": "assistant", "content": "Red, green and blue."}],
    [{"role": "user", "content": "Spell cat backwards."},
     {"role": "assistant", "content": "tac"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Why is the sky blue?"},
     {"role": "assistant", "content": "Rayleigh scattering."}],
    [{"role": "user", "content": "Translate 'thank you' to French."},
     {"role": "assistant", "content": "Merci."}],
    [{"role": "user", "content": "Is 7 prime?"},
     {"role": "assistant", "content": "Yes, 7 is prime."},
     {"role": "user", "content": "And 9?"},
     {"role": "assistant", "content": "No: 9 = 3 x 3."}],
    [{"role": "user", "content": "Say nothing but 'ok'."},
     {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "What is the boiling point of water?"},
     {"role": "assistant", "content": "100 degrees Celsius at sea level."}],
]
TEST_CONVERSATIONS = [
    [{"role": "user", "content": "Held out?"}, {"role": "assistant", "content": "Held out."}],
    [{"role": "user", "content": "Also held out?"}, {"role": "assistant", "content": "Yes."}],
]
PC_CHAT = [
    {"prompt": [{"role": "user", "content": "What colour is the sky?"}],
     "completion": [{"role": "assistant", "content": "It is blue."}]},
    {"prompt": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Capital of Italy?"}],
     "completion": [{"role": "assistant", "content": "Rome."}]},
    {"prompt": [{"role": "user", "content": "Count to three."}],
     "completion": [{"role": "assistant", "content": "One, two, three."}]},
]
PC_TEXT = [
    {"prompt": "The sky is", "completion": " blue."},
    {"prompt": "2 + 2 =", "completion": " 4"},
    {"prompt": "Paris is the capital of", "completion": " France."},
]
ALPACA = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hello.", "input": "", "output": "Hello!"},
    {"instruction": "Name the colour.", "input": "The sky on a clear day", "output": "Blue."},
]


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "tok" / "llama3"
    for name, build in mct.family_specs():
        if name == "llama3":
            tok, cfg, jinja = build()
            mct.write(tok_dir, tok, cfg, jinja)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))

    records = [{"messages": m} for m in CONVERSATIONS]
    test_records = [{"messages": m} for m in TEST_CONVERSATIONS]
    write_jsonl(out / "conv.jsonl", records)
    table = pa.Table.from_pylist(records)
    pq.write_table(table, out / "conv.parquet")
    hub = out / "hub" / "data"
    hub.mkdir(parents=True, exist_ok=True)
    (out / "hub" / "README.md").write_text("---\nlicense: mit\n---\n")
    pq.write_table(pa.Table.from_pylist(records[:7], schema=table.schema),
                   hub / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(records[7:], schema=table.schema),
                   hub / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(test_records), hub / "test-00000-of-00001.parquet")
    for d in ("saved", "saved_dict"):
        shutil.rmtree(out / d, ignore_errors=True)
    train = datasets.Dataset.from_list(records)
    train.save_to_disk(str(out / "saved"))
    datasets.DatasetDict({"train": train, "test": datasets.Dataset.from_list(test_records)}) \
        .save_to_disk(str(out / "saved_dict"))

    pq.write_table(pa.Table.from_pylist(PC_CHAT), out / "pc_chat.parquet")
    write_jsonl(out / "pc_text.jsonl", PC_TEXT)
    write_jsonl(out / "alpaca.jsonl", ALPACA)
    write_jsonl(out / "mix_a.jsonl", [{"text": f"source a record {i}"} for i in range(40)])
    pq.write_table(pa.Table.from_pylist([{"text": f"source b record {i}"} for i in range(20)]),
                   out / "mix_b.parquet")
    whole = (out / "conv.parquet").read_bytes()
    (out / "corrupt.parquet").write_bytes(whole[: len(whole) // 2])
    pq.write_table(pa.table({"messages": pa.array([1, 2, 3], pa.int64())}),
                   out / "wrong_type.parquet")
    write_jsonl(out / "unknown.jsonl", [{"question": "q", "answer": "a"}])
    write_jsonl(out / "preference.jsonl",
                [{"prompt": "q", "chosen": "good", "rejected": "bad"}])

    def ids(text, special):
        return tok(text, add_special_tokens=special)["input_ids"]

    pc_chat = []
    for r in PC_CHAT:
        full = ids(tok.apply_chat_template(r["prompt"] + r["completion"], tokenize=False), False)
        prompt = ids(tok.apply_chat_template(r["prompt"], tokenize=False,
                                             add_generation_prompt=True), False)
        pc_chat.append({"input_ids": full, "prompt_len": common_prefix(prompt, full)})
    pc_text = []
    for r in PC_TEXT:
        completion = r["completion"]
        if not completion.endswith(tok.eos_token):
            completion += tok.eos_token
        full = ids(r["prompt"] + completion, True)
        pc_text.append({"input_ids": full, "prompt_len": common_prefix(ids(r["prompt"], True), full)})
    alpaca = []
    for r in ALPACA:
        user = r["instruction"] + ("\n\n" + r["input"] if r["input"] else "")
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": r["output"]}]
        text = tok.apply_chat_template(messages, tokenize=False)
        alpaca.append({"text": text, "input_ids": ids(text, False)})
    print(json.dumps({"pc_chat": pc_chat, "pc_text": pc_text, "alpaca": alpaca}))


if __name__ == "__main__":
    main()
