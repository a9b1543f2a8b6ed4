//! Run directories: names from the runtime node's patterns, atomic collision-free creation
//! (also across many concurrent `flotilla run --dry-run` processes), `meta.json`, `sweep.json`
//! and its typed update API, and `flotilla status` from a directory's markers.

mod common;
#[path = "common/compose.rs"]
mod compose;
#[path = "common/launch.rs"]
mod launch;

use common::{conf_dir, ov};
use flotilla_config::interp::ResolveContext;
use flotilla_config::{Composer, ConfigError};
use flotilla_launch::rundir::status::{combine, markers, Markers};
use flotilla_launch::rundir::{
    self, JobRecord, JobState, Meta, Plan, PlanFile, PreparedRun, RunDirError,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A composer whose `${now:...}` is 2024-01-02 03:04:05 local time.
fn fixed_clock_composer() -> Composer {
    let mut c = compose::composer();
    use chrono::TimeZone;
    let now = chrono::Local
        .with_ymd_and_hms(2024, 1, 2, 3, 4, 5)
        .single()
        .unwrap();
    c.set_context(ResolveContext {
        now,
        env: std::sync::Arc::new(|name| std::env::var(name).ok()),
    });
    c
}

/// Prepares a run (or with `multirun`, a sweep) at the fixed time.
fn prepare(overrides: &[String], multirun: bool) -> Result<PreparedRun, RunDirError> {
    launch::prepare(&fixed_clock_composer(), overrides, multirun)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn assert_job_dir_complete(dir: &Path) {
    for f in ["config.yaml", "overrides.yaml", "meta.json"] {
        assert!(dir.join(f).is_file(), "{} lacks {f}", dir.display());
    }
    assert!(dir.join("logs").is_dir(), "{} lacks logs/", dir.display());
}

#[test]
fn run_dir_comes_from_the_run_pattern() {
    let tmp = tempfile::tempdir().unwrap();
    let pattern = format!(
        "flotilla.run.dir={}/outputs/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}",
        tmp.path().display()
    );
    let run = prepare(&ov(&[&pattern, "trainer.max_steps=7"]), false).unwrap();
    let expected = tmp.path().join("outputs/2024-01-02/03-04-05");
    assert_eq!(run.sweep_dir, None);
    assert_eq!(run.jobs.len(), 1);
    assert_eq!(run.jobs[0].dir, expected);
    assert_eq!(run.plan, PlanFile::single(&expected));
    assert_job_dir_complete(&expected);
    assert_eq!(
        entries(&expected),
        [
            ".flotilla",
            "config.yaml",
            "job.json",
            "logs",
            "meta.json",
            "overrides.yaml"
        ]
    );
    // config.yaml is the resolved job config, as `flotilla compose` prints it.
    let config = std::fs::read_to_string(expected.join("config.yaml")).unwrap();
    let compose = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["compose", "--config-dir"])
        .arg(conf_dir())
        .arg("trainer.max_steps=7")
        .output()
        .unwrap();
    assert_eq!(config, String::from_utf8_lossy(&compose.stdout));
    assert_eq!(run.jobs[0].config.as_ref().unwrap().trainer.max_steps, 7);
    // overrides.yaml lists the task overrides only (not the runtime one).
    assert_eq!(
        std::fs::read_to_string(expected.join("overrides.yaml")).unwrap(),
        "- \"trainer.max_steps=7\"\n"
    );
    // No staging directory is left behind.
    assert_eq!(
        entries(&tmp.path().join("outputs/2024-01-02")),
        ["03-04-05"]
    );
}

#[test]
fn overrides_yaml_is_an_empty_list_without_overrides() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(
        &ov(&[&format!("flotilla.run.dir={}/r", tmp.path().display())]),
        false,
    )
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(run.jobs[0].dir.join("overrides.yaml")).unwrap(),
        "[]\n"
    );
}

#[test]
fn sweep_dirs_come_from_the_sweep_patterns() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = format!(
        "flotilla.sweep.dir={}/multirun/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}",
        tmp.path().display()
    );
    let run = prepare(&ov(&[&sweep, "trainer.lr=1e-3,1e-4", "seed=1,2"]), true).unwrap();
    let root = tmp.path().join("multirun/2024-01-02/03-04-05");
    assert_eq!(run.sweep_dir.as_deref(), Some(root.as_path()));
    assert_eq!(run.plan, PlanFile::sweep(&root));
    assert_eq!(run.jobs.len(), 4);
    for (i, job) in run.jobs.iter().enumerate() {
        assert_eq!(job.num, i);
        assert_eq!(job.dir, root.join(i.to_string()));
        assert_job_dir_complete(&job.dir);
    }
    assert_eq!(
        entries(&root),
        [".flotilla", "0", "1", "2", "3", "sweep.json"]
    );
    // The copy of the config directory the jobs were composed from.
    assert_eq!(
        std::fs::read(root.join(".flotilla/conf/trainer/default.yaml")).unwrap(),
        std::fs::read(common::conf_dir().join("trainer/default.yaml")).unwrap()
    );

    // A subdir pattern naming the job by its values.
    let run = prepare(
        &ov(&[
            &sweep,
            "flotilla.sweep.subdir=lr_${trainer.lr}/n${flotilla.job.num}",
            "trainer.lr=1e-3,1e-4",
        ]),
        true,
    )
    .unwrap();
    let root = tmp.path().join("multirun/2024-01-02/03-04-05_1");
    assert_eq!(run.sweep_dir.as_deref(), Some(root.as_path()));
    assert_eq!(run.jobs[0].dir, root.join("lr_0.001/n0"));
    assert_eq!(run.jobs[1].dir, root.join("lr_0.0001/n1"));
    assert_job_dir_complete(&run.jobs[1].dir);
}

#[test]
fn sweep_json_lists_every_job_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = format!("flotilla.sweep.dir={}/sw", tmp.path().display());
    let run = prepare(&ov(&[&sweep, "trainer.lr=1e-3,1e-4", "seed=7,8,9"]), true).unwrap();
    let text = std::fs::read_to_string(tmp.path().join("sw/sweep.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["version"], 1);
    assert_eq!(json["sweep"], true);
    assert_eq!(json["launcher"], "local");
    assert_eq!(
        json["argv"],
        serde_json::json!(["flotilla", "run", "--test"])
    );
    let jobs = json["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 6);
    let expected = [
        ["trainer.lr=0.001", "seed=7"],
        ["trainer.lr=0.001", "seed=8"],
        ["trainer.lr=0.001", "seed=9"],
        ["trainer.lr=0.0001", "seed=7"],
        ["trainer.lr=0.0001", "seed=8"],
        ["trainer.lr=0.0001", "seed=9"],
    ];
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job["num"], i);
        assert_eq!(job["dir"], i.to_string());
        assert_eq!(job["overrides"], serde_json::json!(expected[i]));
        assert_eq!(job["job_id"], serde_json::Value::Null);
        assert_eq!(job["state"], "PENDING");
        // Each job's overrides.yaml and meta.json agree.
        let dir = &run.jobs[i].dir;
        let meta: Meta =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta.job_num, i);
        assert_eq!(meta.overrides, expected[i]);
        assert_eq!(
            std::fs::read_to_string(dir.join("overrides.yaml")).unwrap(),
            format!("- \"{}\"\n- \"{}\"\n", expected[i][0], expected[i][1])
        );
    }
    // The typed API reads the same thing.
    let plan = run.plan.read().unwrap();
    assert!(plan.sweep);
    assert_eq!(plan.jobs.len(), 6);
    assert_eq!(run.plan.job_dir(&plan.jobs[4]), run.jobs[4].dir);
}

#[test]
fn meta_json_records_how_the_job_was_made() {
    let tmp = tempfile::tempdir().unwrap();
    let run = prepare(
        &ov(&[
            &format!("flotilla.run.dir={}/r", tmp.path().display()),
            "seed=3",
        ]),
        false,
    )
    .unwrap();
    let text = std::fs::read_to_string(run.jobs[0].dir.join("meta.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in [
        "argv",
        "cwd",
        "time",
        "user",
        "host",
        "git_commit",
        "git_dirty",
        "flotilla_version",
        "libtorch_version",
        "job_num",
        "launcher",
        "overrides",
    ] {
        assert!(json.get(key).is_some(), "meta.json lacks {key}: {text}");
    }
    let meta: Meta = serde_json::from_str(&text).unwrap();
    assert_eq!(meta.argv, ["flotilla", "run", "--test"]);
    assert_eq!(meta.flotilla_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(meta.libtorch_version, flotilla_contract::LIBTORCH_VERSION);
    assert_eq!(meta.job_num, 0);
    assert_eq!(meta.launcher, "local");
    assert_eq!(meta.overrides, ["seed=3"]);
    assert!(!meta.user.is_empty() && !meta.host.is_empty());
    assert!(
        chrono::DateTime::parse_from_rfc3339(&meta.time).is_ok(),
        "{}",
        meta.time
    );
    assert_eq!(
        meta.cwd,
        std::env::current_dir().unwrap().display().to_string()
    );
    // The test runs in the crate's directory: the git facts are those of its repository.
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    assert_eq!(meta.git_commit, head);
    assert_eq!(meta.git_dirty.is_some(), head.is_some());
}

#[test]
fn git_state_outside_a_repository_is_none_and_dirty_flag_follows_changes() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(rundir::meta::git_state(tmp.path()), None);
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(tmp.path())
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !git(&["init", "-q"]) {
        return common::skip_or_fail(
            "`git init` fails: git is not installed (apt-get install git)",
        );
    }
    std::fs::write(tmp.path().join("a.txt"), "one").unwrap();
    assert!(git(&["add", "a.txt"]));
    assert!(git(&[
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "-m",
        "one"
    ]));
    let (commit, dirty) = rundir::meta::git_state(tmp.path()).unwrap();
    assert_eq!(commit.len(), 40);
    assert!(!dirty);
    std::fs::write(tmp.path().join("a.txt"), "two").unwrap();
    assert_eq!(rundir::meta::git_state(tmp.path()), Some((commit, true)));
}

#[test]
fn an_existing_directory_is_never_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = format!("flotilla.run.dir={}/same", tmp.path().display());
    let first = prepare(&ov(&[&dir, "seed=1"]), false).unwrap();
    std::fs::write(first.jobs[0].dir.join("mine.txt"), "keep").unwrap();
    let second = prepare(&ov(&[&dir, "seed=2"]), false).unwrap();
    let third = prepare(&ov(&[&dir, "seed=3"]), false).unwrap();
    assert_eq!(first.jobs[0].dir, tmp.path().join("same"));
    assert_eq!(second.jobs[0].dir, tmp.path().join("same_1"));
    assert_eq!(third.jobs[0].dir, tmp.path().join("same_2"));
    // The first directory is untouched.
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("same/mine.txt")).unwrap(),
        "keep"
    );
    let cfg = std::fs::read_to_string(tmp.path().join("same/config.yaml")).unwrap();
    assert!(cfg.contains("seed: 1"), "{cfg}");
    // An empty directory in the way is not reused either.
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    let run = prepare(
        &ov(&[&format!("flotilla.run.dir={}/empty", tmp.path().display())]),
        false,
    )
    .unwrap();
    assert_eq!(run.jobs[0].dir, tmp.path().join("empty_1"));
    assert!(entries(&tmp.path().join("empty")).is_empty());
}

#[test]
fn create_unique_dir_under_threads_never_hands_out_a_directory_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("a/b/run");
    let dirs: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| s.spawn(|| rundir::create_unique_dir(&target).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut unique = dirs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 16, "{dirs:?}");
    assert!(dirs.contains(&target));
    assert!(dirs.contains(&tmp.path().join("a/b/run_15")));
}

fn run_cli(cwd: &Path, args: &[&str]) -> Output {
    // `flotilla run`, even a dry one, finds the task binary first.
    common::train_binary();
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .current_dir(cwd)
        .arg("run")
        .arg("--config-dir")
        .arg(conf_dir())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn concurrent_dry_runs_get_distinct_complete_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 16;
    common::train_binary();
    let children: Vec<_> = (0..n)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_flotilla"))
                .current_dir(tmp.path())
                .arg("run")
                .arg("--config-dir")
                .arg(conf_dir())
                .args(["--dry-run", "--format", "json"])
                .arg(format!("seed={i}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut dirs = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["sweep_dir"], serde_json::Value::Null);
        let job = &json["jobs"][0];
        assert_eq!(job["state"], "PENDING");
        assert_eq!(job["job_id"], serde_json::Value::Null);
        let dir = PathBuf::from(job["dir"].as_str().unwrap());
        // Default pattern: outputs/<date>/<time>[_N] under the working directory.
        let rel = dir
            .strip_prefix(tmp.path().canonicalize().unwrap())
            .or_else(|_| dir.strip_prefix(tmp.path()))
            .unwrap();
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        assert_eq!(parts.len(), 3, "{rel:?}");
        assert_eq!(parts[0], "outputs");
        assert!(
            chrono::NaiveDate::parse_from_str(&parts[1], "%Y-%m-%d").is_ok(),
            "{rel:?}"
        );
        let time = parts[2].split('_').next().unwrap();
        assert!(
            chrono::NaiveTime::parse_from_str(time, "%H-%M-%S").is_ok(),
            "{rel:?}"
        );
        assert_job_dir_complete(&dir);
        // The directory holds this process's job, not another's.
        let cfg = std::fs::read_to_string(dir.join("config.yaml")).unwrap();
        assert!(cfg.contains(&format!("\nseed: {i}\n")), "{cfg}");
        dirs.push(dir);
    }
    let mut unique = dirs.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), n, "{dirs:?}");
    // Nothing else was left in outputs/ (no staging directories).
    let mut all = 0;
    for date in std::fs::read_dir(tmp.path().join("outputs")).unwrap() {
        for e in std::fs::read_dir(date.unwrap().path()).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(!name.starts_with('.'), "leftover {name}");
            all += 1;
        }
    }
    assert_eq!(all, n);
}

#[test]
fn every_job_is_validated_before_anything_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = format!("flotilla.sweep.dir={}/sw", tmp.path().display());
    // Job 1 has a bad value: nothing at all is created.
    let err = prepare(&ov(&[&sweep, "trainer.lr=1e-3,oops"]), true).unwrap_err();
    assert!(matches!(err, RunDirError::Config(_)), "{err}");
    assert!(err.to_string().contains("job 1"), "{err}");
    assert!(entries(tmp.path()).is_empty(), "{:?}", entries(tmp.path()));
    // Two jobs in one subdirectory.
    let err = prepare(
        &ov(&[&sweep, "flotilla.sweep.subdir=same", "seed=1,2"]),
        true,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("flotilla.sweep.subdir='same'"),
        "{err}"
    );
    // A subdir escaping the sweep directory.
    let err = prepare(
        &ov(&[&sweep, "flotilla.sweep.subdir=../x", "seed=1,2"]),
        true,
    )
    .unwrap_err();
    assert!(err.to_string().contains("relative path"), "{err}");
    assert!(entries(tmp.path()).is_empty());

    // Through the CLI: exit 2 and the culprit named, no directory.
    let out = run_cli(tmp.path(), &["--dry-run", "-m", "trainer.lrr=1,2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trainer.lrr"), "{err}");
    assert!(!tmp.path().join("outputs").exists());
}

#[test]
fn a_config_that_is_not_a_flotilla_job_cannot_be_run() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_cli(
        tmp.path(),
        &["--dry-run", "--no-validate", "flotilla.run.dir=x"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a flotilla job"));
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn plan_file_updates_are_atomic_and_never_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = format!("flotilla.sweep.dir={}/sw", tmp.path().display());
    let run = prepare(&ov(&[&sweep, "seed=range(0,16)"]), true).unwrap();
    let plan = run.plan.clone();
    // 16 threads each record an id and a state for their own job, concurrently.
    std::thread::scope(|s| {
        for num in 0..16 {
            let plan = plan.clone();
            s.spawn(move || {
                plan.set_job_id(num, Some(format!("100_{num}")), JobState::Pending)
                    .unwrap();
                plan.set_state(num, JobState::Running, None).unwrap();
                plan.update_job(num, |j| {
                    j.extra
                        .insert("array_task".into(), serde_json::Value::from(num));
                })
                .unwrap();
            });
        }
    });
    let read = plan.read().unwrap();
    for (num, job) in read.jobs.iter().enumerate() {
        assert_eq!(job.num, num);
        assert_eq!(job.job_id.as_deref(), Some(format!("100_{num}").as_str()));
        assert_eq!(job.state, JobState::Running);
        assert!(job.updated.is_some());
        assert_eq!(job.extra["array_task"], num);
    }
    // Whole-plan update with plan-level extra fields, kept on rewrite.
    plan.update(|p| {
        p.extra
            .insert("array_ids".into(), serde_json::json!(["100"]));
    })
    .unwrap();
    plan.set_state(
        3,
        JobState::Failed,
        Some("rank 1 exited with code 3".into()),
    )
    .unwrap();
    let read: Plan = plan.read().unwrap();
    assert_eq!(read.extra["array_ids"], serde_json::json!(["100"]));
    assert_eq!(read.jobs[3].state, JobState::Failed);
    assert_eq!(
        read.jobs[3].message.as_deref(),
        Some("rank 1 exited with code 3")
    );
    // An unknown job is an error naming the plan.
    let err = plan.set_state(99, JobState::Failed, None).unwrap_err();
    assert!(
        matches!(err, RunDirError::NoSuchJob { num: 99, .. }),
        "{err}"
    );
    // No temporary files are left next to sweep.json.
    let leftovers: Vec<String> = entries(plan.dir())
        .into_iter()
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn job_states_serialise_as_slurm_spells_them() {
    for st in JobState::ALL {
        let json = serde_json::to_string(&st).unwrap();
        assert_eq!(json, format!("\"{}\"", st.as_str()));
        assert_eq!(st.as_str().parse::<JobState>().unwrap(), st);
    }
    assert_eq!(
        JobState::from_slurm("CANCELLED by 1000"),
        JobState::Cancelled
    );
    assert_eq!(JobState::from_slurm("PD"), JobState::Pending);
    assert_eq!(JobState::from_slurm("RUNNING"), JobState::Running);
    assert_eq!(JobState::from_slurm("COMPLETING"), JobState::Running);
    assert_eq!(JobState::from_slurm("COMPLETED"), JobState::Completed);
    assert_eq!(JobState::from_slurm("OUT_OF_MEMORY"), JobState::OutOfMemory);
    assert_eq!(JobState::from_slurm("whatever"), JobState::Unknown);
    assert!(JobState::Failed.is_terminal() && !JobState::Running.is_terminal());
    assert!("nope".parse::<JobState>().is_err());
}

#[test]
fn status_combines_the_plan_with_the_directory_markers() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = format!("flotilla.sweep.dir={}/sw", tmp.path().display());
    let run = prepare(&ov(&[&sweep, "seed=1,2,3"]), true).unwrap();
    // Job 0 finished (metrics + final/), job 1 failed, job 2 untouched.
    let d0 = &run.jobs[0].dir;
    std::fs::write(
        d0.join("metrics.csv"),
        "step,loss,lr\n0,2.0,0.1\n1,1.5,0.1\n2,1.0,0.1\n",
    )
    .unwrap();
    std::fs::create_dir(d0.join("final")).unwrap();
    run.plan
        .set_state(
            1,
            JobState::Failed,
            Some("rank 0 exited with code 1".into()),
        )
        .unwrap();
    assert_eq!(markers(d0).steps, Some(3));
    assert!(markers(d0).final_model);

    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["status", "--format", "json"])
        .arg(run.sweep_dir.as_ref().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<&str> = json["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["COMPLETED", "FAILED", "PENDING"]);
    assert_eq!(json["jobs"][0]["steps"], 3);
    assert_eq!(json["jobs"][0]["recorded"], "PENDING");
    assert_eq!(json["jobs"][1]["message"], "rank 0 exited with code 1");

    // One job directory of the sweep on its own.
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["status"])
        .arg(&run.jobs[1].dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("FAILED") && !text.contains("COMPLETED"),
        "{text}"
    );

    // Not a run directory.
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["status"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));

    assert_eq!(
        combine(JobState::Running, None, &Default::default()),
        JobState::Running
    );
    assert_eq!(
        combine(
            JobState::Running,
            Some(JobState::Failed),
            &Default::default()
        ),
        JobState::Failed
    );
    // `final/` says training finished: COMPLETED over a record the launcher did not update,
    // but not while the scheduler still runs the job (its process is still writing its logs).
    let finished = Markers {
        steps: Some(4),
        final_model: true,
    };
    assert_eq!(
        combine(JobState::Running, None, &finished),
        JobState::Completed
    );
    assert_eq!(
        combine(JobState::Running, Some(JobState::Running), &finished),
        JobState::Running
    );
    assert_eq!(
        combine(JobState::Running, Some(JobState::Timeout), &finished),
        JobState::Completed
    );
    assert_eq!(
        combine(JobState::Running, Some(JobState::Cancelled), &finished),
        JobState::Cancelled
    );
}

#[test]
fn the_config_error_variant_carries_the_composers_error() {
    let err: RunDirError = ConfigError::Override("x".into()).into();
    assert!(matches!(err, RunDirError::Config(ConfigError::Override(_))));
    let rec = JobRecord::pending(0, ".".into(), vec![]);
    assert_eq!(rec.state, JobState::Pending);
}

/// A base directory whose config.json the trainer would refuse (a rope type, an activation or
/// a head size it does not implement) is refused by `run` on the login node with exit 2,
/// naming the file, the field, the value and what is supported, before anything is created.
#[test]
fn a_base_the_trainer_refuses_is_refused_before_anything_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let sizes = r#""model_type": "llama", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4"#;
    for (extra, want) in [
        (
            r#""rope_scaling": {"rope_type": "ntk", "factor": 4.0}"#,
            "field `rope_scaling.rope_type`: `ntk` is not a rope type flotilla implements; the types are 'default', 'linear', 'dynamic', 'yarn', 'longrope' or 'llama3'",
        ),
        (
            r#""hidden_act": "gelu""#,
            "field `hidden_act`: `gelu` is not supported",
        ),
        (
            r#""rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}"#,
            "field `partial_rotary_factor`: 0.5 is Phi-3's setting: transformers rotates whole \
             heads in Llama",
        ),
    ] {
        std::fs::write(base.join("config.json"), format!("{{{sizes}, {extra}}}")).unwrap();
        let out_dir = tmp.path().join("runs");
        let out = run_cli(
            tmp.path(),
            &[
                &format!("model.init_from={}", base.display()),
                &format!("flotilla.run.dir={}/run", out_dir.display()),
                "--dry-run",
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(want), "{want:?} not in: {stderr}");
        assert!(stderr.contains("config.json"), "{stderr}");
        assert!(!out_dir.exists(), "nothing is created: {stderr}");
    }
}

/// JSONL data with `model.init_from` and `data.tokenizer` unset takes the base's
/// tokenizer.json: a base without one is refused by `run` before anything is created, naming
/// the file and the fix; with one, the job is prepared.
#[test]
fn unset_tokenizer_needs_the_base_s_tokenizer_json() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::write(
        base.join("config.json"),
        r#"{"model_type": "llama", "vocab_size": 300, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}"#,
    )
    .unwrap();
    let data = tmp.path().join("train.jsonl");
    std::fs::write(&data, "{\"prompt\": \"a\", \"completion\": \"b\"}\n").unwrap();
    let run = |name: &str| {
        run_cli(
            tmp.path(),
            &[
                &format!("model.init_from={}", base.display()),
                "data=jsonl",
                &format!("data.path={}", data.display()),
                &format!("flotilla.run.dir={}/{name}", tmp.path().display()),
                "--dry-run",
            ],
        )
    };
    let out = run("refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let want = format!(
        "data.tokenizer: {} does not exist",
        base.join("tokenizer.json").display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!tmp.path().join("refused").exists());
    std::fs::write(base.join("tokenizer.json"), "{}").unwrap();
    let out = run("prepared");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tmp.path().join("prepared/config.yaml").is_file());
}
