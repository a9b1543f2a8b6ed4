//! The one place where a trainer's parallelism is applied: [`parallelize`] turns the starting
//! parameters' source and `trainer.dist` / `trainer.precision` into this rank's
//! [`ParallelWeights`] — replicated for one process or DDP (rank 0's parameters broadcast,
//! gradients all-reduced in buckets), sharded for FSDP (process groups of the sharding
//! strategy, flat groups of the auto-wrap policy, each rank reading only its shards) — and into the engine options (activation
//! checkpointing). The training loop and the checkpoints only ever see the trait.

use std::sync::Arc;

use tch::{Device, Kind};

use crate::error::TrainError;
use crate::model::CausalLm;
use crate::optim::AdamWConfig;
use crate::parallel::engine::EngineOptions;
use crate::parallel::fsdp::{process_groups, Fsdp, FsdpOptions};
use crate::parallel::replicated::{broadcast_params, GradReducer, Replicated};
use crate::parallel::weights::ParallelWeights;
use crate::state::param_source::{materialize, TensorSource};
use flotilla_comm::comm::Communicator;
use flotilla_config::schema::{DistConfig, Dtype, Precision, StateDictType, TrainerConfig};

/// The process group a trainer runs in.
#[derive(Clone)]
pub struct DistContext {
    pub comm: Arc<dyn Communicator>,
    /// Ranks per node (HYBRID_SHARD shards within a node).
    pub local_world_size: usize,
}

/// A rank's weights with the engine options that go with them.
pub struct Parallelized {
    pub weights: Box<dyn ParallelWeights>,
    /// Activation checkpointing as configured (`trainer.activation_checkpointing`, or FSDP's
    /// own switch); a loss scale of 1.
    pub engine: EngineOptions,
}

/// Dtypes of a precision setting: `(master weights, compute)`.
fn precision_kinds(p: Precision) -> (Kind, Kind) {
    match p {
        Precision::Full32 => (Kind::Float, Kind::Float),
        Precision::Bf16Mixed => (Kind::Float, Kind::BFloat16),
        Precision::Bf16True => (Kind::BFloat16, Kind::BFloat16),
        Precision::Fp16Mixed => (Kind::Float, Kind::Half),
        // resolved for the device before the trainer is built (`JobConfig::precision`)
        Precision::Auto => (Kind::Float, Kind::Float),
    }
}

fn dtype_kind(d: Dtype) -> Kind {
    match d {
        Dtype::Float32 => Kind::Float,
        Dtype::Bfloat16 => Kind::BFloat16,
        Dtype::Float16 => Kind::Half,
    }
}

/// This rank's weights for `config.dist` (`none`, `ddp` or `fsdp`), starting from the
/// parameters `source` gives (the same values on every rank), on `device` in the master dtype
/// of `config.precision`. Replicated weights read every parameter; FSDP reads only this rank's
/// shards. Collective when `dist` is given (the start-up broadcast, FSDP's HYBRID_SHARD
/// groups).
pub fn parallelize(
    model: &CausalLm,
    source: &dyn TensorSource,
    config: &TrainerConfig,
    device: Device,
    dist: Option<&DistContext>,
) -> Result<Parallelized, TrainError> {
    let (master_kind, compute_kind) = precision_kinds(config.precision);
    let adam = AdamWConfig {
        betas: config.betas,
        eps: config.eps,
        weight_decay: config.weight_decay,
    };
    let comm = dist.map(|d| d.comm.clone());
    let mut activation_checkpointing = config.activation_checkpointing;
    let weights: Box<dyn ParallelWeights> = match &config.dist {
        DistConfig::None | DistConfig::Ddp(_) => {
            // A LoRA job's frozen base is held in the compute dtype: it is only ever read as
            // that (bf16 under bf16-mixed, where the masters of trained weights stay fp32).
            let params = materialize(model, source, master_kind, compute_kind, device)?;
            let compute = (compute_kind != master_kind).then_some(compute_kind);
            let mut w = Replicated::new(model, params, adam, compute);
            if let (DistConfig::Ddp(ddp), Some(comm)) = (&config.dist, &comm) {
                broadcast_params(comm.as_ref(), &w.params)?;
                w.reducer = Some(GradReducer::new(comm.clone(), ddp, model, &w.params));
            }
            Box::new(w)
        }
        DistConfig::Fsdp(f) => {
            activation_checkpointing |= f.activation_checkpointing;
            let local = dist.map_or(1, |d| d.local_world_size);
            let groups = process_groups(f.sharding_strategy, comm.as_ref(), local)?;
            let options = FsdpOptions {
                sharding: f.sharding_strategy,
                wrap: f.auto_wrap_policy,
                min_num_params: f.min_num_params,
                forward_prefetch: f.forward_prefetch,
                backward_prefetch: f.backward_prefetch.is_some(),
                limit_all_gathers: f.limit_all_gathers,
                param_kind: f.param_dtype.map_or(compute_kind, dtype_kind),
                reduce_kind: f.reduce_dtype.map_or(compute_kind, dtype_kind),
                master_kind,
                cpu_offload: f.cpu_offload,
                sharded_checkpoints: f.state_dict_type == StateDictType::Sharded,
            };
            let fsdp = Fsdp::new(
                model,
                source,
                f.sync_module_states,
                options,
                adam,
                groups,
                device,
            )?;
            Box::new(fsdp)
        }
    };
    Ok(Parallelized {
        weights,
        engine: EngineOptions {
            activation_checkpointing,
            loss_scale: 1.0,
            // The trainer derives each step's seed from it (units without dropout ignore it).
            dropout_seed: Some(config.seed as u64),
            // The job's objective is the trainer's to set (`Trainer::set_objective`).
            objective: crate::objective::Objective::NextToken,
            // The trainer sets each step's share (`Trainer::step`).
            router_aux: model.config().moe.as_ref().and_then(|m| {
                m.aux_loss_coef().map(|coef| crate::parallel::RouterAux {
                    coef,
                    share: 1.0,
                    num_experts: m.num_experts as i64,
                })
            }),
            loss_chunks: crate::parallel::LossChunks::Auto,
        },
    })
}
