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
            if let Some((state, message)) = finish(study, pruner, &plan, &run, &outcome, &only)? {
                outcome.state = state;
                outcome.message = Some(message);
            }
            outcomes.push(outcome);
            study.pruner = pruner.clone();
            study.write(&sweep_dir)?;
        }
        // Read the running trials' metrics; the pruner decides at every new value, the trials
        // taken in order of number (decisions at a rung depend on the values recorded there
        // before: the same files give the same decisions).
        let mut changed = false;
        let mut numbers: Vec<usize> = running.keys().copied().collect();
        numbers.sort_unstable();
        for number in &numbers {
            let Some(run) = running.get_mut(number) else {
                continue;
            };
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
/// The values a completed trial logged after the driver last read its metrics go through the
/// pruner as the others did, so that the rungs they reach are recorded for the trials still
/// running to compete with (the trial itself completed: nothing is stopped).
fn finish(
    study: &mut StudyFile,
    pruner: &mut Option<SuccessiveHalving>,
    plan: &PlanFile,
    run: &Running,
    outcome: &JobOutcome,
    only: &[String],
) -> Result<Option<(JobState, String)>, LaunchError> {
    let number = run.job.num as u64;
    let Some(pos) = study.trials.iter().position(|t| t.number == number) else {
        return Ok(None);
    };
    let mut deciding = outcome.state == JobState::Completed && run.pruned_at.is_none();
    if let Some(series) = read_series(&run.job.dir, only) {
        for (step, value) in series {
            let new = study.trials[pos].intermediate.get(&step) != Some(&value);
            study.trials[pos].report(step, value);
            if let (true, true, Some(p)) = (new, deciding, pruner.as_mut()) {
                let mut trial = study.trials[pos].clone();
                // Pruned here: it would have been stopped at this step; its later values
                // reach no rung.
                deciding = !p.prune(&mut trial, &study.trials, study.direction);
                study.trials[pos] = trial;
            }
        }
    }
    let trial = &mut study.trials[pos];
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
    use flotilla_study::MinResource;

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

    /// A trial runner whose trials all advance one step per wait, in the order they started:
    /// trial `n` logs `values[n]` at steps 1, 2, ... `steps` and then completes; a trial
    /// asked to stop ends (CANCELLED) at the next wait, before the others advance.
    struct Stepper {
        values: Vec<f64>,
        steps: u64,
        in_flight: Vec<(usize, PathBuf, u64)>,
        stopping: Vec<usize>,
    }

    impl Stepper {
        fn outcome(
            num: usize,
            dir: &Path,
            state: JobState,
        ) -> (usize, Result<JobOutcome, LaunchError>) {
            let outcome = JobOutcome {
                num,
                dir: dir.to_path_buf(),
                job_id: None,
                state,
                failure: None,
                message: None,
            };
            (num, Ok(outcome))
        }
    }

    impl TrialRunner for Stepper {
        fn start(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
            self.in_flight.push((job.num, job.dir.clone(), 0));
            Ok(())
        }

        fn adopt(&mut self, job: &PreparedJob) -> Result<(), LaunchError> {
            self.start(job)
        }

        fn wait(
            &mut self,
            _timeout: Duration,
            _cancel: &Cancel,
        ) -> Vec<(usize, Result<JobOutcome, LaunchError>)> {
            let mut ended = Vec::new();
            let stopping = std::mem::take(&mut self.stopping);
            self.in_flight.retain(|(num, dir, _)| {
                let stop = stopping.contains(num);
                if stop {
                    ended.push(Stepper::outcome(*num, dir, JobState::Cancelled));
                }
                !stop
            });
            for (num, dir, step) in &mut self.in_flight {
                *step += 1;
                let mut csv = String::from("step,loss\n");
                for s in 1..=*step {
                    csv.push_str(&format!("{s},{}\n", self.values[*num]));
                }
                std::fs::write(dir.join("metrics.csv"), csv).unwrap();
                if *step == self.steps {
                    ended.push(Stepper::outcome(*num, dir, JobState::Completed));
                }
            }
            self.in_flight.retain(|(_, _, step)| *step < self.steps);
            ended
        }

        fn stop(&mut self, num: usize) {
            self.stopping.push(num);
        }

        fn detached(&self) -> bool {
            false
        }
    }

    #[test]
    fn successive_halving_decides_as_optuna_would_with_trials_in_flight() {
        // Rungs at steps 1, 2, 4 (min_resource 1, reduction factor 2); three trials in flight,
        // each logging one constant value for 4 steps. By hand, in the order the driver reads
        // (each wait, the trials by number), with `competing` the values recorded at the rung
        // (the trial's own included) and the trial kept while within the best
        // max(1, len // 2):
        //   wait 1: 0 (0.5) rung 0 [0.5] kept; 1 (0.3) [0.5 0.3] kept; 2 (0.7) [0.5 0.3 0.7]
        //           pruned at step 1;
        //   wait 2: 2 ends; 0 rung 1 [0.5] kept; 1 rung 1 [0.5 0.3] kept; then 3 starts;
        //   wait 3: 3 (0.2) rung 0 [0.5 0.3 0.7 0.2] kept (within the best 2);
        //   wait 4: 0 and 1 complete at step 4, their rung 2 recorded as they end ([0.5],
        //           [0.5 0.3]); 3 rung 1 [0.5 0.3 0.2] kept; then 4 and 5 start;
        //   wait 5: 4 (0.9) rung 0 [.. 0.9] pruned (the best 2 of 5 are 0.2, 0.3); 5 (0.1)
        //           rung 0 kept;
        //   wait 6: 4 ends; 3 completes, rung 2 [0.5 0.3 0.2]; 5 rung 1 [0.5 0.3 0.2 0.1];
        //   wait 8: 5 completes, rung 2 [0.5 0.3 0.2 0.1] kept.
        let tmp = tempfile::tempdir().unwrap();
        let (composer, dir, mut study, first) = new_study(tmp.path(), "asha");
        study.config.n_trials = 6;
        study.config.max_parallel = 3;
        study.pruner = Some(SuccessiveHalving::new(MinResource::Steps(1), 2, 0, 0).unwrap());
        let mut stepper = Stepper {
            values: vec![0.5, 0.3, 0.7, 0.2, 0.9, 0.1],
            steps: 4,
            in_flight: Vec::new(),
            stopping: Vec::new(),
        };
        drive_with(
            &composer,
            &dir,
            &mut study,
            vec![first],
            Vec::new(),
            &mut stepper,
            &Cancel::new(),
        )
        .unwrap();
        let states: Vec<TrialState> = study.trials.iter().map(|t| t.state).collect();
        use TrialState::{Complete, Pruned};
        assert_eq!(
            states,
            [Complete, Complete, Pruned, Complete, Pruned, Complete]
        );
        let rungs: Vec<Vec<(u32, f64)>> = study
            .trials
            .iter()
            .map(|t| t.rungs.iter().map(|(k, v)| (*k, *v)).collect())
            .collect();
        assert_eq!(
            rungs,
            [
                vec![(0, 0.5), (1, 0.5), (2, 0.5)],
                vec![(0, 0.3), (1, 0.3), (2, 0.3)],
                vec![(0, 0.7)],
                vec![(0, 0.2), (1, 0.2), (2, 0.2)],
                vec![(0, 0.9)],
                vec![(0, 0.1), (1, 0.1), (2, 0.1)],
            ]
        );
        let plan = dir.plan.read().unwrap();
        let pruned: Vec<(usize, Option<String>)> = plan
            .jobs
            .iter()
            .filter(|j| j.state == JobState::Pruned)
            .map(|j| (j.num, j.message.clone()))
            .collect();
        assert_eq!(
            pruned,
            [
                (2, Some("pruned at step 1 (loss 0.7)".to_string())),
                (4, Some("pruned at step 1 (loss 0.9)".to_string())),
            ]
        );
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
