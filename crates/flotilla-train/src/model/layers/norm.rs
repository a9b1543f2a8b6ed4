//! RMSNorm as transformers computes it: Llama's (`LlamaRMSNorm`: normalised in fp32, cast back
//! to the activation dtype, then scaled by the weight) and Gemma's (`Gemma2RMSNorm`: scaled by
//! `1 + weight` in fp32, then cast back).

use tch::{Kind, Tensor};

/// transformers' `LlamaRMSNorm`: normalise in fp32, cast back, then scale by the weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let x32 = x.to_kind(Kind::Float);
    let variance = x32.square().mean_dim(-1, true, Kind::Float);
    let normed = x32 * (variance + eps).rsqrt();
    weight * normed.to_kind(kind)
}

/// transformers' `Gemma2RMSNorm` (and Gemma 3's): normalise and scale by `1 + weight` in fp32,
/// then cast back.
pub fn gemma_rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let x32 = x.to_kind(Kind::Float);
    let variance = x32.square().mean_dim(-1, true, Kind::Float);
    let normed = x32 * (variance + eps).rsqrt();
    (normed * (weight.to_kind(Kind::Float) + 1.0)).to_kind(kind)
}
