//! The gated MLP's activation: `act(gate) * up` between the up and down projections.

use tch::Tensor;

/// SwiGLU (`LlamaMLP`): `silu(gate) * up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Tensor {
    gate.silu() * up
}

/// GeGLU with the tanh GELU (`Gemma2MLP`, `gelu_pytorch_tanh`): `gelu_tanh(gate) * up`.
pub fn geglu(gate: &Tensor, up: &Tensor) -> Tensor {
    gate.gelu("tanh") * up
}
