//! Fixtures shared by the integration tests.

use flotilla::config::schema::ModelConfig;

/// A small Llama configuration (2 layers, GQA 4:2) for fast model and engine tests.
pub fn tiny_model_config(tied: bool) -> ModelConfig {
    ModelConfig {
        name: "t".into(),
        vocab_size: 40,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        tie_word_embeddings: tied,
        initializer_range: 0.02,
        init_from: None,
    }
}
