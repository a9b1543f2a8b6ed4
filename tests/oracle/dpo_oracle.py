"""Oracle for flotilla's DPO (tests/dpo.rs): PyPI trl's DPOTrainer, with transformers and peft,
on a tiny local base.

usage:
  dpo_oracle.py make OUT      OUT/base: a tiny fp32 LlamaForCausalLM (norm weights away from
                              one, untied) with a word-level tokenizer and a chat template
                              (<|user|> ... </s> turns); OUT/adapter: a PEFT LoRA adapter of it
                              on q_proj,v_proj with B not zero; OUT/pairs.jsonl: conversational
                              pairs with an explicit prompt; OUT/implicit.jsonl: the same pairs as
                              whole conversations; OUT/standard.jsonl: pairs of plain texts;
                              the pairs again as OUT/pairs.parquet (pyarrow) and as the Hub lays
                              out a split, OUT/hub/data/train_prefs-00000-of-00001.parquet.
                              Prints {"pairs": N}.
  dpo_oracle.py train OUT PAIRS STEPS BATCH LR SEQ_LEN RUNS
                              runs DPOTrainer (fp32, CPU, no shuffling, constant learning rate,
                              no weight decay, gradient clipping at 1.0) STEPS steps of BATCH
                              pairs of PAIRS for each run of RUNS, a JSON list of
                              {"loss_type", "beta", "label_smoothing", "lora", "data"} (lora:
                              retrain OUT/adapter on OUT/base, the reference being a frozen copy
                              of the adapter, TRL's "ref" adapter; else the whole base, the
                              reference a copy of it; data: another pairs file than PAIRS).
                              Prints one list per run of TRL's logged rows (loss, grad_norm,
                              rewards/*, logps/*, logits/*), one per step.
"""

import json
import os
import random
import sys

import torch

VOCAB = 64
SPECIAL = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def words(rng, n):
    return " ".join(f"t{rng.randrange(len(SPECIAL), VOCAB)}" for _ in range(n))


def make(out):
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
    base = os.path.join(out, "base")
    model.save_pretrained(base)
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for i in range(len(SPECIAL), VOCAB):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        additional_special_tokens=SPECIAL[3:],
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(base)

    torch.manual_seed(1)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      init_lora_weights=False)
    get_peft_model(LlamaForCausalLM.from_pretrained(base), lora).save_pretrained(
        os.path.join(out, "adapter"))

    rng = random.Random(7)
    pairs, implicit, standard = [], [], []
    for k in range(12):
        prompt = [{"role": "user", "content": words(rng, rng.randrange(2, 6))}]
        if k % 3 == 0:
            prompt = [{"role": "system", "content": words(rng, 2)}] + prompt
        chosen = [{"role": "assistant", "content": words(rng, rng.randrange(1, 6))}]
        rejected = [{"role": "assistant", "content": words(rng, rng.randrange(1, 6))}]
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        implicit.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
        text = words(rng, rng.randrange(2, 6))
        standard.append({"prompt": text, "chosen": " " + words(rng, 3), "rejected": " " + words(rng, 2)})
    for name, records in [("pairs", pairs), ("implicit", implicit), ("standard", standard)]:
        with open(os.path.join(out, f"{name}.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist(pairs)
    pq.write_table(table, os.path.join(out, "pairs.parquet"))
    os.makedirs(os.path.join(out, "hub", "data"))
    pq.write_table(table, os.path.join(out, "hub", "data", "train_prefs-00000-of-00001.parquet"))
    print(json.dumps({"pairs": len(pairs)}))


def train(out, pairs, steps, batch, lr, seq_len, runs):
    import datasets
    from peft import PeftModel
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()

    class Sequential(DPOTrainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    class Rows(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.rows.append({k: float(v) for k, v in logs.items()})

    base = os.path.join(out, "base")
    tokenizer = AutoTokenizer.from_pretrained(base)
    results = []
    for run in runs:
        data = datasets.load_dataset("json", data_files=run.get("data", pairs), split="train")
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        if run.get("lora"):
            model = PeftModel.from_pretrained(model, os.path.join(out, "adapter"), is_trainable=True)
        config = DPOConfig(
            output_dir=os.path.join(out, "trl"), report_to=[], use_cpu=True, bf16=False,
            per_device_train_batch_size=batch, gradient_accumulation_steps=1, max_steps=steps,
            learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, optim="adamw_torch",
            max_grad_norm=1.0, logging_steps=1, save_strategy="no", seed=0,
            max_length=seq_len, beta=run["beta"], loss_type=[run["loss_type"]],
            label_smoothing=run.get("label_smoothing", 0.0), dataset_num_proc=None,
            dataloader_drop_last=True,
        )
        rows = Rows()
        trainer = Sequential(model=model, args=config, train_dataset=data,
                             processing_class=tokenizer, callbacks=[rows])
        trainer.train()
        results.append(rows.rows)
    print(json.dumps(results))


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "make":
        make(args[0])
    elif mode == "train":
        out, pairs, steps, batch, lr, seq_len, runs = args
        train(out, pairs, int(steps), int(batch), float(lr), int(seq_len), json.loads(runs))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
