//! Ranked advice for a job that does not fit its GPU: each change a user can make to the
//! config (FULL_SHARD instead of DDP, sharded checkpoints, activation checkpointing, a smaller
//! micro batch with the same global batch, more nodes, CPU offload), applied to the typed
//! config and estimated again, with the overrides that make it. Changes that fit come first, in
//! the order of what they cost (communication before recomputation before more GPUs before
//! host round trips); then the rest by their new peak. When no single change fits, the changes
//! are combined in that order until one does.

use flotilla_config::schema::{
    AutoWrapPolicy, BackwardPrefetch, DistConfig, FsdpConfig, JobConfig, ShardingStrategy,
    StateDictType,
};
use serde::Serialize;

use super::peak;

/// One change and what it gives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Advice {
    /// What changes, in words.
    pub change: String,
    /// The overrides that make the change.
    pub overrides: Vec<String>,
    /// The estimated peak per GPU after the change, in bytes.
    pub peak_bytes: u64,
    pub fits: bool,
}

/// A candidate change: its cost rank, words, overrides and changed config.
struct Change {
    rank: usize,
    change: String,
    overrides: Vec<String>,
    job: JobConfig,
}

/// FSDP's defaults (`conf/trainer/dist/fsdp.yaml`) with a DDP job's backend and timeout.
fn fsdp_from(job: &JobConfig) -> FsdpConfig {
    let (backend, timeout_s) = match &job.trainer.dist {
        DistConfig::Ddp(d) => (d.backend, d.timeout_s),
        DistConfig::Fsdp(f) => (f.backend, f.timeout_s),
        DistConfig::None => (flotilla_config::schema::Backend::Auto, 1800),
    };
    FsdpConfig {
        backend,
        timeout_s,
        process_group: None,
        sharding_strategy: ShardingStrategy::FullShard,
        auto_wrap_policy: AutoWrapPolicy::Block,
        min_num_params: 100_000_000,
        activation_checkpointing: false,
        limit_all_gathers: true,
        forward_prefetch: false,
        backward_prefetch: Some(BackwardPrefetch::BackwardPre),
        sync_module_states: false,
        cpu_offload: false,
        param_dtype: None,
        reduce_dtype: None,
        state_dict_type: StateDictType::Full,
    }
}

fn fsdp_mut(job: &mut JobConfig) -> Option<&mut FsdpConfig> {
    match &mut job.trainer.dist {
        DistConfig::Fsdp(f) => Some(f),
        _ => None,
    }
}

/// Whether `job` shards its parameters over more than one rank (more ranks then shrink it).
fn shards_over_world(job: &JobConfig) -> bool {
    matches!(&job.trainer.dist, DistConfig::Fsdp(f)
        if matches!(f.sharding_strategy, ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp))
}

/// The single changes that apply to `job`, in cost order.
fn changes(job: &JobConfig) -> Vec<Change> {
    let mut out = vec![];
    let world = job.compute.world_size();
    // 1. FULL_SHARD instead of DDP (or of another sharding strategy).
    let mut sharded = None;
    match &job.trainer.dist {
        DistConfig::Ddp(_) | DistConfig::None if world > 1 => {
            let mut j = job.clone();
            j.trainer.dist = DistConfig::Fsdp(fsdp_from(job));
            let mut overrides = vec!["trainer/dist=fsdp".to_string()];
            // Full checkpoints gather everything on every GPU: shard them when that is what
            // does not fit.
            let mut s = j.clone();
            fsdp_mut(&mut s).expect("fsdp").state_dict_type = StateDictType::Sharded;
            let sharded_ckpt = peak(&s).0 < peak(&j).0;
            if sharded_ckpt {
                j = s;
                overrides.push("trainer.dist.state_dict_type=sharded".into());
            }
            out.push(Change {
                rank: 0,
                change: format!(
                    "FSDP FULL_SHARD over {world} GPUs instead of {}{}",
                    if matches!(job.trainer.dist, DistConfig::Ddp(_)) {
                        "DDP"
                    } else {
                        "one replica"
                    },
                    if sharded_ckpt {
                        ", with sharded checkpoints"
                    } else {
                        ""
                    }
                ),
                overrides: overrides.clone(),
                job: j.clone(),
            });
            sharded = Some((j, overrides));
        }
        DistConfig::Fsdp(f) if world > 1 && f.sharding_strategy != ShardingStrategy::FullShard => {
            let mut j = job.clone();
            fsdp_mut(&mut j).expect("fsdp").sharding_strategy = ShardingStrategy::FullShard;
            out.push(Change {
                rank: 0,
                change: format!("FULL_SHARD instead of {}", f.sharding_strategy),
                overrides: vec!["trainer.dist.sharding_strategy=FULL_SHARD".into()],
                job: j,
            });
        }
        _ => {}
    }
    // 2. Sharded checkpoints for an FSDP job that gathers full ones.
    if let DistConfig::Fsdp(f) = &job.trainer.dist {
        let mut j = job.clone();
        fsdp_mut(&mut j).expect("fsdp").state_dict_type = StateDictType::Sharded;
        if f.state_dict_type == StateDictType::Full && world > 1 && peak(&j).0 < peak(job).0 {
            out.push(Change {
                rank: 1,
                change: "sharded checkpoints (every rank writes its own shards)".into(),
                overrides: vec!["trainer.dist.state_dict_type=sharded".into()],
                job: j,
            });
        }
    }
    // 3. A smaller micro batch, the same global batch (more accumulation steps): the largest
    //    divisor that fits, else 1.
    let micro = job.trainer.micro_batch_size;
    if micro > 1 {
        let divisors: Vec<usize> = (1..micro)
            .rev()
            .filter(|d| micro.is_multiple_of(*d))
            .collect();
        let capacity = super::job_gpu(&job.compute).map(|g| g.bytes);
        let try_micro = |d: usize| {
            let mut j = job.clone();
            j.trainer.micro_batch_size = d;
            j
        };
        let pick = divisors
            .iter()
            .copied()
            .find(|&d| capacity.is_some_and(|c| peak(&try_micro(d)).0 <= c))
            .unwrap_or(1);
        out.push(Change {
            rank: 2,
            change: format!(
                "micro batch {pick} instead of {micro}, the same global batch ({} accumulation steps)",
                job.trainer.global_batch_size / (pick * world.max(1)).max(1)
            ),
            overrides: vec![format!("trainer.micro_batch_size={pick}")],
            job: try_micro(pick),
        });
    }
    // 4. Activation checkpointing.
    let checkpointing = job.trainer.activation_checkpointing
        || matches!(&job.trainer.dist, DistConfig::Fsdp(f) if f.activation_checkpointing);
    if !checkpointing {
        let mut j = job.clone();
        j.trainer.activation_checkpointing = true;
        out.push(Change {
            rank: 3,
            change: "activation checkpointing (recompute each block in backward)".into(),
            overrides: vec!["trainer.activation_checkpointing=true".into()],
            job: j,
        });
    }
    // 5. More nodes, for parameters sharded over the world (after switching to FULL_SHARD
    //    when the job is DDP): the fewest that fit, up to 16 times as many, keeping the global
    //    batch divisible.
    let base = if shards_over_world(job) {
        Some((job.clone(), vec![]))
    } else {
        sharded.clone()
    };
    if let Some((base, prefix)) = base {
        let nodes = job.compute.nodes;
        let capacity = super::job_gpu(&job.compute).map(|g| g.bytes);
        let mut best = None;
        for factor in [2, 4, 8, 16] {
            let mut j = base.clone();
            j.compute.nodes = nodes * factor;
            let per_step = j.trainer.micro_batch_size * j.compute.world_size();
            if j.trainer.global_batch_size % per_step != 0 {
                continue;
            }
            let fits = capacity.is_some_and(|c| peak(&j).0 <= c);
            best = Some(j);
            if fits {
                break;
            }
        }
        if let Some(j) = best {
            let mut overrides = prefix.clone();
            overrides.push(format!("compute.nodes={}", j.compute.nodes));
            out.push(Change {
                rank: 4,
                change: format!(
                    "{} nodes ({} GPUs){}",
                    j.compute.nodes,
                    j.compute.world_size(),
                    if prefix.is_empty() {
                        ""
                    } else {
                        ", with FSDP FULL_SHARD"
                    }
                ),
                overrides,
                job: j,
            });
        }
    }
    // 6. CPU offload of the shards, gradients and AdamW state (FSDP).
    let offload_base = match &job.trainer.dist {
        DistConfig::Fsdp(f) if !f.cpu_offload => Some((job.clone(), vec![])),
        DistConfig::Fsdp(_) => None,
        _ => sharded.clone(),
    };
    if let Some((mut j, mut overrides)) = offload_base {
        fsdp_mut(&mut j).expect("fsdp").cpu_offload = true;
        overrides.push("trainer.dist.cpu_offload=true".into());
        out.push(Change {
            rank: 5,
            change: format!(
                "CPU offload of the shards, gradients and AdamW state{}",
                if matches!(job.trainer.dist, DistConfig::Fsdp(_)) {
                    ""
                } else {
                    " (FSDP FULL_SHARD)"
                }
            ),
            overrides,
            job: j,
        });
    }
    out
}

/// The advice for `job` against a GPU of `capacity` bytes, ranked (see the module docs).
pub fn advise(job: &JobConfig, capacity: u64) -> Vec<Advice> {
    if !job.runs_on_gpu() {
        return vec![];
    }
    let changes = changes(job);
    let mut ranked: Vec<(usize, Advice)> = changes
        .iter()
        .map(|c| {
            let peak_bytes = peak(&c.job).0;
            (
                c.rank,
                Advice {
                    change: c.change.clone(),
                    overrides: c.overrides.clone(),
                    peak_bytes,
                    fits: peak_bytes <= capacity,
                },
            )
        })
        .collect();
    ranked.sort_by_key(|(rank, a)| {
        if a.fits {
            (0, *rank as u64)
        } else {
            (1, a.peak_bytes)
        }
    });
    let mut out: Vec<Advice> = ranked.into_iter().map(|(_, a)| a).collect();
    if !out.iter().any(|a| a.fits) {
        if let Some(combined) = combine(job, capacity) {
            out.insert(0, combined);
        }
    }
    out
}

/// The changes applied one after another in cost order until the job fits.
fn combine(job: &JobConfig, capacity: u64) -> Option<Advice> {
    let mut current = job.clone();
    let mut overrides: Vec<String> = vec![];
    let mut words = vec![];
    for _ in 0..6 {
        let Some(next) = changes(&current)
            .into_iter()
            .filter(|c| !c.overrides.iter().all(|o| overrides.contains(o)))
            .min_by_key(|c| c.rank)
        else {
            break;
        };
        for o in next.overrides {
            // A later value of the same key replaces the earlier one.
            let key = o.split('=').next().unwrap_or_default().to_string();
            overrides.retain(|x| x.split('=').next() != Some(key.as_str()));
            overrides.push(o);
        }
        words.push(next.change);
        current = next.job;
        let peak_bytes = peak(&current).0;
        if peak_bytes <= capacity {
            return Some(Advice {
                change: format!("together: {}", words.join("; ")),
                overrides,
                peak_bytes,
                fits: true,
            });
        }
    }
    None
}
