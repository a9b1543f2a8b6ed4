//! A decoder-only causal language model as units: the architecture a config describes (its
//! parameter table, its units in forward order, which parameters are trained), the forward
//! context of a batch (rotary tables, packed rows' mask), whole-graph and cached forwards, and
//! transformers' causal-LM loss. Which units a config gets is its family file's business
//! (`llama.rs`, `qwen3.rs`, `gemma.rs`, `phi3.rs`, `mixtral.rs`, `qwen3_moe.rs`, over `decoder/`); this file is the same for every
//! family.

use std::sync::Mutex;

use tch::{Device, Kind, Reduction, Tensor};

use flotilla_config::schema::{LoraConfig, ModelConfig, ModelType};

use super::layers::mask::PackedRows;
use super::layers::rope::Rope;
use super::{
    gemma, is_float_kind, llama, mixtral, phi3, qwen3, qwen3_moe, FamilyUnits, ForwardCtx, KvCache,
    ModelError, ParamSpec, Params, TokenInput, Unit,
};

/// The architecture: config, parameter table and units. Holds no tensors (it is `Send + Sync`);
/// parameters live in a [`Params`] or wherever the trainer keeps them.
pub struct CausalLm {
    config: ModelConfig,
    specs: Vec<ParamSpec>,
    units: Vec<Box<dyn Unit>>,
    /// For each unit, whether each parameter it reads is trained ([`CausalLm::trainable_mask`]).
    unit_trainable: Vec<Vec<bool>>,
    /// The rotary embeddings (every layer's but for `local_rope`'s).
    rope: Rope,
    /// The local layers' rotary embeddings (Gemma 3's sliding layers), when they have their own
    /// theta.
    local_rope: Option<Rope>,
    /// The tables of the last unpacked forward's length and device: every micro-batch of a run
    /// has the same, and they need no work at all.
    unpacked_tables: Mutex<Option<(Device, i64, RopeTables)>>,
}

/// A forward's rotary tables: every layer's, and the local layers' when they have their own.
struct RopeTables {
    cos: Tensor,
    sin: Tensor,
    local: Option<(Tensor, Tensor)>,
}

impl RopeTables {
    fn shallow_clone(&self) -> Self {
        let pair = |(c, s): &(Tensor, Tensor)| (c.shallow_clone(), s.shallow_clone());
        RopeTables {
            cos: self.cos.shallow_clone(),
            sin: self.sin.shallow_clone(),
            local: self.local.as_ref().map(pair),
        }
    }
}

impl std::fmt::Debug for CausalLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalLm")
            .field("config", &self.config)
            .field(
                "units",
                &self.units.iter().map(|u| u.name()).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl CausalLm {
    /// The architecture `config` describes, after checking that it is one.
    pub fn new(config: &ModelConfig) -> Result<Self, ModelError> {
        Self::with_lora(config, None)
    }

    /// The architecture with LoRA adapters on `lora.targets()` of every block (their factors
    /// after the block's weights in its parameter list): only the adapters and
    /// `lora.modules_to_save` are trainable. `None`: [`CausalLm::new`], every parameter trainable.
    pub fn with_lora(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<Self, ModelError> {
        let FamilyUnits { specs, units } = match config.architecture() {
            ModelType::Llama | ModelType::Mistral | ModelType::Qwen2 | ModelType::SmolLm3 => {
                llama::build(config, lora)?
            }
            ModelType::Phi3 => phi3::build(config, lora)?,
            ModelType::Qwen3 => qwen3::build(config, lora)?,
            ModelType::Gemma2 | ModelType::Gemma3 => gemma::build(config, lora)?,
            ModelType::Mixtral => mixtral::build(config, lora)?,
            ModelType::Qwen3Moe => qwen3_moe::build(config, lora)?,
        };
        // Gemma 3's sliding layers: plain rotary embeddings of their own theta.
        let local_rope = config
            .rope_local_base_freq
            .map(|theta| Rope::with_theta(config, theta, None));
        let unit_trainable = units
            .iter()
            .map(|u| {
                u.param_names()
                    .iter()
                    .map(|n| specs.iter().any(|s| s.name == *n && s.trainable))
                    .collect()
            })
            .collect();
        Ok(CausalLm {
            config: config.clone(),
            specs,
            units,
            unit_trainable,
            rope: Rope::new(config),
            local_rope,
            unpacked_tables: Mutex::new(None),
        })
    }

    /// For each parameter unit `unit` reads (in [`Unit::param_names`] order), whether it is
    /// trained (false for a LoRA job's frozen base).
    pub fn trainable_mask(&self, unit: usize) -> &[bool] {
        &self.unit_trainable[unit]
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The units in forward order: `embed`, `layers.0` … `layers.{n-1}`, `head`.
    pub fn units(&self) -> &[Box<dyn Unit>] {
        &self.units
    }

    /// Every parameter once, in Hugging Face order (embedding, layers, norm, lm_head).
    pub fn param_specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    pub fn param_spec(&self, name: &str) -> Option<&ParamSpec> {
        self.specs.iter().find(|s| s.name == name)
    }

    /// The parameters unit `unit` owns (a flat-parameter group for FSDP), in table order.
    pub fn owned_params(&self, unit: usize) -> impl Iterator<Item = &ParamSpec> {
        self.specs.iter().filter(move |s| s.owner == unit)
    }

    /// Freshly initialised parameters, as transformers initialises `LlamaForCausalLM`: linear
    /// and embedding weights ~ N(0, initializer_range²), norm weights 1. The values depend only
    /// on `seed` and the parameter names (see [`super::init`]), not on the device.
    pub fn init_params(&self, seed: u64, device: Device, kind: Kind) -> Params {
        let mut params = Params::new();
        for s in &self.specs {
            let values = s.init.values(seed, &s.name, s.numel());
            let t = Tensor::from_slice(&values)
                .reshape(&s.shape)
                .to_kind(kind)
                .to_device(device);
            params.insert(s.name.clone(), t);
        }
        params
    }

    /// Checks that `params` holds every parameter with its shape and a floating dtype.
    pub fn check_params(&self, params: &Params) -> Result<(), ModelError> {
        for s in &self.specs {
            let t = params.require(&s.name)?;
            if t.size() != s.shape {
                return Err(ModelError::ShapeMismatch {
                    name: s.name.clone(),
                    expected: s.shape.clone(),
                    found: t.size(),
                    file: None,
                });
            }
            if !is_float_kind(t.kind()) {
                return Err(ModelError::UnsupportedDtype {
                    name: s.name.clone(),
                    dtype: format!("{:?}", t.kind()),
                    file: None,
                });
            }
        }
        Ok(())
    }

    /// Shallow handles on the tensors unit `unit` reads, in its `param_names` order.
    pub fn unit_params(&self, unit: usize, params: &Params) -> Result<Vec<Tensor>, ModelError> {
        self.units[unit]
            .param_names()
            .iter()
            .map(|n| params.require(n).map(Tensor::shallow_clone))
            .collect()
    }

    /// The forward context for positions `0 .. seq_len` on `device` (its tables made once per
    /// length and device).
    pub fn ctx(&self, seq_len: i64, device: Device) -> ForwardCtx {
        let mut cached = self
            .unpacked_tables
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let tables = match &*cached {
            Some((d, t, tables)) if *d == device && *t == seq_len => tables.shallow_clone(),
            _ => {
                let positions = Tensor::arange(seq_len, (Kind::Int64, device));
                let tables = self.tables(&positions, Some(seq_len - 1));
                *cached = Some((device, seq_len, tables.shallow_clone()));
                tables
            }
        };
        Self::ctx_with(tables)
    }

    /// The forward context for explicit position ids, `[T]` or `[B, T]` (transformers'
    /// `position_ids`); `max_position`: their largest when the caller knows it (else rotary
    /// embeddings whose frequencies follow the length read it from the device).
    pub fn ctx_for_positions(&self, positions: &Tensor, max_position: Option<i64>) -> ForwardCtx {
        Self::ctx_with(self.tables(positions, max_position))
    }

    fn tables(&self, positions: &Tensor, max_position: Option<i64>) -> RopeTables {
        let (cos, sin) = self.rope.tables(positions, max_position);
        RopeTables {
            cos,
            sin,
            local: self
                .local_rope
                .as_ref()
                .map(|r| r.tables(positions, max_position)),
        }
    }

    fn ctx_with(tables: RopeTables) -> ForwardCtx {
        ForwardCtx {
            cos: tables.cos,
            sin: tables.sin,
            packed: None,
            dropout_seed: None,
            local_rope: tables.local,
            adapters_off: false,
            router_log: None,
            masks: Default::default(),
        }
    }

    /// The forward context of `input`: its positions' rotary tables and, for packed rows, the
    /// mask that keeps each sequence to itself.
    pub fn ctx_for_input(&self, input: &TokenInput) -> ForwardCtx {
        match &input.positions {
            None => self.ctx(input.ids.size()[1], input.ids.device()),
            Some(positions) => {
                let layout = input.layout.as_ref();
                let mut ctx = self.ctx_for_positions(positions, layout.map(|l| l.max_position));
                let bounds = layout.map(|l| l.bounds.shallow_clone());
                ctx.packed = Some(PackedRows::new(positions, bounds));
                ctx
            }
        }
    }

    /// Whole-graph forward: token ids `[B, T]` to logits `[B, T, vocab]`, running the units in
    /// order on one autograd graph.
    pub fn forward(&self, params: &Params, tokens: &Tensor) -> Result<Tensor, ModelError> {
        self.forward_input(params, &TokenInput::new(tokens.shallow_clone()))
    }

    /// [`CausalLm::forward`] of token ids with their position ids when rows are packed.
    pub fn forward_input(&self, params: &Params, input: &TokenInput) -> Result<Tensor, ModelError> {
        self.forward_with(params, input, &self.ctx_for_input(input))
    }

    /// [`CausalLm::forward_input`] in a context of the caller's (one that records routing).
    pub fn forward_with(
        &self,
        params: &Params,
        input: &TokenInput,
        ctx: &ForwardCtx,
    ) -> Result<Tensor, ModelError> {
        let mut x = input.ids.shallow_clone();
        for (i, unit) in self.units.iter().enumerate() {
            x = unit.forward(&self.unit_params(i, params)?, &x, ctx);
        }
        Ok(x)
    }

    /// Forward for generation: token ids `[B, T]` at the positions after the `cache.len()` the
    /// cache has seen to the logits `[B, vocab]` of the last of them. Each block computes its
    /// queries, keys and values for these positions only (with the training forward's
    /// projections and rotary embeddings), appends the keys and values to `cache`, and attends
    /// to every cached position: a prompt is run once (prefill), then one token per step.
    pub fn forward_cached(
        &self,
        params: &Params,
        tokens: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor, ModelError> {
        let t = tokens.size()[1];
        let start = cache.len;
        let needed = (start + t) as usize;
        if needed > cache.capacity as usize {
            return Err(ModelError::CacheFull {
                capacity: cache.capacity as usize,
                needed,
            });
        }
        let positions = Tensor::arange_start(start, start + t, (Kind::Int64, tokens.device()));
        let ctx = self.ctx_for_positions(&positions, Some(start + t - 1));
        let mut x = tokens.shallow_clone();
        let head = self.units.len() - 1;
        for (i, unit) in self.units.iter().enumerate() {
            if i == head {
                x = x.narrow(1, t - 1, 1); // only the last position's logits are wanted
            }
            x = unit.forward_cached(&self.unit_params(i, params)?, &x, &ctx, cache);
        }
        cache.len += t;
        Ok(x.squeeze_dim(1))
    }
}

/// transformers' `ForCausalLMLoss` with mean reduction: logits `[B, T, V]` at position `t`
/// predict `labels[:, t + 1]`; labels equal to -100 are ignored; computed in fp32.
pub fn causal_lm_loss(logits: &Tensor, labels: &Tensor) -> Tensor {
    let (logits, labels) = shifted(logits, labels);
    logits.cross_entropy_loss::<&Tensor>(&labels, None, Reduction::Mean, -100, 0.0)
}

/// The summed loss and the number of predicted (non-ignored) tokens, for normalising over
/// gradient-accumulation micro-batches and ranks by the global token count.
pub fn causal_lm_loss_sum(logits: &Tensor, labels: &Tensor) -> (Tensor, i64) {
    let (logits, labels) = shifted(logits, labels);
    let count = labels.ne(-100).sum(Kind::Int64).int64_value(&[]);
    let sum = logits.cross_entropy_loss::<&Tensor>(&labels, None, Reduction::Sum, -100, 0.0);
    (sum, count)
}

fn shifted(logits: &Tensor, labels: &Tensor) -> (Tensor, Tensor) {
    let size = logits.size();
    let (t, v) = (size[1], size[2]);
    let logits = logits
        .narrow(1, 0, t - 1)
        .to_kind(Kind::Float)
        .reshape([-1, v]);
    let labels = labels.narrow(1, 1, t - 1).reshape([-1]);
    (logits, labels)
}
