//! LoRA adapters folded into their base, `W + scale · B·A` in fp32 ([`merge_lora`]): read from
//! any source of a LoRA model's parameters ([`MergedWeights`], consolidating an adapter
//! directory), or streamed from a job's weights as they are gathered to rank 0 and written unit
//! by unit into a Hugging Face directory's files ([`MergedStream`], `final/merged/`), so that no
//! rank ever holds the whole model.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::hf_shards::{PlannedTensor, ShardedWriter};
use crate::error::TrainError;
use crate::model::names::{LoraFactor, ParamName};
use crate::model::{CausalLm, ModelError};
use crate::state::param_source::TensorSource;
use flotilla_config::schema::LoraConfig;

/// `w + scale · b @ a`, in fp32, whatever the inputs' dtypes.
pub fn merge_lora(w: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor, TrainError> {
    let _guard = tch::no_grad_guard();
    let update = b
        .f_to_kind(Kind::Float)?
        .f_matmul(&a.f_to_kind(Kind::Float)?)?;
    Ok(w.f_to_kind(Kind::Float)?.f_add(&(update * scale))?)
}

/// The names of the LoRA factors `(A, B)` that adapt base parameter `name` in `model`, when
/// it is adapted.
fn factors_of(model: &CausalLm, name: &str) -> Option<(String, String)> {
    let Some(ParamName::Layer(i, layer)) = ParamName::parse(name) else {
        return None;
    };
    let factor = |f| ParamName::Lora(i, layer, f).hf_name();
    let (a, b) = (factor(LoraFactor::A), factor(LoraFactor::B));
    (model.param_spec(&a).is_some() && model.param_spec(&b).is_some()).then_some((a, b))
}

/// Whether `name` is a base parameter (not a LoRA factor).
fn is_base(name: &str) -> bool {
    !matches!(ParamName::parse(name), Some(ParamName::Lora(..)))
}

/// The base parameters with each adapted weight merged, the rest as they are; read from a LoRA
/// model's parameters (base and factors), one parameter at a time.
pub struct MergedWeights<'a> {
    source: &'a dyn TensorSource,
    model: &'a CausalLm,
    scale: f64,
}

impl<'a> MergedWeights<'a> {
    /// Over `source`, which gives the parameters of `model` (built with `lora`).
    pub fn new(source: &'a dyn TensorSource, model: &'a CausalLm, lora: &LoraConfig) -> Self {
        Self {
            source,
            model,
            scale: lora.scale(),
        }
    }

    /// Parameter `name` of the model, whole, in its source's dtype.
    fn whole(&self, name: &str) -> Result<Tensor, TrainError> {
        let spec = self
            .model
            .param_spec(name)
            .ok_or_else(|| ModelError::MissingParam { name: name.into() })?;
        let t = self.source.read_range(name, 0, spec.numel() as i64)?;
        Ok(t.f_reshape(spec.shape.as_slice())?)
    }

    /// The whole merged tensor of base parameter `name`, in fp32.
    pub fn merged(&self, name: &str) -> Result<Tensor, TrainError> {
        let w = self.whole(name)?;
        match factors_of(self.model, name) {
            Some((a, b)) => merge_lora(&w, &self.whole(&a)?, &self.whole(&b)?, self.scale),
            None => Ok(w.f_to_kind(Kind::Float)?),
        }
    }
}

impl TensorSource for MergedWeights<'_> {
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        Ok(self
            .merged(name)?
            .f_reshape([-1])?
            .f_narrow(0, lo, hi - lo)?
            .f_to_device(Device::Cpu)?)
    }
}

/// The merged model written as its parameters arrive (in any order of units: a unit's base
/// parameters are merged and written once every parameter it needs has arrived), one unit's
/// tensors held on the host at a time. The weights files list the base parameters unit by
/// unit, in the order the model declares them.
pub struct MergedStream<'a> {
    model: &'a CausalLm,
    scale: f64,
    /// For each unit, its base parameters and every parameter merging them reads.
    units: Vec<(Vec<String>, Vec<String>)>,
    next_unit: usize,
    /// Parameters arrived and not yet written, fp32 host copies.
    arrived: HashMap<String, Tensor>,
    writer: ShardedWriter,
}

impl<'a> MergedStream<'a> {
    /// Starts the weights files (`model.safetensors`, or shards of at most `max_shard_bytes`
    /// with an index) of `model` (built with `lora`) merged, in `kind`, in `dir`.
    pub fn create(
        dir: &Path,
        model: &'a CausalLm,
        lora: &LoraConfig,
        kind: Kind,
        max_shard_bytes: u64,
    ) -> Result<Self, TrainError> {
        let mut units = vec![];
        let mut order: Vec<PlannedTensor> = vec![];
        for u in 0..model.units().len() {
            let (mut base, mut needs) = (vec![], vec![]);
            for spec in model.owned_params(u).filter(|s| is_base(&s.name)) {
                order.push((spec.name.clone(), kind, spec.shape.clone()));
                base.push(spec.name.clone());
                needs.push(spec.name.clone());
                if let Some((a, b)) = factors_of(model, &spec.name) {
                    needs.extend([a, b]);
                }
            }
            units.push((base, needs));
        }
        let writer = ShardedWriter::create(dir, "model", order, max_shard_bytes)?;
        Ok(Self {
            model,
            scale: lora.scale(),
            units,
            next_unit: 0,
            arrived: HashMap::new(),
            writer,
        })
    }

    /// Takes parameter `name` of the LoRA model (a base weight or a factor; copied, so the
    /// tensor need only live during the call) and writes every unit it completes.
    pub fn take(&mut self, name: &str, t: &Tensor) -> Result<(), TrainError> {
        let host = t
            .f_to_device(Device::Cpu)?
            .f_to_kind(Kind::Float)?
            .f_detach_copy()?;
        self.arrived.insert(name.to_string(), host);
        while let Some((base, needs)) = self.units.get(self.next_unit) {
            if !needs.iter().all(|n| self.arrived.contains_key(n)) {
                break;
            }
            for name in base {
                let w = &self.arrived[name];
                let merged = match factors_of(self.model, name) {
                    Some((a, b)) => {
                        merge_lora(w, &self.arrived[&a], &self.arrived[&b], self.scale)?
                    }
                    None => w.shallow_clone(),
                };
                self.writer.write(name, &merged)?;
            }
            for n in needs {
                self.arrived.remove(n);
            }
            self.next_unit += 1;
        }
        Ok(())
    }

    /// Finishes the files (an error when a parameter never arrived).
    pub fn finish(self) -> Result<(), TrainError> {
        if let Some((_, needs)) = self.units.get(self.next_unit) {
            let missing = needs
                .iter()
                .find(|n| !self.arrived.contains_key(*n))
                .cloned()
                .unwrap_or_default();
            return Err(ModelError::MissingParam { name: missing }.into());
        }
        self.writer.finish()?;
        Ok(())
    }
}
