//! Hydra-style composition: the YAML tree with provenance, defaults lists, the override
//! grammar, OmegaConf interpolation and resolvers, merging, and typed validation.
//!
//! The pipeline is Hydra's: parse overrides → build the defaults list → merge the configs in
//! order → apply the value overrides → split off the runtime node (`flotilla:`/`hydra:`) →
//! resolve interpolations. [`Composer`] runs it and caches parsed files across the jobs of a
//! sweep.

pub mod compose;
pub mod default_element;
pub mod defaults;
pub mod interp;
pub mod node;
pub mod overrides;
pub mod repo;
pub mod schema;
pub mod sweep;
pub mod yaml;

pub use compose::{ComposeOptions, Composed, Composer, Fallback, RUNTIME_KEYS};
pub use node::{Node, Origin, Value};

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

/// The candidate closest to `name`, when it is close enough to be a plausible typo.
pub fn near_miss<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let d = strsim::damerau_levenshtein(name, c);
        let limit = (name.chars().count().max(c.chars().count()) / 3).max(1);
        let plausible = d <= limit || c.starts_with(name) && !name.is_empty();
        if plausible && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}
