//! The decoder every family shares, as units over the shared layers: the token embedding, one
//! unit per decoder block (attention and a gated MLP, each with a residual connection), and the
//! final norm with the LM head (as torchtitan groups them). What differs between families is a
//! [`DecoderStyle`] (how norms apply their weight, Gemma's four norms a block, per-head q/k norms,
//! the MLP's activation, scaled embeddings, attention scale and soft-capping) and each layer's
//! window and rotary tables; each family's file (`llama.rs`, `qwen3.rs`, `gemma.rs`) says which.
//!
//! This file owns the parameter table ([`build`]), the config checks every family shares, the
//! units and which weights LoRA may adapt ([`lora_module`]). Parameter names are
//! [`super::names`]'s; `config.json` is [`super::hf_config`]'s.

use tch::{Kind, Tensor};

use flotilla_config::schema::{
    lora_moe_problem, LoraConfig, LoraModule, ModelConfig, ModelType, SavedModule,
};

use super::layers::attention::{causal_attention, AttentionOptions};
use super::layers::linear::{linear, Projections};
use super::layers::mlp::{geglu, swiglu};
use super::layers::moe::{LoraPair, MoeAdapters, SparseMlp, StackedExperts};
use super::layers::norm::{gemma_rms_norm, rms_norm};
use super::layers::rope::{apply_rotary, shape_tables};
use super::layers::softcap::soft_cap;
use super::names::{ExpertProj, ExpertWrap, LayerWeight, LoraFactor, MoeNames, ParamName};
use super::{FamilyUnits, ForwardCtx, Init, KvCache, ModelError, ParamSpec, Unit};

/// How an RMSNorm applies its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormStyle {
    /// transformers' `LlamaRMSNorm`: normalised in fp32, cast back, times `w` (weights start
    /// at one).
    Llama,
    /// `Gemma2RMSNorm`: normalised and scaled by `1 + w` in fp32, then cast back (weights start
    /// at zero).
    Gemma,
}

/// The gated MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up`.
    SwiGlu,
    /// `gelu_tanh(gate) * up`.
    GeGlu,
}

/// What a family changes in the shared decoder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecoderStyle {
    pub norm: NormStyle,
    /// Gemma's four norms a block: the attention's and the MLP's outputs are normed before
    /// their residual (`post_attention_layernorm`, `post_feedforward_layernorm`), and the MLP's
    /// input by `pre_feedforward_layernorm`.
    pub sandwich_norms: bool,
    /// Each head's queries and keys RMS-normed before the rotary embedding (`q_norm`,
    /// `k_norm`).
    pub qk_norm: bool,
    pub activation: Activation,
    /// Embeddings multiplied by this (rounded to the activation dtype, as Gemma does).
    pub embed_scale: Option<f64>,
    /// The attention's scale (`None`: `head_dim ** -0.5`).
    pub attn_scale: Option<f64>,
    /// Attention scores soft-capped at this value.
    pub attn_softcap: Option<f64>,
    /// Logits soft-capped at this value.
    pub final_softcap: Option<f64>,
    /// Phi-3's fused projections: one `qkv_proj` split into queries, keys and values, one
    /// `gate_up_proj` split into the gate and the up projection.
    pub fused_projections: bool,
}

impl DecoderStyle {
    /// Llama's decoder: Llama norms, two a block, SwiGLU, nothing scaled or capped.
    pub const LLAMA: DecoderStyle = DecoderStyle {
        norm: NormStyle::Llama,
        sandwich_norms: false,
        qk_norm: false,
        activation: Activation::SwiGlu,
        embed_scale: None,
        attn_scale: None,
        attn_softcap: None,
        final_softcap: None,
        fused_projections: false,
    };

    /// The weights of one block, in the order its unit takes them (then its biases and LoRA
    /// factors).
    fn block_weights(&self) -> Vec<LayerWeight> {
        let mut weights = match self.fused_projections {
            true => vec![
                LayerWeight::InputNorm,
                LayerWeight::Qkv,
                LayerWeight::O,
                LayerWeight::PostAttentionNorm,
                LayerWeight::GateUp,
                LayerWeight::Down,
            ],
            false => LayerWeight::LLAMA.to_vec(),
        };
        if self.qk_norm {
            weights.extend([LayerWeight::QNorm, LayerWeight::KNorm]);
        }
        if self.sandwich_norms {
            weights.extend([
                LayerWeight::PreFeedforwardNorm,
                LayerWeight::PostFeedforwardNorm,
            ]);
        }
        weights
    }

    /// How a norm weight starts: at one for Llama's convention, at zero for Gemma's `1 + w`.
    fn norm_init(&self) -> Init {
        match self.norm {
            NormStyle::Llama => Init::Ones,
            NormStyle::Gemma => Init::Zeros,
        }
    }

    /// The norm of `x` in the weight's dtype: an fp32 residual stream (fp16 weights, see
    /// [`Embedding`]) is normed in fp32 and handed to the projections in fp16, where autocast
    /// casts it.
    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
        let normed = match self.norm {
            NormStyle::Llama => rms_norm(x, weight, eps),
            NormStyle::Gemma => gemma_rms_norm(x, weight, eps),
        };
        if normed.kind() == weight.kind() {
            normed
        } else {
            normed.to_kind(weight.kind())
        }
    }
}

/// What one layer of a family does differently from the others: its attention window, whether
/// it takes the local rotary tables (Gemma 3's sliding layers), and whether it applies rotary
/// embeddings at all (not SmolLM3's NoPE layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerStyle {
    pub window: Option<i64>,
    pub local_rope: bool,
    pub rope: bool,
}

impl LayerStyle {
    /// Layer `i` of `config` as the config alone says: its window and whether it has rotary
    /// embeddings, the global ones.
    pub fn of(config: &ModelConfig, i: usize) -> Self {
        LayerStyle {
            window: config.layer_window(i).map(|w| w as i64),
            local_rope: false,
            rope: config.layer_has_rope(i),
        }
    }
}

/// The parameter table and units of `config` in `style`, after checking that it is one; each
/// layer as `layer(i)` says; with LoRA adapters on `lora.targets()` of every block (their
/// factors after the block's weights in its parameter list), where only the adapters and
/// `lora.modules_to_save` are trainable.
pub fn build(
    config: &ModelConfig,
    lora: Option<&LoraConfig>,
    style: DecoderStyle,
    layer: impl Fn(usize) -> LayerStyle,
) -> Result<FamilyUnits, ModelError> {
    validate(config)?;
    let c = config;
    if let Some(l) = lora {
        let linear = c.linear_modules();
        if let Some(t) = l
            .target_modules
            .iter()
            .find(|t| **t != LoraModule::AllLinear && !linear.contains(t))
        {
            return Err(invalid(
                "model_type",
                format!(
                    "peft.target_modules lists `{t}`, which {} does not have; its linear layers \
                     are {}: list those, or peft.target_modules=all-linear",
                    c.architecture().display_name(),
                    linear
                        .iter()
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    if let Some((problem, fix)) = lora.and_then(|l| lora_moe_problem(c, l)) {
        return Err(invalid("peft.target_modules", format!("{problem}: {fix}")));
    }
    let (h, hd) = (c.hidden_size as i64, c.head_dim() as i64);
    let (q_out, kv_out) = (
        c.num_attention_heads as i64 * hd,
        c.num_key_value_heads as i64 * hd,
    );
    let (inter, vocab) = (c.intermediate_size as i64, c.vocab_size as i64);
    let normal = Init::Normal {
        std: c.initializer_range,
    };
    let norm_init = style.norm_init();

    let mut specs: Vec<ParamSpec> = Vec::new();
    let mut units: Vec<Box<dyn Unit>> = Vec::new();
    let saved = |m: SavedModule| lora.is_none_or(|l| l.modules_to_save.contains(&m));
    let add = |specs: &mut Vec<ParamSpec>, p: ParamName, shape: Vec<i64>, init, unit| {
        let trainable = match p {
            p if p.is_lora_factor() => true,
            ParamName::Embed => saved(SavedModule::EmbedTokens),
            ParamName::LmHead => saved(SavedModule::LmHead),
            _ => lora.is_none(),
        };
        specs.push(ParamSpec {
            name: p.hf_name(),
            shape,
            init,
            owner: unit,
            readers: vec![unit],
            trainable,
        });
        p.hf_name()
    };

    let embed = add(&mut specs, ParamName::Embed, vec![vocab, h], normal, 0);
    units.push(Box::new(Embedding {
        name: "embed".into(),
        params: vec![embed.clone()],
        scale: style.embed_scale,
        padding_idx: c.pad_token_id.map_or(-1, |p| p as i64),
    }));

    let targets = lora.map(|l| l.targets(c)).unwrap_or_default();
    let dense_weights = style.block_weights();
    let moe_names = match c.architecture() {
        ModelType::Mixtral => MoeNames::Mixtral,
        _ => MoeNames::Qwen,
    };
    for i in 0..c.num_hidden_layers {
        let u = i + 1;
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        // A sparse layer's MLP is its router and experts instead of the dense projections.
        let sparse = c.layer_is_sparse(i);
        let weights: Vec<LayerWeight> = dense_weights
            .iter()
            .copied()
            .filter(|w| {
                !(sparse && matches!(w, LayerWeight::Gate | LayerWeight::Up | LayerWeight::Down))
            })
            .collect();
        for &w in &weights {
            let (shape, init) = match w {
                LayerWeight::InputNorm
                | LayerWeight::PostAttentionNorm
                | LayerWeight::PreFeedforwardNorm
                | LayerWeight::PostFeedforwardNorm => (vec![h], norm_init),
                LayerWeight::QNorm | LayerWeight::KNorm => (vec![hd], norm_init),
                LayerWeight::Q => (vec![q_out, h], normal),
                LayerWeight::Qkv => (vec![q_out + 2 * kv_out, h], normal),
                LayerWeight::GateUp => (vec![2 * inter, h], normal),
                LayerWeight::K | LayerWeight::V => (vec![kv_out, h], normal),
                LayerWeight::O => (vec![h, q_out], normal),
                LayerWeight::Gate | LayerWeight::Up => (vec![inter, h], normal),
                LayerWeight::Down => (vec![h, inter], normal),
            };
            shapes.push(shape.clone());
            names.push(add(&mut specs, ParamName::Layer(i, w), shape, init, u));
        }
        let mut moe = match (&c.moe, sparse) {
            (Some(m), true) => {
                let e_inter = c.expert_intermediate_size() as i64;
                let router = names.len();
                let router_shape = vec![m.num_experts as i64, h];
                let router_name = ParamName::Router(i, moe_names);
                names.push(add(&mut specs, router_name, router_shape, normal, u));
                let experts = names.len();
                let e = m.num_experts as i64;
                for (proj, shape) in [
                    (ExpertProj::GateUp, vec![e, 2 * e_inter, h]),
                    (ExpertProj::Down, vec![e, h, e_inter]),
                ] {
                    let name = ParamName::Experts(i, proj, moe_names);
                    names.push(add(&mut specs, name, shape, normal, u));
                }
                Some(SparseSlots {
                    router,
                    experts,
                    adapters: ExpertAdapterSlots::default(),
                    mlp: SparseMlp {
                        num_experts: m.num_experts as i64,
                        top_k: m.num_experts_per_tok as i64,
                        norm_topk_prob: c.norm_topk_prob(),
                        scores_in_compute_dtype: c.architecture() == ModelType::Qwen3Moe,
                        jitter: m.jitter(),
                    },
                })
            }
            _ => None,
        };
        // Biases after the weights (transformers initialises them to zero).
        let mut biases = vec![None; weights.len()];
        let with_bias = c.attention_biases();
        for (k, &w) in weights.iter().enumerate() {
            let on = match w {
                LayerWeight::Q | LayerWeight::K | LayerWeight::V => with_bias.qkv,
                LayerWeight::O => with_bias.o,
                _ => false,
            };
            if on {
                biases[k] = Some(names.len());
                let shape = vec![shapes[k][0]];
                names.push(add(
                    &mut specs,
                    ParamName::Bias(i, w),
                    shape,
                    Init::Zeros,
                    u,
                ));
            }
        }
        let mut adapters = vec![None; weights.len()];
        if let Some(l) = lora {
            let r = l.r as i64;
            for (k, &w) in weights.iter().enumerate() {
                // A mixture's dense layers keep their MLP: PEFT's targets name the experts
                // there (transformers 5 fuses them), and none of the dense projections.
                let dense_mlp_of_moe = c.is_moe() && lora_module(w).is_some_and(|m| m.in_mlp());
                if dense_mlp_of_moe || !lora_module(w).is_some_and(|m| targets.contains(&m)) {
                    continue;
                }
                let (out, inp) = (shapes[k][0], shapes[k][1]);
                adapters[k] = Some(names.len());
                let a = Init::Uniform {
                    bound: 1.0 / (inp as f64).sqrt(),
                };
                let a_name = ParamName::Lora(i, w, LoraFactor::A);
                names.push(add(&mut specs, a_name, vec![r, inp], a, u));
                let b_name = ParamName::Lora(i, w, LoraFactor::B);
                names.push(add(&mut specs, b_name, vec![out, r], Init::Zeros, u));
            }
        }
        if let (Some(l), Some(moe)) = (lora, moe.as_mut()) {
            let on = l.expert_targets(c);
            let r = l.r as i64;
            let (experts, e_inter) = (moe.mlp.num_experts, c.expert_intermediate_size() as i64);
            let mut factors = |name: &dyn Fn(LoraFactor) -> ParamName, a: Vec<i64>, b: Vec<i64>| {
                let slot = names.len();
                let init = Init::Uniform {
                    bound: 1.0 / (a[1] as f64).sqrt(),
                };
                names.push(add(&mut specs, name(LoraFactor::A), a, init, u));
                names.push(add(&mut specs, name(LoraFactor::B), b, Init::Zeros, u));
                slot
            };
            let wrap = |p| ExpertWrap::of(p, on.gate_up, on.down);
            if on.gate_up {
                // PEFT's fused gate and up: twice the rank and alpha.
                let r2 = l.gate_up_rank() as i64;
                let name = |f| ParamName::ExpertLora(i, wrap(ExpertProj::GateUp), f);
                let slot = factors(
                    &name,
                    vec![r2 * experts, h],
                    vec![2 * e_inter, r2 * experts],
                );
                moe.adapters.gate_up = Some((slot, l.gate_up_scale()));
            }
            if on.down {
                let name = |f| ParamName::ExpertLora(i, wrap(ExpertProj::Down), f);
                let slot = factors(&name, vec![r * experts, e_inter], vec![h, r * experts]);
                moe.adapters.down = Some((slot, l.scale()));
            }
            if on.router {
                let name = |f| ParamName::RouterLora(i, f);
                let slot = factors(&name, vec![r, h], vec![experts, r]);
                moe.adapters.router = Some((slot, l.scale()));
            }
        }
        units.push(Box::new(Block {
            name: format!("layers.{i}"),
            index: i,
            params: names,
            weights: weights.clone(),
            num_heads: c.num_attention_heads as i64,
            num_kv_heads: c.num_key_value_heads as i64,
            head_dim: hd,
            eps: c.rms_norm_eps,
            style,
            layer: layer(i),
            moe,
            projections: Projections {
                block: i,
                biases,
                adapters,
                lora_scale: lora.map_or(0.0, LoraConfig::scale),
                lora_dropout: lora.map_or(0.0, |l| l.dropout),
            },
        }));
    }

    let head_unit = c.num_hidden_layers + 1;
    let norm = add(&mut specs, ParamName::Norm, vec![h], norm_init, head_unit);
    let head_weight = if c.tie_word_embeddings {
        specs[0].readers.push(head_unit);
        embed
    } else {
        add(
            &mut specs,
            ParamName::LmHead,
            vec![vocab, h],
            normal,
            head_unit,
        )
    };
    units.push(Box::new(Head {
        name: "head".into(),
        params: vec![norm, head_weight],
        eps: c.rms_norm_eps,
        style,
    }));

    Ok(FamilyUnits { specs, units })
}

fn invalid(field: &str, message: impl Into<String>) -> ModelError {
    ModelError::InvalidConfig {
        field: field.to_string(),
        message: message.into(),
    }
}

/// `v > 0`, false for NaN.
fn positive(v: f64) -> bool {
    v > 0.0
}

fn validate(c: &ModelConfig) -> Result<(), ModelError> {
    for (field, v) in [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
    ] {
        if v == 0 {
            return Err(invalid(field, "must be positive"));
        }
    }
    if c.head_dim.is_none() && !c.hidden_size.is_multiple_of(c.num_attention_heads) {
        return Err(invalid(
            "num_attention_heads",
            format!(
                "{} does not divide hidden_size {} (set model.head_dim for heads of another size)",
                c.num_attention_heads, c.hidden_size
            ),
        ));
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return Err(invalid(
            "num_key_value_heads",
            format!(
                "{} does not divide num_attention_heads {}",
                c.num_key_value_heads, c.num_attention_heads
            ),
        ));
    }
    if c.head_dim() == 0 || !c.head_dim().is_multiple_of(2) {
        return Err(invalid(
            "head_dim",
            format!(
                "head dimension {} must be even and positive for rotary embeddings",
                c.head_dim()
            ),
        ));
    }
    if !positive(c.rms_norm_eps) {
        return Err(invalid("rms_norm_eps", "must be positive"));
    }
    if !positive(c.rope_theta) {
        return Err(invalid("rope_theta", "must be positive"));
    }
    if let Some(p) = c.pad_token_id.filter(|p| *p >= c.vocab_size) {
        return Err(invalid(
            "pad_token_id",
            format!("{p} is not below vocab_size {}", c.vocab_size),
        ));
    }
    if !(positive(c.initializer_range) || c.initializer_range == 0.0) {
        return Err(invalid("initializer_range", "must be non-negative"));
    }
    super::layers::rope::validate(c)
}

/// `model.embed_tokens`: token ids to hidden states (scaled, for Gemma). As transformers'
/// `nn.Embedding(..., padding_idx)`, no gradient reaches the padding token's row through it
/// (`-1`: no padding token).
struct Embedding {
    name: String,
    params: Vec<String>,
    scale: Option<f64>,
    padding_idx: i64,
}

impl Unit for Embedding {
    fn name(&self) -> &str {
        &self.name
    }
    fn param_names(&self) -> &[String] {
        &self.params
    }
    /// With fp16 weights (16-mixed's compute copies, an fp16 checkpoint) the residual stream
    /// leaves the embedding in fp32 and stays there, as under autocast: each block's outputs
    /// are added to it in fp32 (type promotion) and its norms hand fp16 to the projections, so
    /// the large activations of real checkpoints do not overflow fp16's range.
    fn forward(&self, params: &[Tensor], input: &Tensor, _ctx: &ForwardCtx) -> Tensor {
        let mut x = Tensor::embedding(&params[0], input, self.padding_idx, false, false);
        if x.kind() == Kind::Half {
            x = x.to_kind(Kind::Float);
        }
        match self.scale {
            // The scale rounded to the activation dtype first, as Gemma's `normalizer` is.
            Some(s) => {
                let s = Tensor::from(s as f32)
                    .to_kind(x.kind())
                    .to_device(x.device());
                x * s
            }
            None => x,
        }
    }
}

/// The LoRA target name of a block weight (`None` for the norms).
pub fn lora_module(w: LayerWeight) -> Option<LoraModule> {
    Some(match w {
        LayerWeight::Q => LoraModule::QProj,
        LayerWeight::K => LoraModule::KProj,
        LayerWeight::V => LoraModule::VProj,
        LayerWeight::O => LoraModule::OProj,
        LayerWeight::Gate => LoraModule::GateProj,
        LayerWeight::Up => LoraModule::UpProj,
        LayerWeight::Down => LoraModule::DownProj,
        LayerWeight::Qkv => LoraModule::QkvProj,
        LayerWeight::GateUp => LoraModule::GateUpProj,
        LayerWeight::InputNorm
        | LayerWeight::PostAttentionNorm
        | LayerWeight::QNorm
        | LayerWeight::KNorm
        | LayerWeight::PreFeedforwardNorm
        | LayerWeight::PostFeedforwardNorm => return None,
    })
}

/// `model.layers.{i}`: attention and the gated MLP, each with a residual connection, normed
/// as the style says. Parameters in the style's block weight order, then the biases of the
/// projections that have one, then the LoRA factors `A, B` of each adapted layer (in the same
/// order).
struct Block {
    name: String,
    index: usize,
    params: Vec<String>,
    /// The block's weights, in the order `params` starts with them.
    weights: Vec<LayerWeight>,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
    eps: f64,
    style: DecoderStyle,
    layer: LayerStyle,
    /// A sparse layer's router and experts (its MLP), `None` for a dense MLP.
    moe: Option<SparseSlots>,
    /// Biases and LoRA adapters of `weights`.
    projections: Projections,
}

/// Where a sparse layer's router and experts sit in its block's parameters (the router, then
/// the experts' stacked `gate_up_proj` and `down_proj`; LoRA's factors last), and how it
/// routes.
#[derive(Clone, Copy, Debug)]
struct SparseSlots {
    router: usize,
    experts: usize,
    adapters: ExpertAdapterSlots,
    mlp: SparseMlp,
}

/// Where a sparse layer's LoRA `A` factors sit (`B` follows each), with their scales.
#[derive(Clone, Copy, Debug, Default)]
struct ExpertAdapterSlots {
    router: Option<(usize, f64)>,
    gate_up: Option<(usize, f64)>,
    down: Option<(usize, f64)>,
}

impl ExpertAdapterSlots {
    /// The factors in `params` (none when the adapters are off).
    fn of<'a>(&self, params: &'a [Tensor], ctx: &ForwardCtx) -> MoeAdapters<'a> {
        let pair = |slot: Option<(usize, f64)>| {
            slot.filter(|_| !ctx.adapters_off)
                .map(|(a, scale)| LoraPair {
                    a: &params[a],
                    b: &params[a + 1],
                    scale,
                })
        };
        MoeAdapters {
            router: pair(self.router),
            gate_up: pair(self.gate_up),
            down: pair(self.down),
        }
    }
}

impl Block {
    /// The position of weight `w` in the block's parameters.
    fn slot(&self, w: LayerWeight) -> usize {
        self.weights
            .iter()
            .position(|x| *x == w)
            .unwrap_or_else(|| panic!("{}: no {w:?} in this block", self.name))
    }

    fn project(&self, params: &[Tensor], w: LayerWeight, x: &Tensor, ctx: &ForwardCtx) -> Tensor {
        self.projections.project(params, self.slot(w), x, ctx)
    }

    fn norm(&self, params: &[Tensor], w: LayerWeight, x: &Tensor) -> Tensor {
        self.style.rms_norm(x, &params[self.slot(w)], self.eps)
    }
}

impl Unit for Block {
    fn name(&self) -> &str {
        &self.name
    }
    fn param_names(&self) -> &[String] {
        &self.params
    }
    fn forward(&self, params: &[Tensor], x: &Tensor, ctx: &ForwardCtx) -> Tensor {
        assert_eq!(
            params.len(),
            self.params.len(),
            "{}: parameter count",
            self.name
        );
        let (q, k, v) = self.qkv(params, x, ctx);
        self.attend_and_mlp(params, x, &q, &k, &v, ctx)
    }

    fn forward_cached(
        &self,
        params: &[Tensor],
        x: &Tensor,
        ctx: &ForwardCtx,
        cache: &mut KvCache,
    ) -> Tensor {
        assert_eq!(
            params.len(),
            self.params.len(),
            "{}: parameter count",
            self.name
        );
        let (q, k, v) = self.qkv(params, x, ctx);
        let (k, v) = cache.append(self.index, &k, &v);
        self.attend_and_mlp(params, x, &q, &k, &v, ctx)
    }
}

impl Block {
    /// The queries `[B, heads, T, head_dim]`, keys and values `[B, kv_heads, T, head_dim]` of
    /// the positions of `x` (`[B, T, hidden]`), queries and keys normed per head where the
    /// style says, then with the layer's rotary embeddings applied.
    fn qkv(&self, params: &[Tensor], x: &Tensor, ctx: &ForwardCtx) -> (Tensor, Tensor, Tensor) {
        let (b, t) = (x.size()[0], x.size()[1]);
        let h = self.norm(params, LayerWeight::InputNorm, x);
        let heads = |w: LayerWeight, n: i64| {
            self.project(params, w, &h, ctx)
                .view([b, t, n, self.head_dim])
                .transpose(1, 2)
        };
        let split = |t: Tensor, n: i64| t.view([b, t.size()[1], n, self.head_dim]).transpose(1, 2);
        let (mut q, mut k, v) = if self.style.fused_projections {
            // Phi-3: queries, then keys, then values along the fused output.
            let qkv = self.project(params, LayerWeight::Qkv, &h, ctx);
            let (nq, nkv) = (
                self.num_heads * self.head_dim,
                self.num_kv_heads * self.head_dim,
            );
            (
                split(qkv.narrow(-1, 0, nq), self.num_heads),
                split(qkv.narrow(-1, nq, nkv), self.num_kv_heads),
                split(qkv.narrow(-1, nq + nkv, nkv), self.num_kv_heads),
            )
        } else {
            (
                heads(LayerWeight::Q, self.num_heads),
                heads(LayerWeight::K, self.num_kv_heads),
                heads(LayerWeight::V, self.num_kv_heads),
            )
        };
        if self.style.qk_norm {
            q = self.norm(params, LayerWeight::QNorm, &q);
            k = self.norm(params, LayerWeight::KNorm, &k);
        }
        if !self.layer.rope {
            return (q, k, v);
        }
        let (cos, sin) = ctx.rope(self.layer.local_rope);
        let (cos, sin) = shape_tables(cos, sin, q.kind());
        let q = apply_rotary(&q, &cos, &sin);
        let k = apply_rotary(&k, &cos, &sin);
        (q, k, v)
    }

    /// The rest of the block for the positions of `x`: causal attention of their queries `q`
    /// to the keys `k` and values `v` of every position up to theirs within the layer's window
    /// ([`causal_attention`]), the output projection and residual, then the MLP and its
    /// residual.
    fn attend_and_mlp(
        &self,
        params: &[Tensor],
        x: &Tensor,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        ctx: &ForwardCtx,
    ) -> Tensor {
        let (b, t) = (x.size()[0], x.size()[1]);
        let options = AttentionOptions {
            scale: self.style.attn_scale,
            softcap: self.style.attn_softcap,
            window: self.layer.window,
        };
        let attn = causal_attention(
            q,
            k,
            v,
            ctx.packed.as_ref(),
            &ctx.masks,
            self.num_heads,
            self.num_kv_heads,
            &options,
        );
        let attn = attn
            .transpose(1, 2)
            .reshape([b, t, self.num_heads * self.head_dim]);
        let mut out = self.project(params, LayerWeight::O, &attn, ctx);
        if self.style.sandwich_norms {
            out = self.norm(params, LayerWeight::PostAttentionNorm, &out);
        }
        let x = x + out;

        let pre_mlp = if self.style.sandwich_norms {
            LayerWeight::PreFeedforwardNorm
        } else {
            LayerWeight::PostAttentionNorm
        };
        let h = self.norm(params, pre_mlp, &x);
        if let Some(moe) = &self.moe {
            let jitter_seed = ctx
                .dropout_seed
                .map(|s| s.wrapping_add((self.index as u64 + 1).wrapping_mul(0x9E37_79B9)));
            let log = ctx.router_log.as_ref().map(|l| (l, self.index));
            let adapters = moe.adapters.of(params, ctx);
            return x + moe.mlp.forward(
                &h,
                &params[moe.router],
                StackedExperts {
                    gate_up: &params[moe.experts],
                    down: &params[moe.experts + 1],
                },
                &adapters,
                jitter_seed,
                log,
            );
        }
        let (gate, up) = if self.style.fused_projections {
            // Phi-3: the gate, then the up projection, along the fused output.
            let fused = self.project(params, LayerWeight::GateUp, &h, ctx);
            let half = fused.size()[2] / 2;
            (fused.narrow(-1, 0, half), fused.narrow(-1, half, half))
        } else {
            (
                self.project(params, LayerWeight::Gate, &h, ctx),
                self.project(params, LayerWeight::Up, &h, ctx),
            )
        };
        let gated = match self.style.activation {
            Activation::SwiGlu => swiglu(&gate, &up),
            Activation::GeGlu => geglu(&gate, &up),
        };
        let mut mlp = self.project(params, LayerWeight::Down, &gated, ctx);
        if self.style.sandwich_norms {
            mlp = self.norm(params, LayerWeight::PostFeedforwardNorm, &mlp);
        }
        x + mlp
    }
}

/// `model.norm` + `lm_head`: hidden states to logits (soft-capped, for Gemma 2). With tied
/// embeddings its second parameter is `model.embed_tokens.weight`, owned by the embedding
/// unit.
struct Head {
    name: String,
    params: Vec<String>,
    eps: f64,
    style: DecoderStyle,
}

impl Unit for Head {
    fn name(&self) -> &str {
        &self.name
    }
    fn param_names(&self) -> &[String] {
        &self.params
    }
    fn forward(&self, params: &[Tensor], x: &Tensor, _ctx: &ForwardCtx) -> Tensor {
        let logits = linear(&self.style.rms_norm(x, &params[0], self.eps), &params[1]);
        match self.style.final_softcap {
            Some(cap) => soft_cap(&logits, cap),
            None => logits,
        }
    }
}

#[cfg(test)]
mod tests;
