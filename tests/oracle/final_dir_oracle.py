"""Oracle for `final/` as save_pretrained writes it (crates/flotilla-train/tests/final_dir.rs).

usage:
  final_dir_oracle.py base OUT      a tiny bf16 LlamaForCausalLM (norm weights not all ones)
                                    saved by save_pretrained in several shards with an index,
                                    a generation_config.json with its own eos ids, and a
                                    tokenizer (tokenizer.json, tokenizer_config.json,
                                    special_tokens_map.json); prints {"shards": N}
  final_dir_oracle.py load DIR [TEXT]
                                    loads DIR with AutoModelForCausalLM and AutoTokenizer; fails
                                    (non-zero exit) on any missing, unexpected or mismatched
                                    weight; prints {"dtypes": [...], "sums": {name: float sum},
                                    "generation_eos": ..., "config_eos": ..., "tokenizer_eos": ...};
                                    with TEXT, also "prompt": TEXT's ids by DIR's tokenizer and
                                    "output": DIR's model.generate() from them (greedy, at most 12
                                    new tokens, DIR's generation_config.json deciding where it stops)
"""

import json
import os
import sys

import torch


def base(out):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="20KB")
    GenerationConfig(bos_token_id=1, eos_token_id=[2, 7], pad_token_id=0, do_sample=False).save_pretrained(out)

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, 64):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(out)
    shards = [f for f in os.listdir(out) if f.startswith("model-") and f.endswith(".safetensors")]
    print(json.dumps({"shards": len(shards)}))


def load(path, text=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"transformers loaded {path} with problems: {problems}")
    tok = AutoTokenizer.from_pretrained(path)
    found = {
        "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "sums": {n: p.detach().double().sum().item() for n, p in model.state_dict().items()},
        "generation_eos": model.generation_config.eos_token_id,
        "config_eos": model.config.eos_token_id,
        "tokenizer_eos": tok.eos_token_id,
    }
    if text is not None:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.eval().generate(ids, max_new_tokens=12, do_sample=False)
        found["prompt"] = ids[0].tolist()
        found["output"] = out[0].tolist()
    print(json.dumps(found))


if __name__ == "__main__":
    {"base": base, "load": load}[sys.argv[1]](*sys.argv[2:])
