//! The Llama family: Hugging Face's `LlamaForCausalLM` is the shared decoder in its plain style
//! ([`DecoderStyle::LLAMA`]: `LlamaRMSNorm` before attention and before the SwiGLU MLP, nothing
//! scaled or capped), numerics as transformers' `modeling_llama.py`. The same units are
//! `MistralForCausalLM` (no biases; attention within its sliding window on every layer) and
//! `Qwen2ForCausalLM` (biases on q/k/v_proj; a window on the layers its config names), as the
//! config's `model_type` says; a Llama with `attention_bias` has biases on q/k/v/o_proj.
//! SmolLM3 (`SmolLM3ForCausalLM`) is a Llama whose `no_rope_layers` apply no rotary embeddings
//! (every fourth by default) and whose window, with `use_sliding_window`, is on the layers
//! `layer_types` names.

use flotilla_config::schema::{LoraConfig, ModelConfig};

use super::decoder::{self, DecoderStyle, LayerStyle};
use super::{FamilyUnits, ModelError};

/// The units of a Llama, Mistral, Qwen2 or SmolLM3 `config`.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    decoder::build(config, lora, DecoderStyle::LLAMA, |i| {
        LayerStyle::of(config, i)
    })
}
