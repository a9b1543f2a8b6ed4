//! Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen3's attention (per-head q/k norms before the rotary
//! embedding, `attention_bias` biases) with a sparse MLP, `mlp`: a router (`gate`) over
//! `num_experts` SwiGLU experts of width `moe_intermediate_size` (`gate_proj`, `up_proj`,
//! `down_proj`), each token through its `num_experts_per_tok` best, the scores renormalised
//! with `norm_topk_prob` and rounded to the activations' dtype; every `decoder_sparse_step`-th
//! layer not in `mlp_only_layers` is sparse, the others keep a dense MLP of `intermediate_size`,
//! as transformers' `modeling_qwen3_moe.py`. Unlike Qwen3, the head size defaults to
//! `hidden_size / num_attention_heads`, and a window (`use_sliding_window`) covers every layer.

use flotilla_config::schema::{LoraConfig, ModelConfig};

use super::decoder::{self, DecoderStyle, LayerStyle};
use super::{FamilyUnits, ModelError};

/// The units of a Qwen3-MoE `config`.
pub fn build(config: &ModelConfig, lora: Option<&LoraConfig>) -> Result<FamilyUnits, ModelError> {
    let style = DecoderStyle {
        qk_norm: true,
        ..DecoderStyle::LLAMA
    };
    decoder::build(config, lora, style, |i| LayerStyle::of(config, i))
}
