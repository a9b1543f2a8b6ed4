//! Running an adaptive study: the driver that samples, starts, watches and prunes trials
//! ([`driver`]) and the detached driver process a SLURM study runs in ([`detach`]). What is
//! sampled and when a trial is pruned is `flotilla_study`'s (spaces, samplers, pruner).

pub mod detach;
pub mod driver;
