"""Oracle for `flotilla generate` (crates/flotilla-train/tests/generate.rs): transformers'
`generate` and tokenizers (and peft for adapters) on tiny random local models.

Modes (each prints one JSON value as the last line of stdout):

- make OUT FAMILY: a seeded tiny random model of FAMILY (a key of FAMILIES) saved with
  save_pretrained in OUT, with a character-level tokenizer (tokenizer.json whose post-processor
  adds `<s>`, tokenizer_config.json with the special tokens and a ChatML chat template) and
  generation_config.json (eos_token_id 2). Prints {"vocab_size": V}.

- tokenizer OUT VARIANT: the same tokenizer alone in OUT, in one of three forms: `bos` (the
  post-processor adds `<s>`), `flag` (no post-processor; tokenizer_config.json says
  add_bos_token true and add_eos_token true), `none` (no post-processor, no flag). Prints {}.

- tokenize DIR TEXTS: `AutoTokenizer.from_pretrained(DIR)(text)["input_ids"]` for each text of
  TEXTS (a JSON list). Prints [[id, ...], ...].

- adapter BASE OUT: a PEFT LoRA adapter (r 4, alpha 8, q_proj, v_proj and down_proj,
  init_lora_weights=False so that B is not zero) over the model in BASE, saved in OUT.
  Prints {}.

- generate DIR ADAPTER PROMPTS N: greedy `model.generate(input_ids, do_sample=False,
  max_new_tokens=N)` of the model in DIR (with the PEFT adapter directory ADAPTER unless it is
  `-`) for each prompt of PROMPTS, a JSON list of objects: {"text": ...} (tokenized as
  `tokenizer(text)`), {"messages": [...]} (rendered with the chat template,
  add_generation_prompt=True, and tokenized without special tokens) or {"ids": [...]}. Prints
  [{"prompt_ids": [...], "output_ids": [...]}, ...], the new tokens only.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

# One line per model family: its config class name, and the config values it adds to BASE.
# (transformers loads Qwen2's tokenizer as its own class, which rebuilds this character-level
# tokenizer and drops its whitespace: the Rust test gives Qwen2 flotilla's prompt ids.)
FAMILIES = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": False}),
    "qwen3": ("Qwen3Config", {"head_dim": 24}),
    # Windows of 6 on prompts of 12 and more: generation attends within them from its cache.
    "gemma2": ("Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 6,
                                "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
    "gemma3_text": ("Gemma3TextConfig", {
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
    }),
    # Phi-4-mini's shape: fused projections, rotary embeddings on three quarters of each head.
    "phi3": ("Phi3Config", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.75}}),
    # Mixtures of experts: Mixtral's 4 experts, 2 a token; Qwen3-MoE's 6 of width 40, 3 a token,
    # not renormalised, its second layer dense.
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", {"num_experts": 6, "num_experts_per_tok": 3,
                                     "moe_intermediate_size": 40, "norm_topk_prob": False,
                                     "mlp_only_layers": [1]}),
}

# The attention implementation each family runs in (transformers' default otherwise): Gemma
# 2's soft-capped scores exist only in eager attention.
ATTENTION = {"gemma2": "eager"}

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
VOCAB = 128

BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=96,
    rms_norm_eps=1e-5,
    initializer_range=0.2,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(out, variant):
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    if variant == "bos":
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {
        "tokenizer_class": "TokenizersBackend",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
    }
    if variant == "flag":
        config.update(add_bos_token=True, add_eos_token=True)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def make(a):
    out, family = a
    config_class, extra = FAMILIES[family]
    torch.manual_seed(2024)
    config = getattr(transformers, config_class)(**{**BASE, **extra})
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # not all ones, so the norm weights are exercised
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):  # Qwen2's q/k/v biases: not zero
                p.normal_(0.0, 0.2)
            elif name.endswith("gate.weight"):  # a router (Qwen3-MoE's starts at zero)
                p.normal_(0.0, 0.3)
    model.save_pretrained(out)
    write_tokenizer(out, "bos")
    return {"vocab_size": VOCAB}


def tokenizer_mode(a):
    out, variant = a
    write_tokenizer(out, variant)
    return {}


def tokenize(a):
    directory, texts = a
    tok = AutoTokenizer.from_pretrained(directory)
    return [tok(t)["input_ids"] for t in json.loads(texts)]


def adapter(a):
    from peft import LoraConfig, get_peft_model

    base, out = a
    torch.manual_seed(77)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False, task_type="CAUSAL_LM",
    )
    get_peft_model(model, lora).save_pretrained(out)
    return {}


def generate(a):
    directory, adapter_dir, prompts, n = a
    tok = AutoTokenizer.from_pretrained(directory)
    with open(os.path.join(directory, "config.json")) as f:
        attention = ATTENTION.get(json.load(f).get("model_type"))
    extra = {"attn_implementation": attention} if attention else {}
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **extra)
    if adapter_dir != "-":
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    out = []
    for prompt in json.loads(prompts):
        if "messages" in prompt:
            text = tok.apply_chat_template(
                prompt["messages"], add_generation_prompt=True, tokenize=False
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
        elif "ids" in prompt:
            ids = prompt["ids"]
        else:
            ids = tok(prompt["text"])["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            y = model.generate(
                input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                max_new_tokens=int(n), pad_token_id=0,
            )
        out.append({"prompt_ids": ids, "output_ids": y[0, len(ids):].tolist()})
    return out


if __name__ == "__main__":
    modes = {
        "make": make, "tokenizer": tokenizer_mode, "tokenize": tokenize, "adapter": adapter,
        "generate": generate,
    }
    print(json.dumps(modes[sys.argv[1]](sys.argv[2:])))
