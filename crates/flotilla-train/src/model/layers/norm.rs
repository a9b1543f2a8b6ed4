//! RMSNorm as transformers computes it (`LlamaRMSNorm`): normalised in fp32, cast back to the
//! activation dtype, then scaled by the weight.

use tch::{Kind, Tensor};

/// transformers' `LlamaRMSNorm`: normalise in fp32, cast back, then scale by the weight.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let kind = x.kind();
    let x32 = x.to_kind(Kind::Float);
    let variance = x32.square().mean_dim(-1, true, Kind::Float);
    let normed = x32 * (variance + eps).rsqrt();
    weight * normed.to_kind(kind)
}
