//! Gemma 2 (`Gemma2ForCausalLM`) and Gemma 3's text model (`Gemma3ForCausalLM`) on the shared
//! decoder, as transformers' `modeling_gemma2.py` and `modeling_gemma3.py` compute them:
//!
//! - every RMSNorm scales by `1 + w` in fp32 (weights start at zero), and a block has four:
//!   `input_layernorm` before attention, `post_attention_layernorm` on the attention's output,
//!   `pre_feedforward_layernorm` before the MLP, `post_feedforward_layernorm` on its output;
//! - embeddings are multiplied by `sqrt(hidden_size)` rounded to the activation dtype;
//! - the MLP is GeGLU with the tanh GELU (`gelu_pytorch_tanh`);
//! - queries are scaled by `query_pre_attn_scalar ** -0.5`;
//! - Gemma 2 soft-caps attention scores (`attn_logit_softcapping`, eager attention) and logits
//!   (`final_logit_softcapping`);
//! - layers alternate sliding-window and global attention (`layer_types`);
//! - Gemma 3 norms each head's queries and keys (`q_norm`, `k_norm`, Gemma's convention) and
//!   gives its sliding layers rotary tables of their own theta (`rope_local_base_freq`), the
//!   global layers `rope_theta` with `rope_scaling`.

use flotilla_config::schema::{LayerType, LoraConfig, ModelConfig, ModelType};

use super::decoder::{self, Activation, DecoderStyle, LayerStyle, NormStyle};
use super::{FamilyUnits, ModelError};

/// The units of a Gemma 2 or Gemma 3 text `config`.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    let style = DecoderStyle {
        norm: NormStyle::Gemma,
        sandwich_norms: true,
        qk_norm: config.architecture() == ModelType::Gemma3,
        activation: Activation::GeGlu,
        embed_scale: Some((config.hidden_size as f64).sqrt()),
        attn_scale: config.query_pre_attn_scalar.map(|s| s.powf(-0.5)),
        attn_softcap: config.attn_logit_softcapping,
        final_softcap: config.final_logit_softcapping,
        fused_projections: false,
    };
    let local = config.rope_local_base_freq.is_some();
    decoder::build(config, lora, style, |i| {
        let sliding = match &config.layer_types {
            Some(types) => types.get(i) == Some(&LayerType::Sliding),
            None => config.sliding_window.is_some(),
        };
        LayerStyle {
            local_rope: local && sliding,
            ..LayerStyle::of(config, i)
        }
    })
}
