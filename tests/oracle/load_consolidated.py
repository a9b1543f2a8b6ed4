"""Loads a Hugging Face directory written by `flotilla consolidate` with transformers and
writes its logits for a token batch, for crates/flotilla-train/tests/train_dist.rs.

usage: load_consolidated.py DIR TOKENS_JSON OUT.safetensors

Fails (non-zero exit, message on stderr) when transformers reports missing, unexpected or
mismatched weights; otherwise writes `logits` (float32) and the loaded `embed` weight.
"""

import json
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaForCausalLM


def main() -> None:
    path, tokens_json, out = sys.argv[1:4]
    model, info = LlamaForCausalLM.from_pretrained(
        path, torch_dtype=torch.float32, output_loading_info=True
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"transformers loaded {path} with problems: {problems}")
    model.eval()
    tokens = torch.tensor(json.loads(tokens_json), dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().contiguous()
    save_file(
        {
            "logits": logits,
            "embed": model.model.embed_tokens.weight.detach().float().contiguous(),
        },
        out,
    )
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "shape": list(logits.shape)}))


if __name__ == "__main__":
    main()
