//! What runs a study's trials: the [`TrialRunner`] trait the study loop
//! ([`drive_with`](super::drive_with)) drives, and its two implementations, the local
//! launcher's threads ([`LocalTrialRunner`]) and SLURM batch jobs ([`SlurmTrialRunner`], which
//! submits, polls and cancels through [`crate::slurm`]).

use crate::local::{Cancel, LocalLauncher};
use crate::rundir::{JobState, PlanFile, PreparedJob};
use crate::slurm::{self, JobSpec, SlurmOptions};
use crate::{JobOutcome, LaunchError};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Where a study's trials run. The study loop ([`drive_with`](super::drive_with)) decides what
/// runs and when a trial is stopped; a trial runner only starts trials, says when they have
/// ended, and stops them: the local launcher's threads ([`LocalTrialRunner`]) or SLURM jobs
/// ([`SlurmTrialRunner`]).
pub trait TrialRunner {
    /// Starts trial `job` (its directory prepared, its record in the plan).
    fn start(&mut self, job: &PreparedJob) -> Result<(), LaunchError>;
    /// Watches a trial that an earlier driver started, as if started here.
    fn adopt(&mut self, job: &PreparedJob) -> Result<(), LaunchError>;
    /// Waits about `timeout` (less once `cancel` trips) and returns the trials that ended
    /// since the last call, with their outcomes. A trial stopped by [`TrialRunner::stop`] ends
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

/// The local launcher's trial runner: one thread per running trial.
pub struct LocalTrialRunner {
    launcher: Arc<LocalLauncher>,
    plan: PlanFile,
    max_parallel: usize,
    tx: mpsc::Sender<(usize, Result<JobOutcome, LaunchError>)>,
    rx: mpsc::Receiver<(usize, Result<JobOutcome, LaunchError>)>,
    stops: HashMap<usize, Cancel>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LocalTrialRunner {
    pub fn new(launcher: LocalLauncher, plan: PlanFile, max_parallel: usize) -> LocalTrialRunner {
        let (tx, rx) = mpsc::channel();
        LocalTrialRunner {
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

impl TrialRunner for LocalTrialRunner {
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

impl Drop for LocalTrialRunner {
    fn drop(&mut self) {
        for stop in self.stops.values() {
            stop.cancel();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How often the SLURM trial runner asks the scheduler about its trials.
pub const SLURM_POLL: Duration = Duration::from_secs(2);

/// How often a wait checks its cancel while sleeping.
const CANCEL_CHECK: Duration = Duration::from_millis(100);

/// One trial submitted as a SLURM job.
struct Flight {
    dir: PathBuf,
    id: Option<String>,
    state: JobState,
    /// When the trial was asked to stop ([`slurm::request_stop`]).
    stop_at: Option<Instant>,
    /// Whether [`slurm::cancel`] followed after the grace period.
    killed: bool,
}

/// The SLURM trial runner: a trial is one batch job (its own sbatch script, never an array),
/// submitted with [`slurm::submit_scripts`] (which records its id in `sweep.json`), watched with
/// one [`slurm::query`] for all trials every [`SLURM_POLL`] (and the exit marker its batch
/// script writes, see [`slurm::job_state`]), stopped with [`slurm::request_stop`] and, after
/// the grace period, [`slurm::cancel`].
pub struct SlurmTrialRunner {
    plan: PlanFile,
    opts: SlurmOptions,
    grace: Duration,
    interval: Duration,
    next_poll: Instant,
    flights: HashMap<usize, Flight>,
}

impl SlurmTrialRunner {
    pub fn new(plan: PlanFile, opts: SlurmOptions, grace: Duration) -> SlurmTrialRunner {
        SlurmTrialRunner {
            plan,
            opts,
            grace,
            interval: SLURM_POLL,
            next_poll: Instant::now(),
            flights: HashMap::new(),
        }
    }

    /// Polls every `interval` instead of [`SLURM_POLL`].
    pub fn with_interval(mut self, interval: Duration) -> SlurmTrialRunner {
        self.interval = interval;
        self
    }

    /// Sleeps until the next poll is due; `false` when `timeout` runs out first or `cancel`
    /// trips.
    fn poll_due(&self, timeout: Duration, cancel: &Cancel) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cancel.is_cancelled() {
                return false;
            }
            let now = Instant::now();
            if now >= self.next_poll {
                return true;
            }
            if now >= deadline {
                return false;
            }
            std::thread::sleep(
                self.next_poll
                    .min(deadline)
                    .saturating_duration_since(now)
                    .min(CANCEL_CHECK),
            );
        }
    }
}

impl TrialRunner for SlurmTrialRunner {
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
        tracing::info!(
            "trial {}: submitted as SLURM job {}",
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
        tracing::info!(
            "trial {}: watching SLURM job {} again",
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
        timeout: Duration,
        cancel: &Cancel,
    ) -> Vec<(usize, Result<JobOutcome, LaunchError>)> {
        if !self.poll_due(timeout, cancel) {
            return Vec::new();
        }
        self.next_poll = Instant::now() + self.interval;
        let ids: Vec<String> = self.flights.values().filter_map(|f| f.id.clone()).collect();
        let live = match slurm::query(&ids) {
            Ok(live) => Some(live),
            Err(e) => {
                tracing::warn!("cannot ask the scheduler: {e}");
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
            let Some(state) = slurm::job_state(live.as_ref(), &f.dir, &id) else {
                continue;
            };
            if state.is_terminal() || state == JobState::Unknown {
                let state = match (f.stop_at, state) {
                    (_, JobState::Completed) => JobState::Completed,
                    (Some(_), _) => JobState::Cancelled,
                    (None, s) => s,
                };
                let message = match state {
                    JobState::Unknown => Some(format!(
                        "SLURM job {id} is no longer known to the scheduler and left no exit marker"
                    )),
                    s => slurm::end_message(s, &f.dir),
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
                    if let Err(e) = slurm::cancel(&id) {
                        tracing::warn!("trial {num}: {e}");
                    }
                }
            }
        }
        for (num, state) in changes {
            if let Err(e) = self.plan.set_state(num, state, None) {
                tracing::warn!("trial {num}: {e}");
            }
        }
        let mut out = Vec::new();
        for (num, state, message) in ended {
            let f = self.flights.remove(&num).expect("a trial in flight");
            tracing::info!(
                "trial {num}: SLURM job {} ended {}",
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
            tracing::info!("trial {num}: stopping SLURM job {id}");
            if let Err(e) = slurm::request_stop(id) {
                tracing::warn!("trial {num}: {e}");
            }
        }
    }

    fn detached(&self) -> bool {
        true
    }
}
