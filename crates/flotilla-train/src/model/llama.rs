//! The Llama family: Hugging Face's `LlamaForCausalLM` as units over the shared layers — the
//! token embedding, one unit per decoder block (pre-norm attention and SwiGLU MLP, each with a
//! residual connection), and the final RMSNorm with the LM head (as torchtitan groups them).
//! The same units are `MistralForCausalLM` (Llama's math within its sliding window, which a
//! context must not exceed: [`CausalLm::check_window`](super::CausalLm::check_window)) and `Qwen2ForCausalLM` (biases on
//! q/k/v_proj), as the config's `model_type` says.
//!
//! Numerics follow transformers' `modeling_llama.py` (each layer's docs say how); the attention
//! projections carry biases where the architecture has them (`ModelConfig::attention_biases`),
//! the MLP never. This file owns the family's parameter table ([`build`]), its config checks,
//! its blocks and which weights LoRA may adapt ([`lora_module`]). Parameter names are
//! [`super::names`]'s; `config.json` is [`super::hf_config`]'s.

use tch::Tensor;

use flotilla_config::schema::{LoraConfig, LoraModule, ModelConfig, SavedModule};

use super::layers::attention::causal_attention;
use super::layers::linear::{linear, Projections};
use super::layers::mlp::swiglu;
use super::layers::norm::rms_norm;
use super::layers::rope::{apply_rotary, rope_tables};
use super::names::{LayerWeight, LoraFactor, ParamName};
use super::{FamilyUnits, ForwardCtx, Init, KvCache, ModelError, ParamSpec, Unit};

/// The family's parameter table and units for `config`, after checking that it is one; with
/// LoRA adapters on `lora.targets()` of every block (their factors after the block's weights in
/// its parameter list), where only the adapters and `lora.modules_to_save` are trainable.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    validate(config)?;
    let c = config;
    let (h, hd) = (c.hidden_size as i64, c.head_dim() as i64);
    let (q_out, kv_out) = (
        c.num_attention_heads as i64 * hd,
        c.num_key_value_heads as i64 * hd,
    );
    let (inter, vocab) = (c.intermediate_size as i64, c.vocab_size as i64);
    let normal = Init::Normal {
        std: c.initializer_range,
    };

    let mut specs: Vec<ParamSpec> = Vec::new();
    let mut units: Vec<Box<dyn Unit>> = Vec::new();
    let saved = |m: SavedModule| lora.is_none_or(|l| l.modules_to_save.contains(&m));
    let add = |specs: &mut Vec<ParamSpec>, p: ParamName, shape: Vec<i64>, init, unit| {
        let trainable = match p {
            ParamName::Lora(..) => true,
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
    }));

    let targets = lora.map(LoraConfig::targets).unwrap_or_default();
    for i in 0..c.num_hidden_layers {
        let u = i + 1;
        let mut names = Vec::new();
        let mut shapes = Vec::new();
        for w in LayerWeight::ALL {
            let (shape, init) = match w {
                LayerWeight::InputNorm | LayerWeight::PostAttentionNorm => (vec![h], Init::Ones),
                LayerWeight::Q => (vec![q_out, h], normal),
                LayerWeight::K | LayerWeight::V => (vec![kv_out, h], normal),
                LayerWeight::O => (vec![h, q_out], normal),
                LayerWeight::Gate | LayerWeight::Up => (vec![inter, h], normal),
                LayerWeight::Down => (vec![h, inter], normal),
            };
            shapes.push(shape.clone());
            names.push(add(&mut specs, ParamName::Layer(i, w), shape, init, u));
        }
        // Biases after the weights (transformers initialises them to zero).
        let mut biases = [None; 9];
        let with_bias = c.attention_biases();
        for (k, w) in LayerWeight::ALL.into_iter().enumerate() {
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
        let mut adapters = [None; 9];
        if let Some(l) = lora {
            let r = l.r as i64;
            for (k, w) in LayerWeight::ALL.into_iter().enumerate() {
                if !lora_module(w).is_some_and(|m| targets.contains(&m)) {
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
        units.push(Box::new(Block {
            name: format!("layers.{i}"),
            index: i,
            params: names,
            num_heads: c.num_attention_heads as i64,
            num_kv_heads: c.num_key_value_heads as i64,
            head_dim: hd,
            eps: c.rms_norm_eps,
            projections: Projections {
                block: i,
                biases: biases.to_vec(),
                adapters: adapters.to_vec(),
                lora_scale: lora.map_or(0.0, LoraConfig::scale),
                lora_dropout: lora.map_or(0.0, |l| l.dropout),
            },
        }));
    }

    let head_unit = c.num_hidden_layers + 1;
    let norm = add(&mut specs, ParamName::Norm, vec![h], Init::Ones, head_unit);
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
    if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
        return Err(invalid(
            "num_attention_heads",
            format!(
                "{} does not divide hidden_size {}",
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
    if !c.head_dim().is_multiple_of(2) {
        return Err(invalid(
            "hidden_size",
            format!(
                "head dimension {} must be even for rotary embeddings",
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
    if !(positive(c.initializer_range) || c.initializer_range == 0.0) {
        return Err(invalid("initializer_range", "must be non-negative"));
    }
    if let Some(s) = &c.rope_scaling {
        if !positive(s.factor) {
            return Err(invalid("rope_scaling.factor", "must be positive"));
        }
        if !(s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0.0) {
            return Err(invalid(
                "rope_scaling.high_freq_factor",
                "llama3 scaling needs high_freq_factor > low_freq_factor > 0",
            ));
        }
        if s.original_max_position_embeddings == 0 {
            return Err(invalid(
                "rope_scaling.original_max_position_embeddings",
                "must be positive",
            ));
        }
    }
    Ok(())
}

/// `model.embed_tokens`: token ids to hidden states.
struct Embedding {
    name: String,
    params: Vec<String>,
}

impl Unit for Embedding {
    fn name(&self) -> &str {
        &self.name
    }
    fn param_names(&self) -> &[String] {
        &self.params
    }
    fn forward(&self, params: &[Tensor], input: &Tensor, _ctx: &ForwardCtx) -> Tensor {
        Tensor::embedding(&params[0], input, -1, false, false)
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
        LayerWeight::InputNorm | LayerWeight::PostAttentionNorm => return None,
    })
}

/// `model.layers.{i}`: pre-norm attention and SwiGLU MLP, each with a residual connection.
/// Parameters in [`LayerWeight::ALL`] order, then the biases of the projections that have one,
/// then the LoRA factors `A, B` of each adapted layer (in the same order).
struct Block {
    name: String,
    index: usize,
    params: Vec<String>,
    num_heads: i64,
    num_kv_heads: i64,
    head_dim: i64,
    eps: f64,
    /// Biases and LoRA adapters of the weights of [`LayerWeight::ALL`].
    projections: Projections,
}

impl Block {
    fn project(&self, params: &[Tensor], k: usize, x: &Tensor, ctx: &ForwardCtx) -> Tensor {
        self.projections.project(params, k, x, ctx)
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
    /// the positions of `x` (`[B, T, hidden]`), with the rotary embeddings of `ctx` applied to
    /// queries and keys.
    fn qkv(&self, params: &[Tensor], x: &Tensor, ctx: &ForwardCtx) -> (Tensor, Tensor, Tensor) {
        let (b, t) = (x.size()[0], x.size()[1]);
        let h = rms_norm(x, &params[0], self.eps);
        let heads = |k: usize, n: i64| {
            self.project(params, k, &h, ctx)
                .view([b, t, n, self.head_dim])
                .transpose(1, 2)
        };
        let q = heads(1, self.num_heads);
        let k = heads(2, self.num_kv_heads);
        let v = heads(3, self.num_kv_heads);
        let (cos, sin) = rope_tables(ctx, q.kind());
        let q = apply_rotary(&q, &cos, &sin);
        let k = apply_rotary(&k, &cos, &sin);
        (q, k, v)
    }

    /// The rest of the block for the positions of `x`: causal attention of their queries `q`
    /// to the keys `k` and values `v` of every position up to theirs ([`causal_attention`]),
    /// the output projection and residual, then the MLP and its residual.
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
        let attn = causal_attention(
            q,
            k,
            v,
            ctx.attention_mask.as_ref(),
            self.num_heads,
            self.num_kv_heads,
        );
        let attn = attn
            .transpose(1, 2)
            .reshape([b, t, self.num_heads * self.head_dim]);
        let x = x + self.project(params, 4, &attn, ctx);

        let h = rms_norm(&x, &params[5], self.eps);
        let gated = swiglu(
            &self.project(params, 6, &h, ctx),
            &self.project(params, 7, &h, ctx),
        );
        let mlp = self.project(params, 8, &gated, ctx);
        x + mlp
    }
}

/// `model.norm` + `lm_head`: hidden states to logits. With tied embeddings its second parameter
/// is `model.embed_tokens.weight`, owned by the embedding unit.
struct Head {
    name: String,
    params: Vec<String>,
    eps: f64,
}

impl Unit for Head {
    fn name(&self) -> &str {
        &self.name
    }
    fn param_names(&self) -> &[String] {
        &self.params
    }
    fn forward(&self, params: &[Tensor], x: &Tensor, _ctx: &ForwardCtx) -> Tensor {
        linear(&rms_norm(x, &params[0], self.eps), &params[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layers::rope::inv_freq;
    use crate::model::{
        causal_lm_loss, causal_lm_loss_sum, packed_attention_mask, vjp, CausalLm, KvCache, Params,
        TokenInput,
    };
    use flotilla_config::schema::{RopeScaling, RopeType};
    use tch::{Device, Kind};

    pub(crate) fn tiny(tied: bool, kv_heads: usize) -> ModelConfig {
        ModelConfig {
            name: "test".into(),
            vocab_size: 48,
            hidden_size: 32,
            intermediate_size: 40,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: kv_heads,
            max_position_embeddings: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_scaling: None,
            tie_word_embeddings: tied,
            initializer_range: 0.02,
            init_from: None,
            model_type: None,
            attention_bias: None,
            sliding_window: None,
        }
    }

    #[test]
    fn a_packed_sequence_sees_only_itself() {
        let model = CausalLm::new(&tiny(false, 2)).unwrap();
        // A larger init than the default so that context visibly matters.
        let init = model.init_params(3, Device::Cpu, Kind::Float);
        let mut params = Params::new();
        for (n, t) in init.iter() {
            params.insert(n, t * 8.0);
        }
        tch::manual_seed(4);
        let ids = Tensor::randint(48, [2, 12], (Kind::Int64, Device::Cpu));
        // Row 0 packs sequences of 5 and 7 tokens; row 1 is one sequence.
        let positions: Vec<i64> = (0..5).chain(0..7).chain(0..12).collect();
        let input = TokenInput {
            ids: ids.shallow_clone(),
            positions: Some(Tensor::from_slice(&positions).reshape([2, 12])),
        };
        let packed = model.forward_input(&params, &input).unwrap();
        let alone = |row: i64, start: i64, len: i64| {
            let x = ids.narrow(0, row, 1).narrow(1, start, len);
            model.forward(&params, &x).unwrap()
        };
        // Relative to the largest logit.
        let diff = |a: &Tensor, b: &Tensor| {
            (a - b).abs().max().double_value(&[]) / b.abs().max().double_value(&[])
        };
        let of = |row: i64, start: i64, len: i64| packed.narrow(0, row, 1).narrow(1, start, len);
        for (row, start, len) in [(0, 0, 5), (0, 5, 7), (1, 0, 12)] {
            let d = diff(&of(row, start, len), &alone(row, start, len));
            assert!(d < 1e-5, "row {row} from {start}: {d:e}");
        }
        // Unpacked, the second sequence of row 0 would see the first: far from alone.
        let whole = model.forward(&params, &ids).unwrap();
        let seen = diff(&whole.narrow(0, 0, 1).narrow(1, 5, 7), &alone(0, 5, 7));
        assert!(seen > 1e-2, "{seen}");

        let mask = packed_attention_mask(input.positions.as_ref().unwrap());
        assert_eq!(mask.size(), [2, 1, 12, 12]);
        let row0 = Vec::<bool>::try_from(mask.get(0).get(0).get(6).to_kind(Kind::Bool)).unwrap();
        let want: Vec<bool> = (0..12).map(|j| (5..=6).contains(&j)).collect();
        assert_eq!(row0, want, "query 6 of row 0 sees keys 5 and 6");
    }

    #[test]
    fn lora_factors_follow_the_block_weights_and_start_as_a_no_op() {
        let c = tiny(false, 2);
        let lora: LoraConfig = serde_yaml::from_str(
            "{r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, down_proj], \
             use_rslora: false, modules_to_save: [lm_head], init_from: null, merge: false}",
        )
        .unwrap();
        let base = CausalLm::new(&c).unwrap();
        let m = CausalLm::with_lora(&c, Some(&lora)).unwrap();
        assert_eq!(m.param_specs().len(), base.param_specs().len() + 2 * 2 * 2);
        let a = m
            .param_spec("model.layers.1.self_attn.q_proj.lora_A.weight")
            .unwrap();
        let b = m
            .param_spec("model.layers.1.mlp.down_proj.lora_B.weight")
            .unwrap();
        assert_eq!(
            (a.shape.clone(), a.owner, a.trainable),
            (vec![4, 32], 2, true)
        );
        assert_eq!(
            (b.shape.clone(), b.owner, b.trainable),
            (vec![32, 4], 2, true)
        );
        assert!(
            matches!(a.init, Init::Uniform { bound } if (bound - 32f64.powf(-0.5)).abs() < 1e-12)
        );
        assert!(matches!(b.init, Init::Zeros));
        let trainable: Vec<&str> = m
            .param_specs()
            .iter()
            .filter(|s| s.trainable && !s.name.contains("lora_"))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(trainable, ["lm_head.weight"], "only the module to save");
        assert_eq!(
            m.units()[1].param_names()[9..],
            [
                "model.layers.0.self_attn.q_proj.lora_A.weight",
                "model.layers.0.self_attn.q_proj.lora_B.weight",
                "model.layers.0.mlp.down_proj.lora_A.weight",
                "model.layers.0.mlp.down_proj.lora_B.weight",
            ]
        );
        // B = 0: the base's logits; B ≠ 0: others.
        let mut p = m.init_params(5, Device::Cpu, Kind::Float);
        let tokens = Tensor::from_slice2(&[[1i64, 2, 3, 4, 5, 6]]);
        let no_op = m.forward(&p, &tokens).unwrap();
        let plain = base.forward(&p, &tokens).unwrap();
        assert!(no_op.equal(&plain));
        p.insert(
            "model.layers.0.mlp.down_proj.lora_B.weight",
            Tensor::ones([32, 4], (Kind::Float, Device::Cpu)),
        );
        let moved = m.forward(&p, &tokens).unwrap();
        assert!((moved - plain).abs().max().double_value(&[]) > 1e-3);
    }

    #[test]
    fn units_and_parameter_table() {
        let m = CausalLm::new(&tiny(true, 2)).unwrap();
        let names: Vec<_> = m.units().iter().map(|u| u.name().to_string()).collect();
        assert_eq!(names, ["embed", "layers.0", "layers.1", "head"]);
        assert_eq!(m.param_specs().len(), 1 + 2 * 9 + 1);
        let embed = m.param_spec("model.embed_tokens.weight").unwrap();
        assert_eq!((embed.owner, embed.readers.clone()), (0, vec![0, 3]));
        assert!(embed.is_shared());
        assert_eq!(
            m.units()[3].param_names(),
            ["model.norm.weight", "model.embed_tokens.weight"]
        );
        assert_eq!(
            m.param_specs()
                .iter()
                .map(|s| s.numel() as u64)
                .sum::<u64>(),
            m.config().num_parameters()
        );
        let untied = CausalLm::new(&tiny(false, 4)).unwrap();
        assert_eq!(
            untied.units()[3].param_names(),
            ["model.norm.weight", "lm_head.weight"]
        );
        assert_eq!(untied.owned_params(3).count(), 2);
        assert_eq!(
            untied
                .param_spec("model.layers.1.self_attn.k_proj.weight")
                .unwrap()
                .shape,
            vec![32, 32]
        );
    }

    #[test]
    fn rejects_bad_configs() {
        let mut c = tiny(true, 3);
        let err = CausalLm::new(&c).unwrap_err().to_string();
        assert!(
            err.contains("num_key_value_heads") && err.contains("3"),
            "{err}"
        );
        c = tiny(true, 2);
        c.num_attention_heads = 5;
        let err = CausalLm::new(&c).unwrap_err().to_string();
        assert!(err.starts_with("model.num_attention_heads"), "{err}");
    }

    #[test]
    fn init_statistics() {
        let mut c = tiny(false, 2);
        c.hidden_size = 128;
        c.intermediate_size = 256;
        c.vocab_size = 512;
        c.initializer_range = 0.05;
        let m = CausalLm::new(&c).unwrap();
        let p = m.init_params(11, Device::Cpu, Kind::Float);
        m.check_params(&p).unwrap();
        for s in m.param_specs() {
            let t = p.get(&s.name).unwrap();
            match s.init {
                Init::Ones => assert_eq!(t.min().double_value(&[]), 1.0, "{}", s.name),
                Init::Normal { .. } => {
                    let std = t.std(true).double_value(&[]);
                    let mean = t.mean(Kind::Float).double_value(&[]);
                    assert!((std / 0.05 - 1.0).abs() < 0.03, "{}: std {std}", s.name);
                    assert!(mean.abs() < 0.05 * 0.03, "{}: mean {mean}", s.name);
                }
                Init::Zeros | Init::Uniform { .. } => panic!("{}: a LoRA init", s.name),
            }
        }
        // Same seed, same values (also in another dtype); another seed, other values.
        let again = m.init_params(11, Device::Cpu, Kind::BFloat16);
        let w = "model.layers.0.mlp.up_proj.weight";
        assert!(again.get(w).unwrap().to_kind(Kind::Float).equal(
            &p.get(w)
                .unwrap()
                .to_kind(Kind::BFloat16)
                .to_kind(Kind::Float)
        ));
        let other = m.init_params(12, Device::Cpu, Kind::Float);
        assert!(!other.get(w).unwrap().equal(p.get(w).unwrap()));
    }

    #[test]
    fn llama3_scaling_changes_only_low_frequencies() {
        let mut c = tiny(true, 2);
        c.hidden_size = 64; // head_dim 16
        c.rope_theta = 500000.0;
        let plain = inv_freq(&c);
        c.rope_scaling = Some(RopeScaling {
            rope_type: RopeType::Llama3,
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64, // wavelength 32.3 lies between 64/4 and 64
        });
        let scaled = inv_freq(&c);
        assert_eq!(plain[0], scaled[0], "highest frequency untouched");
        let last = plain.len() - 1;
        assert!(
            (scaled[last] * 8.0 / plain[last] - 1.0).abs() < 1e-6,
            "lowest divided by factor"
        );
        assert!(
            plain
                .iter()
                .zip(&scaled)
                .any(|(p, s)| s < p && s * 8.0 > *p * 1.0001),
            "some smoothed"
        );
    }

    fn batch() -> Tensor {
        Tensor::from_slice(&[1i64, 5, 9, 2, 47, 0, 3, 3, 8, 13, 21, 34, 4, 4, 40, 7])
            .reshape([2, 8])
    }

    #[test]
    fn causal_outputs_do_not_see_the_future() {
        let m = CausalLm::new(&tiny(true, 2)).unwrap();
        let p = m.init_params(0, Device::Cpu, Kind::Float);
        let a = batch();
        let b = a.copy();
        let _ = b.narrow(1, 5, 3).fill_(11);
        let la = m.forward(&p, &a).unwrap();
        let lb = m.forward(&p, &b).unwrap();
        assert!(la
            .narrow(1, 0, 5)
            .allclose(&lb.narrow(1, 0, 5), 0.0, 0.0, false));
        assert!(!la
            .narrow(1, 5, 1)
            .allclose(&lb.narrow(1, 5, 1), 1e-6, 1e-6, false));
    }

    /// The unit engine's backward (each unit on a detached leaf input, per-unit [`vjp`], shared
    /// gradients summed) gives the same gradients as one backward through the whole graph.
    fn unit_by_unit_equals_whole_graph(tied: bool, kv_heads: usize) {
        unit_by_unit_equals_whole_graph_of(&tiny(tied, kv_heads));
    }

    fn unit_by_unit_equals_whole_graph_of(c: &ModelConfig) {
        let m = CausalLm::new(c).unwrap();
        let p = m.init_params(5, Device::Cpu, Kind::Float).requiring_grad();
        let tokens = batch();

        // Whole graph.
        let loss = causal_lm_loss(&m.forward(&p, &tokens).unwrap(), &tokens);
        let names: Vec<&str> = p.names().collect();
        let refs: Vec<&Tensor> = names.iter().map(|n| p.get(n).unwrap()).collect();
        let whole = vjp(&loss, None, &refs).unwrap();

        // Unit by unit.
        let ctx = m.ctx(8, Device::Cpu);
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        let mut x = tokens.shallow_clone();
        for (i, unit) in m.units().iter().enumerate() {
            let input = if i == 0 {
                x
            } else {
                x.detach().set_requires_grad(true)
            };
            let out = unit.forward(&m.unit_params(i, &p).unwrap(), &input, &ctx);
            x = out.shallow_clone();
            inputs.push(input);
            outputs.push(out);
        }
        let mut grads: std::collections::HashMap<String, Tensor> = Default::default();
        let mut grad_out: Option<Tensor> = None;
        for i in (0..m.units().len()).rev() {
            let unit = &m.units()[i];
            let params = m.unit_params(i, &p).unwrap();
            let mut wrt: Vec<&Tensor> = params.iter().collect();
            if i > 0 {
                wrt.push(&inputs[i]);
            }
            let root = if grad_out.is_none() {
                causal_lm_loss(&outputs[i], &tokens)
            } else {
                outputs[i].shallow_clone()
            };
            let mut g = vjp(&root, grad_out.as_ref(), &wrt).unwrap();
            grad_out = if i > 0 { g.pop().unwrap() } else { None };
            for (name, gi) in unit.param_names().iter().zip(g) {
                let gi = gi.unwrap();
                match grads.remove(name) {
                    Some(prev) => grads.insert(name.clone(), prev + gi),
                    None => grads.insert(name.clone(), gi),
                };
            }
        }
        for (name, w) in names.iter().zip(whole) {
            let w = w.unwrap();
            let u = &grads[*name];
            let diff = (&w - u).abs().max().double_value(&[]);
            assert_eq!(diff, 0.0, "{name}: unit-by-unit gradient differs by {diff}");
            assert!(
                w.abs().max().double_value(&[]) > 0.0,
                "{name}: zero gradient"
            );
        }
    }

    #[test]
    fn unit_by_unit_backward_tied_gqa() {
        unit_by_unit_equals_whole_graph(true, 2);
    }

    #[test]
    fn unit_by_unit_backward_untied_mha() {
        unit_by_unit_equals_whole_graph(false, 4);
    }

    fn qwen2(tied: bool) -> ModelConfig {
        ModelConfig {
            model_type: Some(flotilla_config::schema::ModelType::Qwen2),
            ..tiny(tied, 2)
        }
    }

    #[test]
    fn unit_by_unit_backward_with_biases() {
        unit_by_unit_equals_whole_graph_of(&qwen2(true));
        let mut llama = tiny(false, 4);
        llama.attention_bias = Some(true);
        unit_by_unit_equals_whole_graph_of(&llama);
    }

    #[test]
    fn qwen2_biases_follow_the_block_weights_and_shift_the_projections() {
        let c = qwen2(false);
        let m = CausalLm::new(&c).unwrap();
        let plain = CausalLm::new(&tiny(false, 2)).unwrap();
        assert_eq!(m.param_specs().len(), plain.param_specs().len() + 2 * 3);
        assert_eq!(
            m.units()[2].param_names()[9..],
            [
                "model.layers.1.self_attn.q_proj.bias",
                "model.layers.1.self_attn.k_proj.bias",
                "model.layers.1.self_attn.v_proj.bias",
            ]
        );
        let k = m
            .param_spec("model.layers.1.self_attn.k_proj.bias")
            .unwrap();
        assert_eq!((k.shape.clone(), k.owner), (vec![16], 2));
        assert!(matches!(k.init, Init::Zeros));
        assert_eq!(
            m.param_specs()
                .iter()
                .map(|s| s.numel() as u64)
                .sum::<u64>(),
            c.num_parameters()
        );
        // Zero biases: Llama's logits; a nonzero bias moves them.
        let mut p = m.init_params(4, Device::Cpu, Kind::Float);
        let tokens = batch();
        assert!(m
            .forward(&p, &tokens)
            .unwrap()
            .equal(&plain.forward(&p, &tokens).unwrap()));
        let before = m.forward(&p, &tokens).unwrap();
        p.insert(
            "model.layers.0.self_attn.v_proj.bias",
            Tensor::full([16], 0.5, (Kind::Float, Device::Cpu)),
        );
        let moved = m.forward(&p, &tokens).unwrap();
        assert!((&moved - &before).abs().max().double_value(&[]) > 1e-3);

        // LoRA on q_proj keeps its bias, frozen, before the adapters.
        let lora: LoraConfig = serde_yaml::from_str(
            "{r: 2, alpha: 4, dropout: 0.0, target_modules: [q_proj], use_rslora: false, \
             modules_to_save: [], init_from: null, merge: false}",
        )
        .unwrap();
        let l = CausalLm::with_lora(&c, Some(&lora)).unwrap();
        assert_eq!(
            l.units()[1].param_names()[9..],
            [
                "model.layers.0.self_attn.q_proj.bias",
                "model.layers.0.self_attn.k_proj.bias",
                "model.layers.0.self_attn.v_proj.bias",
                "model.layers.0.self_attn.q_proj.lora_A.weight",
                "model.layers.0.self_attn.q_proj.lora_B.weight",
            ]
        );
        assert!(
            !l.param_spec("model.layers.0.self_attn.q_proj.bias")
                .unwrap()
                .trainable
        );
        assert_eq!(l.trainable_mask(1)[9..], [false, false, false, true, true]);
        let mut lp = l.init_params(4, Device::Cpu, Kind::Float);
        for (n, t) in p.iter() {
            lp.insert(n, t.shallow_clone());
        }
        assert!(
            l.forward(&lp, &tokens).unwrap().equal(&moved),
            "B = 0: the base with its bias"
        );
    }

    #[test]
    fn a_context_beyond_the_sliding_window_is_refused() {
        let c = ModelConfig {
            model_type: Some(flotilla_config::schema::ModelType::Mistral),
            sliding_window: Some(6),
            ..tiny(true, 2)
        };
        let m = CausalLm::new(&c).unwrap();
        m.check_window("data.seq_len", 6).unwrap();
        let err = m.check_window("data.seq_len", 7).unwrap_err().to_string();
        assert!(
            err.contains("data.seq_len = 7 exceeds the Mistral model's sliding window of 6")
                && err.contains("set data.seq_len=6 or less"),
            "{err}"
        );
        let p = m.init_params(0, Device::Cpu, Kind::Float);
        let err = m.forward(&p, &batch()).unwrap_err().to_string();
        assert!(err.contains("the input length = 8 exceeds"), "{err}");
        assert!(m.forward(&p, &batch().narrow(1, 0, 6)).is_ok());
    }

    #[test]
    fn reduced_precision_forward() {
        let m = CausalLm::new(&tiny(true, 2)).unwrap();
        let p32 = m.init_params(1, Device::Cpu, Kind::Float);
        let ref_logits = m.forward(&p32, &batch()).unwrap();
        for kind in [Kind::BFloat16, Kind::Half] {
            let p = p32.to(Device::Cpu, kind);
            let logits = m.forward(&p, &batch()).unwrap();
            assert_eq!(logits.kind(), kind);
            let err = (logits.to_kind(Kind::Float) - &ref_logits)
                .abs()
                .max()
                .double_value(&[]);
            let scale = ref_logits.abs().max().double_value(&[]);
            assert!(
                err / scale < 0.05,
                "{kind:?}: relative error {}",
                err / scale
            );
        }
    }

    #[test]
    fn loss_sum_and_mean_agree() {
        let m = CausalLm::new(&tiny(false, 2)).unwrap();
        let p = m.init_params(2, Device::Cpu, Kind::Float);
        let tokens = batch();
        let labels = tokens.copy();
        let _ = labels.narrow(1, 0, 3).fill_(-100);
        let logits = m.forward(&p, &tokens).unwrap();
        let mean = causal_lm_loss(&logits, &labels).double_value(&[]);
        let (sum, n) = causal_lm_loss_sum(&logits, &labels);
        assert_eq!(n, 2 * 7 - 2 * 2);
        assert!((sum.double_value(&[]) / n as f64 - mean).abs() < 1e-6);
        // Near ln(vocab) for a freshly initialised model.
        assert!((mean - (48f64).ln()).abs() < 0.1, "{mean}");
    }

    /// The cached forward (a prefill, single tokens, then several at once) gives each
    /// position the logits of the whole-sequence forward, with and without LoRA adapters.
    #[test]
    fn cached_forward_equals_the_whole_forward() {
        let lora: LoraConfig = serde_yaml::from_str(
            "{r: 2, alpha: 4, dropout: 0.0, target_modules: [q_proj, v_proj, down_proj], \
             use_rslora: false, modules_to_save: [], init_from: null, merge: false}",
        )
        .unwrap();
        for (kv_heads, lora) in [(2, None), (4, None), (2, Some(&lora))] {
            let m = CausalLm::with_lora(&tiny(false, kv_heads), lora).unwrap();
            let mut p = m.init_params(3, Device::Cpu, Kind::Float);
            if lora.is_some() {
                let b = "model.layers.1.self_attn.v_proj.lora_B.weight";
                p.insert(b, Tensor::randn([16, 2], (Kind::Float, Device::Cpu)) * 0.1);
            }
            let tokens = batch();
            let whole = m.forward(&p, &tokens).unwrap();
            let mut cache = KvCache::new(&m, 8);
            let _no_grad = tch::no_grad_guard();
            for (start, len) in [(0, 3), (3, 1), (4, 1), (5, 3)] {
                let logits = m
                    .forward_cached(&p, &tokens.narrow(1, start, len), &mut cache)
                    .unwrap();
                let want = whole.select(1, start + len - 1);
                let err = (&logits - &want).abs().max().double_value(&[]);
                assert!(err < 1e-5, "kv {kv_heads}, positions {start}+{len}: {err}");
            }
            assert_eq!(cache.len(), 8);
            let full = m.forward_cached(&p, &tokens.narrow(1, 0, 1), &mut cache);
            assert!(matches!(
                full,
                Err(ModelError::CacheFull {
                    capacity: 8,
                    needed: 9
                })
            ));
        }
    }
}
