//! The driver of an adaptive study on the local launcher: it samples a trial whenever one of
//! `max_parallel` slots is free (the sampler sees the running trials, so slots never wait for a
//! batch), prepares its job directory in the sweep directory, runs it, reads the metric from its
//! metrics file as `flotilla report` does, asks the pruner at every new value and stops a pruned
//! trial (SIGTERM: the built-in trainer checkpoints and exits), and writes the whole study to
//! `study.json` after every change. `flotilla run --resume-sweep DIR` reopens the study: trials
//! that were running are started again from their own directories (the trainer resumes from its
//! checkpoint) and sampling goes on until `n_trials`.

use super::config::{SamplerKind, StudyConfig};
use super::{
    best_trial, next_number, Direction, RandomSampler, Sampler, SearchSpace, SuccessiveHalving,
    TpeOptions, TpeSampler, Trial, TrialState,
};
use crate::local::{install_interrupt_handler, Cancel, LocalLauncher, LocalOptions};
use crate::report::metrics::read_job_metrics_named;
use crate::report::Mode;
use crate::rundir::trials::StudyDir;
use crate::rundir::{write_atomic, JobState, PlanFile, PreparedJob, PreparedRun, RunDirError};
use crate::{JobOutcome, LaunchError, RunReport};
use flotilla_config::overrides::{parse_override, Override};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::{ComposeOptions, Composer, ConfigError, Fallback};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// The study file in the sweep directory.
pub const STUDY_FILE: &str = "study.json";
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

fn sampler_for(study: &StudyFile) -> Box<dyn Sampler> {
    match study.config.sampler {
        SamplerKind::Random => Box::new(RandomSampler::new(study.config.seed)),
        SamplerKind::Tpe => Box::new(TpeSampler::new(
            TpeOptions {
                seed: study.config.seed,
                ..TpeOptions::default()
            },
            study.direction,
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
    let study = StudyFile {
        version: STUDY_VERSION,
        config: config.clone(),
        metric: String::new(),
        direction: config.direction.unwrap_or_default(),
        space: space.clone(),
        runtime_overrides: Vec::new(),
        config_name: String::new(),
        validate: true,
        trials: Vec::new(),
        pruner: None,
    };
    let mut sampler = sampler_for(&study);
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
    stop: Cancel,
    pruned_at: Option<(u64, f64)>,
}

/// Starts a new study: `config` from the runtime node, `runtime`/`task` the multirun's
/// overrides.
pub fn run_study(
    composer: &Composer,
    config: StudyConfig,
    runtime: Vec<Override>,
    task: Vec<Override>,
    argv: &[String],
    local: LocalOptions,
) -> Result<RunReport, LaunchError> {
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
    let first_params = sampler_for(&probe).sample(&space, &[]);
    let mut parsed = runtime.clone();
    for text in space.overrides(&first_params) {
        parsed.push(parse_override(&text).map_err(ConfigError::from)?);
    }
    let first = composer.compose_parsed(&parsed, Some(0))?;
    let study_dir = StudyDir::create(composer, &first, runtime, argv)?;
    if study_dir.launcher() != LauncherKind::Local.as_str() {
        let _ = std::fs::remove_dir_all(study_dir.plan.dir());
        return Err(LaunchError::Unsupported(format!(
            "adaptive sweeps ({}) run their trials on the local launcher; compute.launcher is {}. On a cluster, start the study inside an allocation (e.g. `salloc ... flotilla run -m ...` with compute=local), or sweep a grid (flotilla.sweeper.sampler=grid)",
            config.sampler.as_str(),
            study_dir.launcher()
        )));
    }
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
    drive(composer, &study_dir, probe, vec![first_job], local)
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

/// `--resume-sweep` of a study: the trials that were running start again, then sampling goes
/// on to `n_trials`.
pub fn resume_study(
    sweep_dir: &Path,
    study: StudyFile,
    fallbacks: Vec<Fallback>,
    argv: &[String],
    local: LocalOptions,
) -> Result<RunReport, LaunchError> {
    let composer = study_composer(sweep_dir, &study, fallbacks)?;
    let runtime = study
        .runtime_overrides
        .iter()
        .map(|t| parse_override(t).map_err(ConfigError::from))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = PlanFile::sweep(sweep_dir);
    let study_dir = StudyDir::open(&composer, plan.clone(), runtime, argv)?;
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
    drive(&composer, &study_dir, study, restart, local)
}

/// Runs the study until `n_trials` trials have ended (or it is interrupted).
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
    let launcher = LocalLauncher::new(LocalOptions {
        max_parallel: Some(max_parallel),
        ..local.clone()
    });
    let global = local.cancel.clone();
    let mut sampler = sampler_for(&study);
    let mut pruner = study.pruner.clone();
    let mut pending: Vec<PreparedJob> = start_first;
    let mut running: HashMap<u64, Running> = HashMap::new();
    let mut outcomes: Vec<JobOutcome> = Vec::new();
    let mut jobs: Vec<PreparedJob> = Vec::new();
    let (tx, rx) = mpsc::channel::<(u64, Result<JobOutcome, LaunchError>)>();
    let only = [study.metric.clone()];

    let result = std::thread::scope(|scope| -> Result<(), LaunchError> {
        let mut error: Option<LaunchError> = None;
        loop {
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
                let number = job.num as u64;
                let stop = Cancel::new();
                let (tx, launcher, plan, run_stop, run_job) =
                    (tx.clone(), &launcher, &plan, stop.clone(), job.clone());
                scope.spawn(move || {
                    let outcome =
                        launcher.run_job_until(&run_job, Some(plan), max_parallel, &run_stop);
                    let _ = tx.send((number, outcome));
                });
                jobs.push(job.clone());
                running.insert(
                    number,
                    Running {
                        job,
                        stop,
                        pruned_at: None,
                    },
                );
            }
            if running.is_empty() {
                break;
            }
            match rx.recv_timeout(POLL) {
                Ok((number, outcome)) => {
                    let run = running.remove(&number).expect("a running trial");
                    let mut outcome = match outcome {
                        Ok(o) => o,
                        Err(e) => {
                            error.get_or_insert(e);
                            continue;
                        }
                    };
                    if let Some((state, message)) =
                        finish(&mut study, &plan, &run, &outcome, &only)?
                    {
                        outcome.state = state;
                        outcome.message = Some(message);
                    }
                    outcomes.push(outcome);
                    study.pruner = pruner.clone();
                    study.write(&sweep_dir)?;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            // Read the running trials' metrics; the pruner decides at every new value.
            let mut changed = false;
            for (number, run) in running.iter_mut() {
                let Some(series) = read_series(&run.job.dir, &only) else {
                    continue;
                };
                let Some(pos) = study.trials.iter().position(|t| t.number == *number) else {
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
                            run.stop.cancel();
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
                for run in running.values() {
                    run.stop.cancel();
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    });
    study.pruner = pruner;
    study.write(&sweep_dir)?;
    result?;
    // The report pairs jobs and outcomes in job order.
    jobs.sort_by_key(|j| j.num);
    outcomes.sort_by_key(|o| o.num);
    Ok(RunReport {
        run: PreparedRun {
            sweep_dir: Some(sweep_dir.clone()),
            plan,
            launcher: LauncherKind::Local,
            jobs,
        },
        outcomes,
        dry_run: false,
    })
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
                    crate::report::render::number(value)
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
            crate::report::render::number(best.value.unwrap_or(f64::NAN)),
            study.space.overrides(&best.params).join(" ")
        ));
    }
    out.push('\n');
    out
}
