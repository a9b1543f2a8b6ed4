//! Mixtral (`MixtralForCausalLM`): Mistral's decoder (no biases, a sliding window on every layer
//! when `sliding_window` is set) with a sparse MLP in every layer,
//! `block_sparse_moe`: a router (`gate`) over `num_local_experts` SwiGLU experts (`w1` the gate,
//! `w3` the up, `w2` the down projection), each token through its `num_experts_per_tok` best
//! with their softmax scores renormalised, as transformers' `modeling_mixtral.py`
//! (`router_jitter_noise` on the router's input in training). The routing is
//! `layers/moe.rs`'s; the experts are stacked in memory and keep the Hub's per-expert
//! names in weights files.

use flotilla_config::schema::{LoraConfig, ModelConfig};

use super::decoder::{self, DecoderStyle, LayerStyle};
use super::{FamilyUnits, ModelError};

/// The units of a Mixtral `config`.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    decoder::build(config, lora, DecoderStyle::LLAMA, |i| {
        LayerStyle::of(config, i)
    })
}
