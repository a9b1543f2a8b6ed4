"""Makes everything the preference-tuning example of the README needs, locally and in seconds:
the chat example's tiny base, conversations and question (examples/chat/make_example.py), and

  OUT/pairs.jsonl       1000 preference pairs in TRL's conversational format ({"prompt",
                        "chosen", "rejected"}, each a list of {role, content} messages): the
                        chosen answer gives the sum, the rejected one a wrong sum or a refusal;
  OUT/eval_pairs.jsonl  200 held-out pairs of the same kind.

usage: .venv/bin/python examples/preference/make_example.py OUT
"""

import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_CHAT = os.path.join(HERE, "..", "chat", "make_example.py")


def pair(rng):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    wrong = a + b + rng.choice([-10, -3, -2, -1, 1, 2, 3, 10])
    prompt = [{"role": "user", "content": f"What is {a} plus {b}?"}]
    chosen = f"{a} plus {b} is {a + b}."
    rejected = f"{a} plus {b} is {wrong}." if rng.random() < 0.5 else "I do not know."
    reply = lambda text: [{"role": "assistant", "content": text}]  # noqa: E731
    return {"prompt": prompt, "chosen": reply(chosen), "rejected": reply(rejected)}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    made = subprocess.run([sys.executable, MAKE_CHAT, out], capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit(f"examples/chat/make_example.py failed:\n{made.stderr}")
    rng = random.Random(1)
    for name, count in [("pairs.jsonl", 1000), ("eval_pairs.jsonl", 200)]:
        with open(os.path.join(out, name), "w") as f:
            for _ in range(count):
                f.write(json.dumps(pair(rng)) + "\n")
    print(made.stdout.strip())
    print(f"wrote {out}/pairs.jsonl, {out}/eval_pairs.jsonl")


if __name__ == "__main__":
    main()
