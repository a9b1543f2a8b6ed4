//! Packing a sweep into allocations (`compute.pack: K`): instead of one batch job per sweep job,
//! `write_pack_script` renders one job array of allocations, each one node with `K` slots
//! (one rank each: its `cpus_per_task` and its share of the GPUs and memory), whose batch shell
//! execs `flotilla pack-run SPEC` ([`run_allocation`], the packing loop). The loop takes the
//! next PENDING job of its list from `sweep.json` (a claim under the plan's lock, so that
//! several allocations share one queue and a finished job is never run again), starts it as a
//! job step (`srun --exact` with the job's own tasks, CPUs, GPUs and memory, its logs in its own
//! directory), and starts the next as soon as one ends. Each job's record gets the allocation
//! (`allocation`) and step (`step`) that ran it, its state and its failure message.
//!
//! Stopping: `USR2` (the time limit's signal, or `scancel --signal=USR2 --batch`) and `TERM` are
//! forwarded to every running step; no new job starts. A job that checkpointed (the trainer's
//! [`REQUEUE_EXIT_CODE`], or a user program that ended after the signal) is put back in the
//! queue (REQUEUED) and the allocation requeues itself (at most `compute.max_num_timeout`
//! times); the next allocation to run, this one or another, resumes it from its checkpoint. A
//! job that a hard kill left RUNNING under this allocation is taken up again when the
//! allocation restarts.

use super::error::io_err;
use super::quote::sbatch_quote;
use super::render::{format_time, sbatch_options, STOP_SIGNAL};
use super::status::end_message;
use super::{SlurmError, EXIT_MARKER, REQUEUE_EXIT_CODE, SCRIPT_DIR};
use crate::rundir::{JobRecord, JobState, PlanFile, LOGS_DIR};
use crate::TaskCommand;
use flotilla_config::schema::{ComputeConfig, TaskRanks};
use flotilla_contract::rank::{SLURM_PORT_BASE, SLURM_PORT_SPAN};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Why an adaptive study refuses `compute.pack` (a study's directory refuses it first).
pub use crate::rundir::trials::ADAPTIVE_REFUSAL;
/// Key of a packed job's record: its job step in that allocation (part of the plan format).
pub use crate::rundir::STEP_KEY;

/// The hidden subcommand an allocation's batch shell execs.
pub const PACK_SUBCOMMAND: &str = "pack-run";
/// Key of a packed job's record: the allocation (`<array id>_<task>`) that claimed it.
pub const ALLOCATION_KEY: &str = "allocation";
/// Key of a packed job's record: the job array of allocations it was submitted to.
pub const PACK_ARRAY_KEY: &str = "pack_array";

/// How the jobs of one group (same `compute`, same task kind) are packed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PackShape {
    /// Slots (ranks) per allocation: `compute.pack`, or fewer when the group has fewer jobs.
    pub slots: usize,
    /// Ranks one job takes (`compute.tasks_per_node`).
    pub ranks_per_job: usize,
    /// Jobs running at once in one allocation.
    pub jobs_at_once: usize,
    /// Allocations submitted (at most `compute.array_parallelism`).
    pub allocations: usize,
    /// CPUs, GPUs and memory (GiB) of one allocation.
    pub cpus: usize,
    pub gpus: usize,
    pub mem_gb: Option<u64>,
}

/// The allocations a group of `jobs` jobs with `compute` asks for, or `None` when it is not
/// packed (`compute.pack` absent or 1).
pub fn pack_shape(compute: &ComputeConfig, jobs: usize) -> Option<PackShape> {
    let slots = compute.pack.filter(|&k| k >= 2)?;
    let ranks = compute.tasks_per_node.max(1);
    // No more slots than jobs: a sweep of 2 asks for 2 slots' resources, not `pack`.
    let at_once = (slots / ranks).max(1).min(jobs.max(1));
    let mut allocations = jobs.div_ceil(at_once).max(1);
    if compute.array_parallelism > 0 {
        allocations = allocations.min(compute.array_parallelism);
    }
    Some(PackShape {
        slots: slots.min(at_once * ranks),
        ranks_per_job: ranks,
        jobs_at_once: at_once,
        allocations,
        cpus: at_once * ranks * compute.cpus_per_task,
        gpus: at_once * compute.gpus_per_node,
        mem_gb: compute.mem_gb.map(|m| m * at_once as u64),
    })
}

/// What the packing loop of an allocation needs: written as JSON next to its script.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackSpec {
    /// The sweep directory (holding `sweep.json`).
    pub plan_dir: PathBuf,
    /// The jobs this array of allocations runs, in order.
    pub jobs: Vec<usize>,
    /// Jobs running at once in one allocation.
    pub jobs_at_once: usize,
    /// Per job: ranks, CPUs per rank, GPUs, memory (GiB).
    pub tasks_per_node: usize,
    pub cpus_per_task: usize,
    pub gpus_per_node: usize,
    pub mem_gb: Option<u64>,
    /// Requeues of the allocation after a stop before the interrupted jobs fail.
    pub max_num_timeout: u32,
    /// `None`: the built-in trainer; otherwise the user's program (requeued when it ends after
    /// the stop signal, whatever its exit status).
    pub ranks: Option<TaskRanks>,
    /// What each job's tasks run; `{job_dir}` stands for its directory.
    pub task_argv: Vec<String>,
}

/// Renders and writes the allocation script (`submit-<k>.sbatch`) and its [`PackSpec`]
/// (`submit-<k>.pack.json`) for `jobs` (numbers and absolute directories) of one group.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_pack_script(
    plan: &PlanFile,
    compute: &ComputeConfig,
    shape: &PackShape,
    ranks: Option<TaskRanks>,
    task: &TaskCommand,
    jobs: &[usize],
    job_name: &str,
    script_dir: &Path,
) -> Result<PathBuf, SlurmError> {
    let flotilla = std::env::current_exe().map_err(|e| io_err(Path::new("flotilla"), e))?;
    let spec = PackSpec {
        plan_dir: std::path::absolute(plan.dir()).map_err(|e| io_err(plan.dir(), e))?,
        jobs: jobs.to_vec(),
        jobs_at_once: shape.jobs_at_once,
        tasks_per_node: compute.tasks_per_node,
        cpus_per_task: compute.cpus_per_task,
        gpus_per_node: compute.gpus_per_node,
        mem_gb: compute.mem_gb,
        max_num_timeout: compute.max_num_timeout,
        ranks,
        task_argv: task
            .argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    };
    let q = |s: &str| {
        sbatch_quote(s).map_err(|message| SlurmError::Template {
            name: "packed allocation".into(),
            message,
        })
    };
    let sq = |s: &str| {
        super::quote::shell_quote(s).map_err(|message| SlurmError::Template {
            name: "packed allocation".into(),
            message,
        })
    };
    let mut s = format!(
        "#!/bin/bash\n# Generated by flotilla {}: {} allocation(s) of {} slot(s), each running the \
         sweep's jobs {} at a time as job steps; re-submit with: sbatch <this file>\n",
        env!("CARGO_PKG_VERSION"),
        shape.allocations,
        shape.slots,
        shape.jobs_at_once
    );
    let mut line = |l: String| {
        s.push_str(&l);
        s.push('\n');
    };
    line(format!("#SBATCH --job-name={}", q(job_name)?));
    line("#SBATCH --nodes=1".into());
    line(format!(
        "#SBATCH --ntasks={}",
        shape.jobs_at_once * shape.ranks_per_job
    ));
    line(format!("#SBATCH --cpus-per-task={}", compute.cpus_per_task));
    if shape.gpus > 0 {
        line(format!("#SBATCH --gpus-per-node={}", shape.gpus));
    }
    if let Some(mem) = shape.mem_gb {
        line(format!("#SBATCH --mem={mem}G"));
    }
    line(format!(
        "#SBATCH --time={}",
        format_time(compute.timeout_min)
    ));
    for (key, value) in [
        ("partition", &compute.partition),
        ("account", &compute.account),
        ("qos", &compute.qos),
        ("constraint", &compute.constraint),
    ] {
        if let Some(v) = value {
            line(format!("#SBATCH --{key}={}", q(v)?));
        }
    }
    line(format!(
        "#SBATCH --array={}",
        super::batches::array_range(shape.allocations, 0)
    ));
    let base = script_dir.display().to_string().replace('%', "%%");
    line(format!(
        "#SBATCH --output={}",
        q(&format!("{base}/pack-%A_%a.out"))?
    ));
    line(format!(
        "#SBATCH --error={}",
        q(&format!("{base}/pack-%A_%a.err"))?
    ));
    line("#SBATCH --open-mode=append".into());
    line(format!(
        "#SBATCH --signal=B:{STOP_SIGNAL}@{}",
        compute.signal_delay_s
    ));
    match compute.requeue {
        Some(true) => line("#SBATCH --requeue".into()),
        Some(false) => line("#SBATCH --no-requeue".into()),
        None => {}
    }
    for option in sbatch_options(&compute.additional_parameters)? {
        line(format!("#SBATCH {option}"));
    }
    line(String::new());
    if !compute.setup.is_empty() {
        line("# compute.setup".into());
        for l in &compute.setup {
            line(l.clone());
        }
        line(String::new());
    }
    // The spec file is written below, next to the script, under the script's own name.
    let script = super::submit::write_new_script(script_dir, "")?;
    let spec_path = script.with_extension("pack.json");
    line(format!(
        "# The packing loop: claims the sweep's jobs from sweep.json and runs each as a job step.\n\
         exec {} {PACK_SUBCOMMAND} {}",
        sq(&flotilla.display().to_string())?,
        sq(&spec_path.display().to_string())?
    ));
    let json = serde_json::to_string_pretty(&spec).expect("a pack spec serialises");
    std::fs::write(&spec_path, json).map_err(|e| io_err(&spec_path, e))?;
    std::fs::write(&script, s).map_err(|e| io_err(&script, e))?;
    Ok(script)
}

/// Set by the signal handlers of the packing loop.
static GOT_USR2: AtomicBool = AtomicBool::new(false);
static GOT_TERM: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr2(_: libc::c_int) {
    GOT_USR2.store(true, Ordering::SeqCst);
}

extern "C" fn on_term(_: libc::c_int) {
    GOT_TERM.store(true, Ordering::SeqCst);
}

/// How one allocation's loop ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocationOutcome {
    /// Jobs this run of the allocation completed, failed (or cancelled), put back in the queue.
    pub completed: Vec<usize>,
    pub failed: Vec<usize>,
    pub requeued: Vec<usize>,
    /// The allocation asked to be requeued (`scontrol requeue`).
    pub requeue_self: bool,
}

/// One job step being run.
struct Running {
    num: usize,
    dir: PathBuf,
    child: Child,
    /// A stop signal was forwarded to it.
    signalled: bool,
    step_file: PathBuf,
    step_recorded: bool,
}

/// The id of this allocation (`<array id>_<task>` or the job id), from SLURM's variables.
fn allocation_id() -> Result<String, SlurmError> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (var("SLURM_ARRAY_JOB_ID"), var("SLURM_ARRAY_TASK_ID")) {
        (Some(a), Some(t)) => Ok(format!("{a}_{t}")),
        _ => var("SLURM_JOB_ID").ok_or_else(|| SlurmError::Template {
            name: PACK_SUBCOMMAND.into(),
            message: "SLURM_JOB_ID is not set: `flotilla pack-run` runs inside an allocation \
                      that `flotilla run` submitted"
                .into(),
        }),
    }
}

fn now() -> String {
    chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
}

/// The packing loop of one allocation (`flotilla pack-run SPEC`): see the module doc. Returns
/// once no job of its list is left to start and every step it started has ended.
pub fn run_allocation(spec_path: &Path) -> Result<AllocationOutcome, SlurmError> {
    let text = std::fs::read_to_string(spec_path).map_err(|e| io_err(spec_path, e))?;
    let spec: PackSpec = serde_json::from_str(&text).map_err(|e| SlurmError::Template {
        name: spec_path.display().to_string(),
        message: format!("not a pack spec: {e}"),
    })?;
    // SAFETY: the handlers only store to atomics.
    unsafe {
        libc::signal(libc::SIGUSR2, on_usr2 as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
    }
    let me = allocation_id()?;
    let job_id: u64 = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let restart: u32 = std::env::var("SLURM_RESTART_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let plan = PlanFile::sweep(&spec.plan_dir);
    let step_dir = spec.plan_dir.join(SCRIPT_DIR).join("steps");
    std::fs::create_dir_all(&step_dir).map_err(|e| io_err(&step_dir, e))?;
    let master_addr = std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "127.0.0.1".into());
    eprintln!(
        "flotilla: allocation {me} (restart {restart}) at {}: {} job(s) listed, {} at once",
        now(),
        spec.jobs.len(),
        spec.jobs_at_once
    );
    let mut running: Vec<Running> = Vec::new();
    // Slot indices (for distinct ports) in use.
    let mut slot_of: BTreeMap<usize, usize> = BTreeMap::new();
    let mut out = AllocationOutcome::default();
    let mut stopping = false;
    // A TERM before any USR2 (scancel, a preemption that does not requeue) cancels: the jobs it
    // stops are not put back. After a USR2, a TERM is the time limit arriving.
    let mut cancelled = false;
    loop {
        let usr2 = GOT_USR2.swap(false, Ordering::SeqCst);
        let term = GOT_TERM.swap(false, Ordering::SeqCst);
        if usr2 || term {
            if term && !usr2 && !stopping {
                cancelled = true;
            }
            stopping = true;
            let sig = if term { libc::SIGTERM } else { libc::SIGUSR2 };
            eprintln!(
                "flotilla: got SIG{}; forwarding it to {} step(s)",
                if term { "TERM" } else { STOP_SIGNAL },
                running.len()
            );
            for r in &mut running {
                r.signalled = true;
                // SAFETY: signalling a child this loop started and has not reaped.
                unsafe { libc::kill(r.child.id() as i32, sig) };
            }
        }
        // Reap the steps that ended.
        let mut i = 0;
        while i < running.len() {
            let status = running[i]
                .child
                .try_wait()
                .map_err(|e| io_err(&running[i].dir, e))?;
            let Some(status) = status else {
                record_step(&plan, &mut running[i]);
                i += 1;
                continue;
            };
            let r = running.swap_remove(i);
            slot_of.remove(&r.num);
            let rc = status.code().unwrap_or(128 + status_signal(&status));
            finish(&plan, &spec, &me, r, rc, cancelled, &mut out)?;
        }
        // Fill free slots.
        while !stopping && running.len() < spec.jobs_at_once {
            let taken: Vec<usize> = running.iter().map(|r| r.num).collect();
            let Some((num, dir)) = claim(&plan, &spec, &me, &taken)? else {
                break;
            };
            let slot = (0..spec.jobs_at_once)
                .find(|s| !slot_of.values().any(|v| v == s))
                .unwrap_or(0);
            slot_of.insert(num, slot);
            let port = SLURM_PORT_BASE
                + ((job_id * spec.jobs_at_once as u64 + slot as u64) % u64::from(SLURM_PORT_SPAN))
                    as u16;
            let step_file = step_dir.join(format!("{num}"));
            let _ = std::fs::remove_file(&step_file);
            let child = start_step(&spec, &me, num, &dir, &master_addr, port, &step_file)?;
            eprintln!(
                "flotilla: job {num} started (pid {}) at {}: {}",
                child.id(),
                now(),
                dir.display()
            );
            running.push(Running {
                num,
                dir,
                child,
                signalled: false,
                step_file,
                step_recorded: false,
            });
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if !out.requeued.is_empty() {
        if restart < spec.max_num_timeout {
            eprintln!(
                "flotilla: {} job(s) checkpointed; requeueing the allocation (restart {} of at most {})",
                out.requeued.len(),
                restart + 1,
                spec.max_num_timeout
            );
            let status = Command::new("scontrol")
                .args(["requeue", &job_id.to_string()])
                .stdin(Stdio::null())
                .status();
            if status.is_ok_and(|s| s.success()) {
                out.requeue_self = true;
            } else {
                eprintln!("flotilla: scontrol requeue failed; the jobs stay REQUEUED for `flotilla run --resume-sweep`");
            }
        } else {
            let message = format!(
                "checkpointed, but the allocation was requeued {} times already \
                 (compute.max_num_timeout); `flotilla run --resume-sweep {}` starts it again",
                spec.max_num_timeout,
                spec.plan_dir.display()
            );
            plan.update(|p| {
                for num in &out.requeued {
                    if let Some(rec) = p.job_mut(*num) {
                        rec.set_state(JobState::Failed, Some(message.clone()));
                    }
                }
            })?;
            out.failed.append(&mut out.requeued);
        }
    }
    eprintln!(
        "flotilla: allocation {me} done at {}: {} completed, {} failed, {} requeued",
        now(),
        out.completed.len(),
        out.failed.len(),
        out.requeued.len()
    );
    Ok(out)
}

fn status_signal(status: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.signal().unwrap_or(0)
}

/// Takes the next job of `spec.jobs` to run here, under the plan's lock: one PENDING or
/// REQUEUED, or one this allocation was running when it was interrupted (not in `taken`), and
/// marks it RUNNING under this allocation.
fn claim(
    plan: &PlanFile,
    spec: &PackSpec,
    me: &str,
    taken: &[usize],
) -> Result<Option<(usize, PathBuf)>, SlurmError> {
    let ours = |r: &JobRecord| {
        r.extra.get(ALLOCATION_KEY).and_then(|v| v.as_str()) == Some(me) && !r.state.is_terminal()
    };
    let got = plan.update(|p| {
        let pick = spec.jobs.iter().find_map(|&num| {
            let r = p.job(num)?;
            let free = matches!(r.state, JobState::Pending | JobState::Requeued) || ours(r);
            (free && !taken.contains(&num)).then_some(num)
        })?;
        let rec = p.job_mut(pick)?;
        rec.job_id = Some(me.to_string());
        rec.extra
            .insert(ALLOCATION_KEY.into(), serde_json::Value::from(me));
        rec.extra.remove(STEP_KEY);
        rec.set_state(JobState::Running, None);
        Some((pick, rec.dir.clone()))
    })?;
    Ok(got.map(|(num, rel)| {
        let dir = if rel.as_os_str() == "." || rel.as_os_str().is_empty() {
            plan.dir().to_path_buf()
        } else {
            plan.dir().join(rel)
        };
        (num, dir)
    }))
}

/// The step id its rank 0 wrote, recorded once in the job's record.
fn record_step(plan: &PlanFile, r: &mut Running) {
    if r.step_recorded {
        return;
    }
    let Some(step) = std::fs::read_to_string(&r.step_file)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        return;
    };
    r.step_recorded = true;
    let _ = plan.update_job(r.num, |rec| {
        rec.extra
            .insert(STEP_KEY.into(), serde_json::Value::from(step));
    });
}

/// Starts job `num` as a job step: `srun --exact` with its tasks, CPUs, GPUs and memory, rank
/// logs in its `logs/`, srun's own messages in `logs/slurm-<allocation job id>.{out,err}` (as an
/// unpacked job's batch log), rank 0 writing the step id to `step_file`.
fn start_step(
    spec: &PackSpec,
    me: &str,
    num: usize,
    dir: &Path,
    master_addr: &str,
    port: u16,
    step_file: &Path,
) -> Result<Child, SlurmError> {
    let logs = dir.join(LOGS_DIR);
    std::fs::create_dir_all(&logs).map_err(|e| io_err(&logs, e))?;
    let per_node = spec.ranks == Some(TaskRanks::PerNode);
    let (ntasks, cpus) = if per_node {
        (1, spec.cpus_per_task * spec.tasks_per_node)
    } else {
        (spec.tasks_per_node, spec.cpus_per_task)
    };
    let job_id = std::env::var("SLURM_JOB_ID").unwrap_or_default();
    let open = |name: String| {
        let p = logs.join(name);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .map_err(|e| io_err(&p, e))
    };
    let out_log = open(format!("slurm-{job_id}.out"))?;
    let err_log = open(format!("slurm-{job_id}.err"))?;
    {
        use std::io::Write;
        let mut o = &out_log;
        let _ = writeln!(
            o,
            "flotilla: job {num} in allocation {me} (restart {}) on {master_addr} at {}: {}",
            std::env::var("SLURM_RESTART_COUNT").unwrap_or_else(|_| "0".into()),
            now(),
            dir.display()
        );
    }
    let mut cmd = Command::new("srun");
    cmd.arg("--exact")
        .arg("--kill-on-bad-exit=1")
        .arg("--nodes=1")
        .arg(format!("--ntasks={ntasks}"))
        .arg(format!("--cpus-per-task={cpus}"))
        .arg(format!("--job-name=job-{num}"))
        .arg("--open-mode=append")
        .arg(format!(
            "--output={}/{}",
            logs.display().to_string().replace('%', "%%"),
            "rank_%t.log"
        ));
    if spec.gpus_per_node > 0 {
        cmd.arg(format!("--gres=gpu:{}", spec.gpus_per_node));
    } else {
        cmd.arg("--gres=none");
    }
    if let Some(mem) = spec.mem_gb {
        cmd.arg(format!("--mem={mem}G"));
    } else if let Some(mb) = step_memory_share_mb(
        std::env::var("SLURM_MEM_PER_NODE").ok().as_deref(),
        spec.jobs_at_once,
    ) {
        cmd.arg(format!("--mem={mb}M"));
    }
    let pick_gpu = if spec.gpus_per_node > 0 && !per_node {
        "if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then\n  \
         IFS=, read -r -a devices <<<\"$CUDA_VISIBLE_DEVICES\"\n  \
         export CUDA_VISIBLE_DEVICES=${devices[$SLURM_LOCALID]:-$SLURM_LOCALID}\nfi\n"
    } else {
        ""
    };
    let wrapper = format!(
        "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS\n\
         export NODE_RANK=$SLURM_NODEID LOCAL_WORLD_SIZE={}\n\
         if [[ $SLURM_PROCID == 0 ]]; then echo \"$SLURM_STEP_ID\" >\"$FLOTILLA_STEP_FILE\"; fi\n\
         {pick_gpu}exec \"$@\"",
        if per_node { 1 } else { spec.tasks_per_node }
    );
    let dir_text = dir.display().to_string();
    cmd.arg("bash")
        .arg("-c")
        .arg(wrapper)
        .arg("flotilla-task")
        .args(
            spec.task_argv
                .iter()
                .map(|a| a.replace(crate::JOB_DIR_PLACEHOLDER, &dir_text)),
        )
        .env("FLOTILLA_JOB_DIR", dir)
        .env("FLOTILLA_JOB_NUM", num.to_string())
        .env("FLOTILLA_STEP_FILE", step_file)
        .env("MASTER_ADDR", master_addr)
        .env("MASTER_PORT", port.to_string())
        .env(
            "OMP_NUM_THREADS",
            std::env::var("OMP_NUM_THREADS").unwrap_or_else(|_| cpus.to_string()),
        )
        .stdin(Stdio::null())
        .stdout(out_log)
        .stderr(err_log);
    cmd.spawn().map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            SlurmError::CommandMissing {
                program: "srun".into(),
            }
        } else {
            SlurmError::CommandFailed {
                program: "srun".into(),
                source,
            }
        }
    })
}

/// How a job step that exited with `rc` ended, as an unpacked job's batch script decides:
/// after the stop signal (`signalled`, and not `cancelled` by a TERM), the trainer that
/// checkpointed ([`REQUEUE_EXIT_CODE`]) or the user's program (`user_task`), whatever its exit
/// status, goes back in the queue (REQUEUED); a step stopped by a cancelling TERM is CANCELLED
/// unless it completed; otherwise COMPLETED on 0, FAILED on anything else.
pub fn step_end_state(rc: i32, signalled: bool, cancelled: bool, user_task: bool) -> JobState {
    if signalled && !cancelled && (rc == i32::from(REQUEUE_EXIT_CODE) || user_task) {
        JobState::Requeued
    } else if rc == 0 {
        JobState::Completed
    } else if signalled && cancelled {
        JobState::Cancelled
    } else {
        JobState::Failed
    }
}

/// The memory (MB) of one job step when `compute.mem_gb` is not set but the allocation has a
/// memory size per node (`SLURM_MEM_PER_NODE`, from the partition's default): its share among
/// the `jobs_at_once` steps. Without it srun would ask that whole size for every step (it
/// inherits `SLURM_MEM_PER_NODE`), and where memory is a consumable resource the steps would
/// run one at a time.
pub fn step_memory_share_mb(mem_per_node: Option<&str>, jobs_at_once: usize) -> Option<u64> {
    let total: u64 = mem_per_node?.trim().parse().ok()?;
    (total > 0).then(|| (total / jobs_at_once.max(1) as u64).max(1))
}

/// Records how job step `r` ended (exit status `rc`, see [`step_end_state`]): COMPLETED, FAILED
/// with the reason from its logs, CANCELLED, or back in the queue (REQUEUED); and the job's exit
/// marker.
fn finish(
    plan: &PlanFile,
    spec: &PackSpec,
    me: &str,
    r: Running,
    rc: i32,
    cancelled: bool,
    out: &mut AllocationOutcome,
) -> Result<(), SlurmError> {
    let mut r = r;
    record_step(plan, &mut r);
    let state = step_end_state(rc, r.signalled, cancelled, spec.ranks.is_some());
    eprintln!(
        "flotilla: job {} ended with status {rc} at {}: {state}",
        r.num,
        now()
    );
    let message = end_message(state, &r.dir);
    plan.update_job(r.num, |rec| {
        rec.set_state(state, message.clone());
        if state == JobState::Requeued {
            // Back in the queue: any allocation may take it up.
            rec.extra.remove(ALLOCATION_KEY);
        }
    })?;
    if state.is_terminal() {
        let marker = r.dir.join(LOGS_DIR).join(EXIT_MARKER);
        let _ = std::fs::write(&marker, format!("{me} {state} {rc}\n"));
    }
    match state {
        JobState::Completed => out.completed.push(r.num),
        JobState::Requeued => out.requeued.push(r.num),
        _ => out.failed.push(r.num),
    }
    Ok(())
}

/// The state to show for a packed job whose record says `recorded` and names the allocation
/// that last ran it, when the scheduler gives that allocation the state `allocation` (`None`:
/// it does not know it) and the allocations of the job's array the states `array` (`None`: the
/// scheduler could not be asked). The record (the loop keeps it current) while the allocation
/// runs; REQUEUED while a requeued allocation waits. A job back in the queue (PENDING or
/// REQUEUED) of an allocation that ended is PENDING while another allocation of its array is
/// queued or running: that one takes it. Otherwise the allocation's end when it ended without
/// the loop recording the job's (cancelled, timed out, node failure), and UNKNOWN for a RUNNING
/// job whose allocation the scheduler no longer knows (a hard kill, then forgotten; `status`
/// gives the reason, [`super::forgotten_message`]).
pub fn packed_state(
    recorded: JobState,
    allocation: Option<JobState>,
    array: Option<&[JobState]>,
) -> Option<JobState> {
    if recorded.is_terminal() {
        return None;
    }
    match allocation {
        Some(JobState::Running) => return None,
        Some(JobState::Pending | JobState::Requeued | JobState::Preempted) => {
            return (recorded != JobState::Pending).then_some(JobState::Requeued);
        }
        _ => {}
    }
    let queued = matches!(recorded, JobState::Pending | JobState::Requeued);
    if queued && array.is_some_and(|a| a.iter().any(|s| allocation_live(*s))) {
        return Some(JobState::Pending);
    }
    match allocation {
        Some(JobState::Completed | JobState::Unknown) => Some(JobState::Unknown),
        Some(ended) => Some(ended),
        None if array.is_some() && recorded == JobState::Running => Some(JobState::Unknown),
        None => None,
    }
}

/// Whether an allocation in `state` may still claim jobs: queued (or waiting to be requeued)
/// or running.
fn allocation_live(state: JobState) -> bool {
    !state.is_terminal() && state != JobState::Unknown
}

/// The state to show for a packed job no allocation has claimed yet (PENDING in its record),
/// from the states the scheduler reports for the allocations of its array (`allocations`;
/// `None`: the scheduler could not be asked): still PENDING while one of them is queued or
/// running; once all have ended (or the scheduler has forgotten them) the job will never run:
/// CANCELLED when an allocation was cancelled, otherwise UNKNOWN. `--resume-sweep` submits
/// such a job again.
pub fn unclaimed_state(recorded: JobState, allocations: Option<&[JobState]>) -> Option<JobState> {
    if recorded != JobState::Pending {
        return None;
    }
    let allocations = allocations?;
    if allocations.iter().any(|s| allocation_live(*s)) {
        return None;
    }
    Some(if allocations.contains(&JobState::Cancelled) {
        JobState::Cancelled
    } else {
        JobState::Unknown
    })
}

/// Is this record a job of a packed sweep?
pub fn is_packed(rec: &JobRecord) -> bool {
    rec.extra.contains_key(PACK_ARRAY_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let mut c: ComputeConfig = serde_json::from_value(serde_json::json!({
            "launcher": "slurm", "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1,
            "cpus_per_task": 2, "mem_gb": 10, "timeout_min": 5, "partition": null,
            "account": null, "qos": null, "constraint": null, "array_parallelism": 256,
            "pack": 4, "signal_delay_s": 90, "max_num_timeout": 3, "setup": [],
            "additional_parameters": {}, "template": null, "max_parallel": 1,
            "gpu_type": null, "gpu_mem_gb": null, "check_memory": true
        }))
        .unwrap();
        let s = pack_shape(&c, 12).unwrap();
        assert_eq!(
            (s.allocations, s.jobs_at_once, s.cpus, s.gpus, s.mem_gb),
            (3, 4, 8, 4, Some(40))
        );
        // A 2-rank job takes 2 slots.
        c.tasks_per_node = 2;
        c.gpus_per_node = 2;
        let s = pack_shape(&c, 5).unwrap();
        assert_eq!((s.allocations, s.jobs_at_once, s.gpus), (3, 2, 4));
        // One job asks for its own slots only.
        let s = pack_shape(&c, 1).unwrap();
        assert_eq!(
            (s.allocations, s.jobs_at_once, s.cpus, s.gpus),
            (1, 1, 4, 2)
        );
        c.array_parallelism = 2;
        assert_eq!(pack_shape(&c, 5).unwrap().allocations, 2);
        c.pack = Some(1);
        assert_eq!(pack_shape(&c, 5), None);
    }

    #[test]
    fn step_ends() {
        use JobState::*;
        let requeue = i32::from(REQUEUE_EXIT_CODE);
        // The trainer: requeued only when it checkpointed after the stop signal.
        assert_eq!(step_end_state(requeue, true, false, false), Requeued);
        assert_eq!(step_end_state(140, true, false, false), Failed);
        assert_eq!(step_end_state(0, true, false, false), Completed);
        assert_eq!(step_end_state(requeue, false, false, false), Failed);
        // The user's program: requeued after the stop signal, whatever its status.
        assert_eq!(step_end_state(0, true, false, true), Requeued);
        assert_eq!(step_end_state(140, true, false, true), Requeued);
        assert_eq!(step_end_state(3, false, false, true), Failed);
        // A cancelling TERM: never requeued.
        assert_eq!(step_end_state(143, true, true, true), Cancelled);
        assert_eq!(step_end_state(requeue, true, true, false), Cancelled);
        assert_eq!(step_end_state(0, true, true, true), Completed);
    }

    #[test]
    fn step_memory() {
        assert_eq!(step_memory_share_mb(None, 4), None);
        assert_eq!(step_memory_share_mb(Some("0"), 4), None);
        assert_eq!(step_memory_share_mb(Some("16000"), 4), Some(4000));
        assert_eq!(step_memory_share_mb(Some("1001"), 2), Some(500));
        assert_eq!(step_memory_share_mb(Some("junk"), 2), None);
    }

    #[test]
    fn unclaimed_states() {
        use JobState::*;
        assert_eq!(unclaimed_state(Pending, Some(&[Pending, Pending])), None);
        assert_eq!(unclaimed_state(Pending, Some(&[Completed, Running])), None);
        assert_eq!(unclaimed_state(Pending, None), None);
        assert_eq!(
            unclaimed_state(Pending, Some(&[Completed, Cancelled])),
            Some(Cancelled)
        );
        assert_eq!(unclaimed_state(Pending, Some(&[])), Some(Unknown));
        assert_eq!(unclaimed_state(Completed, Some(&[])), None);
    }

    #[test]
    fn shown_states() {
        use JobState::*;
        let none: &[JobState] = &[];
        assert_eq!(packed_state(Completed, Some(Cancelled), Some(none)), None);
        assert_eq!(packed_state(Running, Some(Running), Some(&[Running])), None);
        assert_eq!(
            packed_state(Running, Some(Pending), Some(&[Pending])),
            Some(Requeued)
        );
        assert_eq!(packed_state(Pending, Some(Pending), Some(&[Pending])), None);
        assert_eq!(
            packed_state(Running, Some(Cancelled), Some(&[Cancelled])),
            Some(Cancelled)
        );
        assert_eq!(
            packed_state(Requeued, Some(Timeout), Some(&[Timeout])),
            Some(Timeout)
        );
        assert_eq!(packed_state(Running, None, None), None);
    }

    /// A job back in the queue whose allocation ended waits for the others of its array.
    #[test]
    fn a_queued_job_is_pending_while_a_sibling_allocation_can_take_it() {
        use JobState::*;
        for sibling in [Pending, Running, Requeued] {
            assert_eq!(
                packed_state(Requeued, Some(Completed), Some(&[Completed, sibling])),
                Some(Pending)
            );
            assert_eq!(
                packed_state(Requeued, Some(Timeout), Some(&[Timeout, sibling])),
                Some(Pending)
            );
            assert_eq!(
                packed_state(Requeued, None, Some(&[sibling])),
                Some(Pending)
            );
        }
        // None left to take it: as before.
        assert_eq!(
            packed_state(Requeued, Some(Completed), Some(&[Completed, Failed])),
            Some(Unknown)
        );
        assert_eq!(packed_state(Requeued, None, Some(&[Completed])), None);
        // A job left RUNNING is no sibling's to take.
        assert_eq!(
            packed_state(Running, Some(NodeFail), Some(&[NodeFail, Pending])),
            Some(NodeFail)
        );
    }

    /// A RUNNING job whose allocation the scheduler forgot is UNKNOWN, with the reason.
    #[test]
    fn a_running_job_of_a_forgotten_allocation_is_unknown() {
        use JobState::*;
        assert_eq!(packed_state(Running, None, Some(&[])), Some(Unknown));
        assert_eq!(packed_state(Running, None, Some(&[Pending])), Some(Unknown));
        // The scheduler could not be asked: no opinion.
        assert_eq!(packed_state(Running, None, None), None);
    }
}
