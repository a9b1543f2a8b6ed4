"""Builds tiny Hugging Face tokenizer directories, one per chat-model family, for the chat-data
oracle (tests/oracle/chat_oracle.py) and the chat preprocessing benchmark.

usage: make_chat_tokenizers.py OUTDIR

Writes, in a few seconds and without any download:

  OUTDIR/llama3/      byte-level BPE, Llama 3.1 Instruct template (tokenizer_config.json string)
  OUTDIR/qwen2.5/     byte-level BPE, Qwen2.5 Instruct template in the named-list form
                      [{"name": "tool_use", ...}, {"name": "default", ...}]
  OUTDIR/mistral/     Metaspace + byte fallback BPE, Mistral 7B Instruct v0.3 template (string)
  OUTDIR/gemma/       "▁" spaces (no prefix space) + byte fallback, Gemma 2 template in a separate
                      chat_template.jinja file (tokenizer_config.json has no chat_template key)
  OUTDIR/phi3/        Metaspace + byte fallback, Phi-3 mini instruct template (string)
  OUTDIR/llama2/      Metaspace + byte fallback, Llama 2 chat template (string); bos/eos/unk given
                      as {"__type": "AddedToken", "content": ...} objects, as that model's config has them
  OUTDIR/no_template/ a byte-level tokenizer with no chat template at all (for error tests)

and one directory per template of TEMPLATE_FAMILIES below (DeepSeek-R1 and its Qwen distill,
Llama 3.2, Gemma 3, Phi-4, Phi-4 mini, Phi-3.5, Mistral Nemo, Qwen3, Command R7B, Granite 3.2,
Falcon3, Falcon 7B instruct, Functionary medium v3.1, OLMo, GLM-4): that template (a tokenizer_config.json string) on a tokenizer of its
model's kind, byte-level (sharing the llama3 or qwen2.5 vocabulary) or "▁" spaces with byte fallback
(Gemma 3, Phi-3.5), with the special tokens the template writes added.

Each directory has a tokenizer.json built with the `tokenizers` library (a small BPE trained on
the short English corpus below, so the vocabularies are tiny -- 700 to 870 tokens -- but the
pipelines -- regex split + ByteLevel, or "▁" for spaces + byte fallback -- are those of the real
tokenizers), the family's special
tokens registered as special added tokens at the ids where the real vocabularies have them (at the
start of the vocabulary for the SentencePiece-style families, after it for the byte-level ones),
and a tokenizer_config.json. The templates are read from tests/oracle/fixtures/chat_templates/
(see SOURCES.md there). The output is byte-for-byte the same on every run.

After writing, each directory is loaded with transformers.AutoTokenizer, a sample conversation is
rendered with apply_chat_template, and transformers' tokenizer and tokenizer.json read on its own
must give the same ids and offsets on it, on a few stress strings and on every conversation of
tests/oracle/fixtures/chat/conversations.jsonl (see check()); the script fails otherwise.

    .venv/bin/python tests/oracle/make_chat_tokenizers.py /tmp/chat-tok
"""

import json
import os
import sys
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "chat_templates"

# Llama 3's and Qwen2's pre-tokenizer split patterns (the regexes of their tokenizer.json files).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# A short English corpus, enough for a few hundred merges. Chat words (user, assistant, model,
# system, question, answer) are in it so that turn headers become single tokens, as in the real
# vocabularies.
CORPUS = """\
The user asked a question and the assistant gave a short answer.
You are a helpful assistant. Answer the question as well as you can.
The model reads the system prompt, then the user message, then writes its reply.
Hello! How are you today? I am fine, thank you. What can I do for you?
Please explain how a train travels from one city to another city.
A train runs on rails. The engine pulls the cars along the track at a steady speed.
Write a short poem about the sea, the wind and the light on the water.
The sea is wide and grey; the wind is cold; the light is soft in the evening.
What is the capital of France? The capital of France is Paris.
How many days are there in a week? There are seven days in a week.
Can you help me write a function that adds two numbers together?
def add(a, b):
    return a + b
Here is a list of three things to remember:
1. Drink water.
2. Sleep well.
3. Read a good book every month.
The quick brown fox jumps over the lazy dog, and the dog does not mind at all.
In the morning the city is quiet; by noon the streets are full of people and noise.
She said that the weather would be better tomorrow, so they planned a walk by the river.
Thank you for your help. You are welcome, and have a good day.
Tell me a story about a small robot who wanted to learn how to paint.
Once upon a time there was a small robot who lived in a house near the forest.
Every day the robot watched the painter at work, and every night it tried to paint the moon.
The answer depends on the question; a good question often holds half of its answer.
Summarize the text in one sentence, then list the main points.
The main points are: the plan is simple, the cost is low, and the time is short.
Translate the sentence into French: the cat sleeps on the warm chair.
Le chat dort sur la chaise chaude.
Numbers like 42, 1000 and 3.14 appear in many examples and tests.
"""


def corpus_lines():
    # Several passes so that frequent pairs are clearly ahead of rare ones.
    return CORPUS.splitlines() * 4


def byte_level_tokenizer(split_pattern, vocab_size, nfc):
    """A Llama 3 / Qwen2-style tokenizer: regex split + ByteLevel, BPE over the byte alphabet."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split_pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return tok


def sentencepiece_tokenizer(leading, vocab_size, prepend_scheme, unk="<unk>"):
    """A SentencePiece-style BPE as the Llama 2 / Mistral / Gemma / Phi-3 tokenizer.json files
    have it: "▁" for spaces, byte fallback to <0xXX> tokens, vocabulary laid out as `leading`
    tokens (specials, at their real ids), then the 256 byte tokens, then the pieces.

    prepend_scheme "first" (Llama 2, Mistral, Phi-3): a Metaspace pre-tokenizer that also puts a
    "▁" before the first word. "never" (Gemma): no prefix space, with Gemma's own pipeline, a
    Replace(" ", "▁") normalizer and a Split(" ") pre-tokenizer (the one transformers'
    GemmaTokenizer installs, whatever the file says)."""
    # Train the pieces on words ("▁word"), as SentencePiece does, then lay the vocabulary out.
    trainer_tok = Tokenizer(models.BPE(unk_token=None))
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[], limit_alphabet=80
    )
    trainer_tok.train_from_iterator(corpus_lines(), trainer=trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {}
    for t in leading:
        vocab[t] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    if prepend_scheme == "never":
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme, split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prepend_scheme != "never":
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def add_specials(tok, specials):
    """Registers `specials` as special added tokens: the ones already in the vocabulary keep their
    ids, the others are appended after it, in order."""
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for s in specials:
        assert tok.token_to_id(s) is not None, s


def with_bos(tok, bos):
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
    )


def template(name):
    return (TEMPLATES / name).read_bytes().decode("utf-8")  # byte for byte, no newline translation


def added_tokens_decoder(tok):
    out = {}
    for i, t in sorted(tok.get_added_tokens_decoder().items()):
        out[str(i)] = {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
    return out


def added_token_object(content):
    # The form older tokenizer_config.json files (Llama 2 chat, CodeLlama) use.
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }


def family_specs():
    """(name, build() -> (tokenizer, config dict, chat_template.jinja text or None))."""

    def llama3():
        tok = byte_level_tokenizer(LLAMA3_SPLIT, 700, nfc=False)
        # Real ids 128000.. in this order (reserved tokens omitted).
        add_specials(
            tok,
            [
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eom_id|>",
                "<|eot_id|>",
                "<|python_tag|>",
            ],
        )
        with_bos(tok, "<|begin_of_text|>")
        cfg = {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "chat_template": template("llama-3.1-instruct.jinja"),
            "clean_up_tokenization_spaces": True,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        return tok, cfg, None

    def qwen():
        tok = byte_level_tokenizer(QWEN2_SPLIT, 700, nfc=True)
        add_specials(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        cfg = {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            # The named-list form: `default` is what a plain conversation gets. `tool_use` is listed
            # first so that a reader that takes the first entry renders the wrong thing.
            "chat_template": [
                {"name": "tool_use", "template": template("hermes-2-pro-tool-use.jinja")},
                {"name": "default", "template": template("qwen2.5-instruct.jinja")},
            ],
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "model_max_length": 131072,
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
        }
        return tok, cfg, None

    def mistral():
        leading = [
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ]
        tok = sentencepiece_tokenizer(leading, 600, prepend_scheme="first")
        add_specials(tok, leading)
        with_bos(tok, "<s>")
        cfg = {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "chat_template": template("mistral-7b-instruct-v0.3.jinja"),
            "clean_up_tokenization_spaces": False,
            "legacy": False,
            "model_max_length": 1000000000000000019884624838656,
            "spaces_between_special_tokens": False,
            "tokenizer_class": "LlamaTokenizer",
            "use_default_system_prompt": False,
        }
        return tok, cfg, None

    def gemma():
        leading = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
        tok = sentencepiece_tokenizer(leading, 600, prepend_scheme="never")
        add_specials(tok, leading)
        with_bos(tok, "<bos>")
        cfg = {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1000000000000000019884624838656,
            "spaces_between_special_tokens": False,
            "tokenizer_class": "GemmaTokenizer",
            "use_default_system_prompt": False,
        }
        return tok, cfg, template("gemma-2-it.jinja")

    def phi3():
        tok = sentencepiece_tokenizer(["<unk>", "<s>", "</s>"], 600, prepend_scheme="first")
        # Real ids 32000.. (after the vocabulary), in this order.
        add_specials(
            tok,
            [
                "<unk>",
                "<s>",
                "</s>",
                "<|endoftext|>",
                "<|assistant|>",
                "<|system|>",
                "<|end|>",
                "<|user|>",
            ],
        )
        cfg = {
            "add_bos_token": False,
            "add_eos_token": False,
            "bos_token": "<s>",
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": "<unk>",
            "chat_template": template("phi-3-mini-instruct.jinja"),
            "clean_up_tokenization_spaces": False,
            "legacy": False,
            "model_max_length": 131072,
            "padding_side": "left",
            "sp_model_kwargs": {},
            "tokenizer_class": "LlamaTokenizer",
            "use_default_system_prompt": False,
        }
        return tok, cfg, None

    def llama2():
        leading = ["<unk>", "<s>", "</s>"]
        tok = sentencepiece_tokenizer(leading, 600, prepend_scheme="first")
        add_specials(tok, leading)
        with_bos(tok, "<s>")
        cfg = {
            "add_bos_token": True,
            "add_eos_token": False,
            "bos_token": added_token_object("<s>"),
            "eos_token": added_token_object("</s>"),
            "unk_token": added_token_object("<unk>"),
            "pad_token": None,
            "chat_template": template("llama-2-chat.jinja"),
            "clean_up_tokenization_spaces": False,
            "legacy": False,
            "model_max_length": 1000000000000000019884624838656,
            "sp_model_kwargs": {},
            "tokenizer_class": "LlamaTokenizer",
        }
        return tok, cfg, None

    def no_template():
        tok = byte_level_tokenizer(LLAMA3_SPLIT, 400, nfc=False)
        add_specials(tok, ["<|endoftext|>"])
        cfg = {
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": False,
            "model_max_length": 2048,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
        return tok, cfg, None

    return [
        ("llama3", llama3),
        ("qwen2.5", qwen),
        ("mistral", mistral),
        ("gemma", gemma),
        ("phi3", phi3),
        ("llama2", llama2),
        ("no_template", no_template),
    ] + template_specs()


_TRAINED = {}


def trained_byte_level(split_pattern, nfc):
    """A fresh copy of the byte-level tokenizer trained for (split_pattern, nfc): the training is
    done once and shared by the families that only differ in their added tokens and template."""
    key = (split_pattern, nfc)
    if key not in _TRAINED:
        _TRAINED[key] = byte_level_tokenizer(split_pattern, 700, nfc).to_str()
    return Tokenizer.from_str(_TRAINED[key])


# More real templates, each on a tiny tokenizer of its model's kind (byte-level BPE, or "▁" spaces
# with byte fallback) with the special tokens its template writes registered as added tokens, and
# the named tokens (bos_token, eos_token, ...) of its model's tokenizer_config.json:
# (directory, template file, pipeline, added tokens, named tokens).
DEEPSEEK_TOKENS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
]
DEEPSEEK_NAMED = {
    "bos_token": "<｜begin▁of▁sentence｜>",
    "eos_token": "<｜end▁of▁sentence｜>",
    "pad_token": "<｜end▁of▁sentence｜>",
    "unk_token": None,
}
LLAMA3_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
PHI3_TOKENS = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]
TEMPLATE_FAMILIES = [
    ("deepseek-r1-distill", "deepseek-r1-distill-qwen.jinja", "qwen2", DEEPSEEK_TOKENS, DEEPSEEK_NAMED),
    ("deepseek-r1", "deepseek-r1.jinja", "llama3", DEEPSEEK_TOKENS, DEEPSEEK_NAMED),
    (
        "llama3.2",
        "llama-3.2-instruct.jinja",
        "llama3",
        LLAMA3_TOKENS,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    (
        "gemma3",
        "gemma-3-it.jinja",
        "gemma",
        ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
    ),
    (
        "phi4",
        "phi-4.jinja",
        "llama3",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>"],
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    ),
    (
        "phi4-mini",
        "phi-4-mini-instruct.jinja",
        "llama3",
        PHI3_TOKENS + ["<|tool|>", "<|/tool|>", "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>"],
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
    (
        "phi3.5",
        "phi-3.5-mini-instruct.jinja",
        "metaspace",
        ["<unk>", "<s>", "</s>"] + PHI3_TOKENS,
        {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"},
    ),
    (
        "mistral-nemo",
        "mistral-nemo-instruct-2407.jinja",
        "llama3",
        [
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[TOOL_CALLS]",
        ],
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    ),
    (
        "qwen3",
        "qwen3.jinja",
        "qwen2",
        [
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_end|>",
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
            "<think>",
            "</think>",
        ],
        {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None},
    ),
    (
        "command-r7b",
        "command-r7b-12-2024.jinja",
        "llama3",
        [
            "<PAD>",
            "<UNK>",
            "<BOS_TOKEN>",
            "<EOS_TOKEN>",
            "<|START_OF_TURN_TOKEN|>",
            "<|END_OF_TURN_TOKEN|>",
            "<|SYSTEM_TOKEN|>",
            "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>",
            "<|START_RESPONSE|>",
            "<|END_RESPONSE|>",
            "<|START_THINKING|>",
            "<|END_THINKING|>",
            "<|START_ACTION|>",
            "<|END_ACTION|>",
            "<|START_TOOL_RESULT|>",
            "<|END_TOOL_RESULT|>",
        ],
        {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>", "pad_token": "<PAD>", "unk_token": "<UNK>"},
    ),
    (
        "granite3.2",
        "granite-3.2-instruct.jinja",
        "llama3",
        ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"],
        {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>"},
    ),
    (
        "falcon3",
        "falcon3-instruct.jinja",
        "llama3",
        [
            "<|endoftext|>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<tool_call>",
            "</tool_call>",
            "<tool_response>",
            "</tool_response>",
        ],
        {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
    (
        "olmo",
        "olmo-7b-0724-instruct.jinja",
        "llama3",
        ["<|endoftext|>", "<|padding|>", "<|user|>", "<|assistant|>"],
        {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|padding|>", "unk_token": None},
    ),
    (
        "falcon-7b",
        "falcon-7b-instruct.jinja",
        "llama3",
        ["<|endoftext|>"],
        {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": None, "unk_token": None},
    ),
    (
        "functionary-v3.1",
        "functionary-medium-v3.1.jinja",
        "llama3",
        LLAMA3_TOKENS,
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    (
        "glm4",
        "glm-4-9b-chat.jinja",
        "qwen2",
        ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"],
        {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    ),
]


def template_specs():
    def spec(template_file, pipeline, specials, named):
        def build():
            if pipeline == "gemma":
                tok = sentencepiece_tokenizer(specials, 600, prepend_scheme="never")
                tokenizer_class = "GemmaTokenizer"
            elif pipeline == "metaspace":
                tok = sentencepiece_tokenizer(["<unk>", "<s>", "</s>"], 600, prepend_scheme="first")
                tokenizer_class = "LlamaTokenizer"
            else:
                tok = trained_byte_level(LLAMA3_SPLIT if pipeline == "llama3" else QWEN2_SPLIT, pipeline == "qwen2")
                tokenizer_class = "PreTrainedTokenizerFast"
            add_specials(tok, specials)
            cfg = dict(named)
            cfg.update(
                {
                    "chat_template": template(template_file),
                    "clean_up_tokenization_spaces": False,
                    "model_max_length": 131072,
                    "tokenizer_class": tokenizer_class,
                }
            )
            if pipeline in ("gemma", "metaspace"):
                cfg.update({"add_bos_token": False, "add_eos_token": False, "legacy": False})
            return tok, cfg, None

        return build

    return [(name, spec(*rest)) for name, *rest in TEMPLATE_FAMILIES]


SAMPLE = [
    {"role": "user", "content": "Hello! How are you today?"},
    {"role": "assistant", "content": "I am fine, thank you. What can I do for you?"},
    {"role": "user", "content": "What is the capital of France?"},
]

# Strings the tokenizer.json and transformers' reading of the directory must tokenize alike.
STRESS = [
    "  leading and trailing  ",
    "\n\nnew\r\nlines\t\ttabs\n",
    "naïve café, déjà vu — 東京 🦀👩‍💻👍🏽",
    "special-looking: <|im_start|> <|eot_id|> <start_of_turn> [INST] </s> <s> <|end|>",
    "{{ x }} {% if y %} {# z #}",
    "",
]


def write(out, tok, cfg, jinja):
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("chat_template.jinja", "special_tokens_map.json"):
        if (out / stale).exists():
            (out / stale).unlink()
    cfg = dict(cfg)
    cfg["added_tokens_decoder"] = added_tokens_decoder(tok)
    cfg = dict(sorted(cfg.items()))
    (out / "tokenizer.json").write_text(
        json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out / "tokenizer_config.json").write_text(
        json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    if jinja is not None:
        (out / "chat_template.jinja").write_bytes(jinja.encode("utf-8"))


def check(name, out):
    """Loads the directory with transformers and renders a sample conversation. transformers'
    tokenizer classes (LlamaTokenizer, GemmaTokenizer, Qwen2Tokenizer) rebuild parts of the
    pipeline from the class rather than from tokenizer.json, so this also checks that the
    tokenizer transformers ends up with and tokenizer.json alone give the same ids and offsets on
    the stress strings, the sample and every conversation fixture (a reader of tokenizer.json, as
    flotilla is, must agree with the oracle)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    if name == "no_template":
        try:
            hf.apply_chat_template(SAMPLE, tokenize=False)
        except ValueError:
            return "no chat template (as intended)"
        raise SystemExit(f"{out}: expected apply_chat_template to fail")
    texts = list(STRESS)
    texts.append(hf.apply_chat_template(SAMPLE, tokenize=False, add_generation_prompt=True))
    for fixtures in ("conversations.jsonl", "template_cases.jsonl"):
        fixtures = TEMPLATES.parent / "chat" / fixtures
        if not fixtures.exists():
            continue
        for line in fixtures.read_text(encoding="utf-8").splitlines():
            try:
                texts.append(hf.apply_chat_template(json.loads(line)["messages"], tokenize=False))
            except Exception:
                pass
    mine = Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in texts:
        a = hf(text, add_special_tokens=False, return_offsets_mapping=True)
        b = mine.encode(text, add_special_tokens=False)
        if a["input_ids"] != b.ids or [tuple(o) for o in a["offset_mapping"]] != b.offsets:
            raise SystemExit(f"{out}: transformers and tokenizer.json tokenize {text!r} differently")
    n = len(hf(texts[len(STRESS)], add_special_tokens=False)["input_ids"])
    return f"vocab {mine.get_vocab_size()}, {n} tokens for the sample, {len(texts)} texts agree"


def main():
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    outdir = Path(sys.argv[1])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name, build in family_specs():
        tok, cfg, jinja = build()
        write(outdir / name, tok, cfg, jinja)
    for name, _ in family_specs():
        print(f"{name}: {check(name, outdir / name)}", file=sys.stderr)


if __name__ == "__main__":
    main()
