//! What one micro-batch's activations cost: the bytes each op of the decoder saves for
//! backward, in each family's style, for the planner's terms ([`Activations`]).

use flotilla_config::schema::{JobConfig, ModelType, ObjectiveConfig, Precision};

/// Activation bytes of one micro-batch (the decoder of `flotilla-train`'s `model/decoder/` as
/// autograd runs it, in each family's style: what each op saves for backward, checked against
/// PyTorch's saved tensors of transformers' layers in `crates/flotilla-train/tests/memory.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activations {
    /// A block's input (the previous unit's output, kept by the engine).
    pub block_input: u64,
    /// What a block's graph saves besides its input.
    pub block_saved: u64,
    /// The embedding's input token ids.
    pub tokens: u64,
    /// The head's input and its final norm's saved tensors (of one chunk of tokens when the
    /// loss is fused with the head).
    pub head: u64,
    /// The rotary tables shared by every block (fp32 `cos`/`sin`; a table per row when rows
    /// are packed).
    pub rotary: u64,
    /// Packed rows ([`isolates_packed_sequences`](flotilla_config::schema::DataConfig::isolates_packed_sequences)):
    /// their int64 position ids and boolean attention mask `[M, 1, T, T]` (on a GPU in half
    /// precision, the sequences' int32 bounds instead), held for the micro-batch.
    pub packing: u64,
    /// The logits (of one chunk of tokens when the loss is fused with the head).
    pub logits: u64,
    /// log-softmax's fp32 output and the targets.
    pub loss: u64,
    /// The NLL and log-softmax gradients over the vocabulary, alive together; with the fused
    /// loss also the head's input gradient and its fp32 weight gradient, filled chunk by chunk.
    pub loss_backward: u64,
    /// Evaluation's loss: the whole logits of the micro-batch and one chunk's fp32 copy and
    /// log-probabilities (`next_token_loss_sum_chunked`; DPO: every row's).
    pub eval_loss: u64,
    /// Gradients inside one block's backward: three of the MLP's width and two of the hidden
    /// size at once, and below fp32 the block's weight gradients before their fp32 cast (an
    /// estimate; PyTorch's saved tensors check the other terms, not this one).
    pub block_backward: u64,
}

/// What a block's MLP saves per token, and the widths of its gradients alive at once in its
/// backward, over the model's layers (the larger of a dense and a sparse layer's). A dense SwiGLU
/// saves the gate, its activation, the up projection and their product. A sparse layer
/// (`flotilla-train`'s `layers/moe.rs`) saves the router's fp32 softmax; the top-k's indices
/// and scores (and the renormalisation's); the sort's and its inverse's indices; each (token,
/// slot) row's copy of the input, the expert's SwiGLU of its width and the expert's output,
/// which the score's product keeps (checked against the tensors PyTorch saves for the same ops,
/// `tests/oracle/memory_oracle.py`). A model with dense and sparse layers prices every block as
/// the larger of the two: an upper bound.
fn mlp_per_token(m: &flotilla_config::schema::ModelConfig, a: u64) -> (u64, u64) {
    let (h, inter) = (m.hidden_size as u64, m.intermediate_size as u64);
    let dense = (4 * inter * a, 3 * inter);
    let Some(moe) = m.moe.as_ref().filter(|_| m.sparse_layers() > 0) else {
        return dense;
    };
    let (e, k) = (moe.num_experts as u64, moe.num_experts_per_tok as u64);
    let e_inter = m.expert_intermediate_size() as u64;
    let sparse = e * 4 + 4 + k * (8 + 4 + 4 + 8 + 8) + k * (2 * h + 4 * e_inter) * a;
    let all_sparse = m.sparse_layers() == m.num_hidden_layers;
    let saved = if all_sparse {
        sparse
    } else {
        sparse.max(dense.0)
    };
    (
        saved,
        (3 * k * e_inter).max(if all_sparse { 0 } else { dense.1 }),
    )
}

impl Activations {
    /// `a`: bytes of the compute dtype; `block_params`: a block's parameter elements.
    pub fn of(job: &JobConfig, micro: u64, a: u64, block_params: u64) -> Self {
        let m = &job.model;
        let h = m.hidden_size as u64;
        let (nh, nkv) = (m.num_attention_heads as u64, m.num_key_value_heads as u64);
        let hd = m.head_dim() as u64;
        let (q, kv) = (nh * hd, nkv * hd);
        let vocab = m.vocab_size as u64;
        let t = job.data.seq_len() as u64;
        let n = micro * t;
        let gemma = m.gemma_style();
        // RMSNorm upcasts its input to fp32 (a copy unless already fp32) that the square and the
        // scaling save, and saves its 1/rms per row. Llama's weight product then saves the
        // normalised input cast to the compute dtype; Gemma's `(1 + w)` product, in fp32, the
        // fp32 normalised input. What follows: `normed(d)`, without the fp32 input and output.
        let normed = |d: u64| if gemma { 4 + 4 * d } else { 4 + d * a };
        // fp16 weights keep the residual stream in fp32 (the block inputs, and what the norms
        // of it take: no fp32 copy, and Llama's weight product saves the fp32 normalised input).
        let fp32_residual = a == 2 && job.precision() == Precision::Fp16Mixed;
        let residual = if fp32_residual { 4 } else { a };
        let normed_residual = |d: u64| if fp32_residual { 4 + 4 * d } else { normed(d) };
        // A norm whose input nothing else keeps (the fp32 input or its copy) and whose output
        // is saved by the projections after it.
        let f32_copy = if a == 4 || fp32_residual { 0 } else { 4 * h };
        let norm = f32_copy + normed_residual(h) + h * a;
        // Attention: SDPA without a mask saves q, k and v after rotary, its output (which the
        // output projection reads) and an fp32 log-sum-exp per head. Under a mask (packed rows,
        // or a sliding window shorter than the sequence) the KV heads are repeated to the
        // query heads first. Soft-capped scores (Gemma 2) take transformers' eager attention:
        // the matmul saves q and the repeated k, the tanh its output, the fp32 softmax its
        // output and, below fp32, the product with v its cast; the output projection saves the
        // heads' output. Phi-3's v is a view of the fused projection's output, which it keeps.
        let packed = job.data.isolates_packed_sequences();
        let eager = m.attn_logit_softcapping.is_some();
        let windowed =
            (0..m.num_hidden_layers).any(|i| m.layer_window(i).is_some_and(|w| t > w as u64));
        // Packed rows on a GPU in half precision take flash attention by the sequences' bounds
        // (`layers/varlen.rs`), windowed layers included: no mask, no bias, the KV heads as they
        // are (the same tensors SDPA's causal fast path saves).
        let varlen =
            packed && job.runs_on_gpu() && a == 2 && !eager && hd.is_multiple_of(8) && hd <= 256;
        let masked = (packed || windowed) && !varlen;
        let repeated = (masked || eager) && nkv != nh;
        let k_saved = if repeated { q } else { kv };
        let v_saved = match (repeated, m.architecture() == ModelType::Phi3) {
            (true, _) => q,
            (false, true) => q + 2 * kv,
            (false, false) => kv,
        };
        // SDPA's output is laid out like its queries: after a full rotary (whose products keep
        // the projection's token-major layout) it is the output projection's input; after a
        // partial one (a concatenation, head-major) the projection reads a token-major copy.
        let rotary_dim = m.rotary_dim() as u64;
        let output = if eager || rotary_dim < hd { q } else { 0 };
        let attention = if eager {
            (q + k_saved + v_saved + output) * a + nh * t * (a + 4 + if a == 4 { 0 } else { a })
        } else {
            (q + k_saved + v_saved + q + output) * a + 4 * nh
        };
        // Per-head q and k norms (Qwen3, Gemma 3) before rotary, whose product saves only the
        // tables: the projections' outputs in fp32 and the norms' saved tensors.
        let qk_norm = if m.qk_norm() {
            4 * (q + kv) + 4 * (nh + nkv) + if gemma { 4 * (q + kv) } else { (q + kv) * a }
        } else {
            0
        };
        // The residual into the MLP's norm (in fp32: the residual itself, or its copy) and that
        // norm; the gate, its activation, the up projection and their product. Gemma norms the
        // attention's and the MLP's outputs too, before the residual adds (which save nothing).
        let mlp_norm = 4 * h + normed_residual(h) + h * a;
        let output_norms = if gemma { 2 * (4 * h + normed(h)) } else { 0 };
        let (mlp, mlp_backward) = mlp_per_token(m, a);
        let saved_tok = norm + qk_norm + attention + mlp_norm + mlp + output_norms;
        // Packed rows have rotary tables of their own, and each block's attention saves the
        // additive bias SDPA makes of their boolean mask, in the compute dtype (of a window's
        // `[T, T]` mask too); eager attention saves its boolean mask.
        let tables = if packed { micro } else { 1 };
        let mask_rows = if packed { micro } else { 1 };
        let mask_bias = if eager {
            mask_rows * t * t
        } else if masked {
            mask_rows * t * t * a
        } else {
            0
        };
        // Below fp32 each block casts the rotary tables to its dtype and keeps the casts.
        let block_rotary = if a == 4 {
            0
        } else {
            2 * tables * t * rotary_dim * a
        };
        // Soft-capped logits: the tanh saves its output beside the logits.
        let capped_logits = if m.final_logit_softcapping.is_some() {
            n * vocab * a
        } else {
            0
        };
        // Next-token cross-entropy is fused with the head (`objective/fused_head.rs`): the
        // final norm, the logits and the loss of one chunk of tokens at a time are alive, with
        // the head's input and, filled chunk by chunk, its gradient and the head's fp32 weight
        // gradient. DPO takes the whole logits (shifted by one position).
        let fused = matches!(job.objective, ObjectiveConfig::Sft);
        let (head_rows, rows) = if fused {
            let chunk = m.loss_chunk_rows(n as usize) as u64;
            (chunk, chunk)
        } else {
            (n, micro * t.saturating_sub(1))
        };
        let head_grads = if !fused {
            0
        } else if job.peft.lora().is_some() {
            n * h * residual
        } else {
            n * h * residual + vocab * h * 4
        };
        let capped_logits = capped_logits * head_rows / n.max(1);
        Self {
            block_input: n * h * residual,
            block_saved: n * saved_tok + block_rotary + mask_bias,
            tokens: n * 8,
            head: n * h * residual + head_rows * norm + capped_logits,
            rotary: 2 * tables * t * rotary_dim * 4,
            // The position ids, and the boolean mask or (flash by bounds) the int32 bounds.
            packing: match (packed, varlen) {
                (false, _) => 0,
                (true, false) => n * 8 + micro * t * t,
                (true, true) => n * 8 + (n + 1) * 4,
            },
            logits: head_rows * vocab * a,
            loss: rows * vocab * 4 + rows * 8,
            loss_backward: 2 * rows * vocab * 4 + head_grads,
            eval_loss: n * vocab * a + 2 * rows * vocab * 4,
            block_backward: n * (mlp_backward + 2 * h) * a
                + if a == 4 { 0 } else { block_params * a },
        }
    }

    /// One block with its input.
    pub fn block(&self) -> u64 {
        self.block_input + self.block_saved
    }

    /// What every block of the micro-batch reads: the rotary tables and the packing mask.
    pub fn shared(&self) -> u64 {
        self.rotary + self.packing
    }
}
