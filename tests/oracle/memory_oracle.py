"""Oracle for flotilla's activation memory (crates/flotilla-train/tests/memory.rs): the bytes of
the tensors autograd really saves for backward, measured on CPU with
torch.autograd.graph.saved_tensors_hooks and counted as distinct storages (by data pointer;
parameters left out).

    memory_oracle.py CASES

CASES is a JSON list of [BATCH, SEQ, DTYPE, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB,
PACKED] (DTYPE float32 or bfloat16; PACKED true: every row packs three sequences, with position
ids restarting at each and the boolean block-diagonal causal mask transformers makes of them).
Measures, for each, one micro-batch of BATCH x SEQ tokens:

- block: one transformers LlamaDecoderLayer (sdpa attention, rotary tables for positions
  0..SEQ-1 as flotilla computes them once per micro-batch), the storages saved between its
  forward and backward plus its input (which flotilla's engine keeps as the unit's input);
- checkpointed: the same block under torch.utils.checkpoint (non-reentrant): what stays
  between forward and backward;
- head: the final RMSNorm and the LM head with flotilla's loss (the logits shifted by one
  position, cast to fp32, summed cross-entropy), the storages saved plus its input; and the
  logits' bytes, which flotilla's engine keeps as the head unit's output.

Prints a JSON list of one object per case as the last line of stdout.
"""
import json
import sys

import torch
import torch.utils.checkpoint as checkpoint
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)


class Saved:
    """Distinct storages of the tensors saved for backward while active (parameters aside)."""

    def __init__(self, exclude):
        self.exclude = {p.untyped_storage().data_ptr() for p in exclude}
        self.storages = {}

    def pack(self, t):
        s = t.untyped_storage()
        if s.nbytes() > 0 and s.data_ptr() not in self.exclude:
            self.storages.setdefault(s.data_ptr(), s.nbytes())
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def held(self, *also):
        """Bytes of the saved storages and of `also` (tensors kept anyway), each once."""
        storages = dict(self.storages)
        for t in also:
            s = t.untyped_storage()
            storages.setdefault(s.data_ptr(), s.nbytes())
        return sum(storages.values())


def measure(b, t, dtype, h, inter, heads, kv, vocab, packed=False):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max(t, 8),
        attn_implementation="sdpa",
    )
    layer = LlamaDecoderLayer(config, 0).to(dtype)
    rotary = LlamaRotaryEmbedding(config)
    positions = torch.arange(t)[None]
    mask = None
    if packed:
        starts = [0, t // 3, 2 * t // 3]
        row = [i - max(s for s in starts if s <= i) for i in range(t)]
        positions = torch.tensor([row] * b)
        sequence = torch.tensor([sum(i >= s for s in starts) for i in range(t)])
        same = sequence[:, None] == sequence[None, :]
        mask = (same & torch.ones(t, t, dtype=torch.bool).tril())[None, None].expand(b, 1, t, t)

    def block_input():
        return torch.randn(b, t, h, dtype=dtype, requires_grad=True)

    def run_block(x):
        cos, sin = rotary(x, positions)
        out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out

    x = block_input()
    saved = Saved(layer.parameters())
    with saved.hooks():
        out = run_block(x)
    block = saved.held(x)
    out.float().sum().backward()

    x = block_input()
    saved = Saved(layer.parameters())
    with saved.hooks():
        out = checkpoint.checkpoint(run_block, x, use_reentrant=False)
    checkpointed = saved.held(x)
    out.float().sum().backward()

    norm = LlamaRMSNorm(h, eps=1e-5).to(dtype)
    lm_head = torch.nn.Linear(h, vocab, bias=False).to(dtype)
    x = torch.randn(b, t, h, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (b, t))
    saved = Saved(list(norm.parameters()) + list(lm_head.parameters()))
    with saved.hooks():
        logits = lm_head(norm(x))
        shifted = logits[:, :-1].float().reshape(-1, vocab)
        loss = torch.nn.functional.cross_entropy(
            shifted, labels[:, 1:].reshape(-1), reduction="sum"
        )
    head = saved.held(x)
    logits_bytes = logits.untyped_storage().nbytes()
    loss.backward()

    return {
        "torch": torch.__version__,
        "block": block,
        "checkpointed": checkpointed,
        "head": head,
        "logits": logits_bytes,
    }


def main():
    print(json.dumps([measure(*case) for case in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
