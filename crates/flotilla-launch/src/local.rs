//! The local launcher: runs each job's ranks as processes on this machine, like `torchrun`.
//!
//! Every rank gets the torchrun variables ([`RankEnv`]: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//! `LOCAL_WORLD_SIZE`, `NODE_RANK`/`GROUP_RANK`, `GROUP_WORLD_SIZE`, `ROLE_RANK`,
//! `ROLE_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` = a free port,
//! `TORCHELASTIC_RUN_ID`), `OMP_NUM_THREADS` = its share of the cores (unless set already),
//! `CUDA_VISIBLE_DEVICES` = its device(s) when `compute.gpus_per_node > 0`, and
//! `FLOTILLA_JOB_DIR`/`FLOTILLA_JOB_NUM`. `compute.nodes > 1` simulates several nodes on this
//! host: rank `r` is local rank `r % tasks_per_node` of node `r / tasks_per_node`, and node `n`
//! uses devices `n * gpus_per_node ..`. A job that runs the user's own program starts
//! `flotilla exec-task` in each process (one per rank, or one per node with `ranks: per_node`,
//! placed as a rank holding all the node's devices), which sets the program's variables and
//! becomes it (see [`crate::user_task`]).
//!
//! Each rank's stdout and stderr go to `JOBDIR/logs/rank_<R>.log`; rank 0's are also echoed
//! to flotilla's stderr. Each rank runs in its own process group (so a terminal's Ctrl-C
//! reaches flotilla only) and dies with flotilla (`PR_SET_PDEATHSIG`). When a rank exits
//! non-zero, the others get SIGTERM, then SIGKILL after a grace period, and the job is FAILED
//! with the failing rank, its exit status and the tail of its log. SIGINT/SIGTERM to
//! flotilla (see [`install_interrupt_handler`]) or [`Cancel::cancel`] stops every rank the
//! same way and marks the jobs CANCELLED; a second interrupt skips the grace period. The jobs
//! of a sweep run one after another, or up to `compute.max_parallel` at once.

use super::{JobOutcome, LaunchError, Launcher, RankFailure, TaskCommand, TaskExit};
/// The tail of a rank's log, as every launcher reads it.
pub use crate::launcher::log_tail;
use crate::rundir::{JobState, Plan, PlanFile, PreparedJob, PreparedRun, LOGS_DIR};
use flotilla_config::schema::{ComputeConfig, TaskRanks};
use flotilla_contract::rank::{free_port, RankEnv, RankInfo, RankSource, DEFAULT_MASTER_ADDR};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The running executable, as the kernel holds it (Linux).
const SELF_EXE: &str = "/proc/self/exe";
/// How often the supervisor looks at its ranks.
const POLL: Duration = Duration::from_millis(20);
/// Lines of the failing rank's log reported.
const TAIL_LINES: usize = 20;
/// How long to wait for rank 0's output to drain after it exited.
const DRAIN: Duration = Duration::from_secs(2);

static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
/// The last signal [`on_interrupt`] caught (0: none).
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_interrupt(sig: libc::c_int) {
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

/// Makes SIGINT, SIGTERM and SIGHUP (a closed terminal, a dropped ssh session) to this process
/// request cancellation (counted by [`interrupts`]) instead of killing it, so that the local
/// launcher can stop its ranks and record the jobs as CANCELLED. Call it once, before
/// launching.
pub fn install_interrupt_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only increments an atomic, which is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_interrupt as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// How many SIGINT/SIGTERM/SIGHUP this process received since [`install_interrupt_handler`].
pub fn interrupts() -> usize {
    INTERRUPTS.load(Ordering::SeqCst)
}

/// Why a job was cancelled, as its record says: the signal `flotilla run` received, or a
/// request (another job failed, a study stopped it).
fn cancel_reason() -> String {
    match LAST_SIGNAL.load(Ordering::SeqCst) {
        libc::SIGINT => "stopped: flotilla run received SIGINT (Ctrl-C)".into(),
        libc::SIGTERM => "stopped: flotilla run received SIGTERM".into(),
        libc::SIGHUP => {
            "stopped: flotilla run received SIGHUP (its terminal closed or its ssh session dropped)"
                .into()
        }
        _ => "stopped on request".into(),
    }
}

/// Why the jobs a plan records PENDING or RUNNING will never move: the `flotilla run` that
/// supervised them (recorded in the plan as `supervisor`) ran on this host and is gone. `None`
/// while it runs, when it ran on another host, or when the plan names none.
pub fn supervisor_gone(plan: &Plan) -> Option<String> {
    let sup = plan.extra.get("supervisor")?;
    let host = sup.get("host").and_then(|h| h.as_str())?;
    let pid = sup.get("pid").and_then(|p| p.as_i64())?;
    if host != crate::rundir::meta::host_name() || process_alive(pid as i32) {
        return None;
    }
    Some(format!(
        "recorded as still running, but the flotilla run that started it (pid {pid}) is gone \
         (killed, or its machine restarted) and its processes with it; run the job again \
         with flotilla run --resume-sweep (or --from for a single run)"
    ))
}

/// A cancellation flag shared by the launcher and whoever wants to stop it. It also trips when
/// the process receives SIGINT/SIGTERM after [`install_interrupt_handler`].
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
}

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Asks the launcher to stop every rank and not to start more jobs.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst) || interrupts() > 0
    }
}

/// Settings of the local launcher.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// What every rank runs (default: `flotilla train --run-dir {job_dir} --prepared`).
    pub task: TaskCommand,
    /// Between SIGTERM and SIGKILL when stopping ranks.
    pub grace: Duration,
    /// Echo rank 0's output to stderr (prefixed with `[job N]` when jobs run in parallel).
    pub echo: bool,
    /// Progress lines (`job N: starting ...`) on stderr.
    pub progress: bool,
    /// Jobs at the same time; `None`: the first job's `compute.max_parallel`.
    pub max_parallel: Option<usize>,
    /// Cores shared by the ranks; `None`: the cores available to this process.
    pub cores: Option<usize>,
    pub cancel: Cancel,
    /// Turn SIGINT/SIGTERM to this process into a cancellation while jobs run (see
    /// [`install_interrupt_handler`]); the `flotilla run` command sets it.
    pub catch_interrupts: bool,
    /// What every process of a job that runs the user's own program runs; `None`: this
    /// executable's `exec-task` (see [`TaskCommand::exec_task`]).
    pub exec_task: Option<TaskCommand>,
}

impl LocalOptions {
    /// Defaults around a task command.
    pub fn with_task(task: TaskCommand) -> LocalOptions {
        LocalOptions {
            task,
            grace: Duration::from_secs(10),
            echo: true,
            progress: true,
            max_parallel: None,
            cores: None,
            cancel: Cancel::new(),
            catch_interrupts: false,
            exec_task: None,
        }
    }
}

/// Where one rank sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankSlot {
    pub rank: usize,
    pub local_rank: usize,
    pub node_rank: usize,
    /// Device indices for `CUDA_VISIBLE_DEVICES`; `None` when `gpus_per_node == 0`.
    pub devices: Option<Vec<usize>>,
}

/// The slot of `rank` in a job of `compute`. With `g = gpus_per_node` and
/// `t = tasks_per_node`: when `g >= t` each local rank gets `g / t` consecutive devices,
/// otherwise local rank `l` gets device `l % g`; node `n`'s devices start at `n * g`.
pub fn rank_slot(compute: &ComputeConfig, rank: usize) -> RankSlot {
    let t = compute.tasks_per_node.max(1);
    let g = compute.gpus_per_node;
    let node_rank = rank / t;
    let local_rank = rank % t;
    let devices = (g > 0).then(|| {
        let local: Vec<usize> = if g >= t {
            let per = g / t;
            (local_rank * per..(local_rank + 1) * per).collect()
        } else {
            vec![local_rank % g]
        };
        local.into_iter().map(|d| node_rank * g + d).collect()
    });
    RankSlot {
        rank,
        local_rank,
        node_rank,
        devices,
    }
}

/// `OMP_NUM_THREADS` for a rank: `cores / processes`, at least 1.
pub fn threads_per_rank(cores: usize, processes: usize) -> usize {
    (cores / processes.max(1)).max(1)
}

/// What the environment of one rank needs to say.
#[derive(Clone, Debug)]
pub struct EnvSpec<'a> {
    pub compute: &'a ComputeConfig,
    pub master_port: u16,
    /// `OMP_NUM_THREADS`; `None` leaves the inherited value.
    pub threads: Option<usize>,
    /// The parent's `CUDA_VISIBLE_DEVICES`: device indices are positions in this list.
    pub parent_devices: Option<String>,
    pub run_id: String,
    pub job_dir: &'a Path,
    pub job_num: usize,
}

/// The variables set for `rank` (in addition to the inherited environment): the torchrun
/// variables of its slot with torchrun's elastic-agent ones ([`RankEnv`]), then
/// `FLOTILLA_JOB_DIR` and `FLOTILLA_JOB_NUM`.
pub fn rank_env(spec: &EnvSpec<'_>, rank: usize) -> Vec<(String, String)> {
    let c = spec.compute;
    let slot = rank_slot(c, rank);
    let visible_devices = slot.devices.map(|devices| {
        let parent: Option<Vec<&str>> = spec
            .parent_devices
            .as_deref()
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .collect()
            })
            .filter(|v: &Vec<&str>| !v.is_empty());
        let names: Vec<String> = devices
            .iter()
            .map(|&d| match &parent {
                Some(list) => list[d % list.len()].to_string(),
                None => d.to_string(),
            })
            .collect();
        names.join(",")
    });
    let mut env = RankEnv {
        place: RankInfo {
            rank,
            local_rank: slot.local_rank,
            world_size: c.world_size(),
            local_world_size: c.tasks_per_node,
            node_rank: slot.node_rank,
            num_nodes: c.nodes,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: spec.master_port,
            source: RankSource::Torchrun,
            job_id: Some(spec.run_id.clone()),
            restart_count: 0,
        },
        threads: spec.threads,
        visible_devices,
    }
    .vars();
    env.extend([
        (
            "FLOTILLA_JOB_DIR".to_string(),
            spec.job_dir.to_string_lossy().into_owned(),
        ),
        ("FLOTILLA_JOB_NUM".to_string(), spec.job_num.to_string()),
    ]);
    env
}

/// The job states the local launcher can tell without its supervisor: a job still recorded
/// PENDING or RUNNING whose `flotilla run` (recorded in the plan as `supervisor`) ran on this
/// host and is gone will never move again: UNKNOWN.
pub fn live_states(plan: &Plan) -> HashMap<usize, JobState> {
    let mut out = HashMap::new();
    if supervisor_gone(plan).is_none() {
        return out;
    }
    for j in &plan.jobs {
        if matches!(j.state, JobState::Pending | JobState::Running) {
            out.insert(j.num, JobState::Unknown);
        }
    }
    out
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Starts jobs on this machine.
pub struct LocalLauncher {
    opts: LocalOptions,
}

/// One running rank.
struct Rank {
    child: Child,
    exit: Option<TaskExit>,
}

impl Rank {
    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id() as i32;
        // SAFETY: signalling the rank's own process group (it is its leader, not yet reaped),
        // then the rank itself in case it left the group.
        unsafe {
            libc::kill(-pid, sig);
            libc::kill(pid, sig);
        }
    }
}

/// An OS pipe, close-on-exec.
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills two descriptors that this function then owns.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Copies rank 0's combined output to its log and (optionally) to stderr, line by line.
fn spawn_echo(read: OwnedFd, mut log: File, echo: bool, prefix: String) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(File::from(read));
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let _ = log.write_all(&line);
                    if echo {
                        let mut err = std::io::stderr().lock();
                        let _ = err.write_all(prefix.as_bytes());
                        let _ = err.write_all(&line);
                        if !line.ends_with(b"\n") {
                            let _ = err.write_all(b"\n");
                        }
                    }
                }
            }
        }
        let _ = log.flush();
        let _ = tx.send(());
    });
    rx
}

impl LocalLauncher {
    pub fn new(opts: LocalOptions) -> LocalLauncher {
        LocalLauncher { opts }
    }

    fn note(&self, msg: &str) {
        if self.opts.progress {
            // After SIGHUP the terminal is gone: a failed write must not stop the recording.
            let _ = writeln!(std::io::stderr(), "[flotilla] {msg}");
        }
    }

    /// Runs one job to its end and records its states in `plan`. `parallel` is the number of
    /// jobs running at once (for the thread share and the echo prefix).
    pub fn run_job(
        &self,
        job: &PreparedJob,
        plan: Option<&PlanFile>,
        parallel: usize,
    ) -> Result<JobOutcome, LaunchError> {
        self.run_job_until(job, plan, parallel, &self.opts.cancel)
    }

    /// [`run_job`](Self::run_job), stopped (as a cancellation) when `stop` trips: an adaptive
    /// sweep stops a trial it prunes this way.
    pub fn run_job_until(
        &self,
        job: &PreparedJob,
        plan: Option<&PlanFile>,
        parallel: usize,
        stop: &Cancel,
    ) -> Result<JobOutcome, LaunchError> {
        let compute = &job.compute;
        let world = compute.world_size();
        // The processes started: the ranks, or (a user program with `ranks: per_node`) one per
        // node, placed as if each node ran one rank with all the node's GPUs.
        let (processes, placement, task) = match &job.task {
            None => (world, compute.clone(), self.opts.task.clone()),
            Some(spec) => {
                let placement = match spec.ranks {
                    TaskRanks::PerTask => compute.clone(),
                    TaskRanks::PerNode => ComputeConfig {
                        tasks_per_node: 1,
                        ..compute.clone()
                    },
                };
                let command = match &self.opts.exec_task {
                    Some(c) => c.clone(),
                    // This very executable, even when its file was replaced or removed since it
                    // started (a rebuild or reinstall during a long sweep).
                    None if Path::new(SELF_EXE).exists() => {
                        TaskCommand::exec_task(Some(Path::new(SELF_EXE)))?
                    }
                    None => TaskCommand::exec_task(None)?,
                };
                (spec.processes(), placement, command)
            }
        };
        if world == 0 {
            return Err(LaunchError::Unsupported(format!(
                "job {}: compute.nodes × compute.tasks_per_node is 0: nothing to start",
                job.num
            )));
        }
        let logs = job.dir.join(LOGS_DIR);
        std::fs::create_dir_all(&logs)
            .map_err(|e| LaunchError::io(format!("creating {}", logs.display()), e))?;
        let cores = self.opts.cores.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        let threads = std::env::var_os("OMP_NUM_THREADS")
            .filter(|v| !v.is_empty())
            .is_none()
            .then(|| threads_per_rank(cores, world * parallel.max(1)));
        let spec = EnvSpec {
            compute: &placement,
            master_port: free_port()
                .map_err(|e| LaunchError::io("finding a free port for MASTER_PORT", e))?,
            threads,
            parent_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            run_id: format!("flotilla-{}-{}", std::process::id(), job.num),
            job_dir: &job.dir,
            job_num: job.num,
        };
        let argv = task.for_job(&job.dir);
        let Some((program, args)) = argv.split_first() else {
            return Err(LaunchError::Unsupported("the task command is empty".into()));
        };
        if let Some(p) = plan {
            p.set_state(job.num, JobState::Running, None)?;
        }
        let per_node = job
            .task
            .as_ref()
            .is_some_and(|t| t.ranks == TaskRanks::PerNode);
        let what = match (per_node, processes) {
            (true, 1) => "node process",
            (true, _) => "node processes",
            (false, 1) => "rank",
            (false, _) => "ranks",
        };
        self.note(&format!(
            "job {}: starting {processes} {what} in {}",
            job.num,
            job.dir.display()
        ));
        let prefix = if parallel > 1 {
            format!("[job {}] ", job.num)
        } else {
            String::new()
        };

        let started = Instant::now();
        let mut ranks: Vec<Rank> = Vec::with_capacity(processes);
        let mut drain: Option<mpsc::Receiver<()>> = None;
        for rank in 0..processes {
            match self.spawn_rank(program, args, &spec, rank, &logs, &prefix) {
                Ok((child, rx)) => {
                    ranks.push(Rank { child, exit: None });
                    if rx.is_some() {
                        drain = rx;
                    }
                }
                Err(error) => {
                    for r in &ranks {
                        r.signal(libc::SIGKILL);
                    }
                    for r in &mut ranks {
                        let _ = r.child.wait();
                    }
                    let err = LaunchError::Spawn {
                        num: job.num,
                        rank,
                        program: program.to_string_lossy().into_owned(),
                        error,
                    };
                    if let Some(p) = plan {
                        p.set_state(job.num, JobState::Failed, Some(err.to_string()))?;
                    }
                    return Err(err);
                }
            }
        }

        let (failure, cancelled) = self.supervise(&mut ranks, stop)?;
        if let Some(rx) = drain {
            let _ = rx.recv_timeout(DRAIN);
        }
        let failure = failure.map(|(rank, exit)| {
            let log = logs.join(flotilla_contract::layout::rank_log_name(rank));
            RankFailure {
                rank,
                exit,
                tail: log_tail(&log, TAIL_LINES),
                log,
            }
        });
        let (state, message) = match (&failure, cancelled) {
            (Some(f), _) => (
                JobState::Failed,
                Some(format!("rank {} {}", f.rank, f.exit)),
            ),
            (None, true) => (JobState::Cancelled, Some(cancel_reason())),
            (None, false) => (JobState::Completed, None),
        };
        if let Some(p) = plan {
            p.set_ended(job.num, state, message, started.elapsed().as_secs_f64())?;
        }
        self.note(&format!("job {}: {state}", job.num));
        Ok(JobOutcome {
            num: job.num,
            dir: job.dir.clone(),
            job_id: None,
            state,
            failure,
            message: cancelled.then(cancel_reason),
        })
    }

    fn spawn_rank(
        &self,
        program: &OsString,
        args: &[OsString],
        spec: &EnvSpec<'_>,
        rank: usize,
        logs: &Path,
        prefix: &str,
    ) -> std::io::Result<(Child, Option<mpsc::Receiver<()>>)> {
        let log_path = logs.join(flotilla_contract::layout::rank_log_name(rank));
        let mut log = File::options().create(true).append(true).open(&log_path)?;
        if log.metadata()?.len() > 0 {
            // A job started again (--resume-sweep) appends to its old logs.
            writeln!(
                log,
                "--- flotilla: started again at {} ---",
                chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
            )?;
        }
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null());
        for (k, v) in rank_env(spec, rank) {
            cmd.env(k, v);
        }
        cmd.process_group(0);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: getpid is async-signal-safe.
            let parent = unsafe { libc::getpid() };
            // SAFETY: prctl/getppid/_exit are async-signal-safe; nothing is allocated.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                    Ok(())
                });
            }
        }
        if rank == 0 {
            // One pipe for stdout and stderr keeps their order, as `2>&1` would.
            let (read, write) = pipe()?;
            let write2 = write.try_clone()?;
            cmd.stdout(Stdio::from(write)).stderr(Stdio::from(write2));
            let child = cmd.spawn();
            drop(cmd); // closes the parent's copies of the write end
            let child = child?;
            let rx = spawn_echo(read, log, self.opts.echo, prefix.to_string());
            Ok((child, Some(rx)))
        } else {
            let err = log.try_clone()?;
            cmd.stdout(Stdio::from(log)).stderr(Stdio::from(err));
            Ok((cmd.spawn()?, None))
        }
    }

    /// Waits for every rank. Returns the first rank that failed (before any stop request) and
    /// whether the job was cancelled.
    #[allow(clippy::type_complexity)]
    fn supervise(
        &self,
        ranks: &mut [Rank],
        stop: &Cancel,
    ) -> Result<(Option<(usize, TaskExit)>, bool), LaunchError> {
        let mut failure: Option<(usize, TaskExit)> = None;
        let mut cancelled = false;
        let mut stopping: Option<(Instant, usize)> = None;
        let mut killed = false;
        loop {
            for (i, r) in ranks.iter_mut().enumerate() {
                if r.exit.is_some() {
                    continue;
                }
                let status = r
                    .child
                    .try_wait()
                    .map_err(|e| LaunchError::io(format!("waiting for rank {i}"), e))?;
                if let Some(status) = status {
                    let exit = TaskExit::from_status(status);
                    r.exit = Some(exit);
                    if !exit.success() && failure.is_none() && stopping.is_none() {
                        failure = Some((i, exit));
                    }
                }
            }
            if ranks.iter().all(|r| r.exit.is_some()) {
                return Ok((failure, cancelled));
            }
            match stopping {
                None => {
                    let cancel = stop.is_cancelled() || self.opts.cancel.is_cancelled();
                    if failure.is_some() || cancel {
                        cancelled = failure.is_none();
                        for r in ranks.iter().filter(|r| r.exit.is_none()) {
                            r.signal(libc::SIGTERM);
                        }
                        stopping = Some((Instant::now(), interrupts()));
                    }
                }
                Some((since, seen)) if !killed => {
                    if since.elapsed() >= self.opts.grace || interrupts() > seen {
                        for r in ranks.iter().filter(|r| r.exit.is_none()) {
                            r.signal(libc::SIGKILL);
                        }
                        killed = true;
                    }
                }
                Some(_) => {}
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Launcher for LocalLauncher {
    fn name(&self) -> &'static str {
        flotilla_config::schema::Launcher::Local.as_str()
    }

    fn launch(&mut self, run: &PreparedRun) -> Result<Vec<JobOutcome>, LaunchError> {
        let n = run.jobs.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        if self.opts.catch_interrupts {
            install_interrupt_handler();
        }
        run.plan.update(|p| {
            p.extra.insert(
                "supervisor".into(),
                serde_json::json!({
                    "host": crate::rundir::meta::host_name(),
                    "pid": std::process::id(),
                }),
            );
        })?;
        let parallel = self
            .opts
            .max_parallel
            .unwrap_or(run.jobs[0].compute.max_parallel)
            .clamp(1, n);
        let results: Mutex<Vec<Option<JobOutcome>>> = Mutex::new(vec![None; n]);
        let error: Mutex<Option<LaunchError>> = Mutex::new(None);
        let next = AtomicUsize::new(0);
        let worker = || loop {
            if self.opts.cancel.is_cancelled() || error.lock().expect("lock").is_some() {
                break;
            }
            let i = next.fetch_add(1, Ordering::SeqCst);
            if i >= n {
                break;
            }
            match self.run_job(&run.jobs[i], Some(&run.plan), parallel) {
                Ok(o) => results.lock().expect("lock")[i] = Some(o),
                Err(e) => {
                    error.lock().expect("lock").get_or_insert(e);
                    break;
                }
            }
        };
        if parallel == 1 {
            worker();
        } else {
            // Each job's ranks are spawned and reaped by the same worker thread, which
            // PR_SET_PDEATHSIG requires.
            std::thread::scope(|s| {
                for _ in 0..parallel {
                    s.spawn(worker);
                }
            });
        }
        if let Some(e) = error.into_inner().expect("lock") {
            return Err(e);
        }
        let mut out = Vec::with_capacity(n);
        for (job, result) in run.jobs.iter().zip(results.into_inner().expect("lock")) {
            match result {
                Some(o) => out.push(o),
                None => {
                    // Never started: the launch was cancelled.
                    run.plan.set_state(
                        job.num,
                        JobState::Cancelled,
                        Some("cancelled before it started".into()),
                    )?;
                    out.push(JobOutcome {
                        state: JobState::Cancelled,
                        message: Some("cancelled before it started".into()),
                        ..JobOutcome::pending(job)
                    });
                }
            }
        }
        Ok(out)
    }
}

/// Runs `task` for one already prepared job directory with the torchrun environment of
/// `compute` (no plan file), e.g. to re-run a job by hand or in tests.
pub fn run_in_dir(
    job_dir: &Path,
    num: usize,
    config: flotilla_config::schema::JobConfig,
    opts: LocalOptions,
) -> Result<JobOutcome, LaunchError> {
    let job = PreparedJob {
        num,
        dir: job_dir.to_path_buf(),
        overrides: Vec::new(),
        compute: config.compute.clone(),
        config: Some(config),
        task: None,
    };
    LocalLauncher::new(opts).run_job(&job, None, 1)
}

pub use flotilla_contract::layout::rank_log;
