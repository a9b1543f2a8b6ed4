//! The local launcher, for real: 2 and 4 ranks (one or two simulated nodes) with their torchrun
//! variables and devices, per-rank logs, a failing rank stopping its siblings, cancellation and
//! Ctrl-C leaving no process behind, parallel sweeps, and `flotilla run` end to end with the
//! real `train` command (one rank and DDP).

mod common;
#[path = "common/compose.rs"]
mod compose;
#[path = "common/launch.rs"]
mod launch;

use common::{conf_dir, read_env};
use compose::composer;
use flotilla_contract::rank::{discover, RankEnv, RankSource};
use flotilla_launch::local::{rank_env, rank_slot, threads_per_rank, EnvSpec};
use flotilla_launch::rundir::{self, JobState, PreparedRun};
use flotilla_launch::{
    Cancel, JobOutcome, Launcher, LocalLauncher, LocalOptions, TaskCommand, TaskExit,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Prepares a run (or with `multirun`, a sweep) under `root`; several ranks train with DDP.
fn prepare(root: &Path, overrides: &[&str], multirun: bool) -> PreparedRun {
    let mut ov = common::ov(overrides);
    if overrides
        .iter()
        .any(|o| o.starts_with("compute.tasks_per_node=") || o.starts_with("compute.nodes="))
    {
        ov.push("trainer/dist=ddp".into());
        ov.push("trainer.micro_batch_size=2".into());
    }
    ov.push(format!("flotilla.run.dir={}/run", root.display()));
    ov.push(format!("flotilla.sweep.dir={}/sweep", root.display()));
    launch::prepare(&composer(), &ov, multirun).unwrap()
}

/// A task running `script` with `sh`; `$1` is the job directory.
fn sh(script: &str) -> TaskCommand {
    TaskCommand::new(["sh", "-c", script, "sh", "{job_dir}"])
}

fn options(task: TaskCommand) -> LocalOptions {
    let mut o = LocalOptions::with_task(task);
    o.echo = false;
    o.progress = false;
    o.grace = Duration::from_secs(2);
    o
}

fn launch(run: &PreparedRun, opts: LocalOptions) -> Vec<JobOutcome> {
    LocalLauncher::new(opts).launch(run).unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive for our purposes: read its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Waits until `n` pid files `pid_*` exist in `dir` and returns the pids.
fn wait_for_pids(dir: &Path, n: usize, limit: Duration) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let pids: Vec<i32> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| {
                    let e = e.ok()?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if !name.starts_with("pid_") {
                        return None;
                    }
                    std::fs::read_to_string(e.path()).ok()?.trim().parse().ok()
                })
                .collect()
            })
            .unwrap_or_default();
        if pids.len() >= n {
            return pids;
        }
        assert!(
            start.elapsed() < limit,
            "only {} of {n} ranks started",
            pids.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_all_gone(pids: &[i32]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

const WRITE_ENV: &str = r#"env > "$1/env_$RANK"; echo "hello from rank $RANK""#;

#[test]
fn two_ranks_get_the_torchrun_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(tmp.path(), &["compute.tasks_per_node=2"], false);
    let mut opts = options(sh(WRITE_ENV));
    opts.cores = Some(8);
    let out = launch(&run, opts);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].state, JobState::Completed, "{:?}", out[0]);
    let dir = &run.jobs[0].dir;
    let envs: Vec<_> = (0..2)
        .map(|r| read_env(&dir.join(format!("env_{r}"))))
        .collect();
    let port = &envs[0]["MASTER_PORT"];
    assert!(port.parse::<u16>().unwrap() > 0);
    let omp_inherited = std::env::var_os("OMP_NUM_THREADS").is_some();
    for (r, env) in envs.iter().enumerate() {
        assert_eq!(env["RANK"], r.to_string());
        assert_eq!(env["LOCAL_RANK"], r.to_string());
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        assert_eq!(env["NODE_RANK"], "0");
        assert_eq!(env["GROUP_RANK"], "0");
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(&env["MASTER_PORT"], port);
        assert_eq!(PathBuf::from(&env["FLOTILLA_JOB_DIR"]), *dir);
        if !omp_inherited {
            assert_eq!(env["OMP_NUM_THREADS"], "4"); // 8 cores / 2 ranks
        }
        // gpus_per_node=0: CUDA_VISIBLE_DEVICES is whatever the parent had.
        assert_eq!(
            env.get("CUDA_VISIBLE_DEVICES"),
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_ref()
        );
        let log = std::fs::read_to_string(dir.join(format!("logs/rank_{r}.log"))).unwrap();
        assert_eq!(log, format!("hello from rank {r}\n"));
    }
    let plan = run.plan.read().unwrap();
    assert_eq!(plan.jobs[0].state, JobState::Completed);
}

#[test]
fn four_ranks_on_two_simulated_nodes_get_their_own_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let mut run = prepare(
        tmp.path(),
        &["compute.tasks_per_node=2", "compute.gpus_per_node=2"],
        false,
    );
    // The schema accepts one node with compute.launcher=local; the launcher itself simulates
    // several nodes on this host.
    run.jobs[0].compute.nodes = 2;
    let out = launch(&run, options(sh(WRITE_ENV)));
    assert_eq!(out[0].state, JobState::Completed, "{:?}", out[0]);
    let dir = &run.jobs[0].dir;
    let parent: Option<Vec<String>> = std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .map(|s| s.split(',').map(|d| d.trim().to_string()).collect())
        .filter(|v: &Vec<String>| !v.is_empty() && !v[0].is_empty());
    let mut ports = std::collections::HashSet::new();
    for r in 0..4 {
        let env = read_env(&dir.join(format!("env_{r}")));
        assert_eq!(env["RANK"], r.to_string());
        assert_eq!(env["LOCAL_RANK"], (r % 2).to_string());
        assert_eq!(env["NODE_RANK"], (r / 2).to_string());
        assert_eq!(env["GROUP_WORLD_SIZE"], "2");
        assert_eq!(env["WORLD_SIZE"], "4");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
        let expected = match &parent {
            Some(list) => list[r % list.len()].clone(),
            None => r.to_string(),
        };
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], expected, "rank {r}");
        ports.insert(env["MASTER_PORT"].clone());
        assert!(dir.join(format!("logs/rank_{r}.log")).is_file());
    }
    assert_eq!(ports.len(), 1, "every rank has the same MASTER_PORT");
}

#[test]
fn rank_slots_and_thread_shares() {
    let compute = |nodes: usize, tasks: usize, gpus: usize| {
        let mut c = composer()
            .compose(&[
                format!("compute.tasks_per_node={tasks}"),
                "trainer/dist=ddp".into(),
                "trainer.micro_batch_size=2".into(),
            ])
            .unwrap()
            .typed
            .unwrap()
            .compute;
        // Set directly: the schema allows one node with the local launcher and one GPU per
        // rank; the launcher itself handles the other layouts.
        c.nodes = nodes;
        c.gpus_per_node = gpus;
        c
    };
    // 8 GPUs for 4 tasks: two each.
    let c = compute(1, 4, 8);
    assert_eq!(rank_slot(&c, 1).devices, Some(vec![2, 3]));
    // Fewer GPUs than tasks: shared round robin.
    let c = compute(1, 4, 2);
    assert_eq!(rank_slot(&c, 3).devices, Some(vec![1]));
    // No GPUs: none set.
    let c = compute(2, 2, 0);
    let s = rank_slot(&c, 3);
    assert_eq!((s.node_rank, s.local_rank, s.devices), (1, 1, None));
    // Device indices map through the parent's CUDA_VISIBLE_DEVICES.
    let c = compute(1, 2, 2);
    let dir = PathBuf::from("/x");
    let spec = EnvSpec {
        compute: &c,
        master_port: 1234,
        threads: Some(3),
        parent_devices: Some("4,5".into()),
        run_id: "r".into(),
        job_dir: &dir,
        job_num: 0,
    };
    let env: BTreeMap<String, String> = rank_env(&spec, 1).into_iter().collect();
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "5");
    assert_eq!(env["OMP_NUM_THREADS"], "3");
    assert_eq!(env["MASTER_PORT"], "1234");
    assert_eq!(threads_per_rank(2, 4), 1);
    assert_eq!(threads_per_rank(16, 4), 4);
}

/// The variables a launcher sets for a rank (the local launcher's, and the bare ones of
/// `RankEnv::on_this_host` that `bench comm` and the multi-process tests use) are read back by
/// the task as that rank.
#[test]
fn every_rank_discovers_the_slot_its_environment_gives_it() {
    let mut c = composer()
        .compose(&[
            "compute.tasks_per_node=2".into(),
            "trainer/dist=ddp".into(),
            "trainer.micro_batch_size=2".into(),
        ])
        .unwrap()
        .typed
        .unwrap()
        .compute;
    c.nodes = 2;
    let dir = PathBuf::from("/x");
    let spec = EnvSpec {
        compute: &c,
        master_port: 1234,
        threads: None,
        parent_devices: None,
        run_id: "run-7".into(),
        job_dir: &dir,
        job_num: 3,
    };
    for rank in 0..4 {
        let launched: BTreeMap<String, String> = rank_env(&spec, rank).into_iter().collect();
        let bare: BTreeMap<String, String> = RankEnv::on_this_host(rank, 2, 2, 1234)
            .vars()
            .into_iter()
            .collect();
        for (env, job_id) in [(&launched, Some("run-7")), (&bare, None)] {
            let info = discover(&|k| env.get(k).cloned()).unwrap();
            let slot = rank_slot(&c, rank);
            assert_eq!(
                (info.rank, info.local_rank, info.node_rank),
                (rank, slot.local_rank, slot.node_rank)
            );
            assert_eq!(
                (info.world_size, info.local_world_size, info.num_nodes),
                (4, 2, 2)
            );
            assert_eq!(
                (info.master_addr.as_str(), info.master_port),
                ("127.0.0.1", 1234)
            );
            assert_eq!(info.source, RankSource::Torchrun);
            assert_eq!(info.job_id.as_deref(), job_id);
        }
        assert_eq!(launched["FLOTILLA_JOB_NUM"], "3");
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_fails_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(tmp.path(), &["compute.tasks_per_node=4"], false);
    let script = r#"
        echo $$ > "$1/pid_$RANK"
        if [ "$RANK" = 2 ]; then
            echo "loading shard"
            sleep 0.5
            echo "boom: shard 2 is corrupt" >&2
            exit 3
        fi
        exec sleep 60
    "#;
    let start = Instant::now();
    let out = launch(&run, options(sh(script)));
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    let o = &out[0];
    assert_eq!(o.state, JobState::Failed);
    let f = o.failure.as_ref().expect("a failing rank");
    assert_eq!(f.rank, 2);
    assert_eq!(f.exit, TaskExit::Code(3));
    assert_eq!(f.log, run.jobs[0].dir.join("logs/rank_2.log"));
    assert_eq!(f.tail, ["loading shard", "boom: shard 2 is corrupt"]);
    let text = f.to_string();
    assert!(text.contains("rank 2 exited with code 3"), "{text}");
    assert!(text.contains("boom: shard 2 is corrupt"), "{text}");
    let pids = wait_for_pids(&run.jobs[0].dir, 4, Duration::from_secs(1));
    assert_all_gone(&pids);
    let plan = run.plan.read().unwrap();
    assert_eq!(plan.jobs[0].state, JobState::Failed);
    assert_eq!(
        plan.jobs[0].message.as_deref(),
        Some("rank 2 exited with code 3")
    );
}

#[test]
fn ranks_ignoring_sigterm_are_killed_after_the_grace_period() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(tmp.path(), &["compute.tasks_per_node=2"], false);
    let script = r#"
        if [ "$RANK" = 1 ]; then sleep 0.3; exit 1; fi
        trap '' TERM
        echo $$ > "$1/pid_$RANK"
        sleep 60
    "#;
    let mut opts = options(sh(script));
    opts.grace = Duration::from_millis(700);
    let start = Instant::now();
    let out = launch(&run, opts);
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(8), "{elapsed:?}");
    assert_eq!(out[0].state, JobState::Failed);
    assert_eq!(out[0].failure.as_ref().unwrap().rank, 1);
    let pids = wait_for_pids(&run.jobs[0].dir, 1, Duration::from_secs(1));
    assert_all_gone(&pids);
}

#[test]
fn cancel_stops_every_rank_and_marks_the_jobs_cancelled() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(
        tmp.path(),
        &["compute.tasks_per_node=2", "seed=1,2,3"],
        true,
    );
    let script = r#"echo $$ > "$1/pid_$RANK"; exec sleep 60"#;
    let opts = options(sh(script));
    let cancel: Cancel = opts.cancel.clone();
    let job0 = run.jobs[0].dir.clone();
    let watcher = std::thread::spawn(move || {
        let pids = wait_for_pids(&job0, 2, Duration::from_secs(10));
        cancel.cancel();
        pids
    });
    let start = Instant::now();
    let out = launch(&run, opts);
    assert!(start.elapsed() < Duration::from_secs(10));
    let pids = watcher.join().unwrap();
    assert_all_gone(&pids);
    let states: Vec<JobState> = out.iter().map(|o| o.state).collect();
    assert_eq!(states, [JobState::Cancelled; 3]);
    // Jobs 1 and 2 never started.
    assert!(!run.jobs[1].dir.join("pid_0").exists());
    let plan = run.plan.read().unwrap();
    assert!(plan.jobs.iter().all(|j| j.state == JobState::Cancelled));
}

#[test]
fn sweep_jobs_run_one_after_another_or_up_to_max_parallel() {
    for parallel in [1usize, 2] {
        let tmp = tempfile::tempdir().unwrap();
        let running = tmp.path().join("running");
        std::fs::create_dir(&running).unwrap();
        let run = prepare(
            tmp.path(),
            &[
                "seed=1,2,3,4",
                "compute.tasks_per_node=1",
                &format!("compute.max_parallel={parallel}"),
            ],
            true,
        );
        let script = format!(
            r#"touch "{r}/$FLOTILLA_JOB_NUM"; sleep 0.6; ls "{r}" | wc -l > "$1/seen"; rm "{r}/$FLOTILLA_JOB_NUM""#,
            r = running.display()
        );
        let out = launch(&run, options(sh(&script)));
        assert!(
            out.iter().all(|o| o.state == JobState::Completed),
            "{out:?}"
        );
        let seen: Vec<usize> = run
            .jobs
            .iter()
            .map(|j| {
                std::fs::read_to_string(j.dir.join("seen"))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert!(seen.iter().all(|&s| s <= parallel), "{parallel}: {seen:?}");
        assert!(seen.contains(&parallel), "{parallel}: {seen:?}");
        let plan = run.plan.read().unwrap();
        assert!(plan.jobs.iter().all(|j| j.state == JobState::Completed));
    }
}

#[test]
fn a_task_that_cannot_start_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(tmp.path(), &[], false);
    let err = LocalLauncher::new(options(TaskCommand::new(["/nonexistent/task"])))
        .launch(&run)
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/task") && text.contains("rank 0"),
        "{text}"
    );
    assert_eq!(run.plan.read().unwrap().jobs[0].state, JobState::Failed);
}

// ---------------------------------------------------------------------------------------------
// through the CLI
// ---------------------------------------------------------------------------------------------

fn write_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn flotilla_run(cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    c.current_dir(cwd)
        .arg("run")
        .arg("--config-dir")
        .arg(conf_dir());
    c
}

#[test]
fn cli_ctrl_c_stops_all_ranks_and_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(
        tmp.path(),
        "task.sh",
        r#"echo $$ > "$1/pid_$RANK"; sleep 60 & echo $! > "$1/pid_child_$RANK"; wait"#,
    );
    let run_dir = tmp.path().join("run");
    let mut child = flotilla_run(tmp.path())
        .arg("--task-exec")
        .arg(&script)
        .args(["--format", "json"])
        .arg("compute.tasks_per_node=2")
        .arg("trainer/dist=ddp")
        .arg(format!("flotilla.run.dir={}", run_dir.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = wait_for_pids(&run_dir, 4, Duration::from_secs(20));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            panic!("flotilla run did not stop within 15 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status:?}");
    assert_all_gone(&pids);
    let out = child.wait_with_output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["jobs"][0]["state"], "CANCELLED");
    let plan = rundir::PlanFile::single(&run_dir).read().unwrap();
    assert_eq!(plan.jobs[0].state, JobState::Cancelled);
}

/// A closed terminal (SIGHUP) stops `flotilla run` as Ctrl-C does: every rank stopped, the job
/// CANCELLED with the reason recorded, and `status` and `report` agreeing.
#[test]
fn cli_sighup_cancels_and_records_the_job_as_ctrl_c_does() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(
        tmp.path(),
        "task.sh",
        r#"echo $$ > "$1/pid_$RANK"; sleep 60 & echo $! > "$1/pid_child_$RANK"; wait"#,
    );
    let sweep = tmp.path().join("sweep");
    let mut child = flotilla_run(tmp.path())
        .arg("--task-exec")
        .arg(&script)
        .args(["-m", "--format", "json"])
        .arg("compute.tasks_per_node=2")
        .arg("trainer/dist=ddp")
        .arg("seed=1,2")
        .arg(format!("flotilla.sweep.dir={}", sweep.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = wait_for_pids(&sweep.join("0"), 4, Duration::from_secs(20));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            panic!("flotilla run did not stop within 15 s of SIGHUP");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert_all_gone(&pids);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("job 0 cancelled") && err.contains("received SIGHUP"),
        "{err}"
    );
    assert!(!err.contains("): cancelled\n"), "{err}");
    let plan = rundir::PlanFile::sweep(&sweep).read().unwrap();
    let states: Vec<JobState> = plan.jobs.iter().map(|j| j.state).collect();
    assert_eq!(states, [JobState::Cancelled, JobState::Cancelled]);
    assert!(plan.jobs[0]
        .message
        .as_deref()
        .unwrap()
        .contains("received SIGHUP"));
    let st = flotilla_launch::status(&sweep).unwrap();
    let report = flotilla_results::report::build(
        std::slice::from_ref(&sweep),
        &flotilla_results::report::ReportOptions::default(),
    )
    .unwrap();
    for (s, r) in st.jobs.iter().zip(&report.jobs) {
        assert_eq!((s.num, s.state), (r.num, r.state));
        assert_eq!(s.state, JobState::Cancelled);
    }
}

/// A program that logs no clock of its own still gets its wall time: the launcher records how
/// long its processes ran, and the report shows it.
#[test]
fn a_program_without_its_own_clock_gets_its_wall_time() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(
        tmp.path(),
        "task.sh",
        r#"sleep 0.5; echo '{"step": 0, "loss": 1.5}' > "$1/metrics.jsonl""#,
    );
    let run_dir = tmp.path().join("run");
    let out = flotilla_run(tmp.path())
        .arg("--task-exec")
        .arg(&script)
        .arg(format!("flotilla.run.dir={}", run_dir.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = rundir::PlanFile::single(&run_dir).read().unwrap();
    let wall = plan.jobs[0].wall_s.expect("wall_s recorded");
    assert!((0.5..30.0).contains(&wall), "{wall}");
    let report = flotilla_results::report::build(
        std::slice::from_ref(&run_dir),
        &flotilla_results::report::ReportOptions::default(),
    )
    .unwrap();
    assert_eq!(report.jobs[0].wall_s, Some(wall));
    assert_eq!(report.jobs[0].best, Some(1.5));
}

#[test]
fn cli_failing_job_exits_1_with_the_rank_and_its_log_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let script = write_script(
        tmp.path(),
        "task.sh",
        r#"if [ "$RANK" = 1 ]; then echo "CUDA error: out of memory" >&2; exit 7; fi; exec sleep 60"#,
    );
    let run_dir = tmp.path().join("run");
    let start = Instant::now();
    let out = flotilla_run(tmp.path())
        .arg("--task-exec")
        .arg(&script)
        .args(["--format", "json"])
        .arg("compute.tasks_per_node=2")
        .arg("trainer/dist=ddp")
        .arg(format!("flotilla.run.dir={}", run_dir.display()))
        .output()
        .unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1 exited with code 7"), "{err}");
    assert!(err.contains("CUDA error: out of memory"), "{err}");
    assert!(err.contains("rank_1.log"), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "sweep_dir": null,
            "jobs": [{"num": 0, "dir": run_dir.display().to_string(), "job_id": null, "state": "FAILED"}]
        })
    );
    // status agrees.
    let st = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("status")
        .arg(&run_dir)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&st.stdout).contains("FAILED"));
}

#[test]
fn cli_runs_train_end_to_end_with_one_rank() {
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    let out = flotilla_run(tmp.path())
        .args(["--format", "json", "trainer.max_steps=5"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["sweep_dir"], serde_json::Value::Null);
    assert_eq!(json["jobs"][0]["state"], "COMPLETED");
    let dir = PathBuf::from(json["jobs"][0]["dir"].as_str().unwrap());
    assert!(dir.starts_with(tmp.path().canonicalize().unwrap()) || dir.starts_with(tmp.path()));
    assert!(dir.join("final").is_dir() && dir.join("metrics.csv").is_file());
    // Rank 0's output reached the console (stderr) and its log.
    let log = std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap();
    assert!(log.contains("done: 5 steps"), "{log}");
    assert!(err.contains("done: 5 steps"), "{err}");
    // `--prepared` left the prepared files alone.
    assert_eq!(
        std::fs::read_to_string(dir.join("overrides.yaml")).unwrap(),
        "- \"trainer.max_steps=5\"\n"
    );
    let st = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["status", "--format", "json"])
        .arg(&dir)
        .output()
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(st["jobs"][0]["state"], "COMPLETED");
    assert_eq!(st["jobs"][0]["steps"], 5);
    assert_eq!(st["jobs"][0]["final_model"], true);
}

#[test]
fn cli_runs_a_ddp_sweep_with_two_ranks_per_job() {
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    let out = flotilla_run(tmp.path())
        .args([
            "--format",
            "json",
            "-m",
            "trainer.max_steps=3",
            "compute.tasks_per_node=2",
            "trainer/dist=ddp",
            "seed=1,2",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sweep = PathBuf::from(json["sweep_dir"].as_str().unwrap());
    let jobs = json["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(j["num"], i);
        assert_eq!(j["state"], "COMPLETED");
        let dir = PathBuf::from(j["dir"].as_str().unwrap());
        assert_eq!(dir, sweep.join(i.to_string()));
        assert!(dir.join("final").is_dir());
        for r in 0..2 {
            assert!(dir.join(format!("logs/rank_{r}.log")).is_file());
        }
    }
    let plan = rundir::PlanFile::sweep(&sweep).read().unwrap();
    assert!(plan.jobs.iter().all(|j| j.state == JobState::Completed));
}

#[test]
fn cli_resume_sweep_reruns_only_the_jobs_that_did_not_complete() {
    let tmp = tempfile::tempdir().unwrap();
    // A job succeeds once its directory holds `ok`; every start is counted.
    let script = write_script(
        tmp.path(),
        "task.sh",
        r#"echo x >> "$1/starts"; if [ -e "$1/ok" ]; then echo fine; exit 0; fi; echo "not yet"; exit 4"#,
    );
    let sweep = tmp.path().join("sw");
    let run = |extra: &[&str]| {
        flotilla_run(tmp.path())
            .arg("--task-exec")
            .arg(&script)
            .args(["--format", "json"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[
        "-m",
        "compute.tasks_per_node=1",
        "seed=1,2,3",
        &format!("flotilla.sweep.dir={}", sweep.display()),
    ]);
    assert_eq!(out.status.code(), Some(1));
    std::fs::write(sweep.join("0/ok"), "").unwrap();
    std::fs::write(sweep.join("2/ok"), "").unwrap();
    let resume = ["--resume-sweep", sweep.to_str().unwrap()];
    let out = run(&resume);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<(u64, &str)> = json["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["num"].as_u64().unwrap(), j["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [(0, "COMPLETED"), (1, "FAILED"), (2, "COMPLETED")]);
    std::fs::write(sweep.join("1/ok"), "").unwrap();
    let out = run(&resume);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(json["jobs"][0]["num"], 1);
    // Nothing left to do: nothing starts.
    let out = run(&resume);
    assert!(out.status.success());
    let starts = |n: usize| {
        std::fs::read_to_string(sweep.join(format!("{n}/starts")))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!((starts(0), starts(1), starts(2)), (2, 3, 2));
    let plan = rundir::PlanFile::sweep(&sweep).read().unwrap();
    assert!(plan.jobs.iter().all(|j| j.state == JobState::Completed));
    let log = std::fs::read_to_string(sweep.join("1/logs/rank_0.log")).unwrap();
    assert_eq!(log.matches("started again").count(), 2, "{log}");
}

#[test]
fn status_reports_unknown_for_a_local_job_whose_supervisor_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(tmp.path(), &["seed=1,2"], true);
    // A process that has exited stands for a `flotilla run` killed with SIGKILL.
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    run.plan
        .update(|p| {
            p.extra.insert(
                "supervisor".into(),
                serde_json::json!({"host": rundir::meta::host_name(), "pid": pid}),
            );
        })
        .unwrap();
    run.plan.set_state(0, JobState::Running, None).unwrap();
    run.plan.set_state(1, JobState::Completed, None).unwrap();
    let st = flotilla_launch::status(run.sweep_dir.as_ref().unwrap()).unwrap();
    let states: Vec<JobState> = st.jobs.iter().map(|j| j.state).collect();
    assert_eq!(states, [JobState::Unknown, JobState::Completed]);
    // It says why, and `flotilla report` says the same.
    let reason = st.jobs[0].message.clone().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "the flotilla run that started it (pid {pid}) is gone"
        )),
        "{reason}"
    );
    assert!(st.jobs[1].message.is_none());
    let report = flotilla_results::report::build(
        &[run.sweep_dir.clone().unwrap()],
        &flotilla_results::report::ReportOptions::default(),
    )
    .unwrap();
    let states: Vec<JobState> = report.jobs.iter().map(|j| j.state).collect();
    assert_eq!(states, [JobState::Unknown, JobState::Completed]);
    assert!(
        report.jobs[0]
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains(&reason),
        "{:?}",
        report.jobs[0].reason
    );
    // With a live supervisor (this test process), RUNNING stays RUNNING.
    run.plan
        .update(|p| {
            p.extra.insert(
                "supervisor".into(),
                serde_json::json!({"host": rundir::meta::host_name(), "pid": std::process::id()}),
            );
        })
        .unwrap();
    let st = flotilla_launch::status(run.sweep_dir.as_ref().unwrap()).unwrap();
    assert_eq!(st.jobs[0].state, JobState::Running);
    let text = flotilla_launch::status_text(&st);
    assert!(text.contains("1 RUNNING, 1 COMPLETED"), "{text}");
}
