"""Oracle for flotilla's model (crates/flotilla-train/tests/model_hf.rs): the real transformers
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma2ForCausalLM and
Gemma3ForCausalLM (Gemma 2 in eager attention, the one that soft-caps its scores).

    make_hf_fixtures.py make OUT     small random models saved with save_pretrained (biases and
                                     norm weights random too), a token batch, and transformers'
                                     logits and loss for it, and its logits for the batch as
                                     packed rows (position ids restarting per sequence);
                                     writes OUT/manifest.json
    make_hf_fixtures.py check FILE   FILE lists model directories flotilla saved with the
                                     logits flotilla computed and the class each must load as;
                                     loads each with AutoModelForCausalLM, checks the class and
                                     that nothing is missing or unexpected, and compares logits;
                                     prints one JSON line per model, exits 1 on a mismatch

Fixtures are a few hundred KB and take a second or two to make.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    Phi3Config,
    Phi3ForCausalLM,
    LlamaForCausalLM,
    MistralConfig,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM),
    "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM),
    "phi3": (Phi3Config, Phi3ForCausalLM),
    "smollm3": (SmolLM3Config, SmolLM3ForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
}

# The attention implementation each architecture is checked in (transformers' default
# otherwise): Gemma 2's soft-capped scores exist only in eager attention.
ATTENTION = {"gemma2": "eager"}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
)

# name: (config overrides, options). Options: dtype (saved weights), compute (dtype both sides
# compute in), tol (max |logits - ref| / max |ref|), legacy (rewrite config.json in the
# transformers 4 form: top-level rope_theta / rope_scaling, torch_dtype), shard (max_shard_size),
# arch (llama, mistral or qwen2; default llama).
FIXTURES = {
    "tied_gqa": (
        dict(num_key_value_heads=2, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        dict(),
    ),
    "untied_mha_legacy_config": (
        dict(num_key_value_heads=4, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1234.5}),
        dict(legacy=True),
    ),
    "llama3_rope_mqa": (
        dict(num_key_value_heads=1, tie_word_embeddings=True,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8}),
        dict(),
    ),
    "sharded_untied": (
        dict(num_key_value_heads=2, num_hidden_layers=3, tie_word_embeddings=False),
        dict(shard="60KB"),
    ),
    # float16 weights, loaded by both sides in float32: checks f16 reading exactly.
    "f16_weights": (
        dict(num_key_value_heads=2, tie_word_embeddings=True),
        dict(dtype="float16"),
    ),
    # bfloat16 weights and bfloat16 compute on both sides.
    "bf16": (
        dict(num_key_value_heads=2, tie_word_embeddings=False),
        dict(dtype="bfloat16", compute="bfloat16", tol=2e-2),
    ),
    # Llama with attention_bias: biases on q/k/v/o_proj.
    "llama_attention_bias": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True),
        dict(),
    ),
    # Mistral: a window of 6 over sequences of 16 (packed rows: within each sequence too).
    "mistral_window": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, sliding_window=6,
             rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        dict(arch="mistral"),
    ),
    # Mistral Nemo's shape: heads of their own size (24, not 64 / 4).
    "mistral_nemo_head_dim": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, head_dim=24, sliding_window=None),
        dict(arch="mistral"),
    ),
    # Qwen2: biases on q/k/v_proj, tied and untied, with and without a window on every layer.
    "qwen2_tied": (
        dict(num_key_value_heads=2, tie_word_embeddings=True),
        dict(arch="qwen2"),
    ),
    "qwen2_untied_window": (
        dict(num_key_value_heads=1, tie_word_embeddings=False, use_sliding_window=True,
             sliding_window=32, max_window_layers=0),
        dict(arch="qwen2"),
    ),
    # Qwen3: per-head q/k norms, a head size of its own; then a window of 5 on its second layer.
    "qwen3": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, head_dim=24),
        dict(arch="qwen3"),
    ),
    "qwen3_tied_window": (
        dict(num_key_value_heads=1, tie_word_embeddings=True, head_dim=16,
             use_sliding_window=True, sliding_window=5, max_window_layers=1),
        dict(arch="qwen3"),
    ),
    # Gemma 2: caps low enough to bite, a window of 6 on every second layer.
    "gemma2": (
        dict(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
             attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        dict(arch="gemma2"),
    ),
    # Gemma 3 text: q/k norms, local layers (window 6, their own theta) around a global one.
    "gemma3": (
        dict(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
             num_hidden_layers=3,
             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
        dict(arch="gemma3_text"),
    ),
    # Phi-3: fused qkv_proj and gate_up_proj, a window of 7 on every layer.
    "phi3": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, sliding_window=7,
             pad_token_id=0),
        dict(arch="phi3"),
    ),
    # Phi-4-mini's shape: rotary embeddings on three quarters of each head, tied embeddings.
    "phi4_mini_partial_rotary": (
        dict(num_key_value_heads=1, tie_word_embeddings=True, pad_token_id=0,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                              "partial_rotary_factor": 0.75}),
        dict(arch="phi3"),
    ),
    # SmolLM3: no rotary embeddings on its second layer.
    "smollm3_nope": (
        dict(num_key_value_heads=2, tie_word_embeddings=True, no_rope_layers=[1, 0],
             pad_token_id=0),
        dict(arch="smollm3"),
    ),
    # Mixtral: 4 experts, 2 a token (scores renormalised), a window of 6 on every layer.
    "mixtral": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, sliding_window=6,
             num_local_experts=4, num_experts_per_tok=2),
        dict(arch="mixtral"),
    ),
    # Qwen3-MoE: q/k norms, 6 experts of width 40, 3 a token renormalised; layer 1 of 3 dense
    # (mlp_only_layers) with the dense width.
    "qwen3_moe": (
        dict(num_key_value_heads=2, tie_word_embeddings=False, head_dim=24, num_hidden_layers=3,
             num_experts=6, num_experts_per_tok=3, moe_intermediate_size=40,
             norm_topk_prob=True, mlp_only_layers=[1]),
        dict(arch="qwen3_moe"),
    ),
    # Qwen3-MoE as its Hub checkpoints: scores not renormalised; every second layer sparse
    # (decoder_sparse_step), tied embeddings.
    "qwen3_moe_sparse_step": (
        dict(num_key_value_heads=1, tie_word_embeddings=True, num_hidden_layers=2,
             num_experts=5, num_experts_per_tok=2, moe_intermediate_size=32,
             norm_topk_prob=False, decoder_sparse_step=2),
        dict(arch="qwen3_moe"),
    ),
}

BATCH, SEQ = 2, 16
# Where the sequences packed into each row start: position ids restart there, and transformers
# then keeps each sequence's attention to itself.
PACKED_STARTS = [[0, 5], [0, 3, 10]]


def packed_positions():
    return torch.tensor(
        [[i - max(s for s in starts if s <= i) for i in range(SEQ)] for starts in PACKED_STARTS]
    )


def make(out):
    os.makedirs(out, exist_ok=True)
    manifest = []
    for seed, (name, (overrides, opts)) in enumerate(FIXTURES.items()):
        torch.manual_seed(1000 + seed)
        arch = opts.get("arch", "llama")
        config_class, model_class = ARCHS[arch]
        config = config_class(**{**BASE, **overrides})
        attention = ATTENTION.get(arch)
        if attention:
            config._attn_implementation = attention
        model = model_class(config).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:  # not all ones, so the norm weights are exercised
                    p.normal_(1.0, 0.2)
                elif pname.endswith(".bias"):  # not zeros, so the biases are exercised
                    p.normal_(0.0, 0.5)
                elif pname.endswith("gate.weight"):  # a router (Qwen3-MoE's starts at zero)
                    p.normal_(0.0, 0.3)
        dtype = opts.get("dtype", "float32")
        compute = opts.get("compute", "float32")
        model = model.to(DTYPES[dtype])

        model_dir = os.path.join(out, name, "model")
        kwargs = {"max_shard_size": opts["shard"]} if "shard" in opts else {}
        model.save_pretrained(model_dir, **kwargs)
        if "shard" in opts:
            assert os.path.exists(os.path.join(model_dir, "model.safetensors.index.json")), name
        if opts.get("legacy"):
            path = os.path.join(model_dir, "config.json")
            with open(path) as f:
                cfg = json.load(f)
            rope = cfg.pop("rope_parameters")
            cfg["rope_theta"] = rope.pop("rope_theta")
            cfg["rope_scaling"] = None if rope["rope_type"] == "default" else rope
            cfg["torch_dtype"] = cfg.pop("dtype")
            with open(path, "w") as f:
                json.dump(cfg, f, indent=2)

        # The reference: the directory as transformers loads it, in the compute dtype.
        extra = {"attn_implementation": attention} if attention else {}
        ref = model_class.from_pretrained(model_dir, dtype=DTYPES[compute], **extra).eval()
        gen = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=gen)
        labels = input_ids.clone()
        labels[1, :3] = -100
        positions = packed_positions()
        with torch.no_grad():
            result = ref(input_ids=input_ids, labels=labels)
            # use_cache=False: transformers looks for packed sequences only without a cache.
            packed = ref(input_ids=input_ids, position_ids=positions, use_cache=False)
        save_file(
            {
                "input_ids": input_ids,
                "labels": labels,
                "logits": result.logits.float().contiguous(),
                "loss": result.loss.float().reshape(1),
                "positions": positions,
                "packed_logits": packed.logits.float().contiguous(),
            },
            os.path.join(out, name, "reference.safetensors"),
        )
        size = sum(
            os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir)
        )
        manifest.append(
            dict(name=name, dir=model_dir, reference=os.path.join(out, name, "reference.safetensors"),
                 dtype=dtype, compute=compute, tol=opts.get("tol", 1e-4),
                 sharded="shard" in opts, bytes=size, model_type=arch,
                 cls=model_class.__name__,
                 biases=sorted(n for n, _ in model.named_parameters() if n.endswith(".bias")),
                 sliding_window=getattr(model.config, "sliding_window", None))
        )
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


def check(path):
    with open(path) as f:
        checks = json.load(f)
    failed = False
    for c in checks:
        saved = json.load(open(os.path.join(c["dir"], "config.json")))
        attention = ATTENTION.get(saved.get("model_type"))
        extra = {"attn_implementation": attention} if attention else {}
        model, info = AutoModelForCausalLM.from_pretrained(
            c["dir"], dtype=DTYPES[c["compute"]], output_loading_info=True, **extra
        )
        model.eval()
        problems = {k: list(v) for k, v in info.items() if v}
        if type(model).__name__ != c["cls"]:
            problems["class"] = [type(model).__name__]
        if "sliding_window" in c and getattr(model.config, "sliding_window", None) != c["sliding_window"]:
            problems["sliding_window"] = [getattr(model.config, "sliding_window", None)]
        # transformers 5 writes the weights' dtype as `dtype` (4.x: `torch_dtype`)
        saved_dtype = saved.get("dtype", saved.get("torch_dtype"))
        if saved_dtype != c["dtype"]:
            problems["dtype"] = [saved_dtype]
        data = load_file(c["logits"])
        with torch.no_grad():
            logits = model(input_ids=data["input_ids"]).logits.float()
        theirs = data["logits"]
        err = ((logits - theirs).abs().max() / theirs.abs().max()).item()
        ok = not problems and err <= c["tol"]
        failed |= not ok
        print(json.dumps(dict(name=c["name"], max_rel_err=err, ok=ok, problems=problems,
                              cls=type(model).__name__)), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit(__doc__)
    {"make": make, "check": check}[sys.argv[1]](sys.argv[2])
