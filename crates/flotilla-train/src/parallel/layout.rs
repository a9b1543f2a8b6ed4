//! Flat parameter groups of FSDP: which engine units form a group under an auto-wrap policy
//! ([`wrap_units`]), where each owned parameter sits in its group's flat, padded tensor
//! ([`GroupLayout`], [`layouts`]), a shard's slice of it, and the conversion between named
//! tensors and flat ones ([`flatten`], [`unflatten`]). Sharded checkpoints store these
//! layouts; `fsdp.rs` runs the groups.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::TrainError;
use crate::model::{CausalLm, Params};
use crate::state::param_source::TensorSource;
use flotilla_config::schema::AutoWrapPolicy;

/// One parameter's place in a flat group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlatEntry {
    pub name: String,
    pub shape: Vec<i64>,
    pub offset: i64,
    pub numel: i64,
}

/// The layout of one flat parameter group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupLayout {
    /// Engine units whose parameters the group owns.
    pub units: Range<usize>,
    pub entries: Vec<FlatEntry>,
    /// Elements without padding.
    pub numel: i64,
    /// Elements with padding (`shard_len × shard group size`).
    pub padded: i64,
    pub shard_len: i64,
    /// Whether the group's parameters are trained (false: a LoRA job's frozen base, which has
    /// no gradient, no optimizer state and no place in checkpoints).
    #[serde(default = "trained")]
    pub trainable: bool,
}

fn trained() -> bool {
    true
}

/// Groups of engine units under an auto-wrap policy ([`AutoWrapPolicy::groups`] over the
/// parameters each unit owns).
pub fn wrap_units(
    model: &CausalLm,
    wrap: AutoWrapPolicy,
    min_num_params: u64,
) -> Vec<Range<usize>> {
    let owned: Vec<u64> = (0..model.units().len())
        .map(|u| model.owned_params(u).map(|s| s.numel() as u64).sum())
        .collect();
    wrap.groups(&owned, min_num_params)
}

/// Flat layouts of `groups` for a shard group of `shard_world` ranks. A range whose units own
/// both trained and frozen parameters (LoRA) becomes two groups, the frozen one first, so that
/// one flat parameter never mixes the two.
pub fn layouts(model: &CausalLm, groups: &[Range<usize>], shard_world: usize) -> Vec<GroupLayout> {
    let mut out = vec![];
    for units in groups {
        for trainable in [false, true] {
            let mut entries = vec![];
            let mut offset = 0i64;
            for u in units.clone() {
                for s in model.owned_params(u).filter(|s| s.trainable == trainable) {
                    let numel = s.numel() as i64;
                    entries.push(FlatEntry {
                        name: s.name.clone(),
                        shape: s.shape.clone(),
                        offset,
                        numel,
                    });
                    offset += numel;
                }
            }
            if entries.is_empty() {
                continue;
            }
            let w = shard_world as i64;
            let shard_len = (offset + w - 1) / w;
            out.push(GroupLayout {
                units: units.clone(),
                entries,
                numel: offset,
                padded: shard_len * w,
                shard_len,
                trainable,
            });
        }
    }
    out
}

impl GroupLayout {
    /// The parameters' pieces inside shard `rank`: `(start within the shard, length, entry)`,
    /// in layout order (padding left out).
    pub fn local_pieces(&self, rank: usize) -> impl Iterator<Item = (i64, i64, &FlatEntry)> {
        let lo = rank as i64 * self.shard_len;
        let hi = lo + self.shard_len;
        self.entries.iter().filter_map(move |e| {
            let a = e.offset.max(lo);
            let b = (e.offset + e.numel).min(hi);
            (a < b).then_some((a - lo, b - a, e))
        })
    }

    /// Shard `rank`'s part of a flat `[padded]` tensor (a view).
    pub fn shard_of(&self, flat: &Tensor, rank: usize) -> Result<Tensor, TrainError> {
        Ok(flat.f_narrow(0, rank as i64 * self.shard_len, self.shard_len)?)
    }

    /// Copies the tensors of `named` into their slots of the flat `[padded]` tensor `flat`;
    /// with `require_all`, a parameter missing from `named` is an error, else its slot is
    /// left as it is.
    pub(crate) fn fill(
        &self,
        flat: &Tensor,
        named: &Params,
        require_all: bool,
    ) -> Result<(), TrainError> {
        tch::no_grad(|| {
            for e in &self.entries {
                let Some(src) = named.get(&e.name) else {
                    if require_all {
                        return Err(TrainError::BadState(format!(
                            "no tensor for parameter `{}`",
                            e.name
                        )));
                    }
                    continue;
                };
                flat.f_narrow(0, e.offset, e.numel)?
                    .f_copy_(&src.f_reshape([-1])?)?;
            }
            Ok(())
        })
    }
}

/// A flat, padded tensor of a group from named tensors (in `kind`, on `device`).
pub fn flatten(
    layout: &GroupLayout,
    named: &Params,
    kind: Kind,
    device: Device,
) -> Result<Tensor, TrainError> {
    let flat = Tensor::f_zeros([layout.padded], (kind, device))?;
    layout.fill(&flat, named, true)?;
    Ok(flat)
}

/// Named views of a flat group tensor.
pub fn unflatten(layout: &GroupLayout, flat: &Tensor, out: &mut Params) -> Result<(), TrainError> {
    for e in &layout.entries {
        out.insert(
            e.name.clone(),
            flat.f_narrow(0, e.offset, e.numel)?
                .f_view(e.shape.as_slice())?,
        );
    }
    Ok(())
}

impl GroupLayout {
    /// Shard `rank` of this group's flat tensor, built from `source` (only the elements the
    /// shard holds are read; padding is zero), in `kind` on `device`.
    pub fn shard_from(
        &self,
        source: &dyn TensorSource,
        rank: usize,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor, TrainError> {
        let lo = rank as i64 * self.shard_len;
        self.slice_from(source, lo, lo + self.shard_len, kind, device)
    }

    /// Elements `lo..hi` of this group's flat, padded tensor, built from `source` (only those
    /// elements are read; padding is zero), in `kind` on `device`.
    pub fn slice_from(
        &self,
        source: &dyn TensorSource,
        lo: i64,
        hi: i64,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor, TrainError> {
        let _guard = tch::no_grad_guard();
        let out = Tensor::f_zeros([hi - lo], (kind, device))?;
        for e in &self.entries {
            let a = e.offset.max(lo);
            let b = (e.offset + e.numel).min(hi);
            if a >= b {
                continue;
            }
            let piece = source.read_range(&e.name, a - e.offset, b - e.offset)?;
            out.f_narrow(0, a - lo, b - a)?.f_copy_(&piece)?;
        }
        Ok(out)
    }
}
