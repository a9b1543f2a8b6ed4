//! Hydra-style composition: the YAML tree with provenance, defaults lists, the override
//! grammar, OmegaConf interpolation and resolvers, merging, and typed validation.

pub mod node;
