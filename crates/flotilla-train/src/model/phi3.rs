//! Phi-3, Phi-3.5, Phi-4 and Phi-4-mini (`Phi3ForCausalLM`): Llama's decoder with q/k/v fused into
//! one `self_attn.qkv_proj` (queries, then keys, then values along its output) and the gate and
//! up projections into one `mlp.gate_up_proj` (the gate first), so LoRA adapts those fused
//! layers as PEFT does (`qkv_proj`, `o_proj`, `gate_up_proj`, `down_proj`); no biases; rotary
//! embeddings on the first `partial_rotary_factor` of each head (Phi-4-mini's 0.75) with the
//! `longrope` scaling of the long-context models; a sliding window, when the config has one, on
//! every layer. Numerics as transformers' `modeling_phi3.py` (its `resid_pdrop` and
//! `embd_pdrop`, zero in every released checkpoint, are not applied).

use flotilla_config::schema::{LoraConfig, ModelConfig};

use super::decoder::{self, DecoderStyle, LayerStyle};
use super::{FamilyUnits, ModelError};

/// The units of a Phi-3 `config`.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    let style = DecoderStyle {
        fused_projections: true,
        ..DecoderStyle::LLAMA
    };
    decoder::build(config, lora, style, |i| LayerStyle::of(config, i))
}
