//! The one mapping between the architecture's parameters and transformers' weight names:
//! [`ParamName`] (a parameter of `LlamaForCausalLM`) and [`LayerWeight`] (a weight of one
//! decoder layer), with their Hugging Face names and the parsing of those names. The
//! architecture (`llama.rs`) builds its parameter table from them and the Hugging Face format
//! (`hf.rs`) reads and writes files under them; this module depends on neither.

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
}

impl LayerWeight {
    pub const ALL: [LayerWeight; 9] = [
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
            ParamName::Norm => "model.norm.weight".into(),
            ParamName::LmHead => "lm_head.weight".into(),
            ParamName::Lora(i, w, f) => {
                let module = w.suffix().strip_suffix(".weight").unwrap_or(w.suffix());
                format!("model.layers.{i}.{module}.{}.weight", f.tag())
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
        for f in [LoraFactor::A, LoraFactor::B] {
            let tail = format!(".{}.weight", f.tag());
            if let Some(module) = suffix.strip_suffix(&tail) {
                return LayerWeight::ALL
                    .into_iter()
                    .find(|w| w.suffix().strip_suffix(".weight") == Some(module))
                    .map(|w| ParamName::Lora(i, w, f));
            }
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
        assert_eq!(ParamName::parse("model.layers.0.mlp.up_proj.bias"), None);
    }
}
