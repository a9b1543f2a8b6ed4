"""Makes everything the chat fine-tuning example of the README needs, locally and in seconds:

  OUT/base/          a tiny random Llama (transformers' save_pretrained) with a ChatML tokenizer
                     (tokenizer.json + tokenizer_config.json carrying Qwen2.5's chat template),
                     standing in for a downloaded instruction model;
  OUT/chats.jsonl    2000 conversations ({"messages": [...]}, some with a system prompt, some
                     multi-turn) in which the assistant adds two numbers;
  OUT/question.json  one conversation to answer with `flotilla generate --messages`.

usage: .venv/bin/python examples/chat/make_example.py OUT

Nothing is downloaded: the tokenizer is built by tests/oracle/make_chat_tokenizers.py.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_TOKENIZERS = os.path.join(HERE, "..", "..", "tests", "oracle", "make_chat_tokenizers.py")


def conversation(rng):
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": "You add numbers."})
    for _ in range(rng.choice([1, 1, 2])):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        messages.append({"role": "user", "content": f"What is {a} plus {b}?"})
        messages.append({"role": "assistant", "content": f"{a} plus {b} is {a + b}."})
    return {"messages": messages}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    base = os.path.join(out, "base")
    with tempfile.TemporaryDirectory() as tmp:
        made = subprocess.run([sys.executable, MAKE_TOKENIZERS, tmp], capture_output=True, text=True)
        if made.returncode != 0:
            sys.exit(f"make_chat_tokenizers.py failed:\n{made.stderr}")
        shutil.rmtree(base, ignore_errors=True)
        shutil.copytree(os.path.join(tmp, "qwen2.5"), base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    vocab = (len(tokenizer) + 63) // 64 * 64
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    LlamaForCausalLM(config).save_pretrained(base)
    rng = random.Random(0)
    with open(os.path.join(out, "chats.jsonl"), "w") as f:
        for _ in range(2000):
            f.write(json.dumps(conversation(rng)) + "\n")
    with open(os.path.join(out, "question.json"), "w") as f:
        json.dump([{"role": "user", "content": "What is 21 plus 34?"}], f)
    print(f"wrote {base} (vocabulary {vocab}), {out}/chats.jsonl, {out}/question.json")


if __name__ == "__main__":
    main()
