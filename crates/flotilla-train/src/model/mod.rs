//! The model: decoder-only causal language models (Hugging Face's `LlamaForCausalLM`, and
//! `MistralForCausalLM` and `Qwen2ForCausalLM`, the same units) as a sequence of **units** with
//! explicit parameters.
//!
//! This module owns the unit contract ([`Unit`], [`ForwardCtx`], [`ParamSpec`], [`Params`]),
//! the per-unit backward helper ([`vjp`]) and the error type. The model a config describes is
//! a [`CausalLm`] ([`causal_lm`]); the layers every family shares are in [`layers`], each
//! family's units in its own file ([`llama`]); seeded initialisation is in [`init`], the Hugging
//! Face weight names in [`names`], `config.json` in [`hf_config`], the generation cache in
//! [`kv_cache`]. Reading and writing weights is `state/`'s.
//!
//! The model knows nothing of parallelism (docs/ARCHITECTURE.md, "The unit engine"). A unit
//! is a pure function `(params, input, ctx) -> output`: the trainer decides where the parameter
//! tensors come from (plain tensors, views into a gathered FSDP flat buffer, bf16 copies of
//! fp32 masters), runs each unit on the previous output detached into a fresh leaf, and
//! backpropagates unit by unit with [`vjp`].
//!
//! ## Shared parameters (tied embeddings)
//!
//! Every parameter has exactly one **owner** unit (the first unit that reads it) and a list of
//! **readers** ([`ParamSpec::owner`], [`ParamSpec::readers`]). With `tie_word_embeddings`, the
//! head unit lists `model.embed_tokens.weight` among its `param_names`, so it reads the
//! embedding unit's parameter; there is no `lm_head.weight`. The gradient of a shared
//! parameter is the **sum** of the gradients from each reader: the trainer adds the head's
//! contribution (computed first in the backward pass) into the owner's gradient, and the owner's
//! gradient is complete once the owner's own backward has run. Because the owner is the earliest
//! reader and backward runs units in reverse, "the owner's backward is done" is exactly when the
//! gradient is final, so a strategy can reduce it at that point (DDP all-reduce, FSDP
//! reduce-scatter) without special cases. Under FSDP, making the head's parameters available
//! means gathering the owner's flat parameter too (or keeping it gathered).

pub mod causal_lm;
pub mod decoder;
pub mod gemma;
pub mod hf_config;
pub mod init;
pub mod kv_cache;
pub mod layers;
pub mod llama;
pub mod mixtral;
pub mod names;
pub mod phi3;
pub mod qwen3;
pub mod qwen3_moe;

use std::path::PathBuf;

use flotilla_config::schema::hf_config::HfConfigError;
use indexmap::IndexMap;
use tch::{Device, Kind, Tensor};

pub use causal_lm::{causal_lm_loss, causal_lm_loss_sum, CausalLm};
pub use hf_config::{
    finish_hf_dir, read_hf_config, read_model_config, write_generation_config, HfLlamaConfig,
    SpecialIds,
};
pub use init::Init;
pub use kv_cache::KvCache;
pub use layers::mask::packed_attention_mask;
pub use layers::varlen::PackedLayout;
pub use names::{LayerWeight, ParamName};

/// Errors of model construction, loading and saving. Each names its culprit: the file, the
/// tensor or the config field.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A `ModelConfig` value the architecture cannot take.
    #[error("model.{field}: {message}")]
    InvalidConfig { field: String, message: String },
    /// A `config.json` that is malformed, or describes a model flotilla does not run.
    #[error(transparent)]
    Config(#[from] HfConfigError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A weight the architecture needs that no safetensors file holds.
    #[error("tensor `{name}` is missing from {files}")]
    MissingTensor { name: String, files: String },
    /// A weight whose shape disagrees with the config.
    #[error(
        "tensor `{name}`{}: expected shape {expected:?}, found {found:?}",
        in_file(file)
    )]
    ShapeMismatch {
        name: String,
        expected: Vec<i64>,
        found: Vec<i64>,
        file: Option<PathBuf>,
    },
    /// A weight in a dtype other than f32, bf16, f16 (or f64).
    #[error(
        "tensor `{name}`{}: unsupported dtype {dtype}; expected float32, bfloat16 or float16",
        in_file(file)
    )]
    UnsupportedDtype {
        name: String,
        dtype: String,
        file: Option<PathBuf>,
    },
    /// A tensor in the checkpoint that the model's class (`LlamaForCausalLM`, ...) does not have.
    #[error("tensor `{name}` in {} is not a {class} weight", file.display())]
    UnexpectedTensor {
        name: String,
        file: PathBuf,
        class: &'static str,
    },
    /// Generation past the positions a [`KvCache`] was made for.
    #[error(
        "the key/value cache holds {capacity} positions; {needed} are needed (make it larger, \
         or generate fewer tokens)"
    )]
    CacheFull { capacity: usize, needed: usize },
    /// A parameter set handed to the model lacks a parameter.
    #[error("parameter `{name}` is missing from the parameter set")]
    MissingParam { name: String },
    /// A safetensors file that cannot be read or written.
    #[error(transparent)]
    File(#[from] crate::safetensors_io::SafetensorsError),
    /// A safetensors file that libtorch could not read or write.
    #[error("{}: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: tch::TchError,
    },
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl ModelError {
    /// Whether the model's files or config are at fault (a field, a tensor, a dtype, a file
    /// that is missing or malformed): bad input, not a failure of the machine.
    pub fn is_bad_input(&self) -> bool {
        match self {
            ModelError::InvalidConfig { .. }
            | ModelError::Config(_)
            | ModelError::MissingTensor { .. }
            | ModelError::ShapeMismatch { .. }
            | ModelError::UnsupportedDtype { .. }
            | ModelError::UnexpectedTensor { .. } => true,
            ModelError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            ModelError::File(e) => e.is_bad_input(),
            ModelError::CacheFull { .. }
            | ModelError::MissingParam { .. }
            | ModelError::Safetensors { .. }
            | ModelError::Torch(_) => false,
        }
    }
}

/// Whether a tensor kind is one the model's weights may have (f32, bf16, f16, f64).
pub fn is_float_kind(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double
    )
}

fn in_file(file: &Option<PathBuf>) -> String {
    file.as_ref()
        .map(|f| format!(" in {}", f.display()))
        .unwrap_or_default()
}

/// One parameter of the model: its Hugging Face name, shape, initialisation, and which units
/// use it.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Hugging Face name (`model.layers.0.self_attn.q_proj.weight`); see [`ParamName`].
    pub name: String,
    pub shape: Vec<i64>,
    pub init: Init,
    /// Index of the unit that owns this parameter (the first of `readers`).
    pub owner: usize,
    /// Indices of every unit that reads it, ascending. More than one only for tied weights.
    pub readers: Vec<usize>,
    /// Whether training updates it (false for a LoRA job's frozen base).
    pub trainable: bool,
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    /// True when more than one unit reads this parameter (its gradient is a sum).
    pub fn is_shared(&self) -> bool {
        self.readers.len() > 1
    }
}

/// The input of a forward: token ids `[B, T]` and, when rows pack several sequences that must
/// not see each other, their position ids `[B, T]`. A position that does not follow its
/// predecessor by one starts a new sequence, which attends only to itself and sees its own
/// positions (transformers' rule for packed `position_ids`). Without position ids every row
/// is one sequence at positions `0..T`. `layout`: what the host knew of the position ids when
/// it built them (their largest, the sequences' bounds), so that a forward need not read them
/// back from the device; `None` makes a forward find them from the positions.
#[derive(Debug)]
pub struct TokenInput {
    pub ids: Tensor,
    pub positions: Option<Tensor>,
    pub layout: Option<PackedLayout>,
}

impl TokenInput {
    /// One sequence per row.
    pub fn new(ids: Tensor) -> Self {
        TokenInput {
            ids,
            positions: None,
            layout: None,
        }
    }

    /// Rows packing several sequences each, by their position ids `[B, T]`.
    pub fn packed(ids: Tensor, positions: Tensor) -> Self {
        TokenInput {
            ids,
            positions: Some(positions),
            layout: None,
        }
    }

    /// Another handle on the same tensors.
    pub fn shallow_clone(&self) -> Self {
        TokenInput {
            ids: self.ids.shallow_clone(),
            positions: self.positions.as_ref().map(Tensor::shallow_clone),
            layout: self.layout.as_ref().map(PackedLayout::shallow_clone),
        }
    }
}

/// Per-forward context shared by every unit of one micro-batch: the rotary tables for the
/// positions of the batch, in fp32 (each block casts them to its compute dtype, as
/// transformers does), and the attention mask of packed rows. Build it with [`CausalLm::ctx`],
/// [`CausalLm::ctx_for_positions`] or [`CausalLm::ctx_for_input`].
#[derive(Debug)]
pub struct ForwardCtx {
    /// `[T, head_dim]` (positions shared by the batch) or `[B, T, head_dim]`.
    pub cos: Tensor,
    pub sin: Tensor,
    /// Packed rows: each sequence attends to itself alone (their mask, and on CUDA their
    /// bounds). `None`: causal over the whole row.
    pub packed: Option<layers::mask::PackedRows>,
    /// Training with dropout: the seed of this micro-batch's masks. `None`: no dropout
    /// (evaluation, generation).
    pub dropout_seed: Option<u64>,
    /// The rotary tables of the local layers (Gemma 3's sliding layers, their own theta), in
    /// `cos`'s shape; `None` when every layer takes `cos` and `sin`.
    pub local_rope: Option<(Tensor, Tensor)>,
    /// The LoRA adapters are skipped: the forward is the base model's (a LoRA job's DPO
    /// reference, as PEFT's `disable_adapter()`).
    pub adapters_off: bool,
    /// Where sparse layers record their routing for the load-balancing loss; `None`: they
    /// record nothing (no auxiliary loss, evaluation, generation).
    pub router_log: Option<layers::moe::RouterLog>,
    /// The attention masks of windowed and soft-capped layers, built by the first layer that
    /// needs each and shared by the others (for [`ForwardCtx::packed`] as it is when they are
    /// built: set that first).
    pub masks: layers::attention::MaskCache,
}

impl ForwardCtx {
    /// The rotary tables `(cos, sin)` of a layer: the local ones when it takes them and the
    /// model has them, else the global ones.
    pub fn rope(&self, local: bool) -> (&Tensor, &Tensor) {
        match (&self.local_rope, local) {
            (Some((cos, sin)), true) => (cos, sin),
            _ => (&self.cos, &self.sin),
        }
    }
}

/// A unit of the model: a pure function of its input and an explicit parameter list.
///
/// `forward` receives the tensors of [`Unit::param_names`], in that order. They may be plain
/// tensors or views into a flat buffer; the unit only reads them. The input is token ids
/// (`Int64 [B, T]`, which has no gradient, so the first unit's backward yields parameter
/// gradients only) for the first unit and hidden states (`[B, T, hidden]`, in the parameter
/// dtype) for the others; the last unit returns logits `[B, T, vocab]` in the parameter dtype,
/// and the loss ([`causal_lm_loss`]) is computed outside the units. RMSNorm and the attention
/// softmax compute in fp32 internally, as transformers does.
///
/// Panics (as tch does) if a parameter has the wrong shape; [`CausalLm::check_params`] checks a
/// parameter set once, up front.
pub trait Unit: Send + Sync {
    /// `embed`, `layers.{i}` or `head`.
    fn name(&self) -> &str;
    /// Hugging Face names of the parameters `forward` reads, in the order it takes them. May
    /// include parameters owned by another unit (see the module docs on tied embeddings).
    fn param_names(&self) -> &[String];
    fn forward(&self, params: &[Tensor], input: &Tensor, ctx: &ForwardCtx) -> Tensor;
    /// [`Unit::forward`] in generation ([`CausalLm::forward_cached`]): `input` holds the positions
    /// after the `cache.len()` the cache has seen, and `ctx` their rotary tables; a unit with
    /// attention appends its keys and values to `cache` and attends to all of them. The
    /// default, for units without attention, is `forward`.
    fn forward_cached(
        &self,
        params: &[Tensor],
        input: &Tensor,
        ctx: &ForwardCtx,
        cache: &mut KvCache,
    ) -> Tensor {
        let _ = cache;
        self.forward(params, input, ctx)
    }
}

/// What a family file builds for a config: its parameter table (every parameter once, in
/// Hugging Face order) and its units in forward order; [`CausalLm`] is built from it.
pub struct FamilyUnits {
    pub specs: Vec<ParamSpec>,
    pub units: Vec<Box<dyn Unit>>,
}

/// A named parameter set, in the model's canonical order ([`CausalLm::param_specs`]).
#[derive(Debug, Default)]
pub struct Params {
    tensors: IndexMap<String, Tensor>,
}

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        self.tensors.insert(name.into(), tensor);
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Removes a parameter, keeping the order of the others.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.tensors.shift_remove(name)
    }

    /// The parameter, or [`ModelError::MissingParam`].
    pub fn require(&self, name: &str) -> Result<&Tensor, ModelError> {
        self.get(name).ok_or_else(|| ModelError::MissingParam {
            name: name.to_string(),
        })
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Total number of elements.
    pub fn numel(&self) -> usize {
        self.tensors.values().map(Tensor::numel).sum()
    }

    /// A copy on `device` in `kind` (each tensor detached and contiguous).
    pub fn to(&self, device: Device, kind: Kind) -> Params {
        let tensors = self
            .tensors
            .iter()
            .map(|(k, t)| {
                (
                    k.clone(),
                    t.detach().to_device(device).to_kind(kind).contiguous(),
                )
            })
            .collect();
        Params { tensors }
    }

    /// Shallow handles marked as requiring grad (leaves of a new graph), for whole-graph
    /// training and for tests.
    pub fn requiring_grad(&self) -> Params {
        let tensors = self
            .tensors
            .iter()
            .map(|(k, t)| (k.clone(), t.detach().set_requires_grad(true)))
            .collect();
        Params { tensors }
    }
}

/// Backward through one unit: the gradients of `sum(output * grad_output)` with respect to
/// each of `wrt` (the unit's leaf input and its parameters). With `grad_output = None`,
/// `output` must be a scalar (the loss, for the last unit) and is differentiated itself.
///
/// The gradients are returned, not accumulated into `.grad()`; a tensor that `output` does not
/// depend on gets `None`. Every tensor of `wrt` must require grad. The graph is freed. An
/// exception of the autograd engine (out of memory, say) is an error, not a panic.
pub fn vjp(
    output: &Tensor,
    grad_output: Option<&Tensor>,
    wrt: &[&Tensor],
) -> Result<Vec<Option<Tensor>>, tch::TchError> {
    let grads = match grad_output {
        Some(g) => seeded_backward(output, g, wrt)?,
        None => Tensor::f_run_backward(&[output], wrt, false, false)?,
    };
    Ok(grads
        .into_iter()
        .map(|g| g.defined().then_some(g))
        .collect())
}

extern "C" {
    fn flotilla_vjp(
        output: *const std::ffi::c_void,
        grad_output: *const std::ffi::c_void,
        inputs: *const *const std::ffi::c_void,
        n: std::ffi::c_int,
        outputs: *mut *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
    fn flotilla_vjp_error() -> *const std::ffi::c_char;
}

/// The autograd engine run from `output` seeded with `grad_output` (the C++ shim
/// `csrc/vjp.cpp`; tch's `run_backward` only seeds with ones).
fn seeded_backward(
    output: &Tensor,
    grad_output: &Tensor,
    wrt: &[&Tensor],
) -> Result<Vec<Tensor>, tch::TchError> {
    let inputs: Vec<*const std::ffi::c_void> = wrt
        .iter()
        .map(|t| t.as_ptr() as *const std::ffi::c_void)
        .collect();
    let mut outputs = vec![std::ptr::null_mut::<std::ffi::c_void>(); wrt.len()];
    // SAFETY: every pointer is a live tch tensor handle (an at::Tensor*); the shim fills
    // `outputs` with new at::Tensor* that the returned tch tensors take ownership of.
    let code = unsafe {
        flotilla_vjp(
            output.as_ptr() as *const std::ffi::c_void,
            grad_output.as_ptr() as *const std::ffi::c_void,
            inputs.as_ptr(),
            inputs.len() as std::ffi::c_int,
            outputs.as_mut_ptr(),
        )
    };
    if code != 0 {
        // SAFETY: the shim returns a NUL-terminated thread-local message.
        let msg = unsafe { std::ffi::CStr::from_ptr(flotilla_vjp_error()) };
        return Err(tch::TchError::Torch(format!(
            "backward through a unit failed: {}",
            msg.to_string_lossy()
        )));
    }
    Ok(outputs
        .into_iter()
        // SAFETY: each pointer is a fresh at::Tensor* owned by nobody else.
        .map(|p| unsafe { Tensor::from_ptr(p as *mut torch_sys::C_tensor) })
        .collect())
}
