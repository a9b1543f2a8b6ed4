//! A study from start to end, as the commands see it: [`run_study`] creates a new one (and on
//! the local launcher drives it here), [`resume_study`] goes on with one after an interruption,
//! and [`drive_slurm_study`] is the detached driver of a study whose trials are SLURM jobs
//! (`flotilla study-drive DIR`). Each builds the study's trial runner and hands it to the loop
//! ([`drive_with`]).

use super::detach::DriverLock;
use super::drive_with;
use super::file::{StudyFile, STUDY_FILE, STUDY_VERSION};
use super::sampling::{sampler_for, search_space};
use super::trial_runner::{LocalTrialRunner, SlurmTrialRunner};
use crate::local::{install_interrupt_handler, Cancel, LocalLauncher, LocalOptions};
use crate::rundir::snapshot::SNAPSHOT_DIR;
use crate::rundir::trials::StudyDir;
use crate::rundir::{JobRecord, JobState, PlanFile, PreparedJob, PreparedRun};
use crate::slurm::{self, SlurmOptions};
use crate::{prepared_job_from_dir, LaunchError, RunReport};
use flotilla_config::overrides::{parse_override, Override};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::{ComposeOptions, Composer, ConfigError, Fallback};
use flotilla_contract::metrics::Mode;
use flotilla_study::config::StudyConfig;
use flotilla_study::{Direction, Trial, TrialState};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The metric a study optimises when its config names none: `eval_loss` for the built-in
/// trainer with evaluation on, else `loss`.
fn default_metric(first: &PreparedJob) -> String {
    match &first.config {
        Some(c) if c.trainer.eval_every > 0 => "eval_loss".into(),
        _ => "loss".into(),
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
    match study_dir.launcher() {
        LauncherKind::Slurm => Ok(StudyRun::Slurm(study_dir.plan.dir().to_path_buf())),
        LauncherKind::Local => {
            drive(composer, &study_dir, study, vec![first_job], local).map(StudyRun::Ran)
        }
    }
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
        config_dir: sweep_dir.join(SNAPSHOT_DIR),
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
    Ok(PlanFile::sweep(sweep_dir).read()?.launcher == LauncherKind::Slurm)
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
        restart.push(prepared_job_from_dir(
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
    let running: Vec<&JobRecord> = study
        .trials
        .iter()
        .filter(|t| t.state == TrialState::Running)
        .filter_map(|t| records.job(t.number as usize))
        .collect();
    let ids: Vec<String> = running.iter().filter_map(|r| r.job_id.clone()).collect();
    let live = slurm::query(&ids).ok();
    let (mut resubmit, mut adopt) = (Vec::new(), Vec::new());
    for rec in running {
        let job = prepared_job_from_dir(rec.num, plan.job_dir(rec), rec.overrides.clone())?;
        let Some(id) = &rec.job_id else {
            resubmit.push(job);
            continue;
        };
        match slurm::job_state(live.as_ref(), &job.dir, id) {
            // Still queued or running, or completed while no driver watched: watched again.
            None | Some(JobState::Completed) => adopt.push(job),
            Some(s) if !s.is_terminal() && s != JobState::Unknown => adopt.push(job),
            // Ended without completing: submitted again (it resumes from its checkpoint).
            Some(s) => {
                tracing::info!(
                    "trial {}: SLURM job {id} ended {}; submitting it again",
                    rec.num,
                    s.as_str()
                );
                resubmit.push(job)
            }
        }
    }
    // `pending` is taken from its end: the lowest trial numbers first.
    resubmit.sort_by_key(|j| std::cmp::Reverse(j.num));
    tracing::info!(
        "driving {} ({} of {} trials so far; {} in flight watched, {} to submit)",
        sweep_dir.display(),
        study.trials.len(),
        study.config.n_trials,
        adopt.len(),
        resubmit.len()
    );
    let mut runner = SlurmTrialRunner::new(plan, opts, grace);
    let cancel = Cancel::new();
    drive_with(
        &composer,
        &study_dir,
        &mut study,
        resubmit,
        adopt,
        &mut runner,
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
    let mut runner = LocalTrialRunner::new(launcher, plan.clone(), max_parallel);
    let result = drive_with(
        composer,
        study_dir,
        &mut study,
        start_first,
        Vec::new(),
        &mut runner,
        &global,
    );
    drop(runner);
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
