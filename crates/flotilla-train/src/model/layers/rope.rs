//! Rotary position embeddings as transformers computes them: the inverse frequencies of a
//! config (default and `llama3` scaling, in fp32 tensor operations), the cos/sin tables of a
//! batch's positions (in fp32), and their application to queries and keys in the rotate-half
//! convention, cast to the activation dtype.

use tch::{Device, Kind, Tensor};

use flotilla_config::schema::{ModelConfig, RopeScaling, RopeType};

use crate::model::ForwardCtx;

/// Rotary inverse frequencies, computed with the same fp32 tensor operations as transformers'
/// `compute_default_rope_parameters` and `_compute_llama3_parameters`.
pub fn inv_freq(c: &ModelConfig) -> Vec<f32> {
    let _guard = tch::no_grad_guard();
    let dim = c.head_dim() as i64;
    let exponent = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu))
        .to_kind(Kind::Float)
        / dim as f64;
    let mut inv = Tensor::pow_scalar(c.rope_theta, &exponent).reciprocal();
    if let Some(RopeScaling {
        rope_type: RopeType::Llama3,
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    }) = c.rope_scaling
    {
        let old_context_len = original_max_position_embeddings as f64;
        let low_freq_wavelen = old_context_len / low_freq_factor;
        let high_freq_wavelen = old_context_len / high_freq_factor;
        let wavelen = inv.reciprocal() * (2.0 * std::f64::consts::PI);
        // torch.where(cond, a, b) is a.where_self(cond, b) in tch.
        let scaled = (&inv / factor).where_self(&wavelen.gt(low_freq_wavelen), &inv);
        let smooth = (wavelen.reciprocal() * old_context_len - low_freq_factor)
            / (high_freq_factor - low_freq_factor);
        let smoothed: Tensor = (1.0 - &smooth) * &scaled / factor + &smooth * &scaled;
        let medium = wavelen
            .lt(high_freq_wavelen)
            .logical_not()
            .logical_and(&wavelen.gt(low_freq_wavelen).logical_not());
        inv = smoothed.where_self(&medium, &scaled);
    }
    Vec::<f32>::try_from(&inv).expect("inverse frequencies are f32")
}

/// The rotary tables `(cos, sin)` of `positions` (`[T]` or `[B, T]`), `[..., T, head_dim]` in
/// fp32, as transformers' `LlamaRotaryEmbedding.forward` computes them.
pub fn rotary_tables(inv_freq: &[f32], positions: &Tensor) -> (Tensor, Tensor) {
    let inv = Tensor::from_slice(inv_freq).to_device(positions.device());
    // freqs = positions[..., None].float() * inv_freq; emb = cat(freqs, freqs)
    let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv;
    let emb = Tensor::cat(&[&freqs, &freqs], -1);
    (emb.cos(), emb.sin())
}

/// `x * cos + rotate_half(x) * sin`: the rotary embedding applied to queries or keys
/// `[B, heads, T, head_dim]` with tables from [`rope_tables`].
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    x * cos + rotate_half(x) * sin
}

pub fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&x2.neg(), &x1], -1)
}

/// Rotary tables shaped to broadcast over `[B, heads, T, head_dim]`, in `kind`.
pub fn rope_tables(ctx: &ForwardCtx, kind: Kind) -> (Tensor, Tensor) {
    let shape = |t: &Tensor| {
        let t = t.to_kind(kind);
        if t.dim() == 2 {
            t.unsqueeze(0).unsqueeze(0)
        } else {
            t.unsqueeze(1)
        }
    };
    (shape(&ctx.cos), shape(&ctx.sin))
}
