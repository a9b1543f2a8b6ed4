//! Packed sweeps (`compute.pack`) on the real single-node Slurm of
//! `scripts/slurm-cluster-start.sh` (4 fake GPUs): the jobs run as job steps of a few
//! allocations, never more at once than the slots, each with GPUs of its own; a preempted
//! allocation requeues and every job completes exactly once; a failing job fails alone. The
//! jobs are a tiny shell program (the user's-own-program path) that records, from inside the
//! job, when it ran and which devices it saw.

mod common;
#[path = "common/slurm_cluster.rs"]
mod slurm_cluster;

use slurm_cluster::Cluster;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The job: records its start (time, devices, allocation, step, restart, the step count it
/// starts from, rank), then per `$2`: `run` sleeps 2 s; `steps` counts 8 steps of 0.5 s in
/// `steps` (resumed from it), exiting 75 on USR2 like a checkpointing trainer; `fail` exits 3
/// when x is 5, the first time. Then writes metrics.csv (x·3 at step 0) and its end time.
const PROGRAM: &str = r#"#!/bin/bash
x=$1 mode=$2 d=$FLOTILLA_JOB_DIR
echo "start $(date +%s.%N) ${CUDA_VISIBLE_DEVICES:-none} $SLURM_JOB_ID $SLURM_STEP_ID ${SLURM_RESTART_COUNT:-0} $(cat "$d/steps" 2>/dev/null || echo 0) $RANK" >>"$d/seen"
case $mode in
  run) sleep 2 ;;
  fail)
    if [[ $x == 5 && ! -e $d/failed ]]; then
      touch "$d/failed"; echo "job x=5: something went wrong (boom)" >&2; exit 3
    fi
    sleep 1 ;;
  steps)
    stop=0; trap 'stop=1' USR2
    step=$(cat "$d/steps" 2>/dev/null || echo 0)
    while ((step < 8)); do
      sleep 0.5; step=$((step + 1)); echo "$step" >"$d/steps"
      if ((stop)); then echo "stopped $(date +%s.%N) $step" >>"$d/seen"; exit 75; fi
    done
    # Stopped as the last step ended: checkpointed all the same.
    if ((stop)); then echo "stopped $(date +%s.%N) $step" >>"$d/seen"; exit 75; fi ;;
esac
printf 'step,loss\n0,%s\n' "$((x * 3))" >"$d/metrics.csv"
echo "end $(date +%s.%N)" >>"$d/seen"
"#;

fn project(root: &Path, mode: &str, pack: usize) -> PathBuf {
    project_ranks(root, mode, pack, 1)
}

/// A project whose jobs run `ranks` tasks with a GPU each.
fn project_ranks(root: &Path, mode: &str, pack: usize, ranks: usize) -> PathBuf {
    let proj = root.join(format!("proj-{mode}-{pack}-{ranks}"));
    std::fs::create_dir_all(proj.join("conf")).unwrap();
    std::fs::write(proj.join("job.sh"), PROGRAM).unwrap();
    std::fs::write(
        proj.join("conf/config.yaml"),
        format!(
            "x: 0
compute:
  launcher: slurm
  tasks_per_node: {ranks}
  gpus_per_node: {ranks}
  cpus_per_task: 1
  timeout_min: 5
  pack: {pack}
flotilla:
  task:
    command: [bash, job.sh, '${{x}}', {mode}]
"
        ),
    )
    .unwrap();
    proj
}

fn flotilla(cwd: &Path, args: &[&str]) -> Output {
    Command::new(common::flotilla_bin())
        .args(args)
        .current_dir(cwd)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla")
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn status_json(dir: &Path) -> serde_json::Value {
    let out = ok(flotilla(
        dir,
        &["status", "--format", "json", &dir.display().to_string()],
    ));
    serde_json::from_str(&out).unwrap()
}

fn wait_terminal(dir: &Path, timeout: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let st = status_json(dir);
        if slurm_cluster::all_jobs_terminal(&st) {
            return st;
        }
        if t0.elapsed() > timeout {
            let _ = Command::new("squeue").args(["-t", "all"]).status();
            panic!("{} not finished after {timeout:?}: {st:#}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One run of a job as it recorded it.
#[derive(Debug, Clone)]
struct Seen {
    job: usize,
    start: f64,
    end: Option<f64>,
    devices: String,
    allocation: String,
    /// It ran to the end (not stopped by the signal).
    completed: bool,
    /// The step count it started from (its checkpoint).
    from_step: u32,
    rank: usize,
}

fn seen(sweep: &Path, jobs: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    for job in 0..jobs {
        let text = std::fs::read_to_string(sweep.join(job.to_string()).join("seen"))
            .unwrap_or_else(|e| panic!("job {job} recorded nothing: {e}"));
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w[0] {
                "start" => out.push(Seen {
                    job,
                    start: w[1].parse().unwrap(),
                    end: None,
                    completed: false,
                    devices: w[2].into(),
                    allocation: w[3].into(),
                    from_step: w[6].parse().unwrap(),
                    rank: w[7].parse().unwrap(),
                }),
                "end" | "stopped" => {
                    // Every rank records its end, after its start.
                    let Some(last) = out
                        .iter_mut()
                        .rev()
                        .find(|s| s.job == job && s.end.is_none())
                    else {
                        continue;
                    };
                    last.end = Some(w[1].parse().unwrap());
                    last.completed = w[0] == "end";
                }
                _ => {}
            }
        }
    }
    out
}

/// At no instant more than `slots` ranks run at once, and ranks running at the same time share
/// no device.
fn check_overlaps(runs: &[Seen], slots: usize) {
    for a in runs {
        let during: Vec<&Seen> = runs
            .iter()
            .filter(|b| b.start <= a.start && b.end.is_none_or(|e| e > a.start))
            .collect();
        assert!(
            during.len() <= slots,
            "{} ranks at once at {}: {during:#?}",
            during.len(),
            a.start
        );
        for b in &during {
            if (b.job, b.rank) != (a.job, a.rank) {
                assert_ne!(
                    a.devices, b.devices,
                    "job {} rank {} and job {} rank {} share a GPU",
                    a.job, a.rank, b.job, b.rank
                );
            }
        }
    }
}

#[test]
fn packed_sweeps_on_the_real_cluster() {
    // MaxArraySize 4: every sweep below fits; section 7 checks `plan` and `run` split at it.
    let Some(_cluster) = Cluster::start(1, &[("SLURM_TEST_MAX_ARRAY_SIZE", "4")]) else {
        return;
    };
    let tmp = tempfile::Builder::new()
        .prefix("flotilla-pack-test")
        .tempdir()
        .unwrap();
    let root = tmp.path();

    // 1. 12 one-GPU jobs with pack 4: at most 3 allocations, never more than 4 at once, each
    //    with a device of its own, every job COMPLETED with its own metrics.
    let t = Instant::now();
    let proj = project(root, "run", 4);
    let sweep = root.join("pack12");
    let dir_arg = format!("flotilla.sweep.dir={}", sweep.display());
    let plan = ok(flotilla(&proj, &["plan", "-m", "x=range(0,12)"]));
    assert!(plan.contains("3 allocations"), "{plan}");
    ok(flotilla(&proj, &["run", "-m", "x=range(0,12)", &dir_arg]));
    let st = wait_terminal(&sweep, Duration::from_secs(180));
    let runs = seen(&sweep, 12);
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "COMPLETED", "{st:#}");
        assert!(j["step"].is_u64(), "the step that ran it: {j:#}");
        let num = j["num"].as_u64().unwrap() as usize;
        let metrics =
            std::fs::read_to_string(sweep.join(num.to_string()).join("metrics.csv")).unwrap();
        assert_eq!(metrics, format!("step,loss\n0,{}\n", num * 3));
    }
    assert_eq!(runs.len(), 12, "each job ran once: {runs:#?}");
    let allocations: BTreeSet<&str> = runs.iter().map(|r| r.allocation.as_str()).collect();
    assert!(allocations.len() <= 3, "{allocations:?}");
    let devices: BTreeSet<&str> = runs.iter().map(|r| r.devices.as_str()).collect();
    assert!(
        devices.len() >= 2 && !devices.contains("none"),
        "every job sees its own GPU: {devices:?}"
    );
    check_overlaps(&runs, 4);
    let text = ok(flotilla(&sweep, &["status", &sweep.display().to_string()]));
    println!("{text}");
    println!("12 jobs packed 4 at a time: {:.1?}", t.elapsed());

    // 2. A failing job fails alone, with its reason; the others complete.
    let proj = project(root, "fail", 4);
    let sweep = root.join("packfail");
    let dir_arg = format!("flotilla.sweep.dir={}", sweep.display());
    ok(flotilla(&proj, &["run", "-m", "x=range(0,8)", &dir_arg]));
    let st = wait_terminal(&sweep, Duration::from_secs(120));
    for j in st["jobs"].as_array().unwrap() {
        let want = if j["num"] == 5 { "FAILED" } else { "COMPLETED" };
        assert_eq!(j["state"], want, "{st:#}");
    }
    let msg = st["jobs"][5]["message"].as_str().unwrap_or("");
    assert!(msg.contains("boom"), "the failure's reason: {msg}");
    // `--after` on that sweep is refused, naming the failed job; nothing is created.
    let chained = root.join("after-failed");
    let out = flotilla(
        &proj,
        &[
            "run",
            "--after",
            &sweep.display().to_string(),
            &format!("flotilla.run.dir={}", chained.display()),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("job 5"), "{err}");
    assert!(err.contains("FAILED"), "{err}");
    assert!(!chained.exists());
    // --resume-sweep submits the failed job again, packed: a new allocation runs it as a job
    // step; the completed jobs are not run again.
    let before = seen(&sweep, 8);
    let first_allocation = st["jobs"][5]["job_id"].as_str().unwrap().to_string();
    let out = ok(flotilla(
        &proj,
        &["run", "--resume-sweep", &sweep.display().to_string()],
    ));
    println!("{out}");
    let st = wait_terminal(&sweep, Duration::from_secs(120));
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "COMPLETED", "{st:#}");
    }
    let job5 = &st["jobs"][5];
    assert!(job5["step"].is_u64(), "run as a job step: {job5:#}");
    assert_ne!(job5["job_id"], first_allocation.as_str(), "{job5:#}");
    let after = seen(&sweep, 8);
    assert_eq!(
        after.len(),
        before.len() + 1,
        "only job 5 ran again: {after:#?}"
    );

    // 3. A preempted allocation (USR2 to its batch shell): the running jobs stop (exit 75),
    //    the allocation requeues, and every job completes exactly once, the stopped ones
    //    resumed from their step count.
    let t = Instant::now();
    let proj = project(root, "steps", 4);
    let sweep = root.join("packpreempt");
    let dir_arg = format!("flotilla.sweep.dir={}", sweep.display());
    ok(flotilla(&proj, &["run", "-m", "x=range(0,6)", &dir_arg]));
    let t0 = Instant::now();
    let alloc = loop {
        let plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sweep.join("sweep.json")).unwrap())
                .unwrap();
        let running: Vec<String> = plan["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["state"] == "RUNNING" && j["step"].is_u64())
            .filter_map(|j| j["job_id"].as_str().map(str::to_string))
            .collect();
        if running.len() == 4 {
            break running[0].clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "never 4 running: {plan:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_secs(1));
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &alloc])
        .output()
        .unwrap();
    assert!(
        sc.status.success(),
        "{}",
        String::from_utf8_lossy(&sc.stderr)
    );
    // A sweep chained with --after waits for this one (sbatch --dependency=afterok).
    let run_proj = project(root, "run", 4);
    let chained = root.join("after-ok");
    ok(flotilla(
        &run_proj,
        &[
            "run",
            "-m",
            "x=20,21",
            "--after",
            &sweep.display().to_string(),
            &format!("flotilla.sweep.dir={}", chained.display()),
        ],
    ));
    let st = wait_terminal(&sweep, Duration::from_secs(240));
    let chained_st = wait_terminal(&chained, Duration::from_secs(120));
    let runs = seen(&sweep, 6);
    let last_end = runs.iter().filter_map(|r| r.end).fold(0.0, f64::max);
    for r in seen(&chained, 2) {
        assert!(
            r.start >= last_end,
            "a chained job started before the sweep ended: {r:?}"
        );
    }
    for j in chained_st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "COMPLETED", "{chained_st:#}");
    }
    let mut per_job: BTreeMap<usize, Vec<&Seen>> = BTreeMap::new();
    for r in &runs {
        per_job.entry(r.job).or_default().push(r);
    }
    let mut resumed = 0;
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "COMPLETED", "{st:#}");
        let num = j["num"].as_u64().unwrap() as usize;
        let d = sweep.join(num.to_string());
        assert_eq!(
            std::fs::read_to_string(d.join("steps")).unwrap().trim(),
            "8"
        );
        let job_runs = &per_job[&num];
        assert_eq!(
            job_runs.iter().filter(|r| r.completed).count(),
            1,
            "job {num} completed once: {job_runs:#?}"
        );
        assert!(job_runs.last().unwrap().completed, "{job_runs:#?}");
        // Each run after a stop starts from the step count the stopped one reached (its
        // checkpoint), in this allocation requeued or in another one of the array.
        for pair in job_runs.windows(2) {
            assert!(!pair[0].completed, "{job_runs:#?}");
            assert!(pair[1].from_step > pair[0].from_step, "{job_runs:#?}");
        }
        if job_runs.len() > 1 {
            resumed += 1;
            assert!(
                job_runs.last().unwrap().from_step > 0,
                "job {num} resumed from its checkpoint: {job_runs:#?}"
            );
        }
    }
    assert!(
        resumed >= 1,
        "some jobs were interrupted and resumed: {runs:#?}"
    );
    check_overlaps(&runs, 4);
    let batch_logs: String = std::fs::read_dir(sweep.join("slurm"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pack-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        batch_logs.contains("requeueing the allocation (restart 1"),
        "the stopped allocation requeued itself: {batch_logs}"
    );
    println!(
        "preempted packed allocation, {resumed} jobs resumed: {:.1?}",
        t.elapsed()
    );

    // 4. 2-rank jobs take 2 slots: pack 4 runs 2 jobs at a time, each rank with a GPU of its
    //    own, disjoint from the other job's.
    let t = Instant::now();
    let proj = project_ranks(root, "run", 4, 2);
    let sweep = root.join("pack-2rank");
    let dir_arg = format!("flotilla.sweep.dir={}", sweep.display());
    let plan = ok(flotilla(&proj, &["plan", "-m", "x=range(0,4)"]));
    assert!(
        plan.contains("2 allocations") && plan.contains("2 jobs at a time"),
        "{plan}"
    );
    ok(flotilla(&proj, &["run", "-m", "x=range(0,4)", &dir_arg]));
    let st = wait_terminal(&sweep, Duration::from_secs(120));
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "COMPLETED", "{st:#}");
    }
    let runs = seen(&sweep, 4);
    assert_eq!(runs.len(), 8, "2 ranks per job, each once: {runs:#?}");
    for job in 0..4 {
        let ranks: BTreeSet<usize> = runs
            .iter()
            .filter(|r| r.job == job)
            .map(|r| r.rank)
            .collect();
        assert_eq!(ranks, BTreeSet::from([0, 1]), "{runs:#?}");
    }
    check_overlaps(&runs, 4);
    let at_once = runs
        .iter()
        .map(|a| {
            runs.iter()
                .filter(|b| b.start <= a.start && b.end.is_none_or(|e| e > a.start))
                .map(|b| b.job)
                .collect::<BTreeSet<usize>>()
                .len()
        })
        .max()
        .unwrap();
    assert_eq!(at_once, 2, "two 2-rank jobs at once in 4 slots: {runs:#?}");
    println!("4 two-rank jobs packed 2 at a time: {:.1?}", t.elapsed());

    // 5. The built-in trainer, packed: the same losses as the same jobs unpacked.
    let t = Instant::now();
    common::train_binary();
    let train = |pack: usize, dir: &Path| {
        let mut args: Vec<String> = [
            "run",
            "-m",
            "compute=slurm",
            "compute.tasks_per_node=1",
            "compute.cpus_per_task=1",
            "compute.gpus_per_node=0",
            "compute.mem_gb=1",
            "compute.timeout_min=5",
            "model.hidden_size=32",
            "model.intermediate_size=64",
            "model.num_hidden_layers=1",
            "model.num_attention_heads=2",
            "model.num_key_value_heads=1",
            "trainer.eval_every=0",
            "trainer.warmup_steps=2",
            "trainer.log_every=2",
            "trainer.max_steps=6",
            "trainer.global_batch_size=2",
            "trainer.micro_batch_size=2",
            "data.num_train=50",
            "data.num_eval=0",
            "seed=1,2,3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("compute.pack={pack}"));
        args.push(format!("flotilla.sweep.dir={}", dir.display()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ok(flotilla(&common::repo_root(), &args));
    };
    let packed = root.join("train-packed");
    let unpacked = root.join("train-unpacked");
    train(3, &packed);
    train(1, &unpacked);
    let st = wait_terminal(&packed, Duration::from_secs(240));
    let st_unpacked = wait_terminal(&unpacked, Duration::from_secs(240));
    let losses = |dir: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let (step, loss) = (
            header.iter().position(|h| *h == "step").unwrap(),
            header.iter().position(|h| *h == "loss").unwrap(),
        );
        lines
            .map(|l| l.split(',').collect::<Vec<&str>>())
            .filter(|row| !row[loss].is_empty())
            .map(|row| format!("{} {}", row[step], row[loss]))
            .collect()
    };
    let allocation = st["jobs"][0]["job_id"].as_str().unwrap().to_string();
    for (j, u) in st["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(st_unpacked["jobs"].as_array().unwrap())
    {
        assert_eq!(j["state"], "COMPLETED", "{st:#}");
        assert_eq!(u["state"], "COMPLETED", "{st_unpacked:#}");
        assert_eq!(
            j["job_id"],
            allocation.as_str(),
            "one allocation ran all 3: {st:#}"
        );
        assert!(j["step"].is_u64(), "{j:#}");
        let dir = |v: &serde_json::Value| PathBuf::from(v["dir"].as_str().unwrap());
        let (lp, lu) = (losses(&dir(j)), losses(&dir(u)));
        assert!(lp.len() >= 3, "{lp:?}");
        assert_eq!(lp, lu, "job {}: packed and unpacked losses", j["num"]);
        assert!(dir(j).join("final").is_dir(), "{}", dir(j).display());
    }
    println!(
        "built-in trainer, 3 jobs packed and unpacked: {:.1?}",
        t.elapsed()
    );

    // 6. A job back in the queue whose allocation ended is PENDING while another allocation of
    //    its array can take it, and that one runs it. With `--no-requeue`, allocation 0 cannot
    //    requeue itself after USR2: its two jobs stay REQUEUED and it ends, while allocation 1
    //    is held (`--begin` an hour away) until the test releases it.
    let t = Instant::now();
    let proj = project(root, "steps", 2);
    let sweep = root.join("pack-sibling");
    ok(flotilla(
        &proj,
        &[
            "run",
            "-m",
            "x=range(0,4)",
            "+compute.requeue=false",
            "+compute.additional_parameters.begin=now+1hour",
            &format!("flotilla.sweep.dir={}", sweep.display()),
        ],
    ));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sweep.join("sweep.json")).unwrap()).unwrap();
    let array = plan["jobs"][0]["pack_array"].as_str().unwrap().to_string();
    // The held allocation would start in an hour: cancelled whatever happens here.
    let _cancel = CancelOnDrop(array.clone());
    let (first, second) = (format!("{array}_0"), format!("{array}_1"));
    let release = |id: &str| {
        let out = Command::new("scontrol")
            .args(["update", &format!("jobid={id}"), "StartTime=now"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    release(&first);
    let running = |st: &serde_json::Value| {
        st["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["state"] == "RUNNING" && j["step"].is_u64())
            .count()
    };
    let t0 = Instant::now();
    while running(&status_json(&sweep)) < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{:#}",
            status_json(&sweep)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &first])
        .output()
        .unwrap();
    assert!(
        sc.status.success(),
        "{}",
        String::from_utf8_lossy(&sc.stderr)
    );
    // Allocation 0 ends; its jobs wait in the queue for allocation 1.
    let t0 = Instant::now();
    loop {
        let ended = Command::new("squeue")
            .args(["-j", &first, "-t", "all", "-h", "-o", "%T"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&ended.stdout).trim() == "COMPLETED" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{:#}",
            status_json(&sweep)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let recorded: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sweep.join("sweep.json")).unwrap()).unwrap();
    let requeued = recorded["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["state"] == "REQUEUED" && j["job_id"] == first.as_str())
        .count();
    assert_eq!(requeued, 2, "two jobs went back in the queue: {recorded:#}");
    let st = status_json(&sweep);
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(
            j["state"], "PENDING",
            "allocation {second} will run it: {st:#}"
        );
    }
    release(&second);
    let st = wait_terminal(&sweep, Duration::from_secs(120));
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "COMPLETED", "{st:#}");
        assert_eq!(j["job_id"], second.as_str(), "{st:#}");
    }
    let runs = seen(&sweep, 4);
    let resumed = runs
        .iter()
        .filter(|r| r.allocation == array_job_id(&second) && r.from_step > 0)
        .count();
    assert_eq!(
        resumed, 2,
        "allocation 1 resumed both stopped jobs: {runs:#?}"
    );
    println!(
        "queued jobs of an ended allocation, taken by its sibling: {:.1?}",
        t.elapsed()
    );

    // 7. `plan` prints the submissions `run` makes, split at the cluster's MaxArraySize (4 on
    //    a cluster this test started): 12 jobs packed 2 at a time need 6 allocations, an array
    //    holds 4; 6 unpacked jobs are two arrays.
    let max = flotilla_launch::slurm::max_array_size().unwrap();
    let proj = project(root, "run", 2);
    let plan = ok(flotilla(&proj, &["plan", "-m", "x=range(0,12)"]));
    let allocations = 6.min(max);
    assert!(
        plan.contains(&format!("(MaxArraySize {max})"))
            && plan.contains(&format!(
                "1. job array --array=0-{}, packed: 12 jobs (0-11) into {allocations} allocations",
                allocations - 1
            )),
        "{plan}"
    );
    let plan = ok(flotilla(
        &proj,
        &["plan", "-m", "x=range(0,6)", "compute.pack=1"],
    ));
    let dry = root.join("plan-dry");
    ok(flotilla(
        &proj,
        &[
            "run",
            "-m",
            "--dry-run",
            "x=range(0,6)",
            "compute.pack=1",
            &format!("flotilla.sweep.dir={}", dry.display()),
        ],
    ));
    let mut arrays: Vec<String> = std::fs::read_dir(dry.join("slurm"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("#SBATCH --array=").map(str::to_string))
        })
        .collect();
    arrays.sort();
    let planned: Vec<String> = plan
        .lines()
        .filter_map(|l| l.split("--array=").nth(1))
        .map(|rest| rest.split(':').next().unwrap().to_string())
        .collect();
    assert_eq!(planned.len(), 6usize.div_ceil(max), "{plan}");
    let mut sorted = planned.clone();
    sorted.sort();
    assert_eq!(sorted, arrays, "plan and run agree: {plan}");
}

/// Cancels a SLURM job (or array) when dropped.
struct CancelOnDrop(String);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("scancel").arg(&self.0).output();
    }
}

/// `123` of the allocation `123_1`, as the job records `$SLURM_JOB_ID` (an array task's own
/// job id differs; the test's program records it, so compare by the task's job id).
fn array_job_id(allocation: &str) -> String {
    let out = Command::new("squeue")
        .args(["-j", allocation, "-t", "all", "-h", "-o", "%A"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

// ---------------------------------------------------------------------------------------------
// States the live cluster cannot produce on demand: `flotilla status` against a stand-in
// `squeue` (its output given) and `sacct` (no accounting) on PATH.
// ---------------------------------------------------------------------------------------------

/// A sweep directory whose `sweep.json` holds `jobs` (records, as JSON) on SLURM, with a
/// `bin/` holding a `squeue` that prints `squeue_out` (exit status `squeue_rc`, its error on
/// stderr) and an `sacct` of a cluster without accounting. Returns `flotilla status --format
/// json` of it.
fn status_with_scheduler(
    root: &Path,
    jobs: serde_json::Value,
    squeue_out: &str,
    squeue_rc: i32,
) -> serde_json::Value {
    use std::os::unix::fs::PermissionsExt;
    let sweep = root.join("sweep");
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for j in jobs.as_array().unwrap() {
        std::fs::create_dir_all(sweep.join(j["dir"].as_str().unwrap())).unwrap();
    }
    let plan = serde_json::json!({
        "version": 1, "sweep": true, "created": "2026-11-26T08:00:00+00:00",
        "launcher": "slurm", "argv": ["flotilla", "run", "-m"], "jobs": jobs,
    });
    std::fs::write(sweep.join("sweep.json"), plan.to_string()).unwrap();
    let script = |name: &str, text: String| {
        let p = bin.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    std::fs::write(root.join("squeue.out"), squeue_out).unwrap();
    script(
        "squeue",
        format!(
            "#!/bin/sh\ncat '{}'\n[ {squeue_rc} = 0 ] || echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit {squeue_rc}\n",
            root.join("squeue.out").display()
        ),
    );
    script(
        "sacct",
        "#!/bin/sh\necho 'Slurm accounting storage is disabled' >&2\nexit 1\n".into(),
    );
    let out = Command::new(common::flotilla_bin())
        .args(["status", "--format", "json"])
        .arg(&sweep)
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .env_remove("FLOTILLA_LOG")
        .output()
        .unwrap();
    serde_json::from_str(&ok(out)).unwrap()
}

/// A packed job's record (`sweep.json`) of the array `array`.
fn packed_record(num: usize, state: &str, job_id: Option<&str>, array: &str) -> serde_json::Value {
    let mut r = serde_json::json!({
        "num": num, "dir": num.to_string(), "overrides": [format!("x={num}")],
        "job_id": job_id, "state": state, "pack_array": array,
    });
    if let (Some(id), "RUNNING") = (job_id, state) {
        r["allocation"] = id.into();
    }
    r
}

/// A job put back in the queue (REQUEUED) by an allocation that then ended is PENDING while
/// another allocation of its array is queued or running and can take it (it was UNKNOWN).
#[test]
fn a_queued_packed_job_is_pending_while_a_sibling_allocation_can_take_it() {
    let tmp = tempfile::tempdir().unwrap();
    let jobs = serde_json::json!([
        packed_record(0, "REQUEUED", Some("40_0"), "40"),
        packed_record(1, "COMPLETED", Some("40_0"), "40"),
        packed_record(2, "PENDING", None, "40"),
    ]);
    for (sibling, reason) in [("PENDING", "BeginTime"), ("RUNNING", "None")] {
        let st = status_with_scheduler(
            tmp.path(),
            jobs.clone(),
            &format!("40_0|COMPLETED|None|node1\n40_1|{sibling}|{reason}|\n"),
            0,
        );
        let states: Vec<&str> = st["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["state"].as_str().unwrap())
            .collect();
        assert_eq!(
            states,
            ["PENDING", "COMPLETED", "PENDING"],
            "sibling {sibling}: {st:#}"
        );
    }
    // Once no allocation of the array is left to take it: as before, UNKNOWN.
    let st = status_with_scheduler(
        tmp.path(),
        jobs,
        "40_0|COMPLETED|None|node1\n40_1|COMPLETED|None|node1\n",
        0,
    );
    assert_eq!(st["jobs"][0]["state"], "UNKNOWN", "{st:#}");
}

/// Without accounting, a job left RUNNING by an allocation that was killed outright is UNKNOWN
/// once the scheduler has forgotten that allocation (it stayed RUNNING), with the reason; an
/// unpacked job forgotten so gets the reason too (it was UNKNOWN without one).
#[test]
fn a_running_packed_job_of_a_forgotten_allocation_is_unknown_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    // Job 2 is not packed: its own batch job 60_0, which left no exit marker.
    let unpacked = serde_json::json!({
        "num": 2, "dir": "2", "overrides": ["x=2"], "job_id": "60_0", "state": "RUNNING",
    });
    let jobs = serde_json::json!([
        packed_record(0, "RUNNING", Some("50_0"), "50"),
        packed_record(1, "RUNNING", Some("50_1"), "50"),
        unpacked,
    ]);
    // The scheduler still knows allocation 50_1 (running), not 50_0 nor 60_0.
    let st = status_with_scheduler(tmp.path(), jobs.clone(), "50_1|RUNNING|None|node1\n", 0);
    assert_eq!(st["jobs"][0]["state"], "UNKNOWN", "{st:#}");
    let why = st["jobs"][0]["message"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("its allocation 50_0 is no longer known to the scheduler")
            && why.contains("flotilla run --resume-sweep"),
        "{why}"
    );
    assert_eq!(st["jobs"][1]["state"], "RUNNING", "{st:#}");
    assert!(st["jobs"][1]["message"].is_null(), "{st:#}");
    assert_eq!(st["jobs"][2]["state"], "UNKNOWN", "{st:#}");
    let why = st["jobs"][2]["message"].as_str().unwrap_or_default();
    assert!(
        why.starts_with("its job 60_0 is no longer known to the scheduler"),
        "{why}"
    );
    // Every allocation of the array forgotten: squeue refuses the ids.
    let st = status_with_scheduler(tmp.path(), jobs, "", 1);
    for j in st["jobs"].as_array().unwrap() {
        assert_eq!(j["state"], "UNKNOWN", "{st:#}");
        assert!(
            j["message"]
                .as_str()
                .unwrap_or_default()
                .contains("is no longer known to the scheduler"),
            "{st:#}"
        );
    }
    // A packed job's record is the packing loop's: status does not rewrite it; an unpacked
    // job's state and reason are written to the plan, where `report` reads them.
    let plan: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("sweep/sweep.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(plan["jobs"][0]["state"], "RUNNING", "{plan:#}");
    assert_eq!(plan["jobs"][2]["state"], "UNKNOWN", "{plan:#}");
    assert!(
        plan["jobs"][2]["message"]
            .as_str()
            .is_some_and(|m| m.contains("60_0")),
        "{plan:#}"
    );
}
