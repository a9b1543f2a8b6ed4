//! The one mapping between the architecture's parameters and transformers' weight names:
//! [`ParamName`] (a parameter of any family's `*ForCausalLM`: they share their names, each
//! family with its own subset of a block's weights), [`LayerWeight`] (a weight of one
//! decoder layer) and a sparse layer's router and experts ([`MoeNames`], [`ExpertWeight`]), with their Hugging Face names and the parsing of those names. The decoder
//! (`decoder/`) builds its parameter table from them and the Hugging Face format (`state/`)
//! reads and writes files under them; this module depends on neither.

/// The weights of one decoder layer, in the order a block unit takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerWeight {
    InputNorm,
    Q,
    K,
    V,
    O,
    PostAttentionNorm,
    Gate,
    Up,
    Down,
    /// Qwen3's and Gemma 3's per-head norm of the queries (`[head_dim]`).
    QNorm,
    /// ... and of the keys.
    KNorm,
    /// Gemma's norm of the MLP's input (its `post_attention_layernorm` norms the attention's
    /// output).
    PreFeedforwardNorm,
    /// Gemma's norm of the MLP's output.
    PostFeedforwardNorm,
    /// Phi-3's fused q/k/v projection (`[(heads + 2 kv_heads) head_dim, hidden]`).
    Qkv,
    /// Phi-3's fused gate and up projection (`[2 intermediate, hidden]`).
    GateUp,
}

impl LayerWeight {
    /// Every layer weight of every family.
    pub const ALL: [LayerWeight; 15] = [
        LayerWeight::InputNorm,
        LayerWeight::Q,
        LayerWeight::K,
        LayerWeight::V,
        LayerWeight::O,
        LayerWeight::PostAttentionNorm,
        LayerWeight::Gate,
        LayerWeight::Up,
        LayerWeight::Down,
        LayerWeight::QNorm,
        LayerWeight::KNorm,
        LayerWeight::PreFeedforwardNorm,
        LayerWeight::PostFeedforwardNorm,
        LayerWeight::Qkv,
        LayerWeight::GateUp,
    ];

    /// The weights of a Llama block, in the order its unit takes them (other families add
    /// theirs after these).
    pub const LLAMA: [LayerWeight; 9] = [
        LayerWeight::InputNorm,
        LayerWeight::Q,
        LayerWeight::K,
        LayerWeight::V,
        LayerWeight::O,
        LayerWeight::PostAttentionNorm,
        LayerWeight::Gate,
        LayerWeight::Up,
        LayerWeight::Down,
    ];

    /// The module under `model.layers.{i}.` (`self_attn.q_proj`): the weight's name without
    /// `.weight`.
    pub fn module(self) -> &'static str {
        let s = self.suffix();
        s.strip_suffix(".weight").unwrap_or(s)
    }

    /// The name under `model.layers.{i}.`.
    pub fn suffix(self) -> &'static str {
        match self {
            LayerWeight::InputNorm => "input_layernorm.weight",
            LayerWeight::Q => "self_attn.q_proj.weight",
            LayerWeight::K => "self_attn.k_proj.weight",
            LayerWeight::V => "self_attn.v_proj.weight",
            LayerWeight::O => "self_attn.o_proj.weight",
            LayerWeight::PostAttentionNorm => "post_attention_layernorm.weight",
            LayerWeight::Gate => "mlp.gate_proj.weight",
            LayerWeight::Up => "mlp.up_proj.weight",
            LayerWeight::Down => "mlp.down_proj.weight",
            LayerWeight::QNorm => "self_attn.q_norm.weight",
            LayerWeight::KNorm => "self_attn.k_norm.weight",
            LayerWeight::PreFeedforwardNorm => "pre_feedforward_layernorm.weight",
            LayerWeight::PostFeedforwardNorm => "post_feedforward_layernorm.weight",
            LayerWeight::Qkv => "self_attn.qkv_proj.weight",
            LayerWeight::GateUp => "mlp.gate_up_proj.weight",
        }
    }
}

/// How a family names its sparse MLP's weights in the Hub's files (per expert, as
/// `save_pretrained` writes them whatever layout transformers keeps in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeNames {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up), `w2` (down).
    Mixtral,
    /// `mlp.gate`, `mlp.experts.{e}.gate_proj`, `up_proj`, `down_proj`.
    Qwen,
}

/// One projection of an expert's SwiGLU MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertWeight {
    Gate,
    Up,
    Down,
}

impl ExpertWeight {
    /// The three, in the order a sparse block takes each expert's weights.
    pub const ALL: [ExpertWeight; 3] = [ExpertWeight::Gate, ExpertWeight::Up, ExpertWeight::Down];
}

impl MoeNames {
    const BOTH: [MoeNames; 2] = [MoeNames::Mixtral, MoeNames::Qwen];

    /// The sparse MLP's module under `model.layers.{i}.`.
    fn block(self) -> &'static str {
        match self {
            MoeNames::Mixtral => "block_sparse_moe",
            MoeNames::Qwen => "mlp",
        }
    }

    /// An expert projection's module name.
    fn expert(self, w: ExpertWeight) -> &'static str {
        match (self, w) {
            (MoeNames::Mixtral, ExpertWeight::Gate) => "w1",
            (MoeNames::Mixtral, ExpertWeight::Up) => "w3",
            (MoeNames::Mixtral, ExpertWeight::Down) => "w2",
            (MoeNames::Qwen, ExpertWeight::Gate) => "gate_proj",
            (MoeNames::Qwen, ExpertWeight::Up) => "up_proj",
            (MoeNames::Qwen, ExpertWeight::Down) => "down_proj",
        }
    }

    /// The router or expert weight named by `suffix` (what follows `model.layers.{i}.`).
    fn parse(self, i: usize, suffix: &str) -> Option<ParamName> {
        let rest = suffix.strip_prefix(self.block())?.strip_prefix('.')?;
        if rest == "gate.weight" {
            return Some(ParamName::Router(i, self));
        }
        let (e, module) = rest.strip_prefix("experts.")?.split_once('.')?;
        let e = e.parse().ok()?;
        let module = module.strip_suffix(".weight")?;
        ExpertWeight::ALL
            .into_iter()
            .find(|w| self.expert(*w) == module)
            .map(|w| ParamName::Expert(i, e, w, self))
    }
}

/// Where an expert adapter sits in PEFT's nesting of `ParamWrapper`s around a sparse layer's
/// `mlp.experts` (transformers 5 fuses the experts into `gate_up_proj` and `down_proj`
/// parameters; PEFT wraps the module once per adapted parameter): the outer wrapper's factors
/// are `mlp.experts.lora_A.weight`, the inner's `mlp.experts.base_layer.lora_A.weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertWrap {
    Outer,
    Inner,
}

/// A fused expert parameter LoRA adapts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertProj {
    /// `gate_up_proj`, `[experts, 2 moe_intermediate, hidden]`: the gate rows, then the up rows.
    GateUp,
    /// `down_proj`, `[experts, hidden, moe_intermediate]`.
    Down,
}

impl ExpertWrap {
    /// The wrapper of `proj` when a layer adapts `gate_up` and `down` as said: with both,
    /// `gate_up_proj` is wrapped first (inner) and `down_proj` around it; alone, either is the
    /// outer one.
    pub fn of(proj: ExpertProj, gate_up: bool, down: bool) -> ExpertWrap {
        match proj {
            ExpertProj::GateUp if gate_up && down => ExpertWrap::Inner,
            _ => ExpertWrap::Outer,
        }
    }

    fn module(self) -> &'static str {
        match self {
            ExpertWrap::Outer => "mlp.experts",
            ExpertWrap::Inner => "mlp.experts.base_layer",
        }
    }
}

/// A parameter of `LlamaForCausalLM`. Its Hugging Face name is the name everywhere in
/// flotilla (parameter sets, FSDP groups, checkpoints), so this is the only mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamName {
    /// `model.embed_tokens.weight`, `[vocab, hidden]`.
    Embed,
    /// `model.layers.{i}.…`.
    Layer(usize, LayerWeight),
    /// The bias of an attention projection, `model.layers.{i}.self_attn.q_proj.bias` (`[out]`):
    /// Qwen2's q/k/v, a biased Llama's q/k/v/o.
    Bias(usize, LayerWeight),
    /// `model.norm.weight`, `[hidden]`.
    Norm,
    /// `lm_head.weight`, `[vocab, hidden]`; absent with tied embeddings.
    LmHead,
    /// A LoRA factor of a block's linear layer: `model.layers.{i}.self_attn.q_proj.lora_A.weight`
    /// (`[r, in]`) or `…lora_B.weight` (`[out, r]`), PEFT's names under `base_model.model.`.
    Lora(usize, LayerWeight, LoraFactor),
    /// A sparse layer's router, `[experts, hidden]`: `model.layers.{i}.mlp.gate.weight`
    /// (`block_sparse_moe.gate` for Mixtral).
    Router(usize, MoeNames),
    /// Expert `e`'s projection in layer `i`: `[moe_intermediate, hidden]` (gate, up) or
    /// `[hidden, moe_intermediate]` (down).
    Expert(usize, usize, ExpertWeight, MoeNames),
    /// A LoRA factor of a sparse layer's fused expert parameter, under PEFT's name for it
    /// (`model.layers.{i}.mlp.experts[.base_layer].lora_A.weight`, both families): `A` is
    /// `[r·experts, in]` (expert-major rows), `B` `[out, r·experts]` (rank-major columns).
    /// Which parameter the wrapper adapts is the layer's targets' ([`ExpertWrap::of`]).
    ExpertLora(usize, ExpertWrap, LoraFactor),
    /// A LoRA factor of a sparse layer's router, `model.layers.{i}.mlp.gate.lora_A.weight`
    /// (`[r, hidden]`; `B` `[experts, r]`).
    RouterLora(usize, LoraFactor),
}

/// The two factors of a LoRA update `B·A`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoraFactor {
    A,
    B,
}

impl LoraFactor {
    fn tag(self) -> &'static str {
        match self {
            LoraFactor::A => "lora_A",
            LoraFactor::B => "lora_B",
        }
    }
}

impl ParamName {
    pub fn hf_name(&self) -> String {
        match self {
            ParamName::Embed => "model.embed_tokens.weight".into(),
            ParamName::Layer(i, w) => format!("model.layers.{i}.{}", w.suffix()),
            ParamName::Bias(i, w) => format!("model.layers.{i}.{}.bias", w.module()),
            ParamName::Norm => "model.norm.weight".into(),
            ParamName::LmHead => "lm_head.weight".into(),
            ParamName::Lora(i, w, f) => {
                format!("model.layers.{i}.{}.{}.weight", w.module(), f.tag())
            }
            ParamName::Router(i, n) => format!("model.layers.{i}.{}.gate.weight", n.block()),
            ParamName::Expert(i, e, w, n) => {
                format!(
                    "model.layers.{i}.{}.experts.{e}.{}.weight",
                    n.block(),
                    n.expert(*w)
                )
            }
            ParamName::ExpertLora(i, wrap, f) => {
                format!("model.layers.{i}.{}.{}.weight", wrap.module(), f.tag())
            }
            ParamName::RouterLora(i, f) => format!("model.layers.{i}.mlp.gate.{}.weight", f.tag()),
        }
    }

    /// Whether the parameter is a LoRA factor (of a linear layer, the experts or the router).
    pub fn is_lora_factor(&self) -> bool {
        matches!(
            self,
            ParamName::Lora(..) | ParamName::ExpertLora(..) | ParamName::RouterLora(..)
        )
    }

    /// The parameter a Hugging Face weight name denotes, if any.
    pub fn parse(name: &str) -> Option<ParamName> {
        match name {
            "model.embed_tokens.weight" => return Some(ParamName::Embed),
            "model.norm.weight" => return Some(ParamName::Norm),
            "lm_head.weight" => return Some(ParamName::LmHead),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (index, suffix) = rest.split_once('.')?;
        let i = index.parse().ok()?;
        if let Some(p) = MoeNames::BOTH.iter().find_map(|n| n.parse(i, suffix)) {
            return Some(p);
        }
        for f in [LoraFactor::A, LoraFactor::B] {
            let tail = format!(".{}.weight", f.tag());
            let Some(module) = suffix.strip_suffix(&tail) else {
                continue;
            };
            for wrap in [ExpertWrap::Outer, ExpertWrap::Inner] {
                if module == wrap.module() {
                    return Some(ParamName::ExpertLora(i, wrap, f));
                }
            }
            if module == "mlp.gate" {
                return Some(ParamName::RouterLora(i, f));
            }
        }
        let of_module = |module: &str| LayerWeight::ALL.into_iter().find(|w| w.module() == module);
        for f in [LoraFactor::A, LoraFactor::B] {
            let tail = format!(".{}.weight", f.tag());
            if let Some(module) = suffix.strip_suffix(&tail) {
                return of_module(module).map(|w| ParamName::Lora(i, w, f));
            }
        }
        if let Some(module) = suffix.strip_suffix(".bias") {
            return of_module(module).map(|w| ParamName::Bias(i, w));
        }
        LayerWeight::ALL
            .into_iter()
            .find(|w| w.suffix() == suffix)
            .map(|w| ParamName::Layer(i, w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let mut all = vec![ParamName::Embed, ParamName::Norm, ParamName::LmHead];
        for w in LayerWeight::ALL {
            all.push(ParamName::Layer(13, w));
            all.push(ParamName::Bias(7, w));
            all.push(ParamName::Lora(2, w, LoraFactor::A));
            all.push(ParamName::Lora(2, w, LoraFactor::B));
        }
        for f in [LoraFactor::A, LoraFactor::B] {
            all.push(ParamName::ExpertLora(1, ExpertWrap::Outer, f));
            all.push(ParamName::ExpertLora(1, ExpertWrap::Inner, f));
            all.push(ParamName::RouterLora(1, f));
        }
        for p in all {
            assert_eq!(ParamName::parse(&p.hf_name()), Some(p), "{}", p.hf_name());
        }
        assert_eq!(
            ParamName::Layer(2, LayerWeight::Gate).hf_name(),
            "model.layers.2.mlp.gate_proj.weight"
        );
        assert_eq!(
            ParamName::Lora(0, LayerWeight::V, LoraFactor::B).hf_name(),
            "model.layers.0.self_attn.v_proj.lora_B.weight"
        );
        assert_eq!(ParamName::parse("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(
            ParamName::Bias(3, LayerWeight::K).hf_name(),
            "model.layers.3.self_attn.k_proj.bias"
        );
        assert_eq!(
            ParamName::parse("model.layers.0.mlp.up_proj.bias"),
            Some(ParamName::Bias(0, LayerWeight::Up))
        );
        assert_eq!(ParamName::parse("model.layers.0.mlp.up.bias"), None);
        for n in MoeNames::BOTH {
            let mut moe = vec![ParamName::Router(4, n)];
            moe.extend(ExpertWeight::ALL.map(|w| ParamName::Expert(4, 11, w, n)));
            for p in moe {
                assert_eq!(ParamName::parse(&p.hf_name()), Some(p), "{}", p.hf_name());
            }
        }
        assert_eq!(
            ParamName::Expert(1, 7, ExpertWeight::Up, MoeNames::Mixtral).hf_name(),
            "model.layers.1.block_sparse_moe.experts.7.w3.weight"
        );
        assert_eq!(
            ParamName::Router(0, MoeNames::Qwen).hf_name(),
            "model.layers.0.mlp.gate.weight"
        );
        assert_eq!(
            ParamName::Expert(2, 0, ExpertWeight::Down, MoeNames::Qwen).hf_name(),
            "model.layers.2.mlp.experts.0.down_proj.weight"
        );
    }
}
