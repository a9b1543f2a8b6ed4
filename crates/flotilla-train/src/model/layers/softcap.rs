//! Soft-capping (Gemma 2's attention scores and logits): `cap * tanh(x / cap)`, as
//! transformers computes it in the tensor's dtype.

use tch::Tensor;

/// `cap * tanh(x / cap)`.
pub fn soft_cap(x: &Tensor, cap: f64) -> Tensor {
    (x / cap).tanh() * cap
}
