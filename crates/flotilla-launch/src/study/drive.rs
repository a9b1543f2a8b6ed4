//! The study loop ([`drive_with`]), whatever runs the trials: it samples a trial whenever one
//! of `max_parallel` slots is free (the sampler sees the running trials, so slots never wait for
//! a batch), prepares its job directory in the sweep directory, has a [`TrialRunner`] run it,
//! reads the metric from its metrics file as `flotilla report` does, asks the pruner at every
//! new value and stops a pruned trial, and writes the whole study to `study.json` after every
//! change.

use super::file::StudyFile;
use super::sampling::sampler_for;
use super::trial_runner::TrialRunner;
use crate::local::Cancel;
use crate::rundir::trials::StudyDir;
use crate::rundir::{JobState, PlanFile, PreparedJob};
use crate::{JobOutcome, LaunchError};
use flotilla_config::Composer;
use flotilla_contract::metrics::{format_value, read_job_metrics_named};
use flotilla_study::{next_number, SuccessiveHalving, Trial, TrialState};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often running trials' metrics are read.
const POLL: Duration = Duration::from_millis(500);

/// One running trial.
struct Running {
    job: PreparedJob,
    pruned_at: Option<(u64, f64)>,
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
    runner: &mut dyn TrialRunner,
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
        runner,
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
    runner: &mut dyn TrialRunner,
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
        runner.adopt(&job)?;
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
        if runner.detached() && (error.is_some() || global.is_cancelled()) {
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
            if let Err(e) = runner.start(&job) {
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
        if running.is_empty() || (runner.detached() && error.is_some()) {
            break;
        }
        for (number, outcome) in runner.wait(POLL, global) {
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
                        runner.stop(*number);
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
                runner.stop(*number);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::create_study;
    use flotilla_config::sweep::sweep_overrides;
    use flotilla_config::ComposeOptions;
    use flotilla_study::config::{SamplerKind, StudyConfig};

    /// A trial runner that runs nothing: a trial "ends" (oldest first, one per wait) after writing
    /// `100 - number` as its loss, or fails when its number is `fail`.
    #[derive(Default)]
    struct Fake {
        started: Vec<usize>,
        adopted: Vec<usize>,
        in_flight: Vec<(usize, PathBuf)>,
        most_in_flight: usize,
        fail: Option<usize>,
    }

    impl TrialRunner for Fake {
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
