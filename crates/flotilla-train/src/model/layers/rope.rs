//! Rotary position embeddings as transformers computes them. This module owns a config's
//! rotary embeddings ([`Rope`]): the inverse frequencies of every rope type transformers'
//! `ROPE_INIT_FUNCTIONS` has (`default`, `linear`, `dynamic`, `yarn`, `longrope`, `llama3`),
//! computed with the same fp32 tensor operations, and the attention scaling `yarn` and
//! `longrope` apply to cos and sin; the choice of frequencies for a batch's sequence length
//! (`dynamic`, `longrope`: transformers' `dynamic_rope_update`); the cos/sin tables of a batch's
//! positions (in fp32, [`Rope::tables`], from frequencies copied to each device once); and their
//! application to queries and keys in the rotate-half convention, to the first `rotary_dim` features of each head only when
//! `partial_rotary_factor` is below 1 ([`apply_rotary`], Phi-3's `apply_rotary_pos_emb`). Which
//! keys each type reads, and the checks of a config, are `flotilla_config::schema`'s
//! ([`ModelConfig::rope_problems`]); [`validate`] gives them as a [`ModelError`].
//!
//! ## Frequencies that depend on the sequence
//!
//! transformers' `dynamic_rope_update` takes the sequence length of a forward as
//! `max(position_ids) + 1` and
//! - for `longrope` uses the long factors' frequencies when it exceeds
//!   `original_max_position_embeddings`, the short factors' otherwise; [`Rope::tables`] does the
//!   same for each table it builds, so flotilla equals transformers in every case: training
//!   (`max(position_ids)` of the whole batch, packed rows included), and generation, where each
//!   cached forward builds the tables of its new positions only and the keys already cached keep
//!   the rotation they were computed with (both sides cache rotated keys);
//! - for `dynamic` recomputes the NTK-scaled frequencies for that length when it exceeds the
//!   longest length seen so far (starting from `max_position_embeddings`), and goes back to the
//!   original frequencies when a forward is shorter than `max_position_embeddings` after a
//!   longer one. transformers keeps that longest length as state of the module; flotilla keeps
//!   none and scales for the length of the forward at hand whenever it exceeds
//!   `max_position_embeddings`. The two agree whenever a forward is at least as long as every
//!   forward since the last one within `max_position_embeddings`: a fresh model, training at a
//!   fixed `data.seq_len`, and generation (each step is longer than the one before: the prefill
//!   scales for the prompt, each new token for the length so far). They differ only for a
//!   forward longer than `max_position_embeddings` but shorter than an earlier one with no
//!   shorter forward between them, where transformers reuses the earlier forward's frequencies.

use std::borrow::Cow;
use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

use flotilla_config::schema::{ModelConfig, RopeScaling, RopeType};

use crate::model::{ForwardCtx, ModelError};

/// Refuses a config whose rotary embeddings are not ones transformers computes (a key the rope
/// type does not read, a required one missing, a value out of range), naming the key and the fix.
pub fn validate(c: &ModelConfig) -> Result<(), ModelError> {
    c.check_rope("").map_err(|p| ModelError::InvalidConfig {
        field: p.key,
        message: format!("{}; {}", p.problem, p.fix),
    })
}

/// How the frequencies follow the sequence length ([`Rope::inv_freq_for`]).
#[derive(Clone, Debug)]
enum Update {
    /// The same frequencies for every length.
    Fixed,
    /// `dynamic`: beyond `max_position_embeddings`, NTK scaling for the sequence's length.
    Dynamic {
        theta: f64,
        dim: i64,
        factor: f64,
        max_position_embeddings: i64,
    },
    /// `longrope`: the long factors' frequencies beyond `original_max_position_embeddings`.
    Longrope {
        long_inv_freq: Vec<f32>,
        original_max_position_embeddings: i64,
    },
}

/// A config's rotary embeddings: the inverse frequencies transformers' rotary-embedding module
/// starts with (its `original_inv_freq`), the attention scaling of cos and sin, and how the
/// frequencies follow the sequence length.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
    attention_scaling: f64,
    update: Update,
    /// `inv_freq` and longrope's long frequencies on each device a forward ran on.
    on_devices: OnDevices,
}

/// Which frequencies a forward of a given length takes ([`Rope::inv_freq_for`]).
enum Frequencies<'a> {
    /// `inv_freq`.
    Base,
    /// longrope's long factors'.
    Long(&'a [f32]),
    /// dynamic's, grown for the length.
    Grown(Vec<f32>),
}

/// Host frequencies' copies on devices, made on first use: a copy from pageable host memory
/// waits for everything queued on a GPU, so a forward must not make one. A clone starts empty.
#[derive(Debug, Default)]
struct OnDevices(Mutex<Vec<(Device, bool, Tensor)>>);

impl Clone for OnDevices {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl OnDevices {
    /// `host` (the base frequencies, or with `long` the long ones) on `device`.
    fn get(&self, host: &[f32], long: bool, device: Device) -> Tensor {
        let mut copies = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, t)) = copies.iter().find(|(d, l, _)| *d == device && *l == long) {
            return t.shallow_clone();
        }
        let t = Tensor::from_slice(host).to_device(device);
        copies.push((device, long, t.shallow_clone()));
        t
    }
}

impl Rope {
    /// The rotary embeddings of `c`: `rope_theta` with `rope_scaling` over
    /// `c.rotary_dim()` features of each head.
    pub fn new(c: &ModelConfig) -> Rope {
        Rope::with_theta(c, c.rope_theta, c.rope_scaling.as_ref())
    }

    /// The rotary embeddings of `c`'s heads with another theta and scaling (Gemma 3's sliding
    /// layers: their own theta, no scaling).
    pub fn with_theta(c: &ModelConfig, theta: f64, scaling: Option<&RopeScaling>) -> Rope {
        let _guard = tch::no_grad_guard();
        let dim = c.rotary_dim() as i64;
        let rope_type = scaling.map_or(RopeType::Default, |s| s.rope_type);
        let scaling = scaling
            .cloned()
            .unwrap_or_else(|| RopeScaling::new(RopeType::Default));
        // The factor and pretraining context as transformers resolves them.
        let view = ModelConfig {
            rope_scaling: Some(scaling.clone()),
            ..c.clone()
        };
        let factor = view.rope_factor();
        let original = view.rope_original_max_position_embeddings() as i64;
        let mut attention_scaling = 1.0;
        let mut update = Update::Fixed;
        let inv = match rope_type {
            RopeType::Default => base_inv_freq(theta, dim),
            RopeType::Linear => base_inv_freq(theta, dim) / factor,
            RopeType::Dynamic => {
                let max = c.max_position_embeddings as i64;
                update = Update::Dynamic {
                    theta,
                    dim,
                    factor,
                    max_position_embeddings: max,
                };
                dynamic_initial(theta, dim, factor, max)
            }
            RopeType::Yarn => {
                attention_scaling = yarn_attention_factor(&scaling, factor);
                yarn(&scaling, theta, dim, factor, original)
            }
            RopeType::Longrope => {
                attention_scaling = scaling
                    .attention_factor
                    .unwrap_or_else(|| longrope_attention_factor(factor, original));
                let long = scaling.long_factor.as_deref().unwrap_or(&[]);
                update = Update::Longrope {
                    long_inv_freq: to_vec(&longrope(theta, dim, long)),
                    original_max_position_embeddings: original,
                };
                longrope(theta, dim, scaling.short_factor.as_deref().unwrap_or(&[]))
            }
            RopeType::Llama3 => llama3(&scaling, theta, dim, factor, original),
        };
        Rope {
            inv_freq: to_vec(&inv),
            attention_scaling,
            update,
            on_devices: OnDevices::default(),
        }
    }

    /// The inverse frequencies for sequences within the original context (transformers'
    /// `original_inv_freq`): `rotary_dim / 2` of them, rounded up.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The factor cos and sin are multiplied by (transformers' `attention_scaling`).
    pub fn attention_scaling(&self) -> f64 {
        self.attention_scaling
    }

    /// The inverse frequencies of a forward whose longest sequence is `seq_len` long
    /// (`max(position_ids) + 1`): `dynamic` scales beyond `max_position_embeddings`,
    /// `longrope` takes its long factors beyond `original_max_position_embeddings` (see the
    /// module docs for how this follows transformers' `dynamic_rope_update`).
    pub fn inv_freq_for(&self, seq_len: i64) -> Cow<'_, [f32]> {
        match self.frequencies(seq_len) {
            Frequencies::Base => Cow::Borrowed(&self.inv_freq),
            Frequencies::Long(long) => Cow::Borrowed(long),
            Frequencies::Grown(f) => Cow::Owned(f),
        }
    }

    fn frequencies(&self, seq_len: i64) -> Frequencies<'_> {
        match &self.update {
            Update::Dynamic {
                theta,
                dim,
                factor,
                max_position_embeddings,
            } if seq_len > *max_position_embeddings => {
                let _guard = tch::no_grad_guard();
                Frequencies::Grown(to_vec(&dynamic_grown(
                    *theta,
                    *dim,
                    *factor,
                    *max_position_embeddings,
                    seq_len,
                )))
            }
            Update::Longrope {
                long_inv_freq,
                original_max_position_embeddings,
            } if seq_len > *original_max_position_embeddings => Frequencies::Long(long_inv_freq),
            _ => Frequencies::Base,
        }
    }

    /// The tables `(cos, sin)` of `positions` (`[T]` or `[B, T]`), `[..., T, 2 * inv_freq.len()]`
    /// in fp32, as transformers' rotary-embedding `forward` computes them: the frequencies of
    /// the forward's length ([`Rope::inv_freq_for`] of `max(positions) + 1`), then cos and sin
    /// times the attention scaling. `max_position`: the largest position when the caller knows
    /// it; otherwise frequencies that follow the length read it from `positions` (a host read).
    pub fn tables(&self, positions: &Tensor, max_position: Option<i64>) -> (Tensor, Tensor) {
        let _guard = tch::no_grad_guard();
        let device = positions.device();
        let frequencies = match self.update {
            Update::Fixed => Frequencies::Base,
            _ if positions.numel() == 0 => Frequencies::Base,
            _ => self
                .frequencies(max_position.unwrap_or_else(|| positions.max().int64_value(&[])) + 1),
        };
        let inv = match frequencies {
            Frequencies::Base => self.on_devices.get(&self.inv_freq, false, device),
            Frequencies::Long(long) => self.on_devices.get(long, true, device),
            Frequencies::Grown(f) => Tensor::from_slice(&f).to_device(device),
        };
        let (cos, sin) = rotary_tables(&inv, positions);
        if self.attention_scaling == 1.0 {
            (cos, sin)
        } else {
            (cos * self.attention_scaling, sin * self.attention_scaling)
        }
    }
}

/// The inverse frequencies `c`'s rotary embeddings start with ([`Rope::inv_freq`]).
pub fn inv_freq(c: &ModelConfig) -> Vec<f32> {
    Rope::new(c).inv_freq
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t).expect("inverse frequencies are f32")
}

/// `torch.arange(0, dim, 2).float() / dim`.
fn exponents(dim: i64) -> Tensor {
    Tensor::arange_start_step(0, dim, 2, (Kind::Int64, Device::Cpu)).to_kind(Kind::Float)
        / dim as f64
}

/// `1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))`: the default frequencies.
fn base_inv_freq(theta: f64, dim: i64) -> Tensor {
    Tensor::pow_scalar(theta, &exponents(dim)).reciprocal()
}

/// `_compute_dynamic_ntk_parameters` at initialisation (`seq_len` is `max_position_embeddings`,
/// a Python int, so the base is computed in f64).
fn dynamic_initial(theta: f64, dim: i64, factor: f64, max: i64) -> Tensor {
    let seq_len = max as f64;
    let base = theta
        * ((factor * seq_len / max as f64) - (factor - 1.0)).powf(dim as f64 / (dim - 2) as f64);
    base_inv_freq(base, dim)
}

/// `_compute_dynamic_ntk_parameters` in `dynamic_rope_update`, where `seq_len` is a tensor
/// (`max(position_ids) + 1`), so the base is an fp32 tensor.
fn dynamic_grown(theta: f64, dim: i64, factor: f64, max: i64, seq_len: i64) -> Tensor {
    let seq = Tensor::from(seq_len.max(max)).to_kind(Kind::Float);
    let base = ((seq * factor) / max as f64 - (factor - 1.0))
        .pow_tensor_scalar(dim as f64 / (dim - 2) as f64)
        * theta;
    base.pow(&exponents(dim)).reciprocal()
}

/// transformers' `get_mscale`.
fn mscale_of(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// `yarn`'s attention factor: `attention_factor`, else from `mscale` and `mscale_all_dim` when
/// both are set (and not 0), else `get_mscale(factor)`.
fn yarn_attention_factor(s: &RopeScaling, factor: f64) -> f64 {
    if let Some(a) = s.attention_factor {
        return a;
    }
    match (
        s.mscale.filter(|m| *m != 0.0),
        s.mscale_all_dim.filter(|m| *m != 0.0),
    ) {
        (Some(m), Some(all)) => mscale_of(factor, m) / mscale_of(factor, all),
        _ => mscale_of(factor, 1.0),
    }
}

/// `_compute_yarn_parameters`' frequencies: interpolated (divided by `factor`) below the
/// correction range, extrapolated (the default ones) above it, a linear ramp between.
fn yarn(s: &RopeScaling, theta: f64, dim: i64, factor: f64, original: i64) -> Tensor {
    // `get("beta_fast") or 32`: a 0 takes the default too.
    let beta_fast = s.beta_fast.filter(|b| *b != 0.0).unwrap_or(32.0);
    let beta_slow = s.beta_slow.filter(|b| *b != 0.0).unwrap_or(1.0);
    let pos_freqs = Tensor::pow_scalar(theta, &exponents(dim));
    let extrapolation = pos_freqs.reciprocal();
    let interpolation = (&pos_freqs * factor).reciprocal();
    let correction_dim = |rotations: f64| {
        (dim as f64 * (original as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if s.truncate.unwrap_or(true) {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min((dim - 1) as f64));
    if low == high {
        high += 0.001; // transformers' guard against a zero-width ramp
    }
    let ramp = ((Tensor::arange(dim / 2, (Kind::Float, Device::Cpu)) - low) / (high - low))
        .clamp(0.0, 1.0);
    let extrapolation_factor = 1.0 - ramp;
    interpolation * (1.0 - &extrapolation_factor) + extrapolation * &extrapolation_factor
}

/// `longrope`'s attention factor when the config gives none.
fn longrope_attention_factor(factor: f64, original: i64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + factor.ln() / (original as f64).ln()).sqrt()
    }
}

/// `_compute_longrope_parameters`' frequencies for one set of factors (one per frequency).
fn longrope(theta: f64, dim: i64, factors: &[f64]) -> Tensor {
    let factors: Vec<f32> = factors.iter().map(|f| *f as f32).collect();
    (Tensor::from_slice(&factors) * Tensor::pow_scalar(theta, &exponents(dim))).reciprocal()
}

/// `_compute_llama3_parameters`: low frequencies divided by `factor`, high ones kept, a smooth
/// blend between.
fn llama3(s: &RopeScaling, theta: f64, dim: i64, factor: f64, original: i64) -> Tensor {
    let inv = base_inv_freq(theta, dim);
    // Both required (`validate`); Llama 3.1's values stand in for a config not validated.
    let (low_freq_factor, high_freq_factor) = (
        s.low_freq_factor.unwrap_or(1.0),
        s.high_freq_factor.unwrap_or(4.0),
    );
    let old_context_len = original as f64;
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
    smoothed.where_self(&medium, &scaled)
}

/// The rotary tables `(cos, sin)` of `positions` (`[T]` or `[B, T]`) for the inverse
/// frequencies `inv_freq` (fp32, on the positions' device), `[..., T, 2 * inv_freq.len()]` in
/// fp32, as transformers' rotary-embedding `forward` computes them before the attention
/// scaling.
pub fn rotary_tables(inv_freq: &Tensor, positions: &Tensor) -> (Tensor, Tensor) {
    // freqs = positions[..., None].float() * inv_freq; emb = cat(freqs, freqs)
    let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
    let emb = Tensor::cat(&[&freqs, &freqs], -1);
    (emb.cos(), emb.sin())
}

/// `x * cos + rotate_half(x) * sin`: the rotary embedding applied to queries or keys
/// `[B, heads, T, head_dim]` with tables from [`rope_tables`]. Tables narrower than the head
/// (`partial_rotary_factor` below 1) rotate its first features and pass the rest through, as
/// Phi-3's `apply_rotary_pos_emb` does.
pub fn apply_rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let rotary = cos.size()[cos.dim() - 1];
    let head = x.size()[x.dim() - 1];
    if rotary == head {
        return x * cos + rotate_half(x) * sin;
    }
    let rot = x.narrow(-1, 0, rotary);
    let pass = x.narrow(-1, rotary, head - rotary);
    let rotated = &rot * cos + rotate_half(&rot) * sin;
    Tensor::cat(&[&rotated, &pass], -1)
}

pub fn rotate_half(x: &Tensor) -> Tensor {
    let half = x.size()[x.dim() - 1] / 2;
    let x1 = x.narrow(-1, 0, half);
    let x2 = x.narrow(-1, half, half);
    Tensor::cat(&[&x2.neg(), &x1], -1)
}

/// Rotary tables shaped to broadcast over `[B, heads, T, head_dim]`, in `kind`.
pub fn rope_tables(ctx: &ForwardCtx, kind: Kind) -> (Tensor, Tensor) {
    shape_tables(&ctx.cos, &ctx.sin, kind)
}

/// Tables `cos`, `sin` (`[T, d]` or `[B, T, d]`) shaped to broadcast over
/// `[B, heads, T, head_dim]`, in `kind`.
pub fn shape_tables(cos: &Tensor, sin: &Tensor, kind: Kind) -> (Tensor, Tensor) {
    let shape = |t: &Tensor| {
        let t = t.to_kind(kind);
        if t.dim() == 2 {
            t.unsqueeze(0).unsqueeze(0)
        } else {
            t.unsqueeze(1)
        }
    };
    (shape(cos), shape(sin))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CausalLm;
    use flotilla_config::schema::hf_config::HfLlamaConfig;

    /// head_dim 16, `max_position_embeddings` 64.
    fn config(scaling: Option<RopeScaling>, partial: Option<f64>) -> ModelConfig {
        let text = r#"{"vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
                       "num_hidden_layers": 1, "num_attention_heads": 4,
                       "max_position_embeddings": 64}"#;
        let hf = HfLlamaConfig::from_json(text, std::path::Path::new("config.json")).unwrap();
        ModelConfig {
            rope_scaling: scaling,
            partial_rotary_factor: partial,
            ..ModelConfig::try_from(&hf).unwrap()
        }
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn partial_rotary_rotates_the_first_features_and_passes_the_rest() {
        let c = config(None, Some(0.5));
        let rope = Rope::new(&c);
        assert_eq!(rope.inv_freq().len(), 4);
        let (cos, sin) = rope.tables(&Tensor::arange(5, (Kind::Int64, Device::Cpu)), None);
        assert_eq!(cos.size(), [5, 8]);
        let (cos, sin) = shape_tables(&cos, &sin, Kind::Float);
        let x = Tensor::randn([2, 3, 5, 16], (Kind::Float, Device::Cpu));
        let y = apply_rotary(&x, &cos, &sin);
        assert_eq!(y.size(), x.size());
        assert!(
            y.narrow(-1, 8, 8).equal(&x.narrow(-1, 8, 8)),
            "the rest passed"
        );
        let rotated = apply_rotary(&x.narrow(-1, 0, 8), &cos, &sin);
        assert!(y.narrow(-1, 0, 8).equal(&rotated));
        // Position 0 rotates nothing; later positions do.
        assert!(max_diff(&y.narrow(2, 0, 1), &x.narrow(2, 0, 1)) < 1e-6);
        assert!(max_diff(&y.narrow(-1, 0, 8), &x.narrow(-1, 0, 8)) > 0.1);
        // Partial frequencies are the full ones of an 8-wide head.
        let narrow = config(None, None);
        let narrow = ModelConfig {
            hidden_size: 32,
            ..narrow
        };
        assert_eq!(Rope::new(&narrow).inv_freq(), rope.inv_freq());
    }

    #[test]
    fn longrope_switches_to_its_long_factors_beyond_the_original_context() {
        let scaling = RopeScaling {
            short_factor: Some(vec![1.0; 8]),
            long_factor: Some(vec![2.0; 8]),
            original_max_position_embeddings: Some(16),
            ..RopeScaling::new(RopeType::Longrope)
        };
        let c = config(Some(scaling), None);
        let rope = Rope::new(&c);
        let plain = Rope::new(&config(None, None));
        assert_eq!(rope.inv_freq(), plain.inv_freq(), "short factors of 1");
        assert_eq!(rope.inv_freq_for(16), plain.inv_freq_for(16));
        let long = rope.inv_freq_for(17);
        for (l, p) in long.iter().zip(plain.inv_freq()) {
            assert!((l * 2.0 / p - 1.0).abs() < 1e-6, "long factors of 2");
        }
        // max_position_embeddings / original = 4: sqrt(1 + ln 4 / ln 16) = sqrt(1.5).
        assert!((rope.attention_scaling() - 1.5f64.sqrt()).abs() < 1e-12);
        // The whole table takes the frequencies of its longest sequence.
        let (cos, _) = rope.tables(&Tensor::arange(20, (Kind::Int64, Device::Cpu)), None);
        let (within, _) = rope.tables(&Tensor::arange(16, (Kind::Int64, Device::Cpu)), None);
        let (plain_cos, _) = plain.tables(&Tensor::arange(20, (Kind::Int64, Device::Cpu)), None);
        assert!(max_diff(&within, &(plain_cos.narrow(0, 0, 16) * 1.5f64.sqrt())) < 1e-6);
        assert!(max_diff(&cos.narrow(0, 0, 16), &within) > 1e-2);
        // A largest position the caller knows picks the same frequencies as reading it, on
        // either side of the original context (the device copies are reused, not changed).
        let packed = Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 3, 4]).reshape([2, 4]);
        for (positions, max) in [
            (Tensor::arange(20, (Kind::Int64, Device::Cpu)), 19),
            (packed, 4),
        ] {
            for _ in 0..2 {
                let (known, _) = rope.tables(&positions, Some(max));
                let (read, _) = rope.tables(&positions, None);
                assert_eq!(max_diff(&known, &read), 0.0);
            }
        }
        let (again, _) = rope.tables(&Tensor::arange(16, (Kind::Int64, Device::Cpu)), Some(15));
        assert_eq!(max_diff(&again, &within), 0.0);
    }

    #[test]
    fn dynamic_rope_scales_only_beyond_max_position_embeddings() {
        let scaling = RopeScaling {
            factor: Some(2.0),
            ..RopeScaling::new(RopeType::Dynamic)
        };
        let rope = Rope::new(&config(Some(scaling), None));
        let plain = Rope::new(&config(None, None));
        assert_eq!(rope.inv_freq(), plain.inv_freq());
        assert_eq!(rope.inv_freq_for(64), plain.inv_freq_for(64));
        let grown = rope.inv_freq_for(128);
        // base * (2 * 128 / 64 - 1)^(16 / 14): the first frequency stays 1, the rest fall.
        assert_eq!(grown[0], 1.0);
        let base = 10000.0f64 * 3.0f64.powf(16.0 / 14.0);
        let want = base.powf(-14.0 / 16.0);
        assert!(
            (grown[7] as f64 / want - 1.0).abs() < 1e-5,
            "{} vs {want}",
            grown[7]
        );
        assert!(rope.inv_freq_for(100)[7] > grown[7]);
    }

    #[test]
    fn yarn_scales_cos_and_sin_by_its_attention_factor() {
        let scaling = RopeScaling {
            factor: Some(4.0),
            original_max_position_embeddings: Some(16),
            ..RopeScaling::new(RopeType::Yarn)
        };
        let rope = Rope::new(&config(Some(scaling.clone()), None));
        let want = 0.1 * 4.0f64.ln() + 1.0;
        assert_eq!(rope.attention_scaling(), want);
        let (cos, sin) = rope.tables(&Tensor::from_slice(&[0i64]), None);
        assert!(
            max_diff(
                &cos,
                &Tensor::full([1, 16], want, (Kind::Float, Device::Cpu))
            ) < 1e-6
        );
        assert_eq!(sin.abs().max().double_value(&[]), 0.0);
        let given = RopeScaling {
            attention_factor: Some(0.5),
            ..scaling
        };
        assert_eq!(
            Rope::new(&config(Some(given), None)).attention_scaling(),
            0.5
        );
    }

    #[test]
    fn a_model_refuses_rope_settings_naming_the_key() {
        let scaling = RopeScaling::new(RopeType::Linear);
        let err = CausalLm::new(&config(Some(scaling), None))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "model.rope_scaling.factor: is missing; rope_type linear requires it; add it, e.g. \
             rope_scaling.factor=8.0"
        );
        let err = CausalLm::new(&config(None, Some(0.0)))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("model.partial_rotary_factor: must be above 0"),
            "{err}"
        );
    }
}
