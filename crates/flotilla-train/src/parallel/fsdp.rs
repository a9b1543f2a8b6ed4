//! Fully sharded data parallelism on the unit engine (docs/ARCHITECTURE.md, "The unit
//! engine"). This file owns the sharded weights of a rank ([`Fsdp`]) over the flat parameter
//! groups of `layout.rs`: their sharding across ranks and process groups, the gather /
//! release / reduce-scatter schedule, the AdamW step over the local shards, and the conversion
//! between shards and full named tensors (for evaluation, full checkpoints and resharding).
//!
//! Each FSDP group (one per engine unit with `auto_wrap_policy: block`; consecutive units
//! until `min_num_params` with `size`) owns one flat parameter: the parameters its units own,
//! concatenated in model order and padded to a multiple of the shard-group size `S`. Rank `r`
//! of the shard group keeps elements `r*k .. (r+1)*k` (`k = padded / S`) as an fp32 master
//! shard with its gradient and AdamW moments. A LoRA job's range of units has two groups, its
//! frozen base (a shard in the param dtype, gathered like any other, with no gradient, moments
//! or checkpoint entry) and its trained adapters, so that one flat parameter never mixes them.
//!
//! Sharding strategies map onto two process groups: the shard group (parameters gathered and
//! gradients reduce-scattered within it) and the replica group (gradient shards all-reduced
//! across it). `FULL_SHARD` and `SHARD_GRAD_OP` shard over the world; `NO_SHARD` shards over
//! one rank and replicates over the world (DDP-like); `HYBRID_SHARD` shards within a node and
//! replicates across nodes. `FULL_SHARD`/`HYBRID_SHARD` drop a gathered group after the
//! forward of its last unit and after the backward of its first unit; `SHARD_GRAD_OP` and
//! `NO_SHARD` keep it until the step ends.
//!
//! Each group gathers into one buffer of its own for the whole run. The autograd graph of a
//! unit keeps views of that buffer (the weights saved for the matmul gradients), so freeing
//! means releasing the buffer's storage in place ([`crate::parallel::storage_shim`]), and "gather again
//! before backward" means re-allocating it and gathering into it before the unit's backward
//! ([`Strategy::before_backward`]); with activation checkpointing the unit is recomputed
//! from a fresh gather instead.
//!
//! Every rank issues the same collectives in the same order: gathers in forward order (one
//! group ahead with `forward_prefetch`, one group behind in backward with `backward_prefetch`,
//! at most two groups in flight with `limit_all_gathers`), reduce-scatters in reverse order.
//!
//! What is never alive at once, as in PyTorch's FSDP: a group's unsharded gradient is
//! reduce-scattered as soon as its units' backward is done, on every micro-batch, and freed
//! once the reduction lands in the group's sharded gradient (at most one reduction in flight
//! while the next unit's backward runs); start-up builds each rank's shards from the
//! parameters' source by ranges (`state::param_source`), never the whole model; a full checkpoint
//! is gathered to rank 0 one group at a time ([`ParallelWeights::visit_full`]); evaluation
//! gathers one group at a time in the param dtype ([`ParallelWeights::forward_eval`]).

use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use crate::data::StepBatches;
use crate::error::TrainError;
use crate::model::{CausalLm, Params, TokenInput};
use crate::optim::adamw::{decay_where, scale_to_max_norm, AdamWConfig};
use crate::optim::fused::{foreach_norm, fused_adamw, FusedAdamW};
use crate::optim::loss_scale::unscale;
use crate::parallel::engine::{forward_by_unit, Engine, Strategy};
use crate::parallel::tensor_comm::TensorCollectives;
use crate::parallel::weights::{
    nbytes, FullStateVisitor, HeldTensors, MemoryReport, OptimizerSource, ParallelWeights,
    ShardState, StatePart, TransientPeaks,
};
use crate::state::param_source::TensorSource;
use flotilla_comm::comm::{Communicator, CommunicatorExt, ReduceOp, Work};
use flotilla_config::schema::{AutoWrapPolicy, ShardingStrategy};

pub use crate::parallel::layout::{
    flatten, layouts, unflatten, wrap_units, FlatEntry, GroupLayout,
};

/// FSDP settings (from `trainer.dist` and `trainer.precision`).
#[derive(Clone, Debug)]
pub struct FsdpOptions {
    pub sharding: ShardingStrategy,
    pub wrap: AutoWrapPolicy,
    pub min_num_params: u64,
    pub forward_prefetch: bool,
    pub backward_prefetch: bool,
    pub limit_all_gathers: bool,
    /// Dtype parameters are gathered in (the units compute in it).
    pub param_kind: Kind,
    /// Dtype gradients are reduced in.
    pub reduce_kind: Kind,
    /// Dtype of the master shards and AdamW moments.
    pub master_kind: Kind,
    /// Keep shards, gradients and optimizer state on the host (the compute device gets only
    /// gathered parameters).
    pub cpu_offload: bool,
    /// Checkpoints keep the shards (`state_dict_type: sharded`) instead of full tensors.
    pub sharded_checkpoints: bool,
}

/// A gather in flight or done.
enum Gathered {
    Pending(Work<'static>, Tensor),
    Ready(Tensor),
}

/// One group's state on this rank.
struct Group {
    layout: GroupLayout,
    /// Master shard `[shard_len]`.
    shard: Tensor,
    /// Reduced gradient shard of the current step (master kind, on the store device), summed
    /// over the step's micro-batches.
    grad: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    /// Elements of the shard that get weight decay (parameters of 2+ dimensions).
    decay: Tensor,
    gathered: Option<Gathered>,
    /// The group's gather buffer `[padded]` in the param dtype (with a shard group of more
    /// than one rank); its storage is freed in place between uses.
    buffer: Option<Tensor>,
    /// The flat gradient being assembled over the group's units.
    grad_flat: Option<Tensor>,
    units_ready: usize,
    /// The reduce-scatter of this micro-batch's unsharded gradient in flight: work (which
    /// keeps the unsharded gradient alive), output shard.
    reducing: Option<(Work<'static>, Tensor)>,
}

/// The FSDP-sharded weights of one rank, with their optimizer.
pub struct Fsdp {
    options: FsdpOptions,
    groups: Vec<Group>,
    /// Groups owning each engine unit's parameters: one, or for a LoRA job's units a frozen
    /// and a trained one (the same units, [`layouts`] order).
    unit_groups: Vec<Vec<usize>>,
    /// Groups each engine unit reads (its own and the owners of tied parameters).
    unit_reads: Vec<Vec<usize>>,
    /// Every rank of the job, when distributed.
    world_comm: Option<Arc<dyn Communicator>>,
    shard_comm: Option<Arc<dyn Communicator>>,
    replica_comm: Option<Arc<dyn Communicator>>,
    shard_rank: usize,
    shard_world: usize,
    device: Device,
    adam: AdamWConfig,
    opt_step: u64,
    backward: bool,
    /// Gathers issued so far (for tests and logs).
    pub gathers: u64,
    /// Most bytes of gathered parameters held at once.
    peak_gathered: usize,
    /// Most bytes of the other transient tensors held at once (`visit_full` takes `&self`).
    transient: std::cell::Cell<TransientPeaks>,
    /// Preference tuning's frozen reference: this rank's shard of each trained group in the
    /// param dtype ([`ParallelWeights::keep_reference`]); `None` for a LoRA job's frozen
    /// groups, which it shares.
    reference: Option<Vec<Option<Tensor>>>,
}

impl std::fmt::Debug for Fsdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fsdp")
            .field("options", &self.options)
            .field("groups", &self.groups.len())
            .field("shard_rank", &self.shard_rank)
            .field("shard_world", &self.shard_world)
            .finish()
    }
}

/// A process group, or `None` for a group of one.
pub type ProcessGroup = Option<Arc<dyn Communicator>>;

/// The process groups FSDP runs over.
#[derive(Clone, Default)]
pub struct ProcessGroups {
    /// Every rank of the job (agrees on skipped fp16 steps); `None` in one process.
    pub world: ProcessGroup,
    /// Parameters are gathered and gradients reduce-scattered within it.
    pub shard: ProcessGroup,
    /// Gradient shards are all-reduced across it.
    pub replica: ProcessGroup,
}

/// The process groups of a sharding strategy over `world`; shard and replica groups of one
/// rank are `None`.
pub fn process_groups(
    sharding: ShardingStrategy,
    world: Option<&Arc<dyn Communicator>>,
    local_world_size: usize,
) -> Result<ProcessGroups, TrainError> {
    let all = world.cloned();
    // A group of one exists only when `process_group: always` asked for it: its collectives,
    // HYBRID's split included, run as they would with more ranks.
    let Some(world) = world else {
        return Ok(ProcessGroups {
            world: all,
            shard: None,
            replica: None,
        });
    };
    let exercised = world.world_size() == 1;
    let (shard, replica) = match sharding {
        ShardingStrategy::FullShard | ShardingStrategy::ShardGradOp => (Some(world.clone()), None),
        ShardingStrategy::NoShard => (None, Some(world.clone())),
        ShardingStrategy::HybridShard => {
            let (intra, inter) = world.split_hybrid(local_world_size)?;
            let intra: Arc<dyn Communicator> = Arc::from(intra);
            let inter: Arc<dyn Communicator> = Arc::from(inter);
            crate::parallel::tensor_comm::warm_up(intra.as_ref())?;
            crate::parallel::tensor_comm::warm_up(inter.as_ref())?;
            (
                (intra.world_size() > 1 || exercised).then_some(intra),
                (inter.world_size() > 1 || exercised).then_some(inter),
            )
        }
    };
    Ok(ProcessGroups {
        world: all,
        shard,
        replica,
    })
}

impl Fsdp {
    /// This rank's shards of the parameters `source` gives (every rank must see the same
    /// values). Each rank reads only the elements of its own shards; with `sync_from_rank0`
    /// (`sync_module_states`) rank 0 reads each group whole and broadcasts it instead, one
    /// group at a time.
    pub fn new(
        model: &CausalLm,
        source: &dyn TensorSource,
        sync_from_rank0: bool,
        options: FsdpOptions,
        adam: AdamWConfig,
        groups: ProcessGroups,
        device: Device,
    ) -> Result<Self, TrainError> {
        let ProcessGroups {
            world: world_comm,
            shard: shard_comm,
            replica: replica_comm,
        } = groups;
        let (shard_rank, shard_world) = shard_comm
            .as_ref()
            .map_or((0, 1), |c| (c.rank(), c.world_size()));
        let ranges = wrap_units(model, options.wrap, options.min_num_params);
        let layouts = layouts(model, &ranges, shard_world);
        let n = model.units().len();
        let mut unit_groups = vec![vec![]; n];
        let mut group_of = std::collections::HashMap::new();
        for (g, l) in layouts.iter().enumerate() {
            for u in l.units.clone() {
                unit_groups[u].push(g);
            }
            for e in &l.entries {
                group_of.insert(e.name.as_str(), g);
            }
        }
        let mut unit_reads = vec![vec![]; n];
        for (u, reads) in unit_reads.iter_mut().enumerate() {
            reads.extend(unit_groups[u].iter().copied());
            for name in model.units()[u].param_names() {
                let g = *group_of
                    .get(name.as_str())
                    .ok_or_else(|| TrainError::BadState(format!("unknown parameter `{name}`")))?;
                if !reads.contains(&g) {
                    reads.push(g);
                }
            }
        }
        let store_device = if options.cpu_offload {
            Device::Cpu
        } else {
            device
        };
        let sync = world_comm.as_ref().filter(|_| sync_from_rank0);
        let mut groups = vec![];
        for layout in layouts {
            // A frozen group is only ever gathered: it is held in the param dtype.
            let kind = if layout.trainable {
                options.master_kind
            } else {
                options.param_kind
            };
            let shard = match sync {
                Some(world) => {
                    let full = if world.rank() == 0 {
                        layout.slice_from(source, 0, layout.padded, kind, device)?
                    } else {
                        Tensor::f_empty([layout.padded], (kind, device))?
                    };
                    world.broadcast_tensor(&full, 0)?.wait()?;
                    layout
                        .shard_of(&full, shard_rank)?
                        .f_to_device(store_device)?
                        .f_detach_copy()?
                }
                None => layout.shard_from(source, shard_rank, kind, store_device)?,
            };
            // Moments and the decay mask of trained groups only.
            let trained_len = if layout.trainable {
                layout.shard_len
            } else {
                0
            };
            let decay = Tensor::f_zeros([trained_len], (Kind::Bool, store_device))?;
            if layout.trainable {
                for (start, len, e) in layout.local_pieces(shard_rank) {
                    if e.shape.len() >= 2 {
                        let _ = decay.f_narrow(0, start, len)?.f_fill_(1)?;
                    }
                }
            }
            let moment = || Tensor::f_zeros([trained_len], (options.master_kind, store_device));
            groups.push(Group {
                exp_avg: moment()?,
                exp_avg_sq: moment()?,
                shard,
                grad: None,
                decay,
                gathered: None,
                buffer: None,
                grad_flat: None,
                units_ready: 0,
                reducing: None,
                layout,
            });
        }
        Ok(Self {
            options,
            groups,
            unit_groups,
            unit_reads,
            world_comm,
            shard_comm,
            replica_comm,
            shard_rank,
            shard_world,
            device,
            adam,
            opt_step: 0,
            backward: false,
            gathers: 0,
            peak_gathered: 0,
            transient: Default::default(),
            reference: None,
        })
    }

    /// The layouts of the trained groups (what a sharded checkpoint holds), in group order.
    pub fn layouts(&self) -> Vec<GroupLayout> {
        self.trained_groups().map(|g| g.layout.clone()).collect()
    }

    /// The groups whose parameters are trained (all, but for a LoRA job).
    fn trained_groups(&self) -> impl Iterator<Item = &Group> {
        self.groups.iter().filter(|g| g.layout.trainable)
    }

    /// The groups whose full tensors make up `part`, in group order: every group for
    /// [`StatePart::Model`], the trained ones otherwise.
    fn visited_groups(&self, part: StatePart) -> impl Iterator<Item = &Group> {
        let all = part == StatePart::Model;
        self.groups
            .iter()
            .filter(move |g| all || g.layout.trainable)
    }

    /// The dtype a group's shard is held in: the master dtype, or the param dtype for a
    /// frozen group (only ever gathered).
    fn held_kind(&self, g: &Group) -> Kind {
        if g.layout.trainable {
            self.options.master_kind
        } else {
            self.options.param_kind
        }
    }

    /// This rank's place in the shard group: `(rank, size)`.
    pub fn shard_rank_world(&self) -> (usize, usize) {
        (self.shard_rank, self.shard_world)
    }

    /// Whether this rank is the first replica of its shard (writes sharded checkpoints).
    pub fn is_first_replica(&self) -> bool {
        self.replica_comm.as_ref().is_none_or(|c| c.rank() == 0)
    }

    pub fn optimizer_steps(&self) -> u64 {
        self.opt_step
    }

    /// Starts gathering group `g` (in the param dtype) unless it is gathered or in flight.
    fn issue_gather(&mut self, g: usize) -> Result<(), TrainError> {
        if self.groups[g].gathered.is_some() {
            return Ok(());
        }
        if self.options.limit_all_gathers {
            let pending = self
                .groups
                .iter()
                .filter(|g| matches!(g.gathered, Some(Gathered::Pending(..))))
                .count();
            if pending >= 2 {
                // Rate limit: finish the oldest in-flight gathers first.
                for i in 0..self.groups.len() {
                    if i != g {
                        self.wait_gather(i)?;
                    }
                }
            }
        }
        let group = &self.groups[g];
        let input = group
            .shard
            .f_to_device(self.device)?
            .f_to_kind(self.options.param_kind)?;
        self.gathers += 1;
        let gathered = match &self.shard_comm {
            None => Gathered::Ready(input),
            Some(comm) => {
                let out = match &group.buffer {
                    Some(b) => {
                        crate::parallel::storage_shim::realloc(b)?;
                        b.shallow_clone()
                    }
                    None => Tensor::f_empty(
                        [group.layout.padded],
                        (self.options.param_kind, self.device),
                    )?,
                };
                let work = comm.all_gather_tensor(&input, &out)?;
                Gathered::Pending(work, out)
            }
        };
        if let Gathered::Pending(_, out) = &gathered {
            if self.groups[g].buffer.is_none() {
                self.groups[g].buffer = Some(out.shallow_clone());
            }
        }
        self.groups[g].gathered = Some(gathered);
        let held = self.gathered_bytes();
        self.peak_gathered = self.peak_gathered.max(held);
        Ok(())
    }

    /// Bytes of gathered parameters held now.
    pub fn gathered_bytes(&self) -> usize {
        self.groups
            .iter()
            .map(|g| match (&g.buffer, &g.gathered) {
                (Some(b), _) => crate::parallel::storage_shim::held_bytes(b),
                (None, Some(Gathered::Ready(t))) => nbytes(t),
                _ => 0,
            })
            .sum()
    }

    fn wait_gather(&mut self, g: usize) -> Result<(), TrainError> {
        if let Some(Gathered::Pending(..)) = &self.groups[g].gathered {
            let Some(Gathered::Pending(work, out)) = self.groups[g].gathered.take() else {
                unreachable!()
            };
            work.wait()?;
            self.groups[g].gathered = Some(Gathered::Ready(out));
        }
        Ok(())
    }

    fn gathered(&mut self, g: usize) -> Result<Tensor, TrainError> {
        self.issue_gather(g)?;
        self.wait_gather(g)?;
        match &self.groups[g].gathered {
            Some(Gathered::Ready(t)) => Ok(t.shallow_clone()),
            _ => unreachable!("waited above"),
        }
    }

    fn frees_after_use(&self) -> bool {
        matches!(
            self.options.sharding,
            ShardingStrategy::FullShard | ShardingStrategy::HybridShard
        ) && self.shard_comm.is_some()
    }

    fn drop_gathered(&mut self, g: usize) -> Result<(), TrainError> {
        // An in-flight gather must complete before its buffer may go.
        self.wait_gather(g)?;
        let group = &mut self.groups[g];
        if group.gathered.take().is_some() {
            if let Some(b) = &group.buffer {
                crate::parallel::storage_shim::free(b)?;
            }
        }
        Ok(())
    }

    /// Makes the groups unit `unit` reads available (gathering them again if they were
    /// freed), and with `backward_prefetch` starts gathering the previous unit's group.
    fn materialize(&mut self, unit: usize) -> Result<Vec<(usize, Tensor)>, TrainError> {
        let reads = self.unit_reads[unit].clone();
        let mut flats = Vec::with_capacity(reads.len());
        for &g in &reads {
            flats.push((g, self.gathered(g)?));
        }
        // Prefetch the groups of the next range of units in the pass's direction.
        let range = self.groups[self.unit_groups[unit][0]].layout.units.clone();
        let next = if self.backward {
            (self.options.backward_prefetch && range.start > 0).then(|| range.start - 1)
        } else {
            (self.options.forward_prefetch && range.end < self.unit_groups.len())
                .then_some(range.end)
        };
        if let Some(u) = next {
            for g in self.unit_groups[u].clone() {
                self.issue_gather(g)?;
            }
        }
        Ok(flats)
    }

    /// A shard gathered whole on every rank of the shard group (in its own dtype, on the
    /// compute device).
    fn gather_full(&self, shard: &Tensor) -> Result<Tensor, TrainError> {
        let shard = shard.f_to_device(self.device)?.f_contiguous()?;
        match &self.shard_comm {
            None => Ok(shard),
            Some(comm) => {
                let out = Tensor::f_empty(
                    [shard.numel() as i64 * comm.world_size() as i64],
                    (shard.kind(), self.device),
                )?;
                comm.all_gather_tensor(&shard, &out)?.wait()?;
                Ok(out)
            }
        }
    }

    /// A shard gathered whole on shard rank 0 only (`None` elsewhere): each shard rank in
    /// turn broadcasts its shard, so that no other rank holds more than a shard's worth of
    /// buffer (collective on the shard group).
    fn gather_to_root(&self, shard: &Tensor) -> Result<Option<Tensor>, TrainError> {
        let shard = shard.f_to_device(self.device)?.f_contiguous()?;
        let Some(comm) = &self.shard_comm else {
            return Ok(Some(shard));
        };
        let (me, w) = (comm.rank(), comm.world_size());
        let k = shard.numel() as i64;
        let opts = (shard.kind(), self.device);
        let full = if me == 0 {
            Some(Tensor::f_empty([k * w as i64], opts)?)
        } else {
            None
        };
        let scratch = if me == 0 {
            None
        } else {
            Some(Tensor::f_empty([k], opts)?)
        };
        for r in 0..w {
            let t = match (&full, &scratch) {
                _ if r == me => shard.shallow_clone(),
                (Some(full), _) => full.f_narrow(0, r as i64 * k, k)?,
                (None, Some(scratch)) => scratch.shallow_clone(),
                (None, None) => unreachable!("rank 0 has the output, the others scratch"),
            };
            comm.broadcast_tensor(&t, r)?.wait()?;
        }
        if let Some(full) = &full {
            full.f_narrow(0, 0, k)?.f_copy_(&shard)?;
            self.note(|p| p.checkpoint_gathered = p.checkpoint_gathered.max(nbytes(full)));
        }
        Ok(full)
    }

    fn store_device(&self) -> Device {
        if self.options.cpu_offload {
            Device::Cpu
        } else {
            self.device
        }
    }

    /// The local shards for a sharded checkpoint: `group{g}.param|exp_avg|exp_avg_sq`, `g`
    /// counting the trained groups ([`Fsdp::layouts`]).
    pub fn shard_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![];
        for (i, g) in self.trained_groups().enumerate() {
            out.push((format!("group{i}.param"), g.shard.shallow_clone()));
            out.push((format!("group{i}.exp_avg"), g.exp_avg.shallow_clone()));
            out.push((format!("group{i}.exp_avg_sq"), g.exp_avg_sq.shallow_clone()));
        }
        out
    }

    pub fn set_optimizer_steps(&mut self, steps: u64) {
        self.opt_step = steps;
    }
}

impl Strategy for Fsdp {
    fn begin_forward(&mut self) {
        self.backward = false;
        for g in &mut self.groups {
            g.units_ready = 0;
        }
    }

    fn begin_backward(&mut self) {
        self.backward = true;
    }

    fn params_for(&mut self, model: &CausalLm, unit: usize) -> Result<Vec<Tensor>, TrainError> {
        let flats = self.materialize(unit)?;
        let mut named = Params::new();
        for (g, flat) in &flats {
            unflatten(&self.groups[*g].layout, flat, &mut named)?;
        }
        Ok(model.unit_params(unit, &named)?)
    }

    fn before_backward(&mut self, _model: &CausalLm, unit: usize) -> Result<(), TrainError> {
        self.materialize(unit).map(drop)
    }

    fn release(&mut self, unit: usize) -> Result<(), TrainError> {
        if !self.frees_after_use() {
            return Ok(());
        }
        let own = self.unit_groups[unit].clone();
        let units = self.groups[own[0]].layout.units.clone();
        let done_with_own = if self.backward {
            unit == units.start
        } else {
            unit + 1 == units.end
        };
        for g in self.unit_reads[unit].clone() {
            if !own.contains(&g) || done_with_own {
                self.drop_gathered(g)?;
            }
        }
        Ok(())
    }

    fn gradients_ready(&mut self, unit: usize, grads: &Params) -> Result<(), TrainError> {
        // The unit's trained group; a range of frozen parameters only has nothing to reduce.
        let Some(gi) = self.unit_groups[unit]
            .iter()
            .copied()
            .find(|&g| self.groups[g].layout.trainable)
        else {
            return Ok(());
        };
        let reduce_kind = self.options.reduce_kind;
        let device = self.device;
        let group = &mut self.groups[gi];
        if group.grad_flat.is_none() {
            group.grad_flat = Some(Tensor::f_zeros(
                [group.layout.padded],
                (reduce_kind, device),
            )?);
        }
        let flat = group.grad_flat.as_ref().expect("created above");
        // A group spanning several units receives their gradients one unit at a time.
        group.layout.fill(flat, grads, false)?;
        group.units_ready += 1;
        // The moment the planner prices: this group's unsharded gradient assembled (or being
        // assembled) while the previous reduction is still in flight.
        let alive: usize = self
            .groups
            .iter()
            .map(|g| {
                g.reducing
                    .as_ref()
                    .map_or(0, |_| nbytes_padded(g, reduce_kind))
                    + g.grad_flat.as_ref().map_or(0, nbytes)
            })
            .sum();
        self.note(|p| p.unsharded_grads = p.unsharded_grads.max(alive));
        let group = &mut self.groups[gi];
        if group.units_ready < group.layout.units.len() {
            return Ok(());
        }
        let flat = group.grad_flat.take().expect("assembled above");
        // At most one reduction in flight: the previous group's lands (and its unsharded
        // gradient goes) before this one starts.
        for other in 0..self.groups.len() {
            self.settle_reduction(other)?;
        }
        let group = &mut self.groups[gi];
        let (work, out) = match &self.shard_comm {
            None => (Work::completed(), flat),
            Some(comm) => {
                let out = group.layout.shard_of(&flat, self.shard_rank)?;
                let work = comm.reduce_scatter_tensor(&flat, &out, ReduceOp::Sum)?;
                (work.keep_alive(Box::new(flat)), out)
            }
        };
        group.reducing = Some((work, out));
        Ok(())
    }

    fn takes_gradients(&self) -> bool {
        true
    }

    fn reduces_every_micro_batch(&self) -> bool {
        true
    }

    fn finish_backward(&mut self, last: bool) -> Result<(), TrainError> {
        for gi in (0..self.groups.len()).rev() {
            self.settle_reduction(gi)?;
        }
        if !last {
            return Ok(());
        }
        // The step's sharded gradients are complete on each replica: sum them across
        // replicas (in the reduce dtype, as the reduce-scatter).
        if let Some(comm) = &self.replica_comm {
            let mut works = vec![];
            for (gi, g) in self.groups.iter().enumerate() {
                let Some(grad) = &g.grad else { continue };
                let t = grad
                    .f_to_device(self.device)?
                    .f_to_kind(self.options.reduce_kind)?
                    .f_contiguous()?;
                works.push((gi, comm.all_reduce_tensor(&t, ReduceOp::Sum)?, t));
            }
            for (gi, work, t) in works {
                work.wait()?;
                if let Some(grad) = &self.groups[gi].grad {
                    grad.shallow_clone().f_copy_(&t)?;
                }
            }
        }
        self.backward = false;
        Ok(())
    }
}

/// Bytes of a group's unsharded (padded) tensor in `kind`.
fn nbytes_padded(g: &Group, kind: Kind) -> usize {
    g.layout.padded as usize * kind.elt_size_in_bytes()
}

impl Fsdp {
    /// Updates the transient peaks.
    fn note(&self, f: impl FnOnce(&mut TransientPeaks)) {
        let mut p = self.transient.get();
        f(&mut p);
        self.transient.set(p);
    }

    /// Waits for group `gi`'s reduce-scatter, if one is in flight, and adds its output into
    /// the group's sharded gradient (created on the first micro-batch); the unsharded gradient
    /// is freed here.
    fn settle_reduction(&mut self, gi: usize) -> Result<(), TrainError> {
        let Some((work, out)) = self.groups[gi].reducing.take() else {
            return Ok(());
        };
        work.wait()?;
        let store = self.store_device();
        let master = self.options.master_kind;
        let g = &mut self.groups[gi];
        tch::no_grad(|| -> Result<(), TrainError> {
            match &g.grad {
                None => {
                    let acc = Tensor::f_empty([g.layout.shard_len], (master, store))?;
                    acc.shallow_clone().f_copy_(&out)?;
                    g.grad = Some(acc);
                }
                Some(acc) => {
                    let out = out.f_to_device(store)?.f_to_kind(master)?;
                    let _ = acc.shallow_clone().f_add_(&out)?;
                }
            }
            Ok(())
        })
    }
}

impl Group {
    /// `(start, len)` within this rank's shard of each parameter's elements (padding left
    /// out), in layout order.
    fn local_segments(&self, shard_rank: usize) -> Vec<(i64, i64)> {
        self.layout
            .local_pieces(shard_rank)
            .map(|(start, len, _)| (start, len))
            .collect()
    }
}

impl ParallelWeights for Fsdp {
    fn forward_backward(
        &mut self,
        engine: &Engine<'_>,
        batches: &StepBatches,
    ) -> Result<Tensor, TrainError> {
        let (loss, _) =
            engine.forward_backward(self, &batches.micro_batches, engine.normaliser(batches))?;
        Ok(loss)
    }

    /// Unscales the local gradient shards, then (distributed) takes the maximum of the
    /// found-inf flags over every rank on the device, so that all ranks skip the same steps.
    fn unscale_grads(&mut self, inv_scale: f64) -> Result<Tensor, TrainError> {
        let found_inf = unscale(
            self.groups.iter().filter_map(|g| g.grad.as_ref()),
            inv_scale,
        )?
        .f_to_device(self.device)?;
        if let Some(world) = &self.world_comm {
            world.all_reduce_tensor(&found_inf, ReduceOp::Max)?.wait()?;
        }
        Ok(found_inf)
    }

    /// The global L2 norm of the gradient shards (before clipping; collective on the shard
    /// group; not read), then clipping to `max_norm` when it is positive, as `clip_grad_norm_`.
    fn clip_grad_norm(&mut self, max_norm: f64) -> Result<Tensor, TrainError> {
        tch::no_grad(|| {
            // As `clip_grad_norm_` does per tensor: the norm of each parameter's piece of the
            // local shard, then the squared norm of those norms, summed over the shard group.
            let mut pieces = vec![];
            for g in &self.groups {
                let Some(grad) = &g.grad else { continue };
                let grad = grad.f_to_device(self.device)?.f_to_kind(Kind::Float)?;
                for (start, len) in g.local_segments(self.shard_rank) {
                    pieces.push(grad.f_narrow(0, start, len)?);
                }
            }
            let norms = foreach_norm(&pieces)?;
            let sq = if norms.is_empty() {
                Tensor::f_zeros([1], (Kind::Float, self.device))?
            } else {
                Tensor::f_stack(&norms, 0)?
                    .f_norm()?
                    .f_pow_tensor_scalar(2)?
                    .f_reshape([1])?
            };
            if let Some(comm) = &self.shard_comm {
                comm.all_reduce_tensor(&sq, ReduceOp::Sum)?.wait()?;
            }
            let total = sq.f_sqrt()?;
            scale_to_max_norm(
                &total,
                max_norm,
                self.groups.iter().filter_map(|g| g.grad.as_ref()),
            )?;
            Ok(total)
        })
    }

    /// One AdamW step over the local shards (the formulas of [`crate::optim::AdamW::step`],
    /// element-wise): weight decay where the element belongs to a 2+-dimensional parameter,
    /// then libtorch's fused AdamW over every shard at once.
    fn optimizer_step(&mut self, lr: f64, found_inf: Option<&Tensor>) -> Result<(), TrainError> {
        self.opt_step += 1;
        let [beta1, beta2] = self.adam.betas;
        let wd = self.adam.weight_decay;
        tch::no_grad(|| -> Result<(), TrainError> {
            let (mut p, mut gr, mut m, mut v) = (vec![], vec![], vec![], vec![]);
            for g in &mut self.groups {
                let Some(grad) = g.grad.take() else { continue };
                if wd != 0.0 {
                    decay_where(&mut g.shard, 1.0 - lr * wd, &g.decay, found_inf)?;
                }
                p.push(g.shard.shallow_clone());
                gr.push(grad);
                m.push(g.exp_avg.shallow_clone());
                v.push(g.exp_avg_sq.shallow_clone());
            }
            let h = FusedAdamW {
                step: self.opt_step,
                lr,
                beta1,
                beta2,
                weight_decay: 0.0,
                eps: self.adam.eps,
            };
            fused_adamw(&p, &gr, &m, &v, &h, found_inf)
        })
    }

    fn forget_step(&mut self) {
        self.opt_step = self.opt_step.saturating_sub(1);
    }

    /// Frees every gathered group (end of step).
    fn end_step(&mut self) -> Result<(), TrainError> {
        for g in 0..self.groups.len() {
            self.drop_gathered(g)?;
        }
        self.backward = false;
        Ok(())
    }

    /// Full fp32 parameters, gathered from every shard (collective on the shard group).
    fn full_params(&self) -> Result<Params, TrainError> {
        let mut out = Params::new();
        for g in &self.groups {
            let flat = self.gather_full(&g.shard)?;
            unflatten(&g.layout, &flat, &mut out)?;
        }
        Ok(out)
    }

    /// Bytes held between steps for parameter shards, gradient shards and AdamW moments.
    fn memory(&self) -> MemoryReport {
        let mut m = MemoryReport::default();
        for g in &self.groups {
            m.params += nbytes(&g.shard);
            if g.layout.trainable {
                m.grads += nbytes(&g.shard);
            }
            m.optimizer += nbytes(&g.exp_avg) + nbytes(&g.exp_avg_sq);
        }
        m
    }

    fn peak_gathered_bytes(&self) -> Option<usize> {
        Some(self.peak_gathered)
    }

    fn transient_peaks(&self) -> TransientPeaks {
        self.transient.get()
    }

    /// The shards, the reduced gradient shards (under 32-true, views of each group's
    /// unsharded gradient, whose storage they keep) and the moments.
    fn held_tensors(&self) -> HeldTensors {
        let mut held = HeldTensors::default();
        for g in &self.groups {
            held.params.push(g.shard.shallow_clone());
            held.grads
                .extend(g.grad.as_ref().map(Tensor::shallow_clone));
            if g.layout.trainable {
                held.optimizer.push(g.exp_avg.shallow_clone());
                held.optimizer.push(g.exp_avg_sq.shallow_clone());
            }
        }
        for copy in self.reference.iter().flatten().flatten() {
            held.reference.push(copy.shallow_clone());
        }
        held
    }

    fn sharded_state(&self) -> Option<ShardState> {
        self.options.sharded_checkpoints.then(|| ShardState {
            shard_rank: self.shard_rank,
            shard_world: self.shard_world,
            writes_shard: self.is_first_replica(),
            tensors: self.shard_tensors(),
            optimizer_step: self.opt_step,
            layouts: self.layouts(),
        })
    }

    /// The trained groups' parameters (a LoRA job's frozen base is not state), or for
    /// [`StatePart::Model`] every group's, frozen ones in the param dtype.
    fn full_layout(&self, part: StatePart) -> Vec<(String, Vec<i64>, Kind)> {
        self.visited_groups(part)
            .flat_map(|g| {
                let kind = self.held_kind(g);
                g.layout
                    .entries
                    .iter()
                    .map(move |e| (e.name.clone(), e.shape.clone(), kind))
            })
            .collect()
    }

    /// Group by group: the shard group of the first replica gathers the group's shards to
    /// its rank 0 (world rank 0), which gives `visit` the group's parameters one by one; the
    /// other replicas take no part.
    fn visit_full(
        &self,
        part: StatePart,
        mut visit: Option<FullStateVisitor<'_>>,
    ) -> Result<(), TrainError> {
        if !self.is_first_replica() {
            return Ok(());
        }
        for g in self.visited_groups(part) {
            let shard = match part {
                StatePart::Params | StatePart::Model => &g.shard,
                StatePart::ExpAvg => &g.exp_avg,
                StatePart::ExpAvgSq => &g.exp_avg_sq,
            };
            let full = self.gather_to_root(shard)?;
            if let (Some(full), Some(visit)) = (full, visit.as_deref_mut()) {
                for e in &g.layout.entries {
                    let t = full
                        .f_narrow(0, e.offset, e.numel)?
                        .f_view(e.shape.as_slice())?;
                    visit(&e.name, &t)?;
                }
            }
        }
        Ok(())
    }

    fn optimizer_steps(&self) -> u64 {
        self.opt_step
    }

    /// Each group's shard (and moments) rebuilt from the sources, reading only this rank's
    /// elements.
    fn load_state(
        &mut self,
        params: &dyn TensorSource,
        optimizer: Option<OptimizerSource<'_>>,
    ) -> Result<(), TrainError> {
        let store = self.store_device();
        let (rank, kind) = (self.shard_rank, self.options.master_kind);
        for g in self.groups.iter_mut().filter(|g| g.layout.trainable) {
            let l = &g.layout;
            g.shard = l.shard_from(params, rank, kind, store)?;
            if let Some(o) = &optimizer {
                g.exp_avg = l.shard_from(o.exp_avg, rank, kind, store)?;
                g.exp_avg_sq = l.shard_from(o.exp_avg_sq, rank, kind, store)?;
            }
            g.gathered = None;
        }
        if let Some(o) = &optimizer {
            self.opt_step = o.step;
        }
        Ok(())
    }

    /// Unit by unit, each group gathered in the master dtype (as the replicated weights
    /// evaluate) when a unit first reads it and dropped when no later unit of the walk does.
    fn forward_eval(
        &mut self,
        model: &CausalLm,
        inputs: &[TokenInput],
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<Vec<Tensor>, TrainError> {
        self.walk(model, inputs, false, on_logits)
    }

    fn keep_reference(&mut self, with_adapters: bool) -> Result<(), TrainError> {
        if self.groups.iter().any(|g| !g.layout.trainable) && !with_adapters {
            // A LoRA job: the reference is the base with the adapters off.
            return Ok(());
        }
        let kind = self.options.param_kind;
        let copy = self
            .groups
            .iter()
            .map(|g| match g.layout.trainable {
                true => Ok(Some(g.shard.f_to_kind(kind)?.f_detach_copy()?)),
                false => Ok(None),
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        self.reference = Some(copy);
        Ok(())
    }

    /// As [`ParallelWeights::forward_eval`], the kept reference's shards in place of the
    /// trained groups' (or, with none kept, the current ones with the adapters off), in the
    /// param dtype.
    fn forward_reference(
        &mut self,
        model: &CausalLm,
        inputs: &[TokenInput],
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<(), TrainError> {
        self.walk(model, inputs, true, on_logits).map(|_| ())
    }
}

impl Fsdp {
    /// The forward of [`ParallelWeights::forward_eval`] (`reference` false) or of
    /// [`ParallelWeights::forward_reference`], in the param dtype: each group is cast before
    /// it is gathered.
    fn walk(
        &self,
        model: &CausalLm,
        inputs: &[TokenInput],
        reference: bool,
        on_logits: &mut dyn FnMut(usize, Tensor) -> Result<(), TrainError>,
    ) -> Result<Vec<Tensor>, TrainError> {
        let this = self;
        let kind = this.options.param_kind;
        let shard_of = |g: usize| -> &Tensor {
            match (&this.reference, reference) {
                (Some(copy), true) => copy[g].as_ref().unwrap_or(&this.groups[g].shard),
                _ => &this.groups[g].shard,
            }
        };
        let mut held: Vec<(usize, Tensor)> = vec![];
        let mut params_for = |u: usize| -> Result<Vec<Tensor>, TrainError> {
            let reads = &this.unit_reads[u];
            held.retain(|(g, _)| reads.contains(g));
            for &g in reads {
                if !held.iter().any(|(h, _)| *h == g) {
                    // Cast before the all-gather: half the traffic and the buffer under bf16.
                    let shard = shard_of(g).f_to_kind(kind)?;
                    held.push((g, this.gather_full(&shard)?));
                }
            }
            let bytes = held.iter().map(|(_, t)| nbytes(t)).sum::<usize>();
            this.note(|p| p.eval_gathered = p.eval_gathered.max(bytes));
            let mut named = Params::new();
            for (g, flat) in &held {
                unflatten(&this.groups[*g].layout, flat, &mut named)?;
            }
            Ok(model.unit_params(u, &named)?)
        };
        // The reference with no copy kept is the base: the adapters off.
        let adapters_off = reference && this.reference.is_none();
        forward_by_unit(
            model,
            inputs,
            adapters_off,
            &mut params_for,
            &mut |_| Ok(()),
            on_logits,
        )
    }
}
