//! One training job in a run directory, as `flotilla train` runs it in every task: pick the
//! device, join the process group the environment describes (DDP/FSDP over NCCL or the CPU
//! backend), build the model and data, resume, [`fit`], and write `final/` (rank 0). This file
//! owns that sequence and what each rank says: rank 0 prints progress to the console; the
//! other ranks print only their start and summary lines (the launchers write every rank's
//! output to its own log file).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::Device;

use crate::checkpoint::{save_adapter, save_final, FinalOptions};
use crate::commands::task_error::TaskError;
use crate::cuda::{SyncDebug, SYNC_DEBUG_ENV};
use crate::data::{self, BatchLayout, DataLoader, DataOptions};
use crate::error::TrainError;
use crate::fit::{fit, resume, EvalSet, FitOptions};
use crate::host_memory::HostPhase;
use crate::model::CausalLm;
use crate::objective::{Objective, AUX_LOSS_METRIC, DPO_METRICS};
use crate::parallel::parallelize::DistContext;
use crate::reference;
use crate::state::hf_weights::HfWeights;
use crate::state::param_source::{Overlay, Seeded, TensorSource};
use crate::state::peft::{self, PeftAdapter};
use crate::trainer::Trainer;
use flotilla_comm::comm::{Backend, Communicator};
use flotilla_comm::connect::{self, CommOptions};
use flotilla_comm::store::{KvStore, Store, StoreConfig};
use flotilla_config::schema::{self, DistConfig, JobConfig, Precision, ReferenceModel};
use flotilla_contract::events::{self, EventWriter, SessionStatus};
use flotilla_contract::metrics::{MetricsRow, MetricsWriter};
use flotilla_contract::rank::RankInfo;

/// How a job ended.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSummary {
    pub steps: u64,
    pub final_loss: Option<f64>,
    pub eval_acc: Option<f64>,
    pub wall_s: f64,
}

impl std::fmt::Display for JobSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "done: {} steps", self.steps)?;
        if let Some(l) = self.final_loss {
            write!(f, ", final loss {l:.4}")?;
        }
        if let Some(a) = self.eval_acc {
            write!(f, ", eval accuracy {:.1}%", 100.0 * a)?;
        }
        write!(f, ", wall {:.1}s", self.wall_s)
    }
}

/// The training device of `trainer.device` for a rank: with CUDA, the rank's device among
/// the visible ones (device 0 when the launcher bound one device per task through
/// `CUDA_VISIBLE_DEVICES`, else `LOCAL_RANK`).
pub fn train_device(device: schema::Device, rank: &RankInfo) -> Result<Device, TrainError> {
    let cuda = || -> Option<Device> {
        let count = crate::cuda::device_count();
        (count > 0).then(|| Device::Cuda(rank.local_rank % count))
    };
    match device {
        schema::Device::Cpu => Ok(Device::Cpu),
        schema::Device::Cuda => cuda().ok_or_else(|| {
            TrainError::Unsupported(
                "trainer.device=cuda but CUDA is not available (no GPU or no CUDA libtorch)".into(),
            )
        }),
        schema::Device::Auto => Ok(cuda().unwrap_or(Device::Cpu)),
    }
}

/// Longest wait for the master and the other ranks to join.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// Joins the process group of `rank` for `trainer.dist` (`None` for one process, unless
/// `trainer.dist.process_group: always` asks for a group of one, whose collectives then all run
/// as they would with more ranks).
pub fn join_group(
    rank: &RankInfo,
    dist: &DistConfig,
    device: Device,
) -> Result<Option<DistContext>, TrainError> {
    let (backend, timeout_s, group) = match dist {
        DistConfig::None => {
            if rank.world_size > 1 {
                return Err(TrainError::Unsupported(format!(
                    "WORLD_SIZE={} but trainer.dist.mode=none; use trainer/dist=ddp or trainer/dist=fsdp",
                    rank.world_size
                )));
            }
            return Ok(None);
        }
        DistConfig::Ddp(d) => (d.backend, d.timeout_s, d.process_group),
        DistConfig::Fsdp(f) => (f.backend, f.timeout_s, f.process_group),
    };
    if rank.world_size == 1 && group != Some(schema::ProcessGroup::Always) {
        return Ok(None);
    }
    let backend = match backend {
        schema::Backend::Auto if device.is_cuda() => Backend::Nccl,
        schema::Backend::Auto | schema::Backend::Cpu => Backend::Cpu,
        schema::Backend::Nccl => Backend::Nccl,
    };
    if backend == Backend::Nccl && !device.is_cuda() {
        return Err(TrainError::Unsupported(
            "trainer.dist.backend=nccl needs trainer.device=cuda (or auto on a GPU machine)".into(),
        ));
    }
    let timeout = Duration::from_secs(timeout_s.max(1));
    // Joining waits for the master and every peer at most RENDEZVOUS_TIMEOUT (an unreachable
    // master is an error in minutes, not after the collective timeout).
    let rendezvous = timeout.min(RENDEZVOUS_TIMEOUT);
    let run_id = rank
        .job_id
        .clone()
        .unwrap_or_else(|| "flotilla-train".into());
    let store_cfg = StoreConfig::from_rank_info(rank, run_id, rendezvous);
    let store: Arc<dyn KvStore> = Arc::new(Store::connect(&store_cfg)?);
    let comm: Arc<dyn Communicator> = Arc::from(connect::init(
        store,
        &CommOptions::for_rank(rank, backend, timeout),
    )?);
    crate::parallel::tensor_comm::warm_up(comm.as_ref())?;
    Ok(Some(DistContext {
        comm,
        local_world_size: rank.local_world_size,
    }))
}

/// Runs `job` in `run_dir` as rank `rank` (config files are the caller's business) and returns
/// the summary. `on_row` sees every metrics row (rank 0's console progress).
/// A libtorch exception anywhere in it is an error naming the step ([`crate::error::torch_guard`]).
pub fn run_job(
    job: &JobConfig,
    run_dir: &Path,
    rank: &RankInfo,
    on_row: Option<&mut dyn FnMut(&MetricsRow)>,
) -> Result<JobSummary, TrainError> {
    crate::error::torch_guard::guarded(|| run_job_unguarded(job, run_dir, rank, on_row))
}

/// `FLOTILLA_CUDA_SYNC_DEBUG` (`off`, `warn`, `error`): libtorch's CUDA sync debug mode for
/// this rank (`torch.cuda.set_sync_debug_mode`): `warn` prints a warning for every operation
/// that makes the host wait for the GPU, which is how one step's single read is checked.
fn sync_debug_from_env() -> Result<(), TrainError> {
    let Ok(value) = std::env::var(SYNC_DEBUG_ENV) else {
        return Ok(());
    };
    let mode = SyncDebug::parse(&value).ok_or_else(|| {
        TrainError::Device(format!(
            "{SYNC_DEBUG_ENV}={value:?}: expected off, warn or error"
        ))
    })?;
    crate::cuda::set_sync_debug(mode).map_err(TrainError::Device)
}

fn run_job_unguarded(
    job: &JobConfig,
    run_dir: &Path,
    rank: &RankInfo,
    on_row: Option<&mut dyn FnMut(&MetricsRow)>,
) -> Result<JobSummary, TrainError> {
    let wall = Instant::now();
    prepare_process()?;
    let device = train_device(job.trainer.device, rank)?;
    // The rank's GPU is the current device before anything (NCCL, the allocator, the FSDP
    // storage shim) allocates on one.
    crate::cuda::bind(device).map_err(TrainError::Device)?;
    if device.is_cuda() {
        crate::cuda::set_allow_tf32(job.trainer.allow_tf32.unwrap_or(false));
        sync_debug_from_env()?;
    }
    // `trainer.precision: auto` for the device this rank got: bf16-mixed on a GPU.
    let resolved;
    let job = match job.trainer.precision {
        Precision::Auto => {
            let mut j = job.clone();
            j.trainer.precision = Precision::Auto.on(device.is_cuda());
            resolved = j;
            &resolved
        }
        _ => job,
    };
    let t = &job.trainer;
    let dist = join_group(rank, &t.dist, device)?;
    let (model, start) = StartingWeights::open(job)?;
    let data = data::build(
        &job.data,
        &DataOptions {
            model_vocab_size: model.config().vocab_size,
            run_dir: Some(run_dir),
            init_from: job.model.init_from.as_deref().map(Path::new),
        },
    )?;
    let mut trainer = build_trainer(job, rank, model, start, &data, device, dist)?;
    // Before a checkpoint is restored: a preference objective's reference is the start.
    prepare_objective(job, run_dir, &mut trainer, &data)?;
    trainer.host_peaks_mut().end(HostPhase::Startup);
    if let Some((dir, state)) = resume(&mut trainer, run_dir, &t.resume)? {
        if rank.rank == 0 {
            eprintln!("resuming from {} (step {})", dir.display(), state.step);
        }
    }
    announce(job, rank, &trainer, &data, device);
    let (rows, last_eval_acc) = fit_and_record(job, run_dir, rank, &mut trainer, &data, on_row)?;
    write_final(job, run_dir, &mut trainer, &data)?;
    let summary = JobSummary {
        steps: trainer.step_index(),
        final_loss: rows.last().map(|r| r.loss),
        eval_acc: last_eval_acc,
        wall_s: wall.elapsed().as_secs_f64(),
    };
    report_memory(&trainer, rank, &summary);
    Ok(summary)
}

/// What a job's process needs before anything else: its peak host memory counted from here, a
/// stop signal during start-up honoured at the first step, and libtorch's threads as many as
/// the launcher gave the rank (`OMP_NUM_THREADS`).
fn prepare_process() -> Result<(), TrainError> {
    crate::host_memory::reset_peak_rss();
    crate::preempt::install()?;
    if let Some(n) = std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|n| *n > 0)
    {
        tch::set_num_threads(n);
    }
    Ok(())
}

/// Where a job's starting parameters come from, each rank reading only what it will hold
/// (FSDP: its shards): the base (a Hugging Face directory, `model.init_from`, or the seeded
/// initialisation) and, for a LoRA job, the adapters (and modules to save) from a PEFT adapter
/// directory, or seeded as PEFT initialises them, over the base.
struct StartingWeights {
    seeded: Seeded,
    hf: Option<HfWeights>,
    adapter: Option<PeftAdapter>,
    /// A LoRA job's adapted parameters (what the adapter source gives over the base).
    adapted: Option<HashSet<String>>,
}

impl StartingWeights {
    /// The job's model (with its LoRA adapters) and where its parameters come from.
    fn open(job: &JobConfig) -> Result<(CausalLm, Self), TrainError> {
        let (base, hf) = match &job.model.init_from {
            Some(dir) => {
                let (model, weights) = HfWeights::open(dir)?;
                (model, Some(weights))
            }
            None => (CausalLm::new(&job.model)?, None),
        };
        let lora = job.peft.lora();
        let model = match lora {
            Some(l) => CausalLm::with_lora(base.config(), Some(l))?,
            None => base,
        };
        let seeded = Seeded::new(&model, job.trainer.seed as u64);
        let adapter = match lora.and_then(|l| l.init_from.as_deref().map(|d| (l, d))) {
            Some((l, dir)) => Some(PeftAdapter::open(Path::new(dir), &model, l)?),
            None => None,
        };
        let adapted = lora.map(|_| match &adapter {
            Some(a) => a.names().clone(),
            None => peft::factor_names(&model),
        });
        let start = StartingWeights {
            seeded,
            hf,
            adapter,
            adapted,
        };
        Ok((model, start))
    }

    /// Runs `f` with the source of every starting parameter.
    fn with_source<T>(&self, f: impl FnOnce(&dyn TensorSource) -> T) -> T {
        let base: &dyn TensorSource = match &self.hf {
            Some(weights) => weights,
            None => &self.seeded,
        };
        match &self.adapted {
            Some(names) => f(&Overlay {
                names: names.clone(),
                over: match &self.adapter {
                    Some(a) => a,
                    None => &self.seeded,
                },
                base,
            }),
            None => f(base),
        }
    }
}

/// This rank's trainer: its share of each global batch and its weights under the job's
/// parallelism, built from the starting weights (which are let go once they are built).
fn build_trainer(
    job: &JobConfig,
    rank: &RankInfo,
    model: CausalLm,
    start: StartingWeights,
    data: &data::Data,
    device: Device,
    dist: Option<DistContext>,
) -> Result<Trainer, TrainError> {
    let t = &job.trainer;
    let layout = BatchLayout {
        global_batch_size: t.global_batch_size,
        micro_batch_size: t.micro_batch_size,
        rank: rank.rank,
        world_size: rank.world_size,
    };
    let loader = DataLoader::new(
        data.train.clone(),
        job.data.shuffle(),
        t.seed as u64,
        layout,
        device,
    )?;
    start.with_source(|params| Trainer::distributed(model, params, t, loader, device, dist))
}

/// Sets the job's objective on `trainer`. DPO's reference is the trainer's weights as they
/// are now, the starting ones: kept as a frozen copy (`reference: auto`; with LoRA the base
/// with the adapters off, or a copy of the adapter a job retrains), or its log-probabilities
/// of every pair read from `run_dir` or computed once and written there (`precomputed`).
fn prepare_objective(
    job: &JobConfig,
    run_dir: &Path,
    trainer: &mut Trainer,
    data: &data::Data,
) -> Result<(), TrainError> {
    let objective = Objective::of(&job.objective);
    let Some(dpo) = job.objective.dpo() else {
        return trainer.set_objective(objective, false, false);
    };
    // Retraining an adapter: the reference is the adapter it starts from (as TRL's "ref"
    // adapter), a copy the size of the adapters; a new adapter's is the base.
    let retrained_adapter = job.peft.lora().is_some_and(|l| l.init_from.is_some());
    trainer.set_objective(objective, job.keeps_reference_copy(), retrained_adapter)?;
    let precomputed = dpo.reference == ReferenceModel::Precomputed;
    if precomputed {
        let logps = reference::load_or_compute(
            trainer,
            run_dir,
            data.train.as_ref(),
            data.eval.as_deref(),
            job.trainer.micro_batch_size,
        )?;
        trainer.set_reference_logps(logps);
    }
    Ok(())
}

/// The job's opening lines: where each rank runs (on several nodes), and what is trained how
/// (rank 0 on the console, the other ranks in their logs).
fn announce(
    job: &JobConfig,
    rank: &RankInfo,
    trainer: &Trainer,
    data: &data::Data,
    device: Device,
) {
    let t = &job.trainer;
    let mode = match &t.dist {
        // A process group of one (`process_group: always`) runs every collective.
        DistConfig::Ddp(_) if trainer.comm().is_some() && rank.world_size == 1 => {
            "DDP, a process group of 1 rank".to_string()
        }
        DistConfig::Fsdp(f) if trainer.comm().is_some() && rank.world_size == 1 => format!(
            "FSDP {}, a process group of 1 rank",
            f.sharding_strategy.as_str()
        ),
        _ if rank.world_size == 1 => "single process".to_string(),
        DistConfig::None => "single process".to_string(),
        DistConfig::Ddp(_) => format!("DDP, {} ranks", rank.world_size),
        DistConfig::Fsdp(f) => format!(
            "FSDP {}, {} ranks",
            f.sharding_strategy.as_str(),
            rank.world_size
        ),
    };
    let peft = match job.peft.lora() {
        Some(l) => {
            let specs = trainer.model.param_specs();
            let count = |f: &dyn Fn(&&crate::model::ParamSpec) -> bool| -> usize {
                specs.iter().filter(f).map(|s| s.numel()).sum()
            };
            let (trained, all) = (count(&|s| s.trainable), count(&|_| true));
            format!(
                ", LoRA r={} on {}: {trained} of {all} parameters trained ({:.2}%)",
                l.r,
                l.targets(trainer.model.config())
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                100.0 * trained as f64 / all.max(1) as f64
            )
        }
        None => String::new(),
    };
    // A job from a base is the base's model, whatever preset gave the defaults.
    let model_name = job.model.init_from.as_deref().unwrap_or(&job.model.name);
    let objective = match job.objective.dpo() {
        Some(d) => format!(
            ", DPO {} beta={} with the reference {}",
            d.loss_type.as_str(),
            d.beta,
            match (d.reference, job.peft.lora()) {
                (ReferenceModel::Precomputed, _) => "precomputed",
                (ReferenceModel::Auto, Some(l)) if l.init_from.is_some() => {
                    "the starting adapter (a frozen copy)"
                }
                (ReferenceModel::Auto, Some(_)) => "the base (adapters off)",
                (ReferenceModel::Auto, None) => "a frozen copy of the starting weights",
            }
        ),
        None => String::new(),
    };
    let intro = format!(
        "training {model_name} on {device:?} ({mode}, {}{peft}{objective}): {} steps from \
         step {}",
        t.precision.as_str(),
        t.max_steps,
        trainer.step_index()
    );
    if rank.world_size > 1 {
        // Where this rank runs: on several nodes, what tells a misplaced rank apart.
        eprintln!(
            "[rank {}] on host {}: node {} of {}, local rank {} of {}, master {}:{}",
            rank.rank,
            flotilla_contract::host_name(),
            rank.node_rank,
            rank.num_nodes,
            rank.local_rank,
            rank.local_world_size,
            rank.master_addr,
            rank.master_port
        );
    }
    if rank.rank == 0 {
        eprintln!("{intro}");
        if let Some(stats) = &data.chat_stats {
            eprintln!("chat data: {}", data::chat::summary_line(stats));
        }
        if let Some(stats) = &data.preference_stats {
            eprintln!("preference data: {}", data::preference::summary_line(stats));
        }
    } else {
        eprintln!("[rank {}] {intro}", rank.rank);
    }
}

/// Trains to `trainer.max_steps` ([`fit`]), rank 0 writing `metrics.csv` and mirroring it into
/// TensorBoard events with the job's swept values as HParams (a write error warns once and
/// training goes on). Returns the metrics rows and the last evaluation accuracy.
fn fit_and_record(
    job: &JobConfig,
    run_dir: &Path,
    rank: &RankInfo,
    trainer: &mut Trainer,
    data: &data::Data,
    on_row: Option<&mut dyn FnMut(&MetricsRow)>,
) -> Result<(Vec<MetricsRow>, Option<f64>), TrainError> {
    let t = &job.trainer;
    let is_zero = rank.rank == 0;
    let metrics_path = run_dir.join(flotilla_contract::layout::METRICS_CSV);
    let mut metrics = if is_zero {
        let mut extra: Vec<String> = vec![];
        if trainer.logs_aux_loss() {
            extra.push(AUX_LOSS_METRIC.to_string());
            if data.eval.is_some() {
                extra.push(format!("eval_{AUX_LOSS_METRIC}"));
            }
        }
        if trainer.objective().is_preference() {
            extra.extend(DPO_METRICS.iter().map(|m| m.to_string()));
            if data.eval.is_some() {
                extra.extend(DPO_METRICS.iter().map(|m| format!("eval_{m}")));
            }
        }
        Some(MetricsWriter::open_with(
            &metrics_path,
            trainer.step_index(),
            &extra,
        )?)
    } else {
        None
    };
    let eval = data.eval.as_ref().map(|d| EvalSet {
        dataset: d.clone(),
        num_batches: t.eval_batches,
        micro_batch_size: t.micro_batch_size,
        task: data.arithmetic.as_ref().map(|a| (a, 256)),
    });
    let mut last_eval_acc = None;
    let mut track = |r: &MetricsRow| {
        if let Some(acc) = r.eval_acc {
            last_eval_acc = Some(acc);
        }
    };
    let mut events = is_zero.then(|| {
        let mut writer = EventWriter::create(&run_dir.join(events::TB_DIR));
        let preference = trainer.objective().is_preference();
        let metric_tags: &[&str] = match (&data.eval, preference) {
            (Some(_), false) => &["loss", "eval_loss", "eval_ppl", "eval_acc", "tokens_per_s"],
            (None, false) => &["loss", "tokens_per_s"],
            (Some(_), true) => &[
                "loss",
                "rewards/accuracies",
                "rewards/margins",
                "eval_loss",
                "eval_rewards/accuracies",
                "eval_rewards/margins",
                "tokens_per_s",
            ],
            (None, true) => &[
                "loss",
                "rewards/accuracies",
                "rewards/margins",
                "tokens_per_s",
            ],
        };
        writer.hparams_start(&events::job_hparams(run_dir), metric_tags);
        writer
    });
    let mut forward = on_row;
    let mut observe = |r: &MetricsRow| {
        track(r);
        if let Some(events) = events.as_mut() {
            events.scalars(r.step, &r.scalars());
        }
        if let Some(f) = forward.as_deref_mut() {
            f(r);
        }
    };
    let fitted = fit(
        trainer,
        metrics.as_mut(),
        FitOptions {
            run_dir,
            until: t.max_steps,
            eval_every: t.eval_every,
            eval,
            checkpoint_every: t.checkpoint_every,
            keep_last_checkpoints: t.keep_last_checkpoints,
            on_row: Some(&mut observe),
        },
    );
    if let Some(events) = events.as_mut() {
        events.hparams_end(match &fitted {
            Ok(_) => SessionStatus::Success,
            Err(_) => SessionStatus::Failure,
        });
    }
    let rows = fitted?;
    Ok((rows, last_eval_acc))
}

/// The final model in `final/`: gathered to rank 0 a group at a time and streamed to the file;
/// a LoRA job's is a PEFT adapter directory.
fn write_final(
    job: &JobConfig,
    run_dir: &Path,
    trainer: &mut Trainer,
    data: &data::Data,
) -> Result<(), TrainError> {
    trainer.host_peaks_mut().begin();
    let final_dir = run_dir.join(flotilla_contract::layout::FINAL_DIR);
    let opts = FinalOptions::for_job(job)?;
    match job.peft.lora() {
        Some(l) => save_adapter(
            trainer,
            &final_dir,
            l,
            peft::base_path(job.model.init_from.as_deref()).as_deref(),
            data.tokenizer.as_ref(),
            opts,
        )?,
        None => save_final(trainer, &final_dir, data.tokenizer.as_ref(), opts)?,
    }
    trainer.host_peaks_mut().end(HostPhase::Final);
    Ok(())
}

/// What the rank held (parameters, gradients, optimizer state, the peak of gathered
/// parameters) and its peak host memory by phase, in its log; ranks other than 0 also print
/// it and the summary.
fn report_memory(trainer: &Trainer, rank: &RankInfo, summary: &JobSummary) {
    let m = trainer.memory();
    let mut memory = format!(
        "memory held: params {} B, grads {} B, optimizer {} B",
        m.params, m.grads, m.optimizer
    );
    if let Some(peak) = trainer.peak_gathered_bytes() {
        memory.push_str(&format!(", peak gathered params {peak} B"));
    }
    tracing::info!("{memory}");
    tracing::info!("peak host RSS by phase: {}", trainer.host_peaks());
    if rank.rank != 0 {
        eprintln!("[rank {}] {memory}", rank.rank);
        eprintln!("[rank {}] {summary}", rank.rank);
    }
}

/// Logs to stderr (colour only on a terminal), filtered by `FLOTILLA_LOG` (default `warn`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
}

/// `flotilla train`: this process's part of a run in `run_dir` (one process, or one rank of a
/// DDP/FSDP job whose rank comes from the environment). Unless the directory was `prepared` by
/// `flotilla run`, rank 0 first writes `config.yaml` and `overrides.yaml`. Rank 0 shows the
/// progress on the console.
pub fn train_in_run_dir(
    composed: &flotilla_config::Composed,
    run_dir: &Path,
    prepared: bool,
) -> Result<(), TaskError> {
    use flotilla_contract::layout::{overrides_yaml, CONFIG_FILE, OVERRIDES_FILE};
    let job = composed.typed.as_ref().ok_or_else(|| {
        TaskError::Other(anyhow::anyhow!(
            "the composed config is not a flotilla job (or --no-validate was given)"
        ))
    })?;
    let rank = flotilla_contract::rank::discover_from_process().map_err(|e| {
        TaskError::Other(
            anyhow::Error::new(e).context("reading this task's rank from the environment"),
        )
    })?;
    let io = |what: String, source: std::io::Error| TaskError::Io { what, source };
    std::fs::create_dir_all(run_dir)
        .map_err(|e| io(format!("cannot create {}", run_dir.display()), e))?;
    if rank.is_master() && !prepared {
        let write = |name: &str, text: String| -> Result<(), TaskError> {
            let p = run_dir.join(name);
            std::fs::write(&p, text).map_err(|e| io(format!("cannot write {}", p.display()), e))
        };
        let emit = flotilla_config::yaml::EmitOptions { provenance: false };
        write(
            CONFIG_FILE,
            flotilla_config::yaml::to_yaml(&composed.job, emit),
        )?;
        write(OVERRIDES_FILE, overrides_yaml(&composed.task_overrides))?;
    }
    let t = &job.trainer;
    let mut progress = rank
        .is_master()
        .then(|| crate::progress::Progress::new(t.max_steps, t.log_every));
    let mut log = |r: &MetricsRow| {
        if let Some(p) = progress.as_mut() {
            p.on_row(r);
        }
    };
    let on_row: Option<&mut dyn FnMut(&MetricsRow)> = if rank.is_master() {
        Some(&mut log)
    } else {
        None
    };
    let summary = run_job(job, run_dir, &rank, on_row).map_err(|source| TaskError::Train {
        context: format!(
            "training in {} (rank {} of {})",
            run_dir.display(),
            rank.rank,
            rank.world_size
        ),
        source,
    })?;
    if let Some(p) = progress.as_mut() {
        p.finish(&summary.to_string());
    }
    Ok(())
}
