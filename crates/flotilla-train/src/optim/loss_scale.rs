//! fp16 dynamic loss scaling: the [`LossScaler`] state (scale and growth tracker, kept in
//! checkpoints) with its update rule, and `unscale`, which divides a step's gradients by the
//! scale in place and flags inf/NaN on the device. The training loop owns when these run; the
//! weights (`parallel::replicated`, `parallel::fsdp`) unscale their own gradients, by the
//! multi-tensor kernel of `fused`.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::error::TrainError;

/// fp16 dynamic loss scaling (`torch.amp.GradScaler` defaults): the loss is multiplied by the
/// scale before backward; a step whose unscaled gradients hold an inf/NaN is skipped and the
/// scale halved; after 2000 clean steps in a row the scale doubles.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    pub scale: f64,
    pub growth_tracker: u64,
}

impl LossScaler {
    pub const INIT_SCALE: f64 = 65536.0;
    pub const GROWTH_INTERVAL: u64 = 2000;

    pub fn new() -> Self {
        Self {
            scale: Self::INIT_SCALE,
            growth_tracker: 0,
        }
    }

    /// Updates the scale after a step (`found_inf`: the step was skipped).
    pub fn update(&mut self, found_inf: bool) {
        if found_inf {
            self.scale *= 0.5;
            self.growth_tracker = 0;
        } else {
            self.growth_tracker += 1;
            if self.growth_tracker == Self::GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.growth_tracker = 0;
            }
        }
    }
}

impl Default for LossScaler {
    fn default() -> Self {
        Self::new()
    }
}

/// Multiplies gradients by `inv_scale` in place; returns whether any is inf or NaN as a flag
/// on the device, not read (one multi-tensor kernel and one flag per device, as
/// `GradScaler.unscale_`): the fused update skips by it, and the trainer reads it with the
/// step's other figures.
pub(crate) fn unscale<'a>(
    grads: impl Iterator<Item = &'a Tensor>,
    inv_scale: f64,
) -> Result<Tensor, TrainError> {
    let grads: Vec<Tensor> = grads.map(Tensor::shallow_clone).collect();
    tch::no_grad(|| super::fused::unscale_and_flag(&grads, inv_scale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Every gradient is multiplied exactly as a plain product would; one inf or NaN anywhere
    /// (in any dtype) sets the flag.
    #[test]
    fn unscale_multiplies_every_gradient_and_flags_non_finite_values() {
        tch::manual_seed(0);
        for kind in [Kind::Float, Kind::Half, Kind::BFloat16] {
            let grads: Vec<Tensor> = [[3, 4], [7, 1], [5, 5]]
                .iter()
                .map(|s| (Tensor::randn(*s, (Kind::Float, Device::Cpu)) * 100.0).to_kind(kind))
                .collect();
            let want: Vec<Tensor> = grads.iter().map(|g| g * (1.0 / 1024.0)).collect();
            let flag = unscale(grads.iter(), 1.0 / 1024.0).unwrap();
            assert_eq!(flag.double_value(&[0]), 0.0, "{kind:?}");
            for (g, w) in grads.iter().zip(&want) {
                assert!(g.equal(w), "{kind:?}");
            }
            for bad in [f64::INFINITY, f64::NAN] {
                let g: Vec<Tensor> = grads.iter().map(Tensor::copy).collect();
                let _ = g[1].get(0).get(0).fill_(bad);
                let flag = unscale(g.iter(), 0.5).unwrap();
                assert_eq!(flag.double_value(&[0]), 1.0, "{kind:?} {bad}");
            }
        }
    }
}
