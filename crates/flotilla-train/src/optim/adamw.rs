//! The optimizer: AdamW exactly as `torch.optim.AdamW` (its fused kernel; the single-tensor path
//! kept as the op-for-op reference), with weight decay only on parameters of two or more
//! dimensions, and global gradient-norm clipping as `torch.nn.utils.clip_grad_norm_` (the
//! per-tensor norms by one multi-tensor kernel). This file owns the update formulas and the optimizer state
//! (step count, `exp_avg`, `exp_avg_sq`) and its (de)serialisation to safetensors.

use std::path::Path;

use indexmap::IndexMap;
use tch::{Kind, Tensor};

use super::fused::{foreach_norm, fused_adamw, FusedAdamW};
use crate::error::TrainError;
use crate::model::Params;

/// Hyper-parameters of AdamW other than the learning rate (which the schedule gives per step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub betas: [f64; 2],
    pub eps: f64,
    /// Decoupled weight decay, applied only to parameters with `dim() >= 2`.
    pub weight_decay: f64,
}

/// The per-step scalars of an AdamW update (step count `t` after increment).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StepScalars {
    lr: f64,
    weight_decay: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    /// `lr / (1 − β1^t)`.
    step_size: f64,
    /// `sqrt(1 − β2^t)`.
    bc2_sqrt: f64,
}

impl AdamWConfig {
    /// The scalars of step `t` (1-based, after increment) at learning rate `lr`.
    pub(crate) fn scalars(&self, t: u64, lr: f64) -> StepScalars {
        let [beta1, beta2] = self.betas;
        let t = t as f64;
        StepScalars {
            lr,
            weight_decay: self.weight_decay,
            beta1,
            beta2,
            eps: self.eps,
            // As torch's `lr / (1 - beta1**step)` and `(1 - beta2**step) ** 0.5`, in f64.
            step_size: lr / (1.0 - beta1.powf(t)),
            bc2_sqrt: (1.0 - beta2.powf(t)).powf(0.5),
        }
    }
}

/// Whether a tensor gets decoupled weight decay.
pub(crate) enum Decay {
    None,
    All,
}

/// One AdamW update of `p` (in place, under the caller's `no_grad`) with gradient `g` and
/// moments `m`, `v`: `p *= 1 − lr·wd` where decay applies; `m = lerp(m, g, 1−β1)`;
/// `v = β2·v + (1−β2)·g²`; `p −= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)`.
pub(crate) fn adamw_update(
    p: &mut Tensor,
    g: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    h: &StepScalars,
    decay: Decay,
) -> Result<(), TrainError> {
    let g = g.f_to_kind(p.kind())?;
    if h.weight_decay != 0.0 {
        let factor = 1.0 - h.lr * h.weight_decay;
        match decay {
            Decay::None => {}
            Decay::All => {
                let _ = p.f_mul_scalar_(factor)?;
            }
        }
    }
    // torch's single-tensor AdamW kernel by kernel (`addcmul_` and `addcdiv_` with their
    // `value` folded into the first operand, which is where the kernels apply it), so both
    // round alike on any CPU: `lerp_`, `mul_(β2).addcmul_(g, g, value=1−β2)`,
    // `denom = (v.sqrt() / bc2_sqrt).add_(eps)`, `p.addcdiv_(m, denom, value=−step_size)`.
    let _ = m.f_lerp_(&g, 1.0 - h.beta1)?;
    let _ = v.f_mul_scalar_(h.beta2)?;
    let _ = v.f_addcmul_(&g.f_mul_scalar(1.0 - h.beta2)?, &g)?;
    let denom = v.f_sqrt()?.f_div_scalar(h.bc2_sqrt)?.f_add_scalar_(h.eps)?;
    let _ = p.f_addcdiv_(&m.f_mul_scalar(-h.step_size)?, &denom)?;
    Ok(())
}

/// Decoupled weight decay of the elements of `p` where `mask` is set: `p *= factor` there
/// (`factor` = 1 − lr·wd), in place; nowhere when `found_inf` (fp16's flag on the device)
/// holds 1, as the fused update it precedes then changes nothing either.
pub(crate) fn decay_where(
    p: &mut Tensor,
    factor: f64,
    mask: &Tensor,
    found_inf: Option<&Tensor>,
) -> Result<(), TrainError> {
    let one = Tensor::f_ones([1], (p.kind(), p.device()))?;
    let mut factor = one.f_mul_scalar(factor)?;
    if let Some(found) = found_inf {
        let clean = found.f_to_device(p.device())?.f_eq(0.0)?;
        factor = factor.f_where_self(&clean, &one)?;
    }
    let factor = factor.f_where_self(mask, &one)?;
    let _ = p.f_mul_(&factor)?;
    Ok(())
}

/// Per-parameter moments.
#[derive(Debug)]
pub struct ParamState {
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}

/// AdamW over a named parameter set. Parameters are updated in place (under `no_grad`).
#[derive(Debug)]
pub struct AdamW {
    pub config: AdamWConfig,
    /// Optimizer steps taken (torch's `state["step"]`, the same for every parameter here).
    step: u64,
    state: IndexMap<String, ParamState>,
}

impl AdamW {
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            step: 0,
            state: IndexMap::new(),
        }
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    pub fn state(&self) -> &IndexMap<String, ParamState> {
        &self.state
    }

    /// One AdamW step with learning rate `lr`, by libtorch's fused kernel (torch's
    /// `AdamW(fused=True)`, two calls: the parameters with weight decay and those without).
    /// Every parameter of `params` with a gradient in `grads` (same name) is updated; parameters
    /// without one are skipped, as torch skips `p.grad is None`. The moments are created (zeros)
    /// on first use.
    ///
    /// Per parameter, with `t` the step count after increment:
    /// `p *= 1 − lr·wd` (if `p.dim() ≥ 2`); `m = lerp(m, g, 1−β1)`; `v = β2·v + (1−β2)·g²`;
    /// `p −= lr/(1−β1^t) · m / (sqrt(v)/sqrt(1−β2^t) + eps)`.
    pub fn step(&mut self, params: &Params, grads: &Params, lr: f64) -> Result<(), TrainError> {
        self.step_unless(params, grads, lr, None)
    }

    /// [`AdamW::step`] that changes nothing where `found_inf` (fp16's flag on the device) holds
    /// 1, decided by the fused kernel without reading the flag; the step count advances either
    /// way, and [`AdamW::forget_step`] takes it back once the flag is read set.
    pub fn step_unless(
        &mut self,
        params: &Params,
        grads: &Params,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), TrainError> {
        self.check_shapes(params, grads)?;
        self.step += 1;
        let [beta1, beta2] = self.config.betas;
        tch::no_grad(|| -> Result<(), TrainError> {
            // (params, grads, exp_avgs, exp_avg_sqs) without and with weight decay.
            let mut lists: [[Vec<Tensor>; 4]; 2] = Default::default();
            for (name, p) in params.iter() {
                let Some(g) = grads.get(name) else { continue };
                let st = self.moments(name, p);
                let list = &mut lists[usize::from(p.dim() >= 2)];
                list[0].push(p.shallow_clone());
                list[1].push(g.shallow_clone());
                list[2].push(st.exp_avg.shallow_clone());
                list[3].push(st.exp_avg_sq.shallow_clone());
            }
            for (decay, [p, g, m, v]) in lists.iter().enumerate() {
                if p.is_empty() {
                    continue;
                }
                let h = FusedAdamW {
                    step: self.step,
                    lr,
                    beta1,
                    beta2,
                    weight_decay: if decay == 1 {
                        self.config.weight_decay
                    } else {
                        0.0
                    },
                    eps: self.config.eps,
                };
                fused_adamw(p, g, m, v, &h, found_inf)?;
            }
            Ok(())
        })
    }

    /// Takes back the count of the last step, which its found-inf flag skipped.
    pub fn forget_step(&mut self) {
        self.step = self.step.saturating_sub(1);
    }

    /// A parameter's moments, created (zeros) on first use.
    fn moments(&mut self, name: &str, p: &Tensor) -> &ParamState {
        self.state
            .entry(name.to_string())
            .or_insert_with(|| ParamState {
                exp_avg: p.zeros_like(),
                exp_avg_sq: p.zeros_like(),
            })
    }

    /// Every gradient's and moment's shape against its parameter's, so that an error leaves the
    /// state untouched.
    fn check_shapes(&self, params: &Params, grads: &Params) -> Result<(), TrainError> {
        for (name, p) in params.iter() {
            let Some(g) = grads.get(name) else { continue };
            let state_shape = self.state.get(name).map(|s| s.exp_avg.size());
            for found in [Some(g.size()), state_shape].into_iter().flatten() {
                if found != p.size() {
                    return Err(TrainError::Shape {
                        name: name.to_string(),
                        expected: p.size(),
                        found,
                    });
                }
            }
        }
        Ok(())
    }

    /// [`AdamW::step`] parameter by parameter, kernel by kernel as torch's single-tensor AdamW
    /// (`foreach=False`), which it equals op for op: the reference the fused step is checked
    /// against.
    pub fn step_single_tensor(
        &mut self,
        params: &Params,
        grads: &Params,
        lr: f64,
    ) -> Result<(), TrainError> {
        self.check_shapes(params, grads)?;
        self.step += 1;
        let h = self.config.scalars(self.step, lr);
        tch::no_grad(|| -> Result<(), TrainError> {
            for (name, p) in params.iter() {
                let Some(g) = grads.get(name) else { continue };
                self.moments(name, p);
                let st = self.state.get_mut(name).expect("moments were just made");
                let decay = if p.dim() >= 2 {
                    Decay::All
                } else {
                    Decay::None
                };
                adamw_update(
                    &mut p.shallow_clone(),
                    g,
                    &mut st.exp_avg,
                    &mut st.exp_avg_sq,
                    &h,
                    decay,
                )?;
            }
            Ok(())
        })
    }

    /// The state as named tensors: `{param}.exp_avg`, `{param}.exp_avg_sq`, and `step`
    /// (a scalar int64).
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("step".to_string(), Tensor::from(self.step as i64))];
        for (n, s) in &self.state {
            out.push((format!("{n}.exp_avg"), s.exp_avg.shallow_clone()));
            out.push((format!("{n}.exp_avg_sq"), s.exp_avg_sq.shallow_clone()));
        }
        out
    }

    /// Restores a state produced by [`AdamW::state_tensors`] (on the device and in the kind of
    /// the stored tensors; move them first if needed).
    pub fn load_state_tensors(
        &mut self,
        tensors: impl IntoIterator<Item = (String, Tensor)>,
    ) -> Result<(), TrainError> {
        let mut step = None;
        let mut avg: IndexMap<String, Tensor> = IndexMap::new();
        let mut sq: IndexMap<String, Tensor> = IndexMap::new();
        for (name, t) in tensors {
            if name == "step" {
                step = Some(t.f_int64_value(&[])? as u64);
            } else if let Some(p) = name.strip_suffix(".exp_avg_sq") {
                sq.insert(p.to_string(), t);
            } else if let Some(p) = name.strip_suffix(".exp_avg") {
                avg.insert(p.to_string(), t);
            } else {
                return Err(TrainError::BadState(format!("unexpected tensor `{name}`")));
            }
        }
        let step = step.ok_or_else(|| TrainError::BadState("no `step` tensor".into()))?;
        let mut state = IndexMap::new();
        for (name, exp_avg) in avg {
            let exp_avg_sq = sq
                .shift_remove(&name)
                .ok_or_else(|| TrainError::BadState(format!("`{name}` has no exp_avg_sq")))?;
            state.insert(
                name,
                ParamState {
                    exp_avg,
                    exp_avg_sq,
                },
            );
        }
        if let Some(name) = sq.keys().next() {
            return Err(TrainError::BadState(format!("`{name}` has no exp_avg")));
        }
        self.step = step;
        self.state = state;
        Ok(())
    }

    /// Writes the state to a safetensors file.
    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        crate::state::whole_file::write_safetensors(path, &self.state_tensors())
    }

    /// Reads a state written by [`AdamW::save`].
    pub fn load(&mut self, path: &Path) -> Result<(), TrainError> {
        self.load_state_tensors(crate::state::whole_file::read_safetensors(path)?)
    }
}

/// The global L2 norm of `grads` (as `torch.nn.utils.clip_grad_norm_`: the norm of the
/// per-tensor norms, in fp32), returned before clipping as a scalar on the device (not read).
/// With `max_norm > 0`, every gradient is scaled in place by `min(1, max_norm / (norm + 1e-6))`.
pub fn clip_grad_norm(grads: &Params, max_norm: f64) -> Result<Tensor, TrainError> {
    tch::no_grad(|| {
        let fp32: Vec<Tensor> = grads
            .iter()
            .map(|(_, g)| g.f_to_kind(Kind::Float))
            .collect::<Result<_, _>>()?;
        let norms = foreach_norm(&fp32)?;
        if norms.is_empty() {
            return Ok(Tensor::f_zeros([], (Kind::Float, tch::Device::Cpu))?);
        }
        let total = Tensor::f_stack(&norms, 0)?.f_norm()?;
        scale_to_max_norm(&total, max_norm, grads.iter().map(|(_, g)| g))?;
        Ok(total)
    })
}

/// Clips gradients whose global norm is `total` (a scalar tensor) to `max_norm` in place: each
/// is scaled by `min(1, max_norm / (total + 1e-6))`, as `clip_grad_norm_`. Nothing when
/// `max_norm <= 0`.
pub(crate) fn scale_to_max_norm<'a>(
    total: &Tensor,
    max_norm: f64,
    grads: impl Iterator<Item = &'a Tensor>,
) -> Result<(), TrainError> {
    if max_norm <= 0.0 {
        return Ok(());
    }
    // torch's `max_norm / (total + 1e-6)` is `reciprocal() * max_norm` on a tensor.
    let coef = ((total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
    tch::no_grad(|| {
        for g in grads {
            let c = coef.f_to_device(g.device())?.f_to_kind(g.kind())?;
            let _ = g.shallow_clone().f_mul_(&c)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn named(tensors: &[(&str, &Tensor)]) -> Params {
        let mut p = Params::new();
        for (name, t) in tensors {
            p.insert(name.to_string(), t.copy());
        }
        p
    }

    /// fp16's found-inf flag decides on the device: set, the fused update and the decay
    /// change nothing (and the count is taken back); clear, the update is the plain one.
    #[test]
    fn a_set_found_inf_flag_skips_the_update_without_a_read() {
        tch::manual_seed(3);
        let rand = |s: &[i64]| Tensor::randn(s, (Kind::Float, Device::Cpu));
        let (w, b) = (rand(&[4, 3]), rand(&[3]));
        let (gw, gb) = (rand(&[4, 3]), rand(&[3]));
        let grads = named(&[("w", &gw), ("b", &gb)]);
        let config = AdamWConfig {
            betas: [0.9, 0.95],
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let flag = |v: f64| Tensor::full([1], v, (Kind::Float, Device::Cpu));

        let skipped = named(&[("w", &w), ("b", &b)]);
        let mut opt = AdamW::new(config);
        opt.step_unless(&skipped, &grads, 1e-2, Some(&flag(1.0)))
            .unwrap();
        assert!(skipped.get("w").unwrap().equal(&w) && skipped.get("b").unwrap().equal(&b));
        assert_eq!(opt.steps(), 1);
        opt.forget_step();
        assert_eq!(opt.steps(), 0);
        for state in opt.state().values() {
            assert_eq!(state.exp_avg.abs().sum(Kind::Float).double_value(&[]), 0.0);
            assert_eq!(
                state.exp_avg_sq.abs().sum(Kind::Float).double_value(&[]),
                0.0
            );
        }
        // The next, clean step equals a first plain step.
        opt.step_unless(&skipped, &grads, 1e-2, Some(&flag(0.0)))
            .unwrap();
        let plain = named(&[("w", &w), ("b", &b)]);
        AdamW::new(config).step(&plain, &grads, 1e-2).unwrap();
        for name in ["w", "b"] {
            let (got, want) = (skipped.get(name).unwrap(), plain.get(name).unwrap());
            assert!(got.equal(want), "{name}");
            assert!(
                !got.equal(if name == "w" { &w } else { &b }),
                "{name} moved"
            );
        }

        // The element-wise decay FSDP applies before its fused update follows the flag too.
        let mask = Tensor::from_slice(&[true, false, true]);
        for (found, want) in [(1.0, [2.0, 2.0, 2.0]), (0.0, [1.8, 2.0, 1.8])] {
            let mut p = Tensor::full([3], 2.0, (Kind::Float, Device::Cpu));
            decay_where(&mut p, 0.9, &mask, Some(&flag(found))).unwrap();
            let got = Vec::<f32>::try_from(&p).unwrap();
            for (g, w) in got.iter().zip(want) {
                assert!((*g as f64 - w).abs() < 1e-6, "found {found}: {got:?}");
            }
        }
    }
}
