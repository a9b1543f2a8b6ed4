//! The one mapping between the architecture's parameters and transformers' weight names:
//! [`ParamName`] (a parameter of any family's `*ForCausalLM`: they share their names, each
//! family with its own subset of a block's weights) and [`LayerWeight`] (a weight of one
//! decoder layer), with their Hugging Face names and the parsing of those names. The decoder
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
        }
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
    }
}
