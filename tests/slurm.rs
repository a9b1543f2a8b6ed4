//! The SLURM launcher: rendered sbatch scripts against golden files (always run), quoting
//! round trips through a real shell, and the launcher on a real single-node Slurm that
//! `scripts/slurm-cluster-start.sh` installs and starts (skipped, with a message, only when it
//! cannot be installed: not root or no apt-get; `FLOTILLA_SKIP_SLURM=1` skips it on purpose).
//!
//! Golden files live in `tests/slurm/`; `UPDATE_GOLDEN=1 cargo test --test slurm` rewrites them.

mod common;
#[path = "common/compose.rs"]
mod compose;
#[path = "common/launch.rs"]
mod launch;
#[path = "common/slurm_cluster.rs"]
mod slurm_cluster;

use common::{branin, copy_dir, ov, read_env};
use flotilla_config::schema::{ComputeConfig, Launcher};
use flotilla_launch::rundir::{self, JobState};
use flotilla_launch::slurm::{
    self, expand_ids, format_time, parse_max_array_size, parse_squeue, parse_srun_error,
    quote_task, render_script, sbatch_options, sbatch_quote, shell_quote, ScriptSpec, SlurmOptions,
};
use flotilla_launch::{TaskCommand, TaskExit};
use slurm_cluster::Cluster;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn golden_dir() -> PathBuf {
    Path::new(REPO).join("tests/slurm")
}

/// `conf/compute/slurm.yaml` as a struct.
fn slurm_compute() -> ComputeConfig {
    ComputeConfig {
        launcher: Launcher::Slurm,
        nodes: 1,
        tasks_per_node: 8,
        gpus_per_node: 8,
        cpus_per_task: 12,
        mem_gb: Some(960),
        timeout_min: 240,
        partition: None,
        account: None,
        qos: None,
        constraint: None,
        array_parallelism: 256,
        pack: None,
        signal_delay_s: 90,
        max_num_timeout: 3,
        requeue: Some(true),
        setup: vec![],
        additional_parameters: Default::default(),
        template: None,
        max_parallel: 1,
        gpu_type: None,
        gpu_mem_gb: None,
        check_memory: true,
    }
}

fn train_task() -> TaskCommand {
    TaskCommand::new([
        "/opt/flotilla/bin/flotilla",
        "train",
        "--run-dir",
        "{job_dir}",
        "--prepared",
    ])
}

fn render(compute: &ComputeConfig, name: &str, dirs: &[&str], array: bool) -> String {
    let dirs: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
    let nums: Vec<usize> = (0..dirs.len()).collect();
    let task = train_task();
    let spec = ScriptSpec {
        compute,
        job_name: name,
        task: &task,
        job_dirs: &dirs,
        job_nums: &nums,
        array,
        script_dir: Path::new("/scratch/sweeps/lr/slurm"),
        ranks: None,
    };
    render_script(&spec)
        .unwrap()
        .replace(env!("CARGO_PKG_VERSION"), "VERSION")
}

/// Compares with `tests/slurm/<name>` (rewritten under UPDATE_GOLDEN=1) and checks the script
/// is valid bash.
fn check_golden(name: &str, text: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    if want != text {
        let first = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(text.lines().count()));
        panic!(
            "{} differs from the rendered script at line {}:\n  golden: {:?}\n  now:    {:?}\n(UPDATE_GOLDEN=1 rewrites it)\n--- rendered ---\n{text}",
            path.display(),
            first + 1,
            want.lines().nth(first),
            text.lines().nth(first)
        );
    }
    let out = Command::new("bash")
        .args(["-n", "-c", text])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn golden_single_job_gpus() {
    let c = slurm_compute();
    let text = render(
        &c,
        "train",
        &["/scratch/outputs/2024-05-01/12-00-00"],
        false,
    );
    assert!(text.contains("#SBATCH --gpus-per-node=8\n"));
    assert!(text.contains("#SBATCH --mem=960G\n"));
    assert!(text.contains("#SBATCH --time=0-04:00:00\n"));
    assert!(text.contains("#SBATCH --signal=B:USR2@90\n"));
    assert!(text.contains("export CUDA_VISIBLE_DEVICES"));
    assert!(!text.contains("--array"));
    check_golden("single_gpus.sbatch", &text);
}

#[test]
fn golden_array_parallelism_no_gpus() {
    let c = ComputeConfig {
        tasks_per_node: 2,
        gpus_per_node: 0,
        cpus_per_task: 4,
        mem_gb: None,
        timeout_min: 30,
        array_parallelism: 2,
        partition: Some("gpu".into()),
        account: Some("proj-123".into()),
        qos: Some("high".into()),
        constraint: Some("h100&ib".into()),
        ..slurm_compute()
    };
    let text = render(
        &c,
        "lr-sweep",
        &[
            "/scratch/sweeps/lr/0",
            "/scratch/sweeps/lr/1",
            "/scratch/sweeps/lr/2",
        ],
        true,
    );
    assert!(text.contains("#SBATCH --array=0-2%2\n"));
    assert!(!text.contains("--gpus-per-node"));
    assert!(!text.contains("CUDA_VISIBLE_DEVICES"));
    assert!(!text.contains("--mem"));
    assert!(text.contains("#SBATCH --constraint=\"h100&ib\"\n"));
    check_golden("array_parallelism.sbatch", &text);
}

#[test]
fn golden_additional_parameters_and_setup() {
    let mut c = slurm_compute();
    c.gpus_per_node = 4;
    c.tasks_per_node = 4;
    c.timeout_min = 3 * 24 * 60 + 75;
    c.setup = vec![
        "module load cuda/12.4".into(),
        "source /opt/envs/train/bin/activate".into(),
    ];
    for (k, v) in [
        ("exclusive", serde_json::json!(true)),
        ("mail_type", serde_json::json!("END,FAIL")),
        ("comment", serde_json::json!("lr sweep, take 2")),
        ("nice", serde_json::json!(5)),
        ("overcommit", serde_json::json!(false)),
        ("hint", serde_json::Value::Null),
    ] {
        c.additional_parameters.insert(k.into(), v);
    }
    let text = render(&c, "train", &["/scratch/run"], false);
    assert!(text.contains("#SBATCH --time=3-01:15:00\n"));
    assert!(text.contains("#SBATCH --exclusive\n"));
    assert!(text.contains("#SBATCH --mail-type=END,FAIL\n"));
    assert!(text.contains("#SBATCH --comment=\"lr sweep, take 2\"\n"));
    assert!(text.contains("#SBATCH --nice=5\n"));
    assert!(!text.contains("overcommit") && !text.contains("--hint"));
    assert!(text.contains("\nmodule load cuda/12.4\nsource /opt/envs/train/bin/activate\n"));
    check_golden("additional_setup.sbatch", &text);
}

#[test]
fn golden_custom_template() {
    let mut c = slurm_compute();
    c.template = Some(golden_dir().join("custom.sbatch.j2").display().to_string());
    c.partition = Some("debug".into());
    let text = render(&c, "mine", &["/scratch/a b", "/scratch/c"], true);
    assert!(text.starts_with("#!/bin/bash\n# my own template"));
    check_golden("custom.sbatch", &text);
}

#[test]
fn golden_injection_values_are_quoted() {
    let mut c = slurm_compute();
    c.gpus_per_node = 0;
    c.tasks_per_node = 1;
    c.partition = Some("p$(touch /tmp/pwned-partition)".into());
    c.additional_parameters.insert(
        "comment".into(),
        serde_json::json!("$(touch /tmp/pwned) `id` \"q\" \\ # x"),
    );
    let text = render(
        &c,
        "x\"; $(touch /tmp/pwned-name) 'y'",
        &[
            "/scratch/it's $(touch /tmp/pwned-dir) dir",
            "/scratch/`id`/100%/\"q\"/$HOME",
        ],
        true,
    );
    assert!(text.contains(r#"#SBATCH --job-name="x\"; $(touch /tmp/pwned-name) 'y'""#));
    assert!(text.contains(r#"'/scratch/it'\''s $(touch /tmp/pwned-dir) dir'"#));
    assert!(text.contains(r#"'/scratch/`id`/100%/"q"/$HOME'"#));
    check_golden("injection.sbatch", &text);
}

#[test]
fn render_refuses_what_cannot_be_quoted() {
    let c = slurm_compute();
    let task = train_task();
    let dirs = [PathBuf::from("/d")];
    let spec = ScriptSpec {
        compute: &c,
        job_name: "two\nlines",
        task: &task,
        job_dirs: &dirs,
        job_nums: &[0],
        array: false,
        script_dir: Path::new("/d/slurm"),
        ranks: None,
    };
    let err = render_script(&spec).unwrap_err().to_string();
    assert!(err.contains("line break"), "{err}");

    let mut bad_key = slurm_compute();
    bad_key
        .additional_parameters
        .insert("x=1 --y".into(), serde_json::json!(1));
    let err = sbatch_options(&bad_key.additional_parameters)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not an sbatch option name"), "{err}");

    let mut list = slurm_compute();
    list.additional_parameters
        .insert("gres".into(), serde_json::json!(["a", "b"]));
    let err = sbatch_options(&list.additional_parameters)
        .unwrap_err()
        .to_string();
    assert!(err.contains("additional_parameters.gres"), "{err}");

    let mut missing = slurm_compute();
    missing.template = Some("/nonexistent/tmpl.j2".into());
    let spec = ScriptSpec {
        compute: &missing,
        job_name: "x",
        ..spec
    };
    let err = render_script(&spec).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/tmpl.j2"), "{err}");
}

/// Every quoted word, given to a real bash, comes back as exactly the original string.
#[test]
fn shell_quote_round_trips_through_bash() {
    let nasty = [
        "plain",
        "",
        "with space",
        "it's",
        "$(touch /tmp/flotilla-pwned)",
        "`touch /tmp/flotilla-pwned`",
        "${HOME}",
        "a\"b\\c",
        "new\nline",
        "tab\there",
        "glob*?[a]",
        "semi;colon && echo hi | cat > /tmp/flotilla-pwned",
        "'''",
        "!history",
        "ünïcode",
    ];
    for s in nasty {
        let q = shell_quote(s).unwrap();
        let out = Command::new("bash")
            .args(["-c", &format!("printf '%s' {q}")])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), s, "quoted as {q}");
    }
    assert!(!Path::new("/tmp/flotilla-pwned").exists());
    assert!(shell_quote("nul\0").is_err());
}

#[test]
fn sbatch_quote_forms() {
    assert_eq!(sbatch_quote("gpu").unwrap(), "gpu");
    assert_eq!(sbatch_quote("a b").unwrap(), "\"a b\"");
    assert_eq!(sbatch_quote("a\"b\\c").unwrap(), r#""a\"b\\c""#);
    assert_eq!(sbatch_quote("").unwrap(), "\"\"");
    assert!(sbatch_quote("a\nb").is_err());
    assert!(sbatch_quote("a\rb").is_err());
}

#[test]
fn task_command_quoting() {
    let argv: Vec<String> = [
        "/bin/my prog",
        "train",
        "--run-dir",
        "{job_dir}",
        "--x={job_dir}/sub dir",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        quote_task(&argv).unwrap(),
        r#"'/bin/my prog' train --run-dir "$JOB_DIR" --x="$JOB_DIR"'/sub dir' ''"#
    );
    assert!(quote_task(&[]).is_err());
}

#[test]
fn small_parsers() {
    assert_eq!(format_time(0), "0-00:00:00");
    assert_eq!(format_time(59), "0-00:59:00");
    assert_eq!(format_time(24 * 60 + 61), "1-01:01:00");
    assert_eq!(
        parse_max_array_size(
            "MailProg = /bin/true\nMaxArraySize            = 4\nMaxJobCount = 10000\n"
        ),
        Some(4)
    );
    assert_eq!(parse_max_array_size("nothing"), None);
    assert_eq!(expand_ids("12"), ["12"]);
    assert_eq!(expand_ids("12_3"), ["12_3"]);
    assert_eq!(expand_ids("12_[1-3,7%2]"), ["12_1", "12_2", "12_3", "12_7"]);
    let q = parse_squeue("4_[1-3%1]|PENDING|JobArrayTaskLimit\n4_0|RUNNING|None\n9|COMPLETED|None\n7|CANCELLED by 0|None\n");
    assert_eq!(q.len(), 6);
    assert_eq!(q["4_2"].state, JobState::Pending);
    assert_eq!(q["4_2"].reason.as_deref(), Some("JobArrayTaskLimit"));
    assert_eq!(q["4_0"].state, JobState::Running);
    assert_eq!(q["4_0"].reason, None);
    assert_eq!(q["9"].state, JobState::Completed);
    assert_eq!(q["7"].state, JobState::Cancelled);
    assert_eq!(
        parse_srun_error("srun: error: vm: task 1: Exited with exit code 3"),
        Some((1, TaskExit::Code(3)))
    );
    assert_eq!(
        parse_srun_error("srun: error: node-01: tasks 0-3: Killed by signal 9"),
        Some((0, TaskExit::Signal(9)))
    );
    assert_eq!(parse_srun_error("srun: error: something else"), None);
}

/// Jobs with different `compute` configs go to different arrays, each split at MaxArraySize;
/// array task i of a script runs the i-th directory it lists.
#[test]
fn scripts_group_by_compute_and_split() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = flotilla_launch::rundir::PlanFile::sweep(tmp.path());
    let a = ComputeConfig {
        gpus_per_node: 0,
        tasks_per_node: 1,
        array_parallelism: 0,
        ..slurm_compute()
    };
    let b = ComputeConfig {
        tasks_per_node: 2,
        ..a.clone()
    };
    let jobs: Vec<slurm::JobSpec> = [&a, &b, &a, &b, &a]
        .iter()
        .enumerate()
        .map(|(num, c)| slurm::JobSpec {
            num,
            dir: tmp.path().join(num.to_string()),
            compute: (*c).clone(),
            ranks: None,
        })
        .collect();
    let mut opts = SlurmOptions::with_task(train_task());
    opts.max_array_size = Some(2);
    let scripts = slurm::write_scripts(&plan, &jobs, &opts).unwrap();
    let nums: Vec<Vec<usize>> = scripts
        .iter()
        .map(|s| s.jobs.iter().map(|j| j.0).collect())
        .collect();
    assert_eq!(nums, [vec![0, 2], vec![4], vec![1, 3]]);
    let texts: Vec<String> = scripts
        .iter()
        .map(|s| std::fs::read_to_string(&s.path).unwrap())
        .collect();
    assert!(
        texts[0].contains("#SBATCH --array=0-1\n"),
        "no %: unlimited"
    );
    assert!(texts[1].contains("#SBATCH --array=0-0\n"));
    assert!(texts[2].contains("#SBATCH --ntasks-per-node=2\n"));
    assert!(texts[1].contains("JOB_NUMS=( 4 )"));
    let names: Vec<String> = scripts
        .iter()
        .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["submit-0.sbatch", "submit-1.sbatch", "submit-2.sbatch"]
    );
    // Writing again never overwrites the first scripts.
    let again = slurm::write_scripts(&plan, &jobs[..1], &opts).unwrap();
    assert!(again[0].path.ends_with("slurm/submit-3.sbatch"));
}

// ---------------------------------------------------------------------------------------------
// the real cluster
// ---------------------------------------------------------------------------------------------

/// Prepares a run or sweep with the repository's conf tree.
fn prepare(overrides: &[String], multirun: bool) -> rundir::PreparedRun {
    launch::prepare(&compose::composer(), overrides, multirun)
        .unwrap_or_else(|e| panic!("prepare {overrides:?}: {e}"))
}

/// Polls `slurm::status` until every job is in a terminal state.
fn wait_terminal(dir: &Path, timeout: Duration) -> flotilla_launch::rundir::status::RunStatus {
    let t0 = Instant::now();
    loop {
        let st = slurm::status(dir).unwrap();
        if st.all_terminal() {
            return st;
        }
        if t0.elapsed() > timeout {
            let _ = Command::new("squeue").args(["-t", "all"]).status();
            panic!(
                "jobs of {} not finished after {timeout:?}: {st:#?}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The task of the cluster tests: records what each task saw, then (`train EXE`) runs the real
/// `EXE train`, or fails as asked (`fail`: rank 1 exits 3), or stops like the trainer on USR2
/// (`preempt`).
const TASK_SCRIPT: &str = r#"#!/bin/bash
dir=$1 mode=${2:-}
{
  echo "ARG_DIR=$dir"
  for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK CUDA_VISIBLE_DEVICES MASTER_ADDR MASTER_PORT SLURM_JOB_ID SLURM_PROCID FLOTILLA_JOB_DIR FLOTILLA_JOB_NUM SLURM_RESTART_COUNT SLURM_STEP_GPUS SLURM_JOB_GPUS; do
    echo "$v=${!v-unset}"
  done
} > "$dir/task-$RANK.env"
case $mode in
  train)
    exec "$3" train --run-dir "$dir" --prepared ;;
  fail)
    if [[ $RANK == 1 ]]; then echo "rank 1: something went wrong (boom)" >&2; exit 3; fi
    sleep 30 ;;
  preempt)
    # Like the trainer: count steps in a file; on USR2 finish the step, "checkpoint", exit 75.
    stop=0; trap 'stop=1' USR2
    step=$(cat "$dir/steps" 2>/dev/null || echo 0)
    while ((step < 12)); do
      sleep 0.5; step=$((step + 1)); echo "$step" > "$dir/steps"
      echo "restart=${SLURM_RESTART_COUNT:-0} step=$step" >> "$dir/progress"
      if ((stop)); then echo "stopping at step $step"; exit 75; fi
    done ;;
esac
exit 0
"#;

/// A model and data small enough that a debug build trains ~25 steps/s on 2 cores.
const SMALL_TRAIN: &[&str] = &[
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_hidden_layers=1",
    "model.num_attention_heads=2",
    "model.num_key_value_heads=1",
    "trainer.eval_every=0",
    "trainer.warmup_steps=5",
    "trainer.log_every=5",
    "data.num_train=200",
    "data.num_eval=0",
];

fn sbatch_task(script: &Path, mode: &str) -> SlurmOptions {
    let mut argv = vec![
        "/bin/bash".to_string(),
        script.display().to_string(),
        "{job_dir}".to_string(),
    ];
    if !mode.is_empty() {
        argv.push(mode.to_string());
    }
    SlurmOptions::with_task(TaskCommand::new(argv))
}

/// Waits until `cond` holds (polling), or panics with `what`.
fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// All cluster scenarios in one test, so that they never compete for the single node.
#[test]
fn real_cluster() {
    let Some(_cluster) = Cluster::start(1, &[("SLURM_TEST_MAX_ARRAY_SIZE", "4")]) else {
        return;
    };
    // The scenarios train with `flotilla train` and submit with `flotilla run`.
    common::train_binary();
    let t_all = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("flotilla-slurm-test")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let root = tmp.path();
    let task_script = root.join("fake-train.sh");
    std::fs::write(&task_script, TASK_SCRIPT).unwrap();
    let common = [
        "compute=slurm",
        "compute.cpus_per_task=1",
        "compute.mem_gb=1",
        "compute.timeout_min=5",
    ];

    // 1. A 4-job array, 2 tasks per job with 2 (fake) GPUs each, at most 2 at once; every task
    //    records its environment, then runs the real `flotilla train` as one of 2 DDP ranks.
    let t = Instant::now();
    let sweep_dir = root.join("array");
    let mut o = ov(&common);
    o.extend(ov(&[
        "compute.tasks_per_node=2",
        "compute.gpus_per_node=2",
        "compute.array_parallelism=2",
        "trainer/dist=ddp",
        "trainer.max_steps=40",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=2",
        "seed=1,2,3,4",
    ]));
    o.extend(ov(SMALL_TRAIN));
    o.push(format!("flotilla.sweep.dir={}", sweep_dir.display()));
    let run = prepare(&o, true);
    assert_eq!(run.jobs.len(), 4);
    let mut opts = sbatch_task(&task_script, "train");
    opts.task.argv.push(env!("CARGO_BIN_EXE_flotilla").into());
    let mut launcher = slurm::SlurmLauncher::new(opts);
    use flotilla_launch::Launcher;
    launcher.prepare(&run).unwrap();
    assert_eq!(
        launcher.scripts().len(),
        1,
        "4 jobs fit one array (MaxArraySize 4)"
    );
    let outcomes = launcher.launch(&run).unwrap();
    let array_id = outcomes[0].job_id.clone().unwrap();
    let array_id = array_id.split('_').next().unwrap().to_string();
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(
            o.job_id.as_deref(),
            Some(format!("{array_id}_{i}").as_str())
        );
        assert_eq!(o.state, JobState::Pending);
    }
    let plan = run.plan.read().unwrap();
    assert!(plan.jobs.iter().all(|j| j.job_id.is_some()));
    let array_line = std::fs::read_to_string(&launcher.scripts()[0].path).unwrap();
    assert!(array_line.contains("#SBATCH --array=0-3%2"));
    let st = wait_terminal(&sweep_dir, Duration::from_secs(90));
    for j in &st.jobs {
        assert_eq!(j.state, JobState::Completed, "{j:?}");
        let mut ports = Vec::new();
        let mut cvd = Vec::new();
        for rank in 0..2 {
            let env = read_env(&j.dir.join(format!("task-{rank}.env")));
            assert_eq!(env["RANK"], rank.to_string());
            assert_eq!(env["LOCAL_RANK"], rank.to_string());
            assert_eq!(env["SLURM_PROCID"], rank.to_string());
            assert_eq!(env["WORLD_SIZE"], "2");
            assert_eq!(env["LOCAL_WORLD_SIZE"], "2");
            // The rank's own device of the job's allocation (Slurm numbers the node's GPUs;
            // with device cgroups the allocation is 0..n-1 and this is LOCAL_RANK).
            let gpus = match env["SLURM_STEP_GPUS"].as_str() {
                "unset" => env["SLURM_JOB_GPUS"].clone(),
                g => g.to_string(),
            };
            let devices: Vec<&str> = gpus.split(',').collect();
            assert_eq!(devices.len(), 2, "{env:?}");
            assert_eq!(env["CUDA_VISIBLE_DEVICES"], devices[rank], "{env:?}");
            cvd.push(env["CUDA_VISIBLE_DEVICES"].clone());
            assert_eq!(Path::new(&env["ARG_DIR"]), j.dir);
            assert_eq!(Path::new(&env["FLOTILLA_JOB_DIR"]), j.dir);
            assert_eq!(env["FLOTILLA_JOB_NUM"], j.num.to_string());
            let job_id: u64 = env["SLURM_JOB_ID"].parse().unwrap();
            assert_eq!(
                env["MASTER_PORT"],
                flotilla_contract::rank::slurm_port(job_id).to_string()
            );
            assert!(!env["MASTER_ADDR"].is_empty() && env["MASTER_ADDR"] != "unset");
            ports.push(env["MASTER_PORT"].clone());
        }
        assert_eq!(ports[0], ports[1], "both ranks agree on the port");
        assert_ne!(cvd[0], cvd[1], "each rank has its own device");
        // The real trainer ran as 2 DDP ranks and finished.
        assert_eq!(j.steps, Some(40), "{j:?}");
        assert!(j.final_model, "{j:?}");
        // `final/` makes the job COMPLETED a moment before its batch script ends.
        let marker = j.dir.join("logs/slurm.exit");
        wait_for("the exit marker", Duration::from_secs(10), || {
            marker.exists()
        });
        let marker = std::fs::read_to_string(marker).unwrap();
        assert_eq!(marker, format!("{array_id}_{} COMPLETED 0\n", j.num));
        let rank1 = std::fs::read_to_string(j.dir.join("logs/rank_1.log")).unwrap();
        assert!(
            rank1.contains("[rank 1]") && rank1.contains("DDP, 2 ranks"),
            "{rank1}"
        );
        assert!(j.dir.join("logs/rank_0.log").exists());
    }
    let plan = run.plan.read().unwrap();
    assert!(
        plan.jobs.iter().all(|j| j.state == JobState::Completed),
        "status writes the states back: {plan:?}"
    );
    println!("array of 4 x 2 tasks: {:.1?}", t.elapsed());

    // 2. A job whose rank 1 fails: FAILED, with rank 1's log tail.
    let t = Instant::now();
    let fail_dir = root.join("fail");
    let mut o = ov(&common);
    o.extend(ov(&[
        "compute.tasks_per_node=2",
        "compute.gpus_per_node=0",
        "trainer/dist=ddp",
    ]));
    o.push(format!("flotilla.run.dir={}", fail_dir.display()));
    let run = prepare(&o, false);
    let subs = slurm::submit(
        &run.plan,
        &slurm::job_specs(&run),
        &sbatch_task(&task_script, "fail"),
    )
    .unwrap();
    assert_eq!(subs.len(), 1);
    assert!(!subs[0].job_id.contains('_'));
    let st = wait_terminal(&fail_dir, Duration::from_secs(60));
    let j = &st.jobs[0];
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    let msg = j.message.clone().unwrap_or_default();
    assert!(msg.contains("rank 1 exited with code 3"), "{msg}");
    assert!(msg.contains("something went wrong (boom)"), "{msg}");
    let text = flotilla_launch::status_text(&st);
    assert!(text.contains("FAILED") && text.contains("boom"), "{text}");
    // The scheduler may report FAILED a moment before the batch script writes its marker.
    let marker = fail_dir.join("logs/slurm.exit");
    wait_for("the exit marker", Duration::from_secs(10), || {
        marker.exists()
    });
    let marker = std::fs::read_to_string(marker).unwrap();
    // srun's status is its worst task's: 3, or 143 for rank 0 killed by --kill-on-bad-exit.
    assert!(
        marker.starts_with(&format!("{} FAILED ", subs[0].job_id)),
        "{marker}"
    );
    // Once the scheduler has forgotten a job, its exit marker tells; without one: UNKNOWN.
    std::fs::write(fail_dir.join("logs/slurm.exit"), "999999 COMPLETED 0\n").unwrap();
    run.plan
        .set_job_id(0, Some("999999".into()), JobState::Running)
        .unwrap();
    assert_eq!(
        slurm::status(&fail_dir).unwrap().jobs[0].state,
        JobState::Completed
    );
    run.plan
        .set_job_id(0, Some("999998".into()), JobState::Running)
        .unwrap();
    let forgotten = slurm::status(&fail_dir).unwrap().jobs.remove(0);
    assert_eq!(forgotten.state, JobState::Unknown);
    let why = forgotten.message.unwrap_or_default();
    assert!(why.starts_with("its job 999998 is no longer"), "{why}");
    println!("failing job: {:.1?}", t.elapsed());

    // 3. Shell injection: directory, job name and sbatch values full of shell syntax; a sweep
    //    of 5 jobs split into arrays of at most MaxArraySize (4 here).
    let t = Instant::now();
    let pwned = root.join("PWNED");
    let evil = format!(
        "{}/it's $(touch {p}) `touch {p}` \"q\" 100% dir",
        root.display(),
        p = pwned.display()
    );
    let mut o = ov(&common);
    o.extend(ov(&[
        "compute.tasks_per_node=1",
        "compute.gpus_per_node=0",
        "seed=range(5)",
    ]));
    o.push(format!(
        "flotilla.sweep.dir='{}'",
        evil.replace('\\', "\\\\").replace('\'', "\\'")
    ));
    o.push(format!(
        "+compute.additional_parameters.comment='$(touch {p}); `touch {p}`'",
        p = pwned.display()
    ));
    o.push("compute.setup=['echo setup ran > \"$FLOTILLA_JOB_DIR/setup.txt\"']".to_string());
    let run = prepare(&o, true);
    let sweep = run.sweep_dir.clone().unwrap();
    assert!(
        sweep.display().to_string().contains("$(touch"),
        "{}",
        sweep.display()
    );
    let mut opts = sbatch_task(&task_script, "");
    let evil_name = format!("n\"$(touch {p})'", p = pwned.display());
    opts.job_name = Some(evil_name.clone());
    if slurm::max_array_size().unwrap() > 4 {
        opts.max_array_size = Some(4); // the cluster was started by someone else
    }
    let subs = slurm::submit(&run.plan, &slurm::job_specs(&run), &opts).unwrap();
    assert_eq!(subs.len(), 2, "5 jobs in arrays of at most 4");
    assert_eq!(subs[0].jobs.len(), 4);
    assert_eq!(subs[1].jobs[0].job_id, format!("{}_0", subs[1].job_id));
    let name = Command::new("squeue")
        .args(["-j", &subs[0].job_id, "-h", "-t", "all", "-o", "%j"])
        .output()
        .unwrap();
    let st = wait_terminal(&sweep, Duration::from_secs(60));
    for j in &st.jobs {
        assert_eq!(j.state, JobState::Completed, "{j:?}");
        let env = read_env(&j.dir.join("task-0.env"));
        assert_eq!(Path::new(&env["ARG_DIR"]), j.dir);
        assert_eq!(
            std::fs::read_to_string(j.dir.join("setup.txt")).unwrap(),
            "setup ran\n"
        );
    }
    assert!(!pwned.exists(), "a config value was executed");
    let first_name = String::from_utf8_lossy(&name.stdout);
    assert_eq!(
        first_name.lines().next().unwrap_or(""),
        evil_name,
        "sbatch read the quoted job name back exactly"
    );
    println!("injection sweep (2 arrays): {:.1?}", t.elapsed());

    // 3b. sbatch refuses an impossible request: the error carries its message.
    let reject_dir = root.join("reject");
    let mut o = ov(&common);
    o.extend(ov(&[
        "compute.cpus_per_task=64",
        "compute.tasks_per_node=1",
        "compute.gpus_per_node=0",
    ]));
    o.push(format!("flotilla.run.dir={}", reject_dir.display()));
    let run = prepare(&o, false);
    let err = slurm::submit(
        &run.plan,
        &slurm::job_specs(&run),
        &sbatch_task(&task_script, ""),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("sbatch rejected") && err.contains("More processors requested"),
        "{err}"
    );
    assert_eq!(run.plan.read().unwrap().jobs[0].job_id, None);

    // 4. Preemption with a fake trainer: USR2 to the batch shell reaches the task, which stops
    //    with 75; the job requeues itself and finishes its steps on the second run.
    let t = Instant::now();
    let pre_dir = root.join("preempt");
    let mut o = ov(&common);
    o.extend(ov(&["compute.tasks_per_node=1", "compute.gpus_per_node=0"]));
    o.push(format!("flotilla.run.dir={}", pre_dir.display()));
    let run = prepare(&o, false);
    let subs = slurm::submit(
        &run.plan,
        &slurm::job_specs(&run),
        &sbatch_task(&task_script, "preempt"),
    )
    .unwrap();
    let id = subs[0].job_id.clone();
    let steps = |d: &Path| -> u64 {
        std::fs::read_to_string(d.join("steps"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    wait_for("the fake trainer's step 3", Duration::from_secs(60), || {
        steps(&pre_dir) >= 3
    });
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &id])
        .output()
        .unwrap();
    assert!(
        sc.status.success(),
        "{}",
        String::from_utf8_lossy(&sc.stderr)
    );
    let st = wait_terminal(&pre_dir, Duration::from_secs(90));
    assert_eq!(st.jobs[0].state, JobState::Completed, "{:?}", st.jobs[0]);
    let progress = std::fs::read_to_string(pre_dir.join("progress")).unwrap();
    assert!(progress.contains("restart=0"), "{progress}");
    assert!(progress.contains("restart=1"), "requeued: {progress}");
    assert!(progress.ends_with("restart=1 step=12\n"), "{progress}");
    let log = std::fs::read_to_string(pre_dir.join(format!("logs/slurm-{id}.out"))).unwrap();
    assert!(log.contains("got SIGUSR2"), "{log}");
    assert!(log.contains("requeueing (restart 1"), "{log}");
    println!("preempt + requeue (fake trainer): {:.1?}", t.elapsed());

    // 5. --resume-sweep: re-submits only what did not complete.
    let t = Instant::now();
    let resume_dir = root.join("resume");
    let mut o = ov(&common);
    o.extend(ov(&[
        "compute.tasks_per_node=1",
        "compute.gpus_per_node=0",
        "seed=1,2,3",
    ]));
    o.push(format!("flotilla.sweep.dir={}", resume_dir.display()));
    let run = prepare(&o, true);
    let opts = sbatch_task(&task_script, "");
    slurm::submit(&run.plan, &slurm::job_specs(&run)[..2], &opts).unwrap();
    wait_for("jobs 0 and 1", Duration::from_secs(60), || {
        let st = slurm::status(&resume_dir).unwrap();
        st.jobs[..2].iter().all(|j| j.state.is_terminal())
    });
    // `flotilla run --resume-sweep DIR`'s library function.
    let report = flotilla_launch::resume(
        &resume_dir,
        flotilla_launch::RunOptions {
            dry_run: false,
            local: flotilla_launch::LocalOptions::with_task(opts.task.clone()),
        },
    )
    .unwrap();
    let nums: Vec<usize> = report.outcomes.iter().map(|o| o.num).collect();
    assert_eq!(nums, [2], "only the job never submitted");
    assert!(report.outcomes[0].job_id.is_some());
    let st = wait_terminal(&resume_dir, Duration::from_secs(60));
    assert!(
        st.jobs.iter().all(|j| j.state == JobState::Completed),
        "{st:?}"
    );
    println!("resume-sweep: {:.1?}", t.elapsed());

    adaptive_study(root);
    user_programs(root);
    real_trainer_requeue(root);
    println!("real-cluster scenarios: {:.1?} in all", t_all.elapsed());
}

/// The real trainer: SIGUSR2 to the batch shell makes `flotilla train` checkpoint and exit 75;
/// the job requeues and resumes, its step count continuing.
fn real_trainer_requeue(root: &Path) {
    let t = Instant::now();
    let dir = root.join("train");
    let max_steps = 300;
    let mut o = ov(&[
        "compute=slurm",
        "compute.cpus_per_task=2",
        "compute.mem_gb=null",
        "compute.timeout_min=10",
        "compute.tasks_per_node=1",
        "compute.gpus_per_node=0",
        "trainer.global_batch_size=4",
        "trainer.micro_batch_size=4",
    ]);
    o.extend(ov(SMALL_TRAIN));
    o.push(format!("trainer.max_steps={max_steps}"));
    o.push(format!("flotilla.run.dir={}", dir.display()));
    let run = prepare(&o, false);
    let exe = env!("CARGO_BIN_EXE_flotilla");
    let opts = SlurmOptions::with_task(TaskCommand::new([
        exe,
        "train",
        "--run-dir",
        "{job_dir}",
        "--prepared",
    ]));
    let subs = slurm::submit(&run.plan, &slurm::job_specs(&run), &opts).unwrap();
    let id = subs[0].job_id.clone();
    let metrics = dir.join("metrics.csv");
    let last_step = |p: &Path| {
        flotilla_launch::rundir::status::markers(p)
            .steps
            .unwrap_or(0)
    };
    wait_for(
        "the trainer's first metrics",
        Duration::from_secs(120),
        || last_step(&dir) >= 30 || slurm::status(&dir).unwrap().all_terminal(),
    );
    let st = slurm::status(&dir).unwrap();
    assert!(
        !st.all_terminal(),
        "the trainer ended before it was signalled: {st:?}\n{}",
        std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap_or_default()
    );
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &id])
        .output()
        .unwrap();
    assert!(sc.status.success());
    let st = wait_terminal(&dir, Duration::from_secs(240));
    let log = std::fs::read_to_string(dir.join(format!("logs/slurm-{id}.out"))).unwrap_or_default();
    let rank0 = std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap_or_default();
    assert_eq!(
        st.jobs[0].state,
        JobState::Completed,
        "{:?}\n{log}\n{rank0}",
        st.jobs[0]
    );
    assert!(log.contains("requeueing (restart 1"), "{log}\n{rank0}");
    assert!(rank0.contains("stopped by SIGUSR2 at step"), "{rank0}");
    let resumed = rank0
        .lines()
        .find(|l| l.starts_with("resuming from"))
        .unwrap_or_else(|| panic!("no resume in {rank0}"));
    println!("  {resumed}");
    assert_eq!(last_step(&dir), max_steps as u64, "{}", metrics.display());
    // One row per step, 0..max_steps, across both runs: the count continued.
    let steps: Vec<u64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next()?.parse().ok())
        .collect();
    assert_eq!(steps, (0..max_steps as u64).collect::<Vec<_>>());
    assert!(dir.join("final").is_dir());
    println!(
        "preempt + requeue (flotilla train, {max_steps} steps): {:.1?}",
        t.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// the user's own program as the task, through the CLI
// ---------------------------------------------------------------------------------------------

/// `flotilla ARGS` in `cwd` with `path` as PATH (the venv first, so that the jobs' `python` is
/// the venv's: sbatch passes the environment on).
fn flotilla_cli(cwd: &Path, path: &std::ffi::OsStr, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .current_dir(cwd)
        .env("PATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla");
    assert!(
        out.status.success(),
        "flotilla {args:?}: exit {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Polls `flotilla status --format json DIR` until every job has ended; the last status.
fn cli_wait_terminal(dir: &Path, path: &std::ffi::OsStr, timeout: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let out = flotilla_cli(
            dir,
            path,
            &["status", "--format", "json", &dir.display().to_string()],
        );
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if slurm_cluster::all_jobs_terminal(&st) {
            return st;
        }
        if t0.elapsed() > timeout {
            let _ = Command::new("squeue").args(["-t", "all"]).status();
            panic!(
                "jobs of {} not finished after {timeout:?}: {st:#}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A program that stops on SIGUSR2 the way a user's training script would: it notes the stop
/// (its "checkpoint") and exits 0; started again after the requeue it finds the note and ends.
const USR2_PROGRAM: &str = r#"
import os, signal, sys, time
job = os.environ["FLOTILLA_JOB_DIR"]
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
def note(line):
    with open(os.path.join(job, "progress"), "a") as f:
        f.write(line + "\n")
note(f"start restart={restart}")
if os.path.exists(os.path.join(job, "stopped")):
    note(f"done restart={restart}")
    sys.exit(0)
got = []
signal.signal(signal.SIGUSR2, lambda *_: got.append(1))
open(os.path.join(job, "started"), "w").write(restart)
t0 = time.time()
while not got and time.time() - t0 < 120:
    time.sleep(0.1)
if not got:
    note("never signalled")
    sys.exit(4)
open(os.path.join(job, "stopped"), "w").write(restart)
note(f"usr2 restart={restart}")
sys.exit(0)
"#;

/// 6. `examples/ddp_gloo` submitted with `flotilla run ... compute=slurm`: 2 tasks of one job
///    join one gloo process group, each seeing its rank, the world and the job directory.
/// 7. A user program that traps SIGUSR2 and exits 0: `scancel --signal=USR2 --batch` makes the
///    job requeue once; started again, it completes.
/// 8. The DDP example stopped by SIGUSR2: it checkpoints, is requeued and resumes.
fn user_programs(root: &Path) {
    let python = common::venv_python();
    if !common::venv_imports("torch") {
        return common::skip_or_fail(&format!(
            "the user-program scenarios: {} cannot import torch (run scripts/setup.sh)",
            python.display()
        ));
    }
    let mut dirs = vec![python.parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(dirs).unwrap();

    // 6. The DDP example, 2 ranks of one SLURM job.
    let t = Instant::now();
    let example = root.join("ddp_gloo");
    copy_dir(&Path::new(REPO).join("examples/ddp_gloo"), &example);
    let run_dir = root.join("user-ddp");
    let out = flotilla_cli(
        &example,
        &path,
        &[
            "run",
            "--config-dir",
            "conf",
            "--format",
            "json",
            "compute=slurm",
            "compute.tasks_per_node=2",
            "compute.cpus_per_task=1",
            "compute.mem_gb=1",
            "compute.timeout_min=5",
            "steps=4",
            &format!("flotilla.run.dir={}", run_dir.display()),
        ],
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let job_id = printed["jobs"][0]["job_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no SLURM job id: {printed}"))
        .to_string();
    let st = cli_wait_terminal(&run_dir, &path, Duration::from_secs(120));
    let rank0_log = std::fs::read_to_string(run_dir.join("logs/rank_0.log")).unwrap_or_default();
    assert_eq!(st["jobs"][0]["state"], "COMPLETED", "{st:#}\n{rank0_log}");
    let run_dir = run_dir.canonicalize().unwrap();
    let seen: Vec<serde_json::Value> = (0..2)
        .map(|r| {
            let p = run_dir.join(format!("seen_rank{r}.json"));
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
        })
        .collect();
    let port = flotilla_contract::rank::slurm_port(job_id.parse().unwrap()).to_string();
    for (r, s) in seen.iter().enumerate() {
        let env = &s["env"];
        let r = r.to_string();
        assert_eq!(env["RANK"].as_str(), Some(r.as_str()), "{s:#}");
        assert_eq!(env["LOCAL_RANK"].as_str(), Some(r.as_str()), "{s:#}");
        assert_eq!(env["SLURM_PROCID"].as_str(), Some(r.as_str()), "{s:#}");
        assert_eq!(env["WORLD_SIZE"].as_str(), Some("2"), "{s:#}");
        assert_eq!(env["SLURM_JOB_ID"].as_str(), Some(job_id.as_str()), "{s:#}");
        assert_eq!(env["MASTER_PORT"].as_str(), Some(port.as_str()), "{s:#}");
        assert_eq!(
            Path::new(env["FLOTILLA_JOB_DIR"].as_str().unwrap())
                .canonicalize()
                .unwrap(),
            run_dir
        );
        assert_eq!(
            Path::new(env["FLOTILLA_CONFIG"].as_str().unwrap()),
            Path::new(env["FLOTILLA_JOB_DIR"].as_str().unwrap()).join("config.yaml")
        );
        assert_eq!(s["world_size"], 2);
        assert_eq!(
            s["allreduce_sum"], 3.0,
            "all_reduce of rank + 1 over 2 ranks"
        );
        assert_eq!(s["args"]["steps"], 4);
        assert_eq!(
            Path::new(s["cwd"].as_str().unwrap())
                .canonicalize()
                .unwrap(),
            example.canonicalize().unwrap(),
            "cwd: null is where flotilla ran"
        );
    }
    assert_eq!(
        seen[0]["weight"], seen[1]["weight"],
        "DDP keeps the weights equal"
    );
    let metrics = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    let steps: Vec<&str> = metrics
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next())
        .collect();
    assert_eq!(steps, ["0", "1", "2", "3"], "{metrics}");
    println!("user DDP program, 2 SLURM tasks: {:.1?}", t.elapsed());

    // 7. SIGUSR2: the program stops (exit 0), the job requeues once and completes.
    let t = Instant::now();
    let proj = root.join("usr2");
    std::fs::create_dir_all(proj.join("conf")).unwrap();
    std::fs::write(proj.join("usr2.py"), USR2_PROGRAM).unwrap();
    std::fs::write(
        proj.join("conf/config.yaml"),
        "compute:
  launcher: slurm
  nodes: 1
  tasks_per_node: 1
  gpus_per_node: 0
  cpus_per_task: 1
  mem_gb: 1
  timeout_min: 5
  partition: null
  account: null
  qos: null
  constraint: null
  array_parallelism: 256
  signal_delay_s: 90
  max_num_timeout: 3
  setup: []
  additional_parameters: {}
  template: null
  max_parallel: 1
flotilla:
  task:
    command: [python, usr2.py]
",
    )
    .unwrap();
    let run_dir = root.join("usr2-run");
    let out = flotilla_cli(
        &proj,
        &path,
        &[
            "run",
            "--config-dir",
            "conf",
            "--format",
            "json",
            &format!("flotilla.run.dir={}", run_dir.display()),
        ],
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = printed["jobs"][0]["job_id"].as_str().unwrap().to_string();
    wait_for("the program's trap", Duration::from_secs(90), || {
        run_dir.join("started").exists()
    });
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &id])
        .output()
        .unwrap();
    assert!(
        sc.status.success(),
        "{}",
        String::from_utf8_lossy(&sc.stderr)
    );
    let st = cli_wait_terminal(&run_dir, &path, Duration::from_secs(150));
    let progress = std::fs::read_to_string(run_dir.join("progress")).unwrap_or_default();
    let log =
        std::fs::read_to_string(run_dir.join(format!("logs/slurm-{id}.out"))).unwrap_or_default();
    assert_eq!(
        st["jobs"][0]["state"], "COMPLETED",
        "{st:#}\n{progress}\n{log}"
    );
    assert_eq!(
        progress, "start restart=0\nusr2 restart=0\nstart restart=1\ndone restart=1\n",
        "requeued once after the stop, then completed\n{log}"
    );
    assert!(log.contains("got SIGUSR2"), "{log}");
    println!(
        "user program stopped by USR2, requeued: {:.1?}",
        t.elapsed()
    );

    // 8. The DDP example stopped by USR2 (both ranks agree on the step, rank 0 checkpoints into
    //    the job directory, exit 0), requeued, resumed: one metrics row per step, no gap.
    let t = Instant::now();
    let run_dir = root.join("user-ddp-usr2");
    let steps = 24;
    let command =
        format!("flotilla.task.command=[python,train.py,'--steps={steps}','--step-seconds=0.5']");
    let out = flotilla_cli(
        &example,
        &path,
        &[
            "run",
            "--config-dir",
            "conf",
            "--format",
            "json",
            "compute=slurm",
            "compute.tasks_per_node=2",
            "compute.cpus_per_task=1",
            "compute.mem_gb=1",
            "compute.timeout_min=5",
            &command,
            &format!("flotilla.run.dir={}", run_dir.display()),
        ],
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = printed["jobs"][0]["job_id"].as_str().unwrap().to_string();
    let rows = |d: &Path| {
        std::fs::read_to_string(d.join("metrics.csv"))
            .map(|m| m.lines().count().saturating_sub(1))
            .unwrap_or(0)
    };
    wait_for(
        "3 steps of the DDP example",
        Duration::from_secs(90),
        || rows(&run_dir) >= 3,
    );
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &id])
        .output()
        .unwrap();
    assert!(
        sc.status.success(),
        "{}",
        String::from_utf8_lossy(&sc.stderr)
    );
    let st = cli_wait_terminal(&run_dir, &path, Duration::from_secs(180));
    let rank0 = std::fs::read_to_string(run_dir.join("logs/rank_0.log")).unwrap_or_default();
    let rank1 = std::fs::read_to_string(run_dir.join("logs/rank_1.log")).unwrap_or_default();
    assert_eq!(st["jobs"][0]["state"], "COMPLETED", "{st:#}\n{rank0}");
    let stopped = rank0
        .lines()
        .find(|l| l.starts_with("stopped by SIGUSR2 at step"))
        .unwrap_or_else(|| panic!("no stop in {rank0}"));
    assert!(rank0.contains("rank 0: resuming from"), "{rank0}");
    assert!(rank1.contains("rank 1: resuming from"), "{rank1}");
    assert!(run_dir.join("checkpoint.pt").is_file());
    let metrics = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    let logged: Vec<u64> = metrics
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        logged,
        (0..steps).collect::<Vec<u64>>(),
        "{stopped}\n{metrics}"
    );
    for r in 0..2 {
        let p = run_dir.join(format!("seen_rank{r}.json"));
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(
            s["env"]["SLURM_RESTART_COUNT"], "1",
            "the requeued run: {s:#}"
        );
        assert_eq!(
            s["stopped_at"],
            serde_json::Value::Null,
            "ran to the end: {s:#}"
        );
    }
    println!("  {stopped}");
    println!("DDP example stopped by USR2, resumed: {:.1?}", t.elapsed());
}

// ---------------------------------------------------------------------------------------------
// an adaptive study whose trials are SLURM jobs
// ---------------------------------------------------------------------------------------------

/// The objective of the study scenario: logs the Branin value of its params at every step
/// (`steps` of them, `pause` seconds apart) in `metrics.csv`.
const STUDY_OBJECTIVE: &str = r#"import math, os, sys, time
x = float(sys.argv[1]); y = float(sys.argv[2]); steps = int(sys.argv[3]); pause = float(sys.argv[4])
a, b, c, r, s, t = 1, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
f = a * (y - b * x * x + c * x - r) ** 2 + s * (1 - t) * math.cos(x) + s
with open(os.path.join(os.environ["FLOTILLA_JOB_DIR"], "metrics.csv"), "w") as out:
    out.write("step,loss\n")
    for i in range(1, steps + 1):
        time.sleep(pause)
        out.write(f"{i},{f!r}\n")
        out.flush()
"#;

const STUDY_CONFIG: &str = "x: 0.0
y: 0.0
steps: 1
pause: 0.0
flotilla:
  task:
    command: [python3, objective.py, '${x}', '${y}', '${steps}', '${pause}']
  sweeper:
    sampler: random
    seed: 7
    n_trials: 4
    max_parallel: 2
    params:
      x: interval(-5, 10)
      y: interval(0, 15)
";

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null)
}

/// The study's trials in `state`.
fn trials_in(dir: &Path, state: &str) -> usize {
    read_json(&dir.join("study.json"))["trials"]
        .as_array()
        .map_or(0, |t| t.iter().filter(|t| t["state"] == state).count())
}

/// Every trial COMPLETE with the Branin value of its params; every job of `sweep.json`
/// COMPLETED with its own SLURM id.
fn check_study(dir: &Path) {
    let study = read_json(&dir.join("study.json"));
    let trials = study["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{study:#}");
    for t in trials {
        assert_eq!(t["state"], "COMPLETE", "{t}");
        let (x, y) = (
            t["params"]["x"].as_f64().unwrap(),
            t["params"]["y"].as_f64().unwrap(),
        );
        let value = t["value"].as_f64().unwrap();
        assert!((value - branin(x, y)).abs() < 1e-9, "{t}");
    }
    let plan = read_json(&dir.join("sweep.json"));
    let jobs = plan["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4, "{plan:#}");
    let mut ids: Vec<&str> = jobs
        .iter()
        .map(|j| {
            assert_eq!(j["state"], "COMPLETED", "{j}");
            let id = j["job_id"].as_str().unwrap_or_else(|| panic!("{j}"));
            assert!(id.chars().all(|c| c.is_ascii_digit()), "a batch job: {id}");
            id
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "one SLURM job per trial: {plan:#}");
}

/// Waits until the study's driver has exited (its lock released).
fn wait_driver_gone(dir: &Path) {
    wait_for("the study driver to exit", Duration::from_secs(20), || {
        !dir.join("driver.pid").exists()
    });
}

/// 9. An adaptive study (random sampler) of a Python program, each trial a SLURM job:
///    `flotilla run -m` returns at once and a detached driver runs the study to its 4 trials,
///    2 at a time; a second study's driver is killed (SIGKILL) mid-way and `--resume-sweep`
///    starts a new one, which watches the jobs in flight again and finishes the study.
fn adaptive_study(root: &Path) {
    let t = Instant::now();
    let project = root.join("study-project");
    std::fs::create_dir_all(project.join("conf")).unwrap();
    std::fs::write(project.join("conf/config.yaml"), STUDY_CONFIG).unwrap();
    std::fs::write(project.join("objective.py"), STUDY_OBJECTIVE).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let slurm = [
        "+compute.launcher=slurm",
        "+compute.nodes=1",
        "+compute.tasks_per_node=1",
        "+compute.cpus_per_task=1",
        "+compute.mem_gb=1",
        "+compute.timeout_min=5",
    ];
    let start = |dir: &Path, extra: &[&str]| -> serde_json::Value {
        let sweep_dir = format!("flotilla.sweep.dir={}", dir.display());
        let mut args = vec!["run", "-m", "--format", "json"];
        args.extend(slurm);
        args.extend(extra);
        args.push(&sweep_dir);
        let t0 = Instant::now();
        let out = flotilla_cli(&project, &path, &args);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "flotilla run -m took {:?}",
            t0.elapsed()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };

    // The whole study, driven in the background.
    let dir = root.join("study-a");
    let printed = start(&dir, &[]);
    let pid = printed["driver_pid"].as_i64().unwrap();
    assert_eq!(printed["driver_started"], true, "{printed}");
    assert!(dir.join("study.json").is_file());
    let log = dir.join("driver.log");
    assert_eq!(Path::new(printed["driver_log"].as_str().unwrap()), log);
    wait_for("4 COMPLETE trials", Duration::from_secs(60), || {
        trials_in(&dir, "COMPLETE") == 4
    });
    wait_driver_gone(&dir);
    check_study(&dir);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("submitted as SLURM job") && text.contains("study: 4 trials (4 complete"),
        "driver {pid}'s log:\n{text}"
    );
    println!("adaptive study on SLURM: {:.1?}", t.elapsed());

    // Killed mid-way, resumed: the jobs in flight are watched again, not submitted again.
    let t = Instant::now();
    let dir = root.join("study-b");
    let printed = start(&dir, &["steps=6", "pause=0.5"]);
    let pid = printed["driver_pid"].as_i64().unwrap() as i32;
    let submitted = |dir: &Path| -> Vec<String> {
        read_json(&dir.join("sweep.json"))["jobs"]
            .as_array()
            .map(|j| {
                j.iter()
                    .filter_map(|j| j["job_id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_for("2 trials submitted", Duration::from_secs(20), || {
        submitted(&dir).len() == 2
    });
    assert_eq!(
        std::fs::read_to_string(dir.join("driver.pid"))
            .unwrap()
            .trim(),
        pid.to_string()
    );
    // SAFETY: signals the driver this test started (its pid as printed and in driver.pid).
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = submitted(&dir);
    assert_eq!(
        trials_in(&dir, "RUNNING"),
        2,
        "killed with 2 trials in flight"
    );
    let out = flotilla_cli(
        &project,
        &path,
        &[
            "run",
            "--format",
            "json",
            "--resume-sweep",
            &dir.display().to_string(),
        ],
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["driver_started"], true, "{printed}");
    assert_ne!(printed["driver_pid"].as_i64(), Some(pid as i64));
    wait_for(
        "4 COMPLETE trials after resuming",
        Duration::from_secs(60),
        || trials_in(&dir, "COMPLETE") == 4,
    );
    wait_driver_gone(&dir);
    check_study(&dir);
    let after = submitted(&dir);
    assert_eq!(
        &after[..2],
        &before[..],
        "the jobs in flight kept their SLURM ids (watched again, not submitted again)"
    );
    let text = std::fs::read_to_string(dir.join("driver.log")).unwrap();
    assert!(
        text.contains("watching SLURM job"),
        "the resumed driver's log:\n{text}"
    );
    println!("adaptive study killed and resumed: {:.1?}", t.elapsed());
}
