//! Hydra-style composition: the YAML tree with provenance, defaults lists, the override
//! grammar, OmegaConf interpolation and resolvers, merging, and typed validation.
//!
//! The pipeline is Hydra's: parse overrides → build the defaults list → merge the configs in
//! order → apply the value overrides → split off the runtime node (`flotilla:`/`hydra:`) →
//! resolve interpolations. [`Composer`] runs it and caches parsed files across the jobs of a
//! sweep.
//!
//! The modules build on one another bottom up: the tree ([`node`]) and its merge, YAML, the
//! override grammar, interpolation and the schema; then [`ConfigError`], which wraps their
//! errors; then the config repository, defaults lists, composition and sweeps.
//! [`near_miss()`] is the "did you mean" suggestion they (and the other crates) share.

pub mod compose;
pub mod default_element;
pub mod defaults;
mod error;
pub mod interp;
mod merge;
mod near_miss;
pub mod node;
pub mod overrides;
pub mod repo;
pub mod schema;
pub mod sweep;
pub mod yaml;

pub use compose::{ComposeOptions, Composed, Composer, Fallback, RUNTIME_KEYS};
pub use error::ConfigError;
pub use near_miss::near_miss;
pub use node::{Node, Origin, Value};
