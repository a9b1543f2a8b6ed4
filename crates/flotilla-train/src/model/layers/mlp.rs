//! The gated MLP's activation: `act(gate) * up` between the up and down projections.

use tch::Tensor;

/// SwiGLU (`LlamaMLP`): `silu(gate) * up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Tensor {
    gate.silu() * up
}
