//! The driver of an adaptive study: it samples a trial whenever one of `max_parallel` slots is
//! free (the sampler sees the running trials, so slots never wait for a batch), prepares its job
//! directory in the sweep directory, runs it, reads the metric from its metrics file as
//! `flotilla report` does, asks the pruner at every new value and stops a pruned trial, and
//! writes the whole study to `study.json` after every change.
//!
//! The loop ([`drive_with`]) is the same whatever runs the trials; a [`Backend`] starts them,
//! says when they have ended and stops them:
//! * [`LocalBackend`]: the local launcher, one thread per trial (a pruned trial gets SIGTERM:
//!   the built-in trainer checkpoints and exits). `flotilla run` drives the study itself;
//!   `--resume-sweep DIR` starts the trials that were running again from their own
//!   directories (the trainer resumes from its checkpoint) and samples on to `n_trials`.
//! * [`SlurmBackend`]: each trial one SLURM batch job. `flotilla run` only creates the study
//!   and starts a detached driver (`flotilla study-drive DIR`, see [`super::detach`]);
//!   `--resume-sweep DIR` starts a new driver when none is alive, which watches the jobs still
//!   in flight again and submits again those that ended without completing.

use super::detach::DriverLock;
use crate::local::{install_interrupt_handler, Cancel, LocalLauncher, LocalOptions};
use crate::rundir::trials::StudyDir;
use crate::rundir::{write_atomic, JobState, PlanFile, PreparedJob, PreparedRun, RunDirError};
use crate::slurm::{self, JobSpec, SlurmOptions};
use crate::{JobOutcome, LaunchError, RunReport};
use flotilla_config::overrides::{parse_override, Override};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::{ComposeOptions, Composer, ConfigError, Fallback};
use flotilla_contract::metrics::read_job_metrics_named;
use flotilla_contract::metrics::{format_value, Mode};
use flotilla_study::config::{SamplerKind, StudyConfig};
use flotilla_study::{
    best_trial, next_number, Direction, RandomSampler, Sampler, SearchSpace, SuccessiveHalving,
    TpeOptions, TpeSampler, Trial, TrialState,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The study file in the sweep directory.
pub use flotilla_contract::layout::STUDY_FILE;
const STUDY_VERSION: u32 = 1;
/// How often running trials' metrics are read.
const POLL: Duration = Duration::from_millis(500);

/// Everything a study is, as `study.json` holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudyFile {
    pub version: u32,
    pub config: StudyConfig,
    /// The metric and direction in use (the configured ones, or the defaults decided when the
    /// study started).
    pub metric: String,
    pub direction: Direction,
    pub space: SearchSpace,
    /// The runtime overrides every trial is composed with.
    pub runtime_overrides: Vec<String>,
    /// The primary config's name; the config is the sweep directory's copy of its directory.
    pub config_name: String,
    pub validate: bool,
    pub trials: Vec<Trial>,
    /// The pruner's state (its `auto` estimate once made).
    pub pruner: Option<SuccessiveHalving>,
}

impl StudyFile {
    pub fn read(sweep_dir: &Path) -> Result<Option<StudyFile>, RunDirError> {
        let path = sweep_dir.join(STUDY_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(RunDirError::Io { path, error }),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|error| RunDirError::Json { path, error })
    }

    fn write(&self, sweep_dir: &Path) -> Result<(), RunDirError> {
        let mut text = serde_json::to_string_pretty(self).expect("a study serialises");
        text.push('\n');
        write_atomic(&sweep_dir.join(STUDY_FILE), text.as_bytes())
    }

    /// The best COMPLETE trial.
    pub fn best(&self) -> Option<&Trial> {
        best_trial(&self.trials, self.direction)
    }
}

fn sampler_for(config: &StudyConfig, direction: Direction) -> Box<dyn Sampler> {
    match config.sampler {
        SamplerKind::Random => Box::new(RandomSampler::new(config.seed)),
        SamplerKind::Tpe => Box::new(TpeSampler::new(
            TpeOptions {
                seed: config.seed,
                multivariate: config.multivariate,
                ..TpeOptions::default()
            },
            direction,
        )),
    }
}

/// The metric a study optimises when its config names none: `eval_loss` for the built-in
/// trainer with evaluation on, else `loss`.
fn default_metric(first: &PreparedJob) -> String {
    match &first.config {
        Some(c) if c.trainer.eval_every > 0 => "eval_loss".into(),
        _ => "loss".into(),
    }
}

/// The study's search space: every task override (sweeps become parameters).
pub fn search_space(task: &[Override]) -> Result<SearchSpace, ConfigError> {
    let texts: Vec<&str> = task.iter().map(|o| o.input.as_str()).collect();
    SearchSpace::from_overrides(&texts).map_err(|e| ConfigError::Override(e.to_string()))
}

/// The first trials a new study would sample (for `plan`): their override lists.
pub fn first_trials(config: &StudyConfig, space: &SearchSpace, count: usize) -> Vec<Vec<String>> {
    let mut sampler = sampler_for(config, config.direction.unwrap_or_default());
    let mut trials: Vec<Trial> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..count.min(config.n_trials) {
        let params = sampler.sample(space, &trials);
        out.push(space.overrides(&params));
        trials.push(Trial::new(next_number(&trials), params));
    }
    out
}

/// One running trial.
struct Running {
    job: PreparedJob,
    pruned_at: Option<(u64, f64)>,
}

/// Where a study's trials run. The study loop ([`drive_with`]) decides what runs and when a
/// trial is stopped; a backend only starts trials, says when they have ended, and stops them:
/// the local launcher's threads ([`LocalBackend`]) or SLURM jobs ([`SlurmBackend`]).
pub trait Backend {
    /// Starts trial `job` (its directory prepared, its record in the plan).
    fn start(&mut self, job: &PreparedJob) -> Result<(), LaunchError>;
    /// Watches a trial that an earlier driver started, as if started here.
    fn adopt(&mut self, job: &PreparedJob) -> Result<(), LaunchError>;
    /// Waits about `timeout` (less once `cancel` trips) and returns the trials that ended
    /// since the last call, with their outcomes. A trial stopped by [`Backend::stop`] ends
    /// CANCELLED unless it completed first.
    fn wait(
        &mut self,
        timeout: Duration,
        cancel: &Cancel,
    ) -> Vec<(usize, Result<JobOutcome, LaunchError>)>;
    /// Asks trial `num` to stop (it was pruned, or the study is failing).
    fn stop(&mut self, num: usize);
    /// Whether trials go on without the driver (SLURM jobs): an interruption or an error then
    /// ends the loop at once and leaves them to the next driver (`--resume-sweep`); otherwise
    /// the loop stops them and waits until they have ended.
    fn detached(&self) -> bool;
}

/// The local launcher's backend: one thread per running trial.
pub struct LocalBackend {
    launcher: Arc<LocalLauncher>,
    plan: PlanFile,
    max_parallel: usize,
    tx: mpsc::Sender<(usize, Result<JobOutcome, LaunchError>)>,
    rx: mpsc::Receiver<(usize, Result<JobOutcome, LaunchError>)>,
    stops: HashMap<usize, Cancel>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LocalBackend {
    pub fn new(launcher: LocalLauncher, plan: PlanFile, max_parallel: usize) -> LocalBackend {
        let (tx, rx) = mpsc::channel();
        LocalBackend {
            launcher: Arc::new(launcher),
            plan,
            max_parallel,
            tx,
            rx,
            stops: HashMap::new(),
            threads: Vec::new(),
        }
    }
}

impl Backend for LocalBackend {
    fn start(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
        let stop = Cancel::new();
        self.stops.insert(job.num, stop.clone());
        let (tx, launcher, plan, job, parallel) = (
            self.tx.clone(),
            self.launcher.clone(),
            self.plan.clone(),
            job.clone(),
            self.max_parallel,
        );
        self.threads.push(std::thread::spawn(move || {
            let outcome = launcher.run_job_until(&job, Some(&plan), parallel, &stop);
            let _ = tx.send((job.num, outcome));
        }));
        Ok(())
    }

    fn adopt(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
        // A local trial dies with its driver: it is started again.
        self.start(job)
    }

    fn wait(
        &mut self,
        timeout: Duration,
        _cancel: &Cancel,
    ) -> Vec<(usize, Result<JobOutcome, LaunchError>)> {
        let mut out = Vec::new();
        if let Ok(first) = self.rx.recv_timeout(timeout) {
            out.push(first);
            out.extend(self.rx.try_iter());
        }
        for (num, _) in &out {
            self.stops.remove(num);
        }
        out
    }

    fn stop(&mut self, num: usize) {
        if let Some(stop) = self.stops.get(&num) {
            stop.cancel();
        }
    }

    fn detached(&self) -> bool {
        false
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        for stop in self.stops.values() {
            stop.cancel();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How often the SLURM backend asks the scheduler about its trials.
pub const SLURM_POLL: Duration = Duration::from_secs(2);

/// One trial submitted as a SLURM job.
struct Flight {
    dir: PathBuf,
    id: Option<String>,
    state: JobState,
    /// When the trial was asked to stop (`scancel --signal=TERM`).
    stop_at: Option<Instant>,
    /// Whether the plain `scancel` followed after the grace period.
    killed: bool,
}

/// The SLURM backend: a trial is one batch job (its own sbatch script, never an array),
/// submitted with [`slurm::submit_scripts`] (which records its id in `sweep.json`), watched with
/// `squeue`/`sacct` and the exit marker its batch script writes, stopped with
/// `scancel --signal=TERM --full ID` and, after the grace period, `scancel ID`.
pub struct SlurmBackend {
    plan: PlanFile,
    opts: SlurmOptions,
    grace: Duration,
    interval: Duration,
    next_poll: Instant,
    flights: HashMap<usize, Flight>,
}

fn stamp() -> String {
    chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
}

impl SlurmBackend {
    pub fn new(plan: PlanFile, opts: SlurmOptions, grace: Duration) -> SlurmBackend {
        SlurmBackend {
            plan,
            opts,
            grace,
            interval: SLURM_POLL,
            next_poll: Instant::now(),
            flights: HashMap::new(),
        }
    }

    /// Polls every `interval` instead of [`SLURM_POLL`].
    pub fn with_interval(mut self, interval: Duration) -> SlurmBackend {
        self.interval = interval;
        self
    }
}

impl Backend for SlurmBackend {
    fn start(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
        let spec = JobSpec {
            num: job.num,
            dir: job.dir.clone(),
            compute: job.compute.clone(),
            ranks: job.task.as_ref().map(|t| t.ranks),
        };
        let scripts = slurm::write_single_scripts(&self.plan, &[spec], &self.opts)?;
        let submitted = slurm::submit_scripts(&self.plan, &scripts)?;
        let id = submitted
            .first()
            .and_then(|s| s.jobs.first())
            .map(|j| j.job_id.clone());
        eprintln!(
            "{} trial {}: submitted as SLURM job {}",
            stamp(),
            job.num,
            id.as_deref().unwrap_or("?")
        );
        self.flights.insert(
            job.num,
            Flight {
                dir: job.dir.clone(),
                id,
                state: JobState::Pending,
                stop_at: None,
                killed: false,
            },
        );
        Ok(())
    }

    fn adopt(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
        let plan = self.plan.read()?;
        let rec = plan.job(job.num);
        let id = rec.and_then(|r| r.job_id.clone());
        eprintln!(
            "{} trial {}: watching SLURM job {} again",
            stamp(),
            job.num,
            id.as_deref().unwrap_or("?")
        );
        self.flights.insert(
            job.num,
            Flight {
                dir: job.dir.clone(),
                id,
                state: rec.map(|r| r.state).unwrap_or(JobState::Pending),
                stop_at: None,
                killed: false,
            },
        );
        Ok(())
    }

    fn wait(
        &mut self,
        _timeout: Duration,
        cancel: &Cancel,
    ) -> Vec<(usize, Result<JobOutcome, LaunchError>)> {
        while Instant::now() < self.next_poll {
            if cancel.is_cancelled() {
                return Vec::new();
            }
            std::thread::sleep(
                self.next_poll
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
        self.next_poll = Instant::now() + self.interval;
        let ids: Vec<String> = self.flights.values().filter_map(|f| f.id.clone()).collect();
        let live = match slurm::query(&ids) {
            Ok(live) => Some(live),
            Err(e) => {
                eprintln!("{} cannot ask the scheduler: {e}", stamp());
                None
            }
        };
        let mut ended = Vec::new();
        let mut changes = Vec::new();
        for (num, f) in self.flights.iter_mut() {
            let Some(id) = f.id.clone() else {
                // Never submitted: nothing will ever end it.
                ended.push((*num, JobState::Failed, Some("no SLURM job id".to_string())));
                continue;
            };
            let state = match live.as_ref().and_then(|l| l.get(&id)) {
                Some(l) => Some(l.state),
                None => slurm::exit_marker(&f.dir, &id)
                    .or_else(|| live.as_ref().map(|_| JobState::Unknown)),
            };
            let Some(state) = state else { continue };
            if state.is_terminal() || state == JobState::Unknown {
                let state = match (f.stop_at, state) {
                    (_, JobState::Completed) => JobState::Completed,
                    (Some(_), _) => JobState::Cancelled,
                    (None, s) => s,
                };
                let message = match state {
                    JobState::Failed
                    | JobState::OutOfMemory
                    | JobState::NodeFail
                    | JobState::Timeout => slurm::failure_message(&f.dir),
                    JobState::Unknown => Some(format!(
                        "SLURM job {id} is no longer known to the scheduler and left no exit marker"
                    )),
                    _ => None,
                };
                ended.push((*num, state, message));
                continue;
            }
            if state != f.state {
                f.state = state;
                changes.push((*num, state));
            }
            if let Some(t) = f.stop_at {
                if !f.killed && t.elapsed() >= self.grace {
                    f.killed = true;
                    if let Err(e) = slurm::scancel(&id, &[]) {
                        eprintln!("{} trial {num}: {e}", stamp());
                    }
                }
            }
        }
        for (num, state) in changes {
            if let Err(e) = self.plan.set_state(num, state, None) {
                eprintln!("{} trial {num}: {e}", stamp());
            }
        }
        let mut out = Vec::new();
        for (num, state, message) in ended {
            let f = self.flights.remove(&num).expect("a trial in flight");
            eprintln!(
                "{} trial {num}: SLURM job {} ended {}",
                stamp(),
                f.id.as_deref().unwrap_or("?"),
                state.as_str()
            );
            let outcome = self
                .plan
                .set_state(num, state, message.clone())
                .map_err(LaunchError::from)
                .map(|_| JobOutcome {
                    num,
                    dir: f.dir,
                    job_id: f.id,
                    state,
                    failure: None,
                    message,
                });
            out.push((num, outcome));
        }
        out
    }

    fn stop(&mut self, num: usize) {
        let Some(f) = self.flights.get_mut(&num) else {
            return;
        };
        if f.stop_at.is_some() {
            return;
        }
        f.stop_at = Some(Instant::now());
        if let Some(id) = &f.id {
            eprintln!("{} trial {num}: stopping SLURM job {id}", stamp());
            // --full: the batch shell sees the TERM too, so it never requeues the job.
            if let Err(e) = slurm::scancel(id, &["--signal=TERM", "--full"]) {
                eprintln!("{} trial {num}: {e}", stamp());
            }
        }
    }

    fn detached(&self) -> bool {
        true
    }
}

/// What a new study needs next.
pub enum StudyRun {
    /// The local launcher ran the study to its end (or to an interruption).
    Ran(RunReport),
    /// The trials are SLURM jobs: the study directory (with `study.json` and its first trial
    /// prepared) is ready for a detached driver (`flotilla study-drive DIR`).
    Slurm(PathBuf),
}

/// Starts a new study: `config` from the runtime node, `runtime`/`task` the multirun's
/// overrides. On the local launcher it runs the study here; on SLURM it only creates the study
/// directory and leaves the trials to a driver.
pub fn run_study(
    composer: &Composer,
    config: StudyConfig,
    runtime: Vec<Override>,
    task: Vec<Override>,
    argv: &[String],
    local: LocalOptions,
) -> Result<StudyRun, LaunchError> {
    let (study_dir, study, first_job) = create_study(composer, config, runtime, task, argv)?;
    if study_dir.launcher() == LauncherKind::Slurm.as_str() {
        return Ok(StudyRun::Slurm(study_dir.plan.dir().to_path_buf()));
    }
    drive(composer, &study_dir, study, vec![first_job], local).map(StudyRun::Ran)
}

/// Creates a new study's sweep directory and `study.json`, with its first trial sampled and
/// its job prepared (not started).
pub fn create_study(
    composer: &Composer,
    config: StudyConfig,
    runtime: Vec<Override>,
    task: Vec<Override>,
    argv: &[String],
) -> Result<(StudyDir, StudyFile, PreparedJob), LaunchError> {
    let space = search_space(&task)?;
    // The first trial's sample decides the directory, the launcher and the default metric.
    let mut probe = StudyFile {
        version: STUDY_VERSION,
        config: config.clone(),
        metric: String::new(),
        direction: Direction::Minimize,
        space: space.clone(),
        runtime_overrides: runtime.iter().map(|o| o.input.clone()).collect(),
        config_name: composer.options().config_name.clone(),
        validate: composer.validates(),
        trials: Vec::new(),
        pruner: config.pruner.clone(),
    };
    // Sampled before any result exists, so the direction (decided below) plays no part.
    let first_params = sampler_for(&config, probe.direction).sample(&space, &[]);
    let mut parsed = runtime.clone();
    for text in space.overrides(&first_params) {
        parsed.push(parse_override(&text).map_err(ConfigError::from)?);
    }
    let first = composer.compose_parsed(&parsed, Some(0))?;
    let study_dir = StudyDir::create(composer, &first, runtime, argv)?;
    let first_job = study_dir.add_job(composer, 0, &space.overrides(&first_params))?;
    probe.metric = config
        .metric
        .clone()
        .unwrap_or_else(|| default_metric(&first_job));
    probe.direction = config
        .direction
        .unwrap_or(match Mode::for_metric(&probe.metric) {
            Mode::Min => Direction::Minimize,
            Mode::Max => Direction::Maximize,
        });
    probe.trials.push(Trial::new(0, first_params));
    probe.write(study_dir.plan.dir())?;
    Ok((study_dir, probe, first_job))
}

/// A composer over the sweep directory's copy of its config directory.
pub fn study_composer(
    sweep_dir: &Path,
    study: &StudyFile,
    fallbacks: Vec<Fallback>,
) -> Result<Composer, ConfigError> {
    let mut composer = Composer::new(ComposeOptions {
        config_dir: sweep_dir.join(crate::rundir::snapshot::SNAPSHOT_DIR),
        config_name: study.config_name.clone(),
    })?;
    composer.set_validate(study.validate);
    composer.set_fallbacks(fallbacks);
    Ok(composer)
}

/// The study directory of an existing study, its composer and plan.
fn reopen(
    sweep_dir: &Path,
    study: &StudyFile,
    fallbacks: Vec<Fallback>,
    argv: &[String],
) -> Result<(Composer, StudyDir), LaunchError> {
    let composer = study_composer(sweep_dir, study, fallbacks)?;
    let runtime = study
        .runtime_overrides
        .iter()
        .map(|t| parse_override(t).map_err(ConfigError::from))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = PlanFile::sweep(sweep_dir);
    let study_dir = StudyDir::open(&composer, plan, runtime, argv)?;
    Ok((composer, study_dir))
}

/// Whether the study in `sweep_dir` runs its trials on SLURM (its plan says so).
pub fn is_slurm_study(sweep_dir: &Path) -> Result<bool, LaunchError> {
    Ok(PlanFile::sweep(sweep_dir).read()?.launcher == LauncherKind::Slurm.as_str())
}

/// `--resume-sweep` of a study: the trials that were running start again, then sampling goes
/// on to `n_trials`. A SLURM study is left to its driver ([`StudyRun::Slurm`]).
pub fn resume_study(
    sweep_dir: &Path,
    study: StudyFile,
    fallbacks: Vec<Fallback>,
    argv: &[String],
    local: LocalOptions,
) -> Result<StudyRun, LaunchError> {
    if is_slurm_study(sweep_dir)? {
        return Ok(StudyRun::Slurm(sweep_dir.to_path_buf()));
    }
    let (composer, study_dir) = reopen(sweep_dir, &study, fallbacks, argv)?;
    let plan = study_dir.plan.clone();
    let records = plan.read()?;
    let mut restart = Vec::new();
    for t in study
        .trials
        .iter()
        .filter(|t| t.state == TrialState::Running)
    {
        let Some(rec) = records.job(t.number as usize) else {
            continue;
        };
        restart.push(crate::prepared_job_from_dir(
            rec.num,
            plan.job_dir(rec),
            rec.overrides.clone(),
        )?);
    }
    drive(&composer, &study_dir, study, restart, local).map(StudyRun::Ran)
}

/// `flotilla study-drive DIR`: drives the SLURM study in `sweep_dir` to `n_trials` while
/// holding its lock (`driver.pid`). Trials RUNNING in `study.json` whose SLURM job is still
/// queued, running or completed are watched again; those whose job ended without completing
/// (or that were never submitted) are submitted again. Returns the study as it ended.
pub fn drive_slurm_study(
    sweep_dir: &Path,
    fallbacks: Vec<Fallback>,
    argv: &[String],
    opts: SlurmOptions,
    grace: Duration,
) -> Result<StudyFile, LaunchError> {
    let sweep_dir = std::path::absolute(sweep_dir)
        .map_err(|e| LaunchError::io(format!("resolving {}", sweep_dir.display()), e))?;
    let _lock = DriverLock::acquire(&sweep_dir, std::process::id() as i32)?;
    install_interrupt_handler();
    let mut study = StudyFile::read(&sweep_dir)?.ok_or_else(|| {
        LaunchError::Unsupported(format!(
            "{}: no {STUDY_FILE}; not an adaptive study",
            sweep_dir.display()
        ))
    })?;
    if !is_slurm_study(&sweep_dir)? {
        return Err(LaunchError::Unsupported(format!(
            "{}: the study runs its trials on the local launcher; use flotilla run --resume-sweep",
            sweep_dir.display()
        )));
    }
    let (composer, study_dir) = reopen(&sweep_dir, &study, fallbacks, argv)?;
    let plan = study_dir.plan.clone();
    let records = plan.read()?;
    let running: Vec<&crate::rundir::JobRecord> = study
        .trials
        .iter()
        .filter(|t| t.state == TrialState::Running)
        .filter_map(|t| records.job(t.number as usize))
        .collect();
    let ids: Vec<String> = running.iter().filter_map(|r| r.job_id.clone()).collect();
    let live = slurm::query(&ids).ok();
    let (mut resubmit, mut adopt) = (Vec::new(), Vec::new());
    for rec in running {
        let job = crate::prepared_job_from_dir(rec.num, plan.job_dir(rec), rec.overrides.clone())?;
        let Some(id) = &rec.job_id else {
            resubmit.push(job);
            continue;
        };
        let state = match live.as_ref().and_then(|l| l.get(id)) {
            Some(l) => Some(l.state),
            None => slurm::exit_marker(&job.dir, id)
                .or_else(|| live.as_ref().map(|_| JobState::Unknown)),
        };
        match state {
            // Still queued or running, or completed while no driver watched: watched again.
            None | Some(JobState::Completed) => adopt.push(job),
            Some(s) if !s.is_terminal() && s != JobState::Unknown => adopt.push(job),
            // Ended without completing: submitted again (it resumes from its checkpoint).
            Some(s) => {
                eprintln!(
                    "{} trial {}: SLURM job {id} ended {}; submitting it again",
                    stamp(),
                    rec.num,
                    s.as_str()
                );
                resubmit.push(job)
            }
        }
    }
    // `pending` is taken from its end: the lowest trial numbers first.
    resubmit.sort_by_key(|j| std::cmp::Reverse(j.num));
    eprintln!(
        "{} driving {} ({} of {} trials so far; {} in flight watched, {} to submit)",
        stamp(),
        sweep_dir.display(),
        study.trials.len(),
        study.config.n_trials,
        adopt.len(),
        resubmit.len()
    );
    let mut backend = SlurmBackend::new(plan, opts, grace);
    let cancel = Cancel::new();
    drive_with(
        &composer,
        &study_dir,
        &mut study,
        resubmit,
        adopt,
        &mut backend,
        &cancel,
    )?;
    Ok(study)
}

/// Runs the study on the local launcher until `n_trials` trials have ended (or it is
/// interrupted).
fn drive(
    composer: &Composer,
    study_dir: &StudyDir,
    mut study: StudyFile,
    start_first: Vec<PreparedJob>,
    local: LocalOptions,
) -> Result<RunReport, LaunchError> {
    if local.catch_interrupts {
        install_interrupt_handler();
    }
    let sweep_dir: PathBuf = study_dir.plan.dir().to_path_buf();
    let plan = study_dir.plan.clone();
    let max_parallel = study.config.max_parallel;
    let global = local.cancel.clone();
    let launcher = LocalLauncher::new(LocalOptions {
        max_parallel: Some(max_parallel),
        ..local
    });
    let mut backend = LocalBackend::new(launcher, plan.clone(), max_parallel);
    let result = drive_with(
        composer,
        study_dir,
        &mut study,
        start_first,
        Vec::new(),
        &mut backend,
        &global,
    );
    drop(backend);
    let (mut jobs, mut outcomes) = result?;
    // The report pairs jobs and outcomes in job order.
    jobs.sort_by_key(|j| j.num);
    outcomes.sort_by_key(|o| o.num);
    Ok(RunReport {
        run: PreparedRun {
            sweep_dir: Some(sweep_dir),
            plan,
            launcher: LauncherKind::Local,
            jobs,
        },
        outcomes,
        dry_run: false,
    })
}

/// The study loop, whatever runs the trials: it fills the free slots (`max_parallel`) with
/// `pending` trials (taken from the end), then new samples; reads the running trials'
/// metrics and asks the pruner at every new value (stopping a pruned trial); records each
/// ended trial; writes `study.json` after every change. `adopted` are trials already running
/// (started by an earlier driver). Returns the jobs it ran and their outcomes; the study is
/// written whatever happens.
pub fn drive_with(
    composer: &Composer,
    study_dir: &StudyDir,
    study: &mut StudyFile,
    pending: Vec<PreparedJob>,
    adopted: Vec<PreparedJob>,
    backend: &mut dyn Backend,
    global: &Cancel,
) -> Result<(Vec<PreparedJob>, Vec<JobOutcome>), LaunchError> {
    let mut pruner = study.pruner.clone();
    let result = study_loop(
        composer,
        study_dir,
        study,
        &mut pruner,
        pending,
        adopted,
        backend,
        global,
    );
    study.pruner = pruner;
    study.write(study_dir.plan.dir())?;
    result
}

#[allow(clippy::too_many_arguments)]
fn study_loop(
    composer: &Composer,
    study_dir: &StudyDir,
    study: &mut StudyFile,
    pruner: &mut Option<SuccessiveHalving>,
    mut pending: Vec<PreparedJob>,
    adopted: Vec<PreparedJob>,
    backend: &mut dyn Backend,
    global: &Cancel,
) -> Result<(Vec<PreparedJob>, Vec<JobOutcome>), LaunchError> {
    let sweep_dir: PathBuf = study_dir.plan.dir().to_path_buf();
    let plan = study_dir.plan.clone();
    let max_parallel = study.config.max_parallel;
    let mut sampler = sampler_for(&study.config, study.direction);
    let mut running: HashMap<usize, Running> = HashMap::new();
    let mut outcomes: Vec<JobOutcome> = Vec::new();
    let mut jobs: Vec<PreparedJob> = Vec::new();
    let only = [study.metric.clone()];
    let mut error: Option<LaunchError> = None;
    for job in adopted {
        backend.adopt(&job)?;
        jobs.push(job.clone());
        running.insert(
            job.num,
            Running {
                job,
                pruned_at: None,
            },
        );
    }
    loop {
        if backend.detached() && (error.is_some() || global.is_cancelled()) {
            break;
        }
        // Fill the free slots: restarted trials first, then new samples.
        while error.is_none() && !global.is_cancelled() && running.len() < max_parallel {
            let job = match pending.pop() {
                Some(job) => job,
                None if study.trials.len() < study.config.n_trials => {
                    let params = sampler.sample(&study.space, &study.trials);
                    let number = next_number(&study.trials);
                    let overrides = study.space.overrides(&params);
                    match study_dir.add_job(composer, number as usize, &overrides) {
                        Ok(job) => {
                            study.trials.push(Trial::new(number, params));
                            study.write(&sweep_dir)?;
                            job
                        }
                        Err(e) => {
                            error = Some(e.into());
                            break;
                        }
                    }
                }
                None => break,
            };
            if let Err(e) = backend.start(&job) {
                error = Some(e);
                break;
            }
            jobs.push(job.clone());
            running.insert(
                job.num,
                Running {
                    job,
                    pruned_at: None,
                },
            );
        }
        if running.is_empty() || (backend.detached() && error.is_some()) {
            break;
        }
        for (number, outcome) in backend.wait(POLL, global) {
            let Some(run) = running.remove(&number) else {
                continue;
            };
            let mut outcome = match outcome {
                Ok(o) => o,
                Err(e) => {
                    error.get_or_insert(e);
                    continue;
                }
            };
            if let Some((state, message)) = finish(study, &plan, &run, &outcome, &only)? {
                outcome.state = state;
                outcome.message = Some(message);
            }
            outcomes.push(outcome);
            study.pruner = pruner.clone();
            study.write(&sweep_dir)?;
        }
        // Read the running trials' metrics; the pruner decides at every new value.
        let mut changed = false;
        for (number, run) in running.iter_mut() {
            let Some(series) = read_series(&run.job.dir, &only) else {
                continue;
            };
            let Some(pos) = study.trials.iter().position(|t| t.number == *number as u64) else {
                continue;
            };
            for (step, value) in series {
                if study.trials[pos].intermediate.get(&step) == Some(&value) {
                    continue;
                }
                study.trials[pos].report(step, value);
                changed = true;
                if let (Some(p), None) = (pruner.as_mut(), run.pruned_at) {
                    let mut trial = study.trials[pos].clone();
                    if p.prune(&mut trial, &study.trials, study.direction) {
                        run.pruned_at = Some((step, value));
                        backend.stop(*number);
                    }
                    study.trials[pos] = trial;
                }
            }
        }
        if changed {
            study.pruner = pruner.clone();
            study.write(&sweep_dir)?;
        }
        if error.is_some() {
            for number in running.keys() {
                backend.stop(*number);
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok((jobs, outcomes)),
    }
}

/// The metric's points in a job directory, as `flotilla report` reads them.
fn read_series(job_dir: &Path, only: &[String]) -> Option<Vec<(u64, f64)>> {
    let m = read_job_metrics_named(job_dir, Some(only));
    m.get(&only[0]).cloned()
}

/// Records how a trial ended; returns the job's state and its reason when the study changes
/// what the launcher saw (a stopped trial that was pruned, a completed one without its metric).
fn finish(
    study: &mut StudyFile,
    plan: &PlanFile,
    run: &Running,
    outcome: &JobOutcome,
    only: &[String],
) -> Result<Option<(JobState, String)>, LaunchError> {
    let number = run.job.num as u64;
    let Some(trial) = study.trials.iter_mut().find(|t| t.number == number) else {
        return Ok(None);
    };
    if let Some(series) = read_series(&run.job.dir, only) {
        for (step, value) in series {
            trial.report(step, value);
        }
    }
    let changed = match (outcome.state, run.pruned_at) {
        (JobState::Completed, _) => match trial.intermediate.values().next_back() {
            // As Optuna: a NaN objective fails the trial.
            Some(v) if v.is_nan() => {
                trial.state = TrialState::Failed;
                Some((
                    JobState::Failed,
                    format!("its final {} is NaN", study.metric),
                ))
            }
            Some(v) => {
                trial.value = Some(*v);
                trial.state = TrialState::Complete;
                None
            }
            None => {
                trial.state = TrialState::Failed;
                Some((
                    JobState::Failed,
                    format!("it ended without logging {}", study.metric),
                ))
            }
        },
        (JobState::Cancelled, Some((step, value))) => {
            trial.state = TrialState::Pruned;
            Some((
                JobState::Pruned,
                format!(
                    "pruned at step {step} ({} {})",
                    study.metric,
                    format_value(value)
                ),
            ))
        }
        // Interrupted: still RUNNING in the study, so that --resume-sweep starts it again.
        (JobState::Cancelled, None) => None,
        _ => {
            trial.state = TrialState::Failed;
            None
        }
    };
    if let Some((state, message)) = &changed {
        plan.set_state(run.job.num, *state, Some(message.clone()))?;
    }
    Ok(changed)
}

/// A one-line summary of a study: trials by state and the best trial.
pub fn summary(study: &StudyFile) -> String {
    let count = |s: TrialState| study.trials.iter().filter(|t| t.state == s).count();
    let mut out = format!(
        "study: {} trials ({} complete, {} pruned, {} failed, {} unfinished) of {}, {} {}",
        study.trials.len(),
        count(TrialState::Complete),
        count(TrialState::Pruned),
        count(TrialState::Failed),
        count(TrialState::Running),
        study.config.n_trials,
        study.direction.as_str(),
        study.metric
    );
    if let Some(best) = study.best() {
        out.push_str(&format!(
            "\nbest: trial {} {} = {} ({})",
            best.number,
            study.metric,
            format_value(best.value.unwrap_or(f64::NAN)),
            study.space.overrides(&best.params).join(" ")
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_config::sweep::sweep_overrides;

    /// A backend that runs nothing: a trial "ends" (oldest first, one per wait) after writing
    /// `100 - number` as its loss, or fails when its number is `fail`.
    #[derive(Default)]
    struct Fake {
        started: Vec<usize>,
        adopted: Vec<usize>,
        in_flight: Vec<(usize, PathBuf)>,
        most_in_flight: usize,
        fail: Option<usize>,
    }

    impl Backend for Fake {
        fn start(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
            self.started.push(job.num);
            self.in_flight.push((job.num, job.dir.clone()));
            self.most_in_flight = self.most_in_flight.max(self.in_flight.len());
            Ok(())
        }

        fn adopt(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
            self.adopted.push(job.num);
            self.in_flight.push((job.num, job.dir.clone()));
            Ok(())
        }

        fn wait(
            &mut self,
            _timeout: Duration,
            _cancel: &Cancel,
        ) -> Vec<(usize, Result<JobOutcome, LaunchError>)> {
            if self.in_flight.is_empty() {
                return Vec::new();
            }
            let (num, dir) = self.in_flight.remove(0);
            let state = if self.fail == Some(num) {
                JobState::Failed
            } else {
                let csv = format!("step,loss\n1,{}\n", 100.0 - num as f64);
                std::fs::write(dir.join("metrics.csv"), csv).unwrap();
                JobState::Completed
            };
            let outcome = JobOutcome {
                num,
                dir,
                job_id: None,
                state,
                failure: None,
                message: None,
            };
            vec![(num, Ok(outcome))]
        }

        fn stop(&mut self, _num: usize) {}

        fn detached(&self) -> bool {
            false
        }
    }

    fn new_study(root: &Path, name: &str) -> (Composer, StudyDir, StudyFile, PreparedJob) {
        std::fs::create_dir_all(root.join("conf")).unwrap();
        std::fs::write(
            root.join("conf/config.yaml"),
            "x: 0.0\nflotilla:\n  task:\n    command: ['true']\n",
        )
        .unwrap();
        let composer = Composer::new(ComposeOptions {
            config_dir: root.join("conf"),
            config_name: "config".into(),
        })
        .unwrap();
        let texts = [
            "x=interval(0, 1)".to_string(),
            format!("flotilla.sweep.dir={}", root.join(name).display()),
        ];
        let parsed = composer.parse_overrides(&texts).unwrap();
        let sweep = sweep_overrides(&composer, parsed, None).unwrap();
        let config = StudyConfig {
            sampler: SamplerKind::Random,
            n_trials: 5,
            seed: 0,
            metric: Some("loss".into()),
            direction: None,
            max_parallel: 2,
            pruner: None,
            multivariate: false,
        };
        let (dir, study, first) =
            create_study(&composer, config, sweep.runtime, sweep.task, &[]).unwrap();
        (composer, dir, study, first)
    }

    #[test]
    fn the_loop_fills_its_slots_and_records_each_trial_whatever_runs_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (composer, dir, mut study, first) = new_study(tmp.path(), "a");
        let mut fake = Fake {
            fail: Some(3),
            ..Fake::default()
        };
        let (jobs, outcomes) = drive_with(
            &composer,
            &dir,
            &mut study,
            vec![first],
            Vec::new(),
            &mut fake,
            &Cancel::new(),
        )
        .unwrap();
        assert_eq!(fake.started, [0, 1, 2, 3, 4]);
        assert_eq!(fake.most_in_flight, 2, "max_parallel trials at once");
        assert_eq!((jobs.len(), outcomes.len()), (5, 5));
        let on_disk = StudyFile::read(dir.plan.dir()).unwrap().unwrap();
        assert_eq!(on_disk, study);
        for t in &study.trials {
            if t.number == 3 {
                assert_eq!(t.state, TrialState::Failed);
            } else {
                assert_eq!(t.state, TrialState::Complete, "{t:?}");
                assert_eq!(t.value, Some(100.0 - t.number as f64));
            }
        }
        assert_eq!(dir.plan.read().unwrap().jobs.len(), 5);

        // A trial already running (an earlier driver's) is watched, not started again.
        let (composer, dir, mut study, first) = new_study(tmp.path(), "b");
        let mut fake = Fake::default();
        drive_with(
            &composer,
            &dir,
            &mut study,
            Vec::new(),
            vec![first],
            &mut fake,
            &Cancel::new(),
        )
        .unwrap();
        assert_eq!(fake.adopted, [0]);
        assert_eq!(fake.started, [1, 2, 3, 4]);
        assert!(study.trials.iter().all(|t| t.state == TrialState::Complete));
    }
}
