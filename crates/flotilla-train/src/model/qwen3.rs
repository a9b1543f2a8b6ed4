//! Qwen3 (`Qwen3ForCausalLM`): Llama's decoder with each head's queries and keys RMS-normed
//! (`self_attn.q_norm`, `self_attn.k_norm`, `[head_dim]`, Llama's convention) after their
//! projection and before the rotary embedding, a head size of its own (`head_dim`, 128 by
//! default), biases only with `attention_bias`, and a sliding window on the layers
//! `layer_types` names (with `use_sliding_window`), as transformers' `modeling_qwen3.py`.

use flotilla_config::schema::{LoraConfig, ModelConfig};

use super::decoder::{self, DecoderStyle, LayerStyle};
use super::{FamilyUnits, ModelError};

/// The units of a Qwen3 `config`.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    let style = DecoderStyle {
        qk_norm: true,
        ..DecoderStyle::LLAMA
    };
    decoder::build(config, lora, style, |i| LayerStyle::of(config, i))
}
