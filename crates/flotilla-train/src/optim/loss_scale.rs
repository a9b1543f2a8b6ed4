//! fp16 dynamic loss scaling: the [`LossScaler`] state (scale and growth tracker, kept in
//! checkpoints) with its update rule, and `unscale`, which divides a step's gradients by the
//! scale in place and reports inf/NaN. The training loop owns when these run; the weights
//! (`parallel::replicated`, `parallel::fsdp`) unscale their own gradients. This module depends on nothing else
//! of the crate but its error type.

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

/// Multiplies gradients by `inv_scale` in place; returns whether any is inf or NaN.
pub(crate) fn unscale<'a>(
    grads: impl Iterator<Item = &'a Tensor>,
    inv_scale: f64,
) -> Result<bool, TrainError> {
    let mut found = false;
    tch::no_grad(|| -> Result<(), TrainError> {
        for g in grads {
            let mut g = g.shallow_clone();
            let _ = g.f_mul_scalar_(inv_scale)?;
            if !found && g.f_isfinite()?.f_all()?.f_int64_value(&[])? == 0 {
                found = true;
            }
        }
        Ok(())
    })?;
    Ok(found)
}
