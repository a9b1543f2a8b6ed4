//! flotilla: compose experiment configs Hydra-style, expand sweeps, launch jobs, and train
//! Llama-style models with DDP or FSDP. This crate root only wires the modules together.

pub mod config;
pub mod data;
pub mod dist;
pub mod launch;
pub mod model;
pub mod rundir;
pub mod sweep;
pub mod train;

/// The libtorch version this build links against (tch 0.24.0 binds libtorch 2.11.0).
pub const LIBTORCH_VERSION: &str = "2.11.0";
