//! LoRA adapters folded into their base, `W + scale · B·A` in fp32 ([`merge_lora`]): read from
//! any source of a LoRA model's parameters ([`MergedWeights`], consolidating an adapter
//! directory), or streamed from a job's weights as they are gathered to rank 0 and written unit
//! by unit into a Hugging Face directory's files ([`MergedStream`], `final/merged/`), so that no
//! rank ever holds the whole model.

use std::collections::HashMap;
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::hf_shards::{hub_planned, PlannedTensor, ShardedWriter};
use crate::error::TrainError;
use crate::model::names::{ExpertProj, ExpertWrap, LoraFactor, ParamName};
use crate::model::{CausalLm, ModelError};
use crate::state::param_source::TensorSource;
use flotilla_config::schema::LoraConfig;

/// `w + scale · b @ a`, in fp32, whatever the inputs' dtypes (batched over a leading
/// dimension, one product per slice, when the factors have one).
pub fn merge_lora(w: &Tensor, a: &Tensor, b: &Tensor, scale: f64) -> Result<Tensor, TrainError> {
    let _guard = tch::no_grad_guard();
    let update = b
        .f_to_kind(Kind::Float)?
        .f_matmul(&a.f_to_kind(Kind::Float)?)?;
    Ok(w.f_to_kind(Kind::Float)?.f_add(&(update * scale))?)
}

/// The LoRA factors that adapt one base parameter.
struct Factors {
    a: String,
    b: String,
    scale: f64,
    /// A stacked expert parameter's factors, over this many experts (PEFT's layout: `A`'s rows
    /// expert-major, `B`'s columns rank-major).
    experts: Option<i64>,
}

impl Factors {
    /// `w + scale · update`, in fp32.
    fn merge(&self, w: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor, TrainError> {
        let Some(experts) = self.experts else {
            return merge_lora(w, a, b, self.scale);
        };
        // PEFT's `einsum("o r e, e r i -> e o i")`: expert e's `B_e @ A_e`, one batched product.
        let r = a.size()[0] / experts;
        let a = a.f_reshape([experts, r, -1])?;
        let b = b
            .f_reshape([b.size()[0], r, experts])?
            .f_permute([2, 0, 1])?;
        merge_lora(w, &a, &b, self.scale)
    }
}

/// The LoRA factors that adapt base parameter `name` in `model` (built with `lora`), when it
/// is adapted.
fn factors_of(model: &CausalLm, lora: &LoraConfig, name: &str) -> Option<Factors> {
    let config = model.config();
    let plain = |a: ParamName, b: ParamName| Factors {
        a: a.hf_name(),
        b: b.hf_name(),
        scale: lora.scale(),
        experts: None,
    };
    let found = match ParamName::parse(name)? {
        ParamName::Layer(i, w) => plain(
            ParamName::Lora(i, w, LoraFactor::A),
            ParamName::Lora(i, w, LoraFactor::B),
        ),
        ParamName::Router(i, _) => plain(
            ParamName::RouterLora(i, LoraFactor::A),
            ParamName::RouterLora(i, LoraFactor::B),
        ),
        ParamName::Experts(i, proj, _) => {
            let on = lora.expert_targets(config);
            let (adapted, scale) = match proj {
                ExpertProj::GateUp => (on.gate_up, lora.gate_up_scale()),
                ExpertProj::Down => (on.down, lora.scale()),
            };
            if !adapted {
                return None;
            }
            let wrap = ExpertWrap::of(proj, on.gate_up, on.down);
            Factors {
                a: ParamName::ExpertLora(i, wrap, LoraFactor::A).hf_name(),
                b: ParamName::ExpertLora(i, wrap, LoraFactor::B).hf_name(),
                scale,
                experts: Some(config.moe.as_ref()?.num_experts as i64),
            }
        }
        _ => return None,
    };
    (model.param_spec(&found.a).is_some() && model.param_spec(&found.b).is_some()).then_some(found)
}

/// Whether `name` is a base parameter (not a LoRA factor).
fn is_base(name: &str) -> bool {
    !ParamName::parse(name).is_some_and(|p| p.is_lora_factor())
}

/// The base parameters with each adapted weight merged, the rest as they are; read from a LoRA
/// model's parameters (base and factors), one parameter at a time.
pub struct MergedWeights<'a> {
    source: &'a dyn TensorSource,
    model: &'a CausalLm,
    lora: LoraConfig,
}

impl<'a> MergedWeights<'a> {
    /// Over `source`, which gives the parameters of `model` (built with `lora`).
    pub fn new(source: &'a dyn TensorSource, model: &'a CausalLm, lora: &LoraConfig) -> Self {
        Self {
            source,
            model,
            lora: lora.clone(),
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
        match factors_of(self.model, &self.lora, name) {
            Some(f) => f.merge(&w, &self.whole(&f.a)?, &self.whole(&f.b)?),
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
    lora: LoraConfig,
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
                order.extend(hub_planned(&spec.name, kind, &spec.shape));
                base.push(spec.name.clone());
                needs.push(spec.name.clone());
                if let Some(f) = factors_of(model, lora, &spec.name) {
                    for n in [f.a, f.b] {
                        if !needs.contains(&n) {
                            needs.push(n);
                        }
                    }
                }
            }
            units.push((base, needs));
        }
        let writer = ShardedWriter::create(dir, "model", order, max_shard_bytes)?;
        Ok(Self {
            model,
            lora: lora.clone(),
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
                let merged = match factors_of(self.model, &self.lora, name) {
                    Some(f) => f.merge(w, &self.arrived[&f.a], &self.arrived[&f.b])?,
                    None => w.shallow_clone(),
                };
                self.writer.write_param(name, &merged)?;
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
