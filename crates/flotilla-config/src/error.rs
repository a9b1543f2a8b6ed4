//! [`ConfigError`]: anything that goes wrong while composing a config, wrapping the errors of
//! the stages below composition (YAML loading, the override grammar, interpolation, the schema).
//!
//! It sits above those stages and below everything that composes (`repo`, `defaults`,
//! `compose`, `sweep`), so that each of those can return it.

use crate::{interp, overrides, schema, yaml};

/// Anything that goes wrong while composing a config. Every message names its culprit: the
/// file (and line) or the override.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Yaml(#[from] yaml::YamlError),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("{0}")]
    Override(String),
    #[error("{0}")]
    Composition(String),
    #[error(transparent)]
    Interpolation(#[from] interp::InterpError),
    #[error(transparent)]
    Schema(#[from] schema::SchemaError),
}

impl From<overrides::OverrideError> for ConfigError {
    fn from(e: overrides::OverrideError) -> Self {
        ConfigError::Override(e.to_string())
    }
}
