"""Oracle for flotilla's rotary embeddings (crates/flotilla-train/tests/rope_oracle.rs): the real
transformers' rotary-embedding modules and models.

    rope_oracle.py tables CASES   CASES is a JSON file listing cases, each a config.json dict
                                  ("config"), the config class ("arch": llama or phi3) and the
                                  position ids of successive forwards ("forwards"). For each case
                                  builds the model's rotary-embedding module from the config
                                  (LlamaRotaryEmbedding or Phi3RotaryEmbedding, which computes
                                  with ROPE_INIT_FUNCTIONS) and gives its initial inv_freq and
                                  attention scaling, and for each forward in
                                  turn (on the same module, so `dynamic_rope_update` sees them as
                                  transformers would) the cos and sin it returns and the inv_freq
                                  it used; prints the cases as one JSON line.
    rope_oracle.py model OUT      small random models saved with save_pretrained: Llama with
                                  yarn, dynamic and longrope scaling, and a Phi-3 with longrope
                                  and partial_rotary_factor 0.5, as saved and also under Llama's
                                  weight names (q/k/v_proj, gate/up_proj split from qkv_proj and
                                  gate_up_proj: Phi-3's math is Llama's but for the partial
                                  rotary); for each,
                                  transformers' logits for token batches longer and shorter than
                                  the original context, and the last logits of each step of a
                                  cached forward (a prefill then one token at a time, as
                                  generation runs); writes OUT/manifest.json.

Everything is fp32 on the CPU and takes a few seconds.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402

CONFIGS = {"llama": (LlamaConfig, LlamaRotaryEmbedding), "phi3": (Phi3Config, Phi3RotaryEmbedding)}


def floats(t):
    return t.detach().float().tolist()


def tables(cases_path):
    with open(cases_path) as f:
        cases = json.load(f)
    results = []
    for case in cases:
        config_class, rotary_class = CONFIGS[case["arch"]]
        config = config_class.from_dict(dict(case["config"]))
        rotary = rotary_class(config).eval()
        out = dict(
            name=case["name"],
            rope_parameters=config.rope_parameters,
            inv_freq=floats(rotary.original_inv_freq),
            attention_scaling=float(rotary.attention_scaling),
            forwards=[],
        )
        x = torch.zeros(1, dtype=torch.float32)
        with torch.no_grad():
            for positions in case["forwards"]:
                ids = torch.tensor(positions, dtype=torch.int64)
                if ids.dim() == 1:
                    ids = ids[None]
                cos, sin = rotary(x, ids)
                out["forwards"].append(
                    dict(cos=floats(cos), sin=floats(sin), inv_freq=floats(rotary.inv_freq))
                )
        results.append(out)
    print(json.dumps(results))


BASE = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)

FACTORS_8 = ([1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.6, 3.2], [1.0, 1.2, 1.6, 2.4, 3.6, 5.0, 7.0, 9.0])
FACTORS_4 = ([1.0, 1.1, 1.5, 2.0], [1.2, 2.0, 4.0, 8.0])

# name: (config class, config, token batch lengths, cached-forward chunk lengths). The original
# context is 16 (`dynamic`: max_position_embeddings 16), so the 24-token batches and the cached
# forwards past 16 tokens take the scaled frequencies.
MODELS = {
    "yarn": (
        "llama",
        dict(max_position_embeddings=64,
             rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": 16}),
        [24],
        [10] + [1] * 14,
    ),
    "dynamic": (
        "llama",
        dict(max_position_embeddings=16,
             rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        [24, 12],
        [10] + [1] * 14,
    ),
    "longrope": (
        "llama",
        dict(max_position_embeddings=64,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": FACTORS_8[0], "long_factor": FACTORS_8[1],
                              "original_max_position_embeddings": 16}),
        [24, 12],
        [10] + [1] * 14,
    ),
    "longrope_partial": (
        "phi3",
        dict(max_position_embeddings=64, partial_rotary_factor=0.5, pad_token_id=0,
             original_max_position_embeddings=16,
             rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                              "short_factor": FACTORS_4[0], "long_factor": FACTORS_4[1],
                              "partial_rotary_factor": 0.5, "original_max_position_embeddings": 16}),
        [24, 12],
        [10] + [1] * 14,
    ),
}


def llama_names(state, config):
    """Phi-3's fused qkv_proj and gate_up_proj split into Llama's projections."""
    hd = config.hidden_size // config.num_attention_heads
    q = config.num_attention_heads * hd
    kv = config.num_key_value_heads * hd
    out = {}
    for name, t in state.items():
        if name.endswith("self_attn.qkv_proj.weight"):
            prefix = name[: -len("qkv_proj.weight")]
            out[prefix + "q_proj.weight"] = t[:q].clone()
            out[prefix + "k_proj.weight"] = t[q : q + kv].clone()
            out[prefix + "v_proj.weight"] = t[q + kv :].clone()
        elif name.endswith("mlp.gate_up_proj.weight"):
            prefix = name[: -len("gate_up_proj.weight")]
            gate, up = t.chunk(2, dim=0)
            out[prefix + "gate_proj.weight"] = gate.clone()
            out[prefix + "up_proj.weight"] = up.clone()
        else:
            out[name] = t.clone()
    return out


def llama_config_json(config, rope):
    """The Llama config.json of the split Phi-3: its sizes, its rope and partial rotary."""
    return dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps, hidden_act="silu", tie_word_embeddings=False,
        rope_scaling=rope, partial_rotary_factor=rope["partial_rotary_factor"],
        dtype="float32",
    )


def model(out):
    os.makedirs(out, exist_ok=True)
    manifest = []
    for seed, (name, (arch, overrides, lengths, chunks)) in enumerate(MODELS.items()):
        torch.manual_seed(2000 + seed)
        config_class, model_class = {
            "llama": (LlamaConfig, LlamaForCausalLM),
            "phi3": (Phi3Config, Phi3ForCausalLM),
        }[arch]
        config = config_class(**{**BASE, **overrides})
        m = model_class(config).eval()
        with torch.no_grad():
            for pname, p in m.named_parameters():
                if "norm" in pname:  # not all ones, so a wrong convention shows
                    p.normal_(1.0, 0.2)
        model_dir = os.path.join(out, name, "model")
        if arch == "llama":
            m.save_pretrained(model_dir)
        else:
            os.makedirs(model_dir, exist_ok=True)
            save_file(llama_names(m.state_dict(), config),
                      os.path.join(model_dir, "model.safetensors"))
            with open(os.path.join(model_dir, "config.json"), "w") as f:
                json.dump(llama_config_json(config, overrides["rope_parameters"]), f, indent=2)
            m.save_pretrained(os.path.join(out, name, "phi3"))
        # The reference: the directory as transformers loads it (a fresh model, so the
        # rotary module has seen no earlier forward).
        ref_dir = model_dir if arch == "llama" else os.path.join(out, name, "phi3")
        ref = model_class.from_pretrained(ref_dir, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(seed)
        tensors = {}
        with torch.no_grad():
            for length in lengths:
                fresh = model_class.from_pretrained(ref_dir, dtype=torch.float32).eval()
                ids = torch.randint(3, config.vocab_size, (2, length), generator=gen)
                tensors[f"input_ids_{length}"] = ids
                tensors[f"logits_{length}"] = fresh(input_ids=ids).logits.float().contiguous()
            ids = torch.randint(3, config.vocab_size, (1, sum(chunks)), generator=gen)
            cache = DynamicCache(config=ref.config)
            steps, start = [], 0
            for n in chunks:
                result = ref(input_ids=ids[:, start : start + n], past_key_values=cache,
                             use_cache=True)
                cache = result.past_key_values
                steps.append(result.logits[0, -1].float())
                start += n
            tensors["cached_ids"] = ids
            tensors["cached_logits"] = torch.stack(steps).contiguous()
        reference = os.path.join(out, name, "reference.safetensors")
        save_file(tensors, reference)
        entry = dict(name=name, dir=model_dir, reference=reference, lengths=lengths,
                     chunks=chunks, cls=model_class.__name__)
        if arch == "phi3":
            entry["phi3_dir"] = ref_dir
        manifest.append(entry)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("tables", "model"):
        sys.exit(__doc__)
    {"tables": tables, "model": model}[sys.argv[1]](sys.argv[2])
