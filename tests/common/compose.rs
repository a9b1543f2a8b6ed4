//! Config fixtures over flotilla_config: a composer of the repository's `conf/`, and small
//! model and trainer configs. Included beside `common` (whose `conf_dir` it uses):
//! `#[path = "common/compose.rs"] mod compose;` from the root tests,
//! `#[path = "../../../tests/common/compose.rs"] mod compose;` from a crate's.

#![allow(dead_code)]

use flotilla_config::schema::{ModelConfig, TrainerConfig};
use flotilla_config::{ComposeOptions, Composer};

/// A composer of the repository's `conf/config.yaml`.
pub fn composer() -> Composer {
    Composer::new(ComposeOptions {
        config_dir: crate::common::conf_dir(),
        config_name: "config".into(),
    })
    .unwrap()
}

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
        partial_rotary_factor: None,
        tie_word_embeddings: tied,
        initializer_range: 0.02,
        init_from: None,
        model_type: None,
        attention_bias: None,
        sliding_window: None,
        head_dim: None,
        layer_types: None,
        query_pre_attn_scalar: None,
        attn_logit_softcapping: None,
        final_logit_softcapping: None,
        rope_local_base_freq: None,
        no_rope_layers: None,
        pad_token_id: None,
        moe: None,
    }
}

/// A complete `trainer:` section for tests: one process, fp32 on CPU, constant LR with no
/// warmup, no evaluation or checkpoints, with `overrides` (a YAML mapping such as
/// `{max_steps: 12, schedule: cosine}`) replacing keys of that base.
pub fn trainer_config(overrides: &str) -> TrainerConfig {
    const BASE: &str = "
dist: {mode: none}
max_steps: 10
global_batch_size: 8
micro_batch_size: 4
lr: 3.0e-3
min_lr: 0.0
warmup_steps: 0
schedule: constant
weight_decay: 0.1
betas: [0.9, 0.95]
eps: 1.0e-8
grad_clip: 1.0
precision: 32-true
device: cpu
eval_every: 0
eval_batches: 1
checkpoint_every: 0
keep_last_checkpoints: 0
resume: never
log_every: 1
activation_checkpointing: false
seed: 7
";
    let mut config: serde_yaml::Mapping = serde_yaml::from_str(BASE).unwrap();
    let overrides: serde_yaml::Mapping = serde_yaml::from_str(overrides)
        .unwrap_or_else(|e| panic!("trainer overrides {overrides}: {e}"));
    for (k, v) in overrides {
        assert!(config.contains_key(&k), "unknown trainer key {k:?}");
        config.insert(k, v);
    }
    serde_yaml::from_value(serde_yaml::Value::Mapping(config))
        .unwrap_or_else(|e| panic!("trainer config: {e}"))
}
