"""Oracle for crates/flotilla-train/tests/data.rs: the Hugging Face `tokenizers` library encodes
strings with tokenizer.json files written by flotilla, and trains tokenizers of its own for
flotilla to load.

usage: tokenizers_oracle.py DIR
  DIR/strings.json      list of strings to encode
  DIR/<name>.json       for each name in DIR/flotilla.json (a list): a tokenizer flotilla wrote
writes DIR/py_bpe.json and DIR/py_wordpiece.json, and prints
  {"<name>": [[ids...] per string], ..., "py_bpe": [...], "py_wordpiece": [...]}
"""

import json
import sys

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers


def encode_all(tok, strings):
    return [tok.encode(s, add_special_tokens=False).ids for s in strings]


def main():
    d = sys.argv[1]
    strings = json.load(open(f"{d}/strings.json"))
    out = {}
    for name in json.load(open(f"{d}/flotilla.json")):
        out[name] = encode_all(Tokenizer.from_file(f"{d}/{name}.json"), strings)

    corpus = [
        "The quick brown fox jumps over the lazy dog. " * 3,
        "Pack my box with five dozen liquor jugs!",
        "naïve café déjà vu — 東京 🦀🦀",
        "def f(x):\n    return x * 2\n\n",
    ] * 5

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<|endoftext|>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    bpe.save(f"{d}/py_bpe.json")
    out["py_bpe"] = encode_all(bpe, strings)

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(
        corpus,
        trainers.WordPieceTrainer(
            vocab_size=200, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"], show_progress=False
        ),
    )
    wp.save(f"{d}/py_wordpiece.json")
    out["py_wordpiece"] = encode_all(wp, strings)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
