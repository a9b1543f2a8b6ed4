//! Adaptive sweeps through the CLI: a user program computing a known function of its params
//! (Branin, and a learning curve for pruning) is optimised by the TPE and random samplers; the
//! study's trials, values and states are checked against the function itself, pruned trials
//! really stop, an interrupted study resumes to its budget with the trials an uninterrupted one
//! samples, and bad settings are refused before anything is created.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{branin, ok};

const OBJECTIVE: &str = r#"import math, os, sys, time
x = float(sys.argv[1]); y = float(sys.argv[2]); steps = int(sys.argv[3])
a, b, c, r, s, t = 1, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
f = a * (y - b * x * x + c * x - r) ** 2 + s * (1 - t) * math.cos(x) + s
with open(os.path.join(os.environ["FLOTILLA_JOB_DIR"], "metrics.csv"), "w") as out:
    out.write("step,loss\n")
    for i in range(1, steps + 1):
        out.write(f"{i},{f + 10.0 / i!r}\n")
        out.flush()
        if steps > 1:
            time.sleep(0.05)
"#;

const CONFIG: &str = "x: 0.0
y: 0.0
steps: 1
flotilla:
  task:
    command: [python3, objective.py, '${x}', '${y}', '${steps}']
  sweeper:
    sampler: tpe
    n_trials: 12
    max_parallel: 2
    params:
      x: interval(-5, 10)
      y: interval(0, 15)
";

fn project() -> tempfile::TempDir {
    // Every test here runs `flotilla run`, which finds the task binary first.
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("conf")).unwrap();
    std::fs::write(tmp.path().join("conf/config.yaml"), CONFIG).unwrap();
    std::fs::write(tmp.path().join("objective.py"), OBJECTIVE).unwrap();
    tmp
}

fn flotilla(cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    c.current_dir(cwd).env_remove("FLOTILLA_LOG");
    c
}

fn run(cwd: &Path, args: &[&str]) -> Output {
    flotilla(cwd).args(args).output().expect("run flotilla")
}

fn json(path: PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn param(t: &serde_json::Value, name: &str) -> f64 {
    t["params"][name].as_f64().unwrap()
}

#[test]
fn a_tpe_study_runs_its_budget_and_records_each_trials_value() {
    let p = project();
    let cwd = p.path();
    ok(run(cwd, &["run", "-m", "flotilla.sweep.dir=study"]));
    let study = json(cwd.join("study/study.json"));
    let trials = study["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 12);
    assert_eq!(study["metric"], "loss");
    assert_eq!(study["direction"], "minimize");
    let plan = json(cwd.join("study/sweep.json"));
    let jobs = plan["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 12);
    let mut best = (f64::INFINITY, 0);
    for (i, t) in trials.iter().enumerate() {
        assert_eq!(t["number"], i as u64);
        assert_eq!(t["state"], "COMPLETE", "{t}");
        let (x, y) = (param(t, "x"), param(t, "y"));
        assert!(
            (-5.0..=10.0).contains(&x) && (0.0..=15.0).contains(&y),
            "{t}"
        );
        // The value is what the program computed for these params (its last logged loss).
        let value = t["value"].as_f64().unwrap();
        assert!((value - (branin(x, y) + 10.0)).abs() < 1e-9, "{t}");
        if value < best.0 {
            best = (value, i);
        }
        let job = jobs.iter().find(|j| j["num"] == i as u64).unwrap();
        assert_eq!(job["state"], "COMPLETED");
        let overrides: Vec<&str> = job["overrides"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap())
            .collect();
        assert_eq!(overrides, [format!("x={x}"), format!("y={y}")]);
    }
    // The report ranks the trials as the study does.
    let report: serde_json::Value =
        serde_json::from_str(&ok(run(cwd, &["report", "study", "--format", "json"]))).unwrap();
    assert_eq!(report["best"]["num"], best.1 as u64);
    assert_eq!(report["jobs"].as_array().unwrap().len(), 12);
}

#[test]
fn asha_stops_the_trials_that_fall_behind() {
    let p = project();
    let cwd = p.path();
    ok(run(
        cwd,
        &[
            "run",
            "-m",
            "flotilla.sweep.dir=study",
            "steps=30",
            "flotilla.sweeper.n_trials=8",
            "flotilla.sweeper.pruner=asha",
            "flotilla.sweeper.min_resource=2",
        ],
    ));
    let study = json(cwd.join("study/study.json"));
    let plan = json(cwd.join("study/sweep.json"));
    let trials = study["trials"].as_array().unwrap();
    let pruned: Vec<&serde_json::Value> =
        trials.iter().filter(|t| t["state"] == "PRUNED").collect();
    assert!(!pruned.is_empty(), "nothing was pruned: {study}");
    assert!(trials.iter().any(|t| t["state"] == "COMPLETE"));
    for t in trials {
        let n = t["number"].as_u64().unwrap();
        let rows = std::fs::read_to_string(cwd.join(format!("study/{n}/metrics.csv")))
            .unwrap()
            .lines()
            .count()
            - 1;
        let job = &plan["jobs"].as_array().unwrap()[n as usize];
        if t["state"] == "PRUNED" {
            // Stopped before its 30 steps, at a rung (2 or 8 steps), and recorded as such.
            assert!(rows < 30, "trial {n} ran to the end: {rows} rows");
            assert_eq!(job["state"], "PRUNED");
            assert!(
                job["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("pruned at step "),
                "{job}"
            );
            let rungs = t["rungs"].as_object().unwrap();
            assert!(!rungs.is_empty(), "{t}");
        } else {
            assert_eq!(t["state"], "COMPLETE", "{t}");
            assert_eq!(rows, 30);
            assert_eq!(job["state"], "COMPLETED");
        }
    }
    let status = ok(run(cwd, &["status", "study"]));
    assert!(status.contains("PRUNED"), "{status}");
    // The report draws the optimization history: one point per trial, the best-so-far line.
    ok(run(cwd, &["report", "study", "--plot", "plots"]));
    let history = std::fs::read_to_string(cwd.join("plots/history.svg")).unwrap();
    assert_eq!(history.matches("class=\"trial\"").count(), 8, "{history}");
    assert_eq!(
        history.matches("fill=\"none\" stroke=\"#4e79a7\"").count(),
        pruned.len(),
        "pruned trials are hollow"
    );
    assert_eq!(history.matches("class=\"best\"").count(), 1);
    assert!(cwd.join("plots/history.png").is_file());
}

#[test]
fn an_interrupted_study_resumes_to_its_budget_with_the_same_trials() {
    let p = project();
    let cwd = p.path();
    let args = [
        "-m",
        "flotilla.sweep.dir=study",
        "steps=40",
        "flotilla.sweeper.sampler=random",
        "flotilla.sweeper.n_trials=6",
    ];
    // What the study will sample, as `plan` shows it.
    let planned = ok(run(cwd, &[&["plan"][..], &args].concat()));
    let mut child = flotilla(cwd)
        .args([&["run"][..], &args].concat())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Let a trial or two start, then Ctrl-C.
    let study_file = cwd.join("study/study.json");
    let t0 = std::time::Instant::now();
    while !study_file.exists() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(!status.success(), "an interrupted study exits non-zero");
    let before = json(study_file.clone());
    let unfinished = before["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "RUNNING")
        .count();
    assert!(unfinished > 0, "{before}");
    assert!(before["trials"].as_array().unwrap().len() < 6, "{before}");

    ok(run(cwd, &["run", "--resume-sweep", "study"]));
    let after = json(study_file);
    let trials = after["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 6);
    assert!(trials.iter().all(|t| t["state"] == "COMPLETE"), "{after}");
    // Trial n is sampled from its own seeded stream: the same as `plan` listed.
    for t in trials.iter().take(5) {
        let n = t["number"].as_u64().unwrap();
        let line = planned
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{n}  ")))
            .unwrap();
        assert!(
            line.contains(&format!("x={}", param(t, "x"))),
            "{line} vs {t}"
        );
    }
}

#[test]
fn bad_study_settings_are_refused_before_anything_is_created() {
    let p = project();
    let cwd = p.path();
    for (args, says) in [
        (vec!["flotilla.sweeper.sampler=bayes"], "'bayes'"),
        (vec!["flotilla.sweeper.n_trials=null"], "n_trials"),
        (vec!["flotilla.sweeper.pruner=hyperband"], "asha"),
        (vec!["flotilla.sweeper.sampler=grid"], "interval"),
        (vec!["x=interval(5,1)"], "low <= high"),
        (
            vec!["+compute.launcher=slurm", "+compute.pack=4"],
            "no queue of jobs to pack",
        ),
    ] {
        let mut all = vec!["run", "-m", "flotilla.sweep.dir=study"];
        all.extend(args.iter().copied());
        let o = run(cwd, &all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !cwd.join("study").exists(),
            "{args:?} created the sweep dir"
        );
    }
}
