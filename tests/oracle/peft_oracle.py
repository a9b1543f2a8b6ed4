"""Oracle for flotilla's LoRA: PyPI peft and transformers, on a tiny local base.

Modes (each prints one JSON value as the last line of stdout):

- make OUT TARGETS SAVE R ALPHA RSLORA RANDOM_B [FAMILY]: a seeded tiny untied model of FAMILY
  (llama, the default; qwen3 with heads of their own size; phi3 shaped as Phi-4-mini, with
  fused projections and rotary embeddings on three quarters of each head; mixtral and
  qwen3_moe with four experts, two a token, qwen3_moe's first layer dense) saved
  with save_pretrained in OUT/base (norm weights away from one), and a LoRA adapter created by peft.get_peft_model
  (target_modules TARGETS, comma-separated or all-linear; modules_to_save SAVE, comma-separated
  or "-"; PEFT's default init, or with RANDOM_B=1 `init_lora_weights=False` so that B is not
  zero) saved with save_pretrained in OUT/adapter. Prints the adapter's key names.

- train BASE ADAPTER BATCHES STEPS OUT LR MIN_LR WARMUP SCHEDULE WD BETA1 BETA2 EPS CLIP:
  PeftModel.from_pretrained(base, adapter, is_trainable=True) trained with train_oracle.py's
  loop on the micro-batches flotilla trained on (`x.{s}.{k}`, `y.{s}.{k}`, `tok.{s}`); the
  trained adapter is saved in OUT. Prints [[loss, grad_norm, lr], ...].

- logits BASE ADAPTER TOKENS: logits of PeftModel.from_pretrained(base, adapter) on the token
  ids TOKENS (a JSON list of lists), with the warnings PEFT emitted while loading.
  Prints {"logits": [...], "warnings": [...]}.

- hf_logits MODEL_DIR TOKENS: logits of transformers' model loaded from MODEL_DIR
  (a merged model). Prints {"logits": [...], "warnings": [...]}.
"""
import json
import os
import sys
import warnings

import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM, LlamaConfig, MixtralConfig, Phi3Config, Qwen3Config, Qwen3MoeConfig,
)

from peft import LoraConfig, PeftModel, get_peft_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_oracle import hyper, train  # noqa: E402


def base_model(path):
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )


# The config class of each family `make` builds, and what it adds to the common sizes.
FAMILIES = {
    "llama": (LlamaConfig, {}),
    "qwen3": (Qwen3Config, {"head_dim": 24}),
    "phi3": (Phi3Config, {"pad_token_id": 0, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}}),
    # Mixtures of experts: PEFT adapts transformers 5's fused experts as parameters.
    "mixtral": (MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # Layer 0 dense (PEFT leaves its MLP alone), experts of their own width.
    "qwen3_moe": (Qwen3MoeConfig, {"head_dim": 24, "num_experts": 4, "num_experts_per_tok": 2,
                                   "moe_intermediate_size": 40, "norm_topk_prob": True,
                                   "mlp_only_layers": [0]}),
}


def make(a):
    out, targets, save, r, alpha, rslora, random_b = a[:7]
    family = a[7] if len(a) > 7 else "llama"
    config_class, extra = FAMILIES[family]
    torch.manual_seed(4321)
    sizes = dict(
        vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, tie_word_embeddings=False, initializer_range=0.02,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config = config_class(**{**sizes, **extra})
    model = AutoModelForCausalLM.from_config(config).float()
    if family != "llama":
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:  # not all ones, so the norm weights are exercised
                    p.normal_(1.0, 0.2)
    model.save_pretrained(os.path.join(out, "base"))
    base = base_model(os.path.join(out, "base"))
    lora = LoraConfig(
        r=int(r),
        lora_alpha=float(alpha) if "." in alpha else int(alpha),
        target_modules="all-linear" if targets == "all-linear" else targets.split(","),
        modules_to_save=None if save == "-" else save.split(","),
        use_rslora=rslora == "1",
        init_lora_weights=random_b != "1",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    model.save_pretrained(os.path.join(out, "adapter"))
    keys = sorted(load_file(os.path.join(out, "adapter", "adapter_model.safetensors")))
    return keys


def train_mode(a):
    base, adapter, batches, steps, out = a[0], a[1], a[2], int(a[3]), a[4]
    model = PeftModel.from_pretrained(base_model(base), adapter, is_trainable=True)
    data = load_file(batches)

    def step_batches(s):
        micro = []
        while f"x.{s}.{len(micro)}" in data:
            k = len(micro)
            micro.append((data[f"x.{s}.{k}"], data[f"y.{s}.{k}"]))
        return float(data[f"tok.{s}"].item()), micro

    rows = train(model, steps, step_batches, hyper(a[5:]))
    model.save_pretrained(out)
    return rows


def logits_of(model, tokens):
    with torch.no_grad():
        x = torch.tensor(json.loads(tokens), dtype=torch.int64)
        return model(input_ids=x).logits.float().tolist()


def logits_mode(a):
    base, adapter, tokens = a
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base_model(base), adapter)
    model.eval()
    return {"logits": logits_of(model, tokens), "warnings": [str(w.message) for w in caught]}


def hf_logits(a):
    model_dir, tokens = a
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = base_model(model_dir)
    model.eval()
    return {"logits": logits_of(model, tokens), "warnings": [str(w.message) for w in caught]}


if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    modes = {"make": make, "train": train_mode, "logits": logits_mode, "hf_logits": hf_logits}
    print(json.dumps(modes[sys.argv[1]](sys.argv[2:])))
