"""Oracle for flotilla's activation memory (crates/flotilla-train/tests/memory.rs): the bytes of
the tensors autograd really saves for backward, measured on CPU with
torch.autograd.graph.saved_tensors_hooks and counted as distinct storages (by data pointer;
parameters left out).

    memory_oracle.py CASES

CASES is a JSON list of [BATCH, SEQ, DTYPE, CONFIG, PACKED, CHUNK] (DTYPE float32 or bfloat16;
CONFIG the model's `config.json` as an object, its family named by `architectures`; PACKED
true: every row packs three sequences, with position ids restarting at each and the boolean
block-diagonal causal mask transformers makes of them; CHUNK: the tokens of one chunk of the
loss fused with the head, or null for the whole logits). Measures, for each, one micro-batch
of BATCH x SEQ tokens:

- block: the family's first decoder layer as transformers builds it (`LlamaDecoderLayer`,
  `Gemma2DecoderLayer`, ...; sdpa attention, eager where the family soft-caps its scores as
  flotilla does; rotary tables for positions 0..SEQ-1 as flotilla computes them once per
  micro-batch), the storages saved between its forward and backward plus its input (which
  flotilla's engine keeps as the unit's input). A mixture's sparse MLP is flotilla's dispatch
  written with the same ops (`SparseMlp` below: transformers' own experts save other tensors),
  over the layer's router and expert weights;
- checkpointed: the same block under torch.utils.checkpoint (non-reentrant): what stays
  between forward and backward;
- head: the family's final RMSNorm and the LM head (logits soft-capped where the family caps
  them) with flotilla's loss (the logits shifted by one position, cast to fp32, summed
  cross-entropy), the storages saved plus its input; and the
  logits' bytes, which flotilla's engine keeps as the head unit's output. With CHUNK, the
  same for the first CHUNK tokens only (unshifted: the data's labels are shifted already), plus
  the whole micro-batch's input: what the fused head and loss hold while a chunk runs.

Prints a JSON list of one object per case as the last line of stdout.
"""
import importlib
import json
import sys

import torch
import torch.utils.checkpoint as checkpoint
from transformers import AutoConfig


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


class SparseMlp(torch.nn.Module):
    """flotilla's sparse MLP (crates/flotilla-train/src/model/layers/moe.rs) op for op, over a
    transformers 5 sparse block's router and fused experts: the router's fp32 softmax and
    top-k, the (token, slot) assignments sorted by expert (stable), each expert's SwiGLU on
    its rows, the rows put back and weighted by their scores."""

    def __init__(self, block, config):
        super().__init__()
        self.router = block.gate.weight
        self.gate_up = block.experts.gate_up_proj
        self.down = block.experts.down_proj
        self.k = config.num_experts_per_tok
        self.norm = getattr(config, "norm_topk_prob", True) or config.model_type == "mixtral"
        self.scores_in_dtype = config.model_type == "qwen3_moe"

    def forward(self, x):
        b, t, h = x.shape
        rows = x.reshape(-1, h)
        n, k, experts = rows.shape[0], self.k, self.router.shape[0]
        probs = torch.nn.functional.linear(rows, self.router).softmax(-1, dtype=torch.float32)
        scores, chosen = probs.topk(k, -1)
        if self.norm:
            scores = scores / scores.sum(-1, keepdim=True)
        if self.scores_in_dtype:
            scores = scores.to(x.dtype)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        grouped = rows[:, None].expand(n, k, h).reshape(n * k, h).index_select(0, order)
        outputs, start = [], 0
        inter = self.down.shape[2]
        for e, count in enumerate(flat.bincount(minlength=experts).tolist()):
            if count == 0:
                continue
            rows_e = grouped.narrow(0, start, count)
            gate = torch.nn.functional.linear(rows_e, self.gate_up[e, :inter])
            up = torch.nn.functional.linear(rows_e, self.gate_up[e, inter:])
            out = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, self.down[e])
            outputs.append(out)
            start += count
        routed = torch.cat(outputs).index_select(0, order.argsort())
        weighted = (routed.view(n, k, h) * scores.unsqueeze(-1)).to(x.dtype).sum(1)
        return weighted.view(b, t, h)


def family(config):
    """The modeling module of `config`'s family and its class-name prefix (`Gemma2`)."""
    prefix = config["architectures"][0].removesuffix("ForCausalLM")
    module = config["model_type"].removesuffix("_text")
    return importlib.import_module(f"transformers.models.{module}.modeling_{module}"), prefix


def measure(b, t, dtype, model, packed=False, chunk=None):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    fields = dict(model)
    model_type = fields.pop("model_type")
    fields.pop("architectures", None)
    fields.pop("torch_dtype", None)
    fields.pop("dtype", None)
    # flotilla's attention is eager where scores are soft-capped, SDPA otherwise.
    eager = fields.get("attn_logit_softcapping") is not None
    fields["max_position_embeddings"] = max(t, 8, fields.get("max_position_embeddings", 0))
    config = AutoConfig.for_model(model_type, **fields)
    config._attn_implementation = "eager" if eager else "sdpa"
    h, vocab = config.hidden_size, config.vocab_size
    modeling, prefix = family(model)
    layer = getattr(modeling, f"{prefix}DecoderLayer")(config, 0).to(dtype)
    if hasattr(layer.mlp, "experts"):
        layer.mlp = SparseMlp(layer.mlp, config)
    rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(config)
    positions = torch.arange(t)[None]
    mask = None
    if packed:
        starts = [0, t // 3, 2 * t // 3]
        row = [i - max(s for s in starts if s <= i) for i in range(t)]
        positions = torch.tensor([row] * b)
        sequence = torch.tensor([sum(i >= s for s in starts) for i in range(t)])
        same = sequence[:, None] == sequence[None, :]
        mask = (same & torch.ones(t, t, dtype=torch.bool).tril())[None, None].expand(b, 1, t, t)

    # A sliding window shorter than the sequence masks the first layer as flotilla masks it:
    # one [T, T] mask for the batch (additive for eager attention).
    window = fields.get("sliding_window")
    layer_types = fields.get("layer_types")
    if window is not None and t > window and not packed:
        if layer_types is None or layer_types[0] == "sliding_attention":
            i = torch.arange(t)
            visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
            mask = visible[None, None]
            if eager:
                mask = torch.zeros(1, 1, t, t, dtype=dtype).masked_fill(~mask, float("-inf"))

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

    norm = getattr(modeling, f"{prefix}RMSNorm")(h, eps=1e-5).to(dtype)
    lm_head = torch.nn.Linear(h, vocab, bias=False).to(dtype)
    cap = getattr(config, "final_logit_softcapping", None)
    x = torch.randn(b, t, h, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (b, t))
    saved = Saved(list(norm.parameters()) + list(lm_head.parameters()))
    if chunk is None:
        with saved.hooks():
            logits = lm_head(norm(x))
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
            shifted = logits[:, :-1].float().reshape(-1, vocab)
            loss = torch.nn.functional.cross_entropy(
                shifted, labels[:, 1:].reshape(-1), reduction="sum"
            )
    else:
        rows = x.detach().reshape(-1, h)[:chunk].detach().requires_grad_()
        with saved.hooks():
            logits = lm_head(norm(rows[None]))
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
            loss = torch.nn.functional.cross_entropy(
                logits.float().reshape(-1, vocab), labels.reshape(-1)[:chunk], reduction="sum"
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
