//! Preemption of `flotilla train`: SIGUSR2 (or SIGTERM) after the first metrics row stops the
//! run at a step boundary with exit status 75, a checkpoint at that step and no `final/`; the
//! same command then resumes and completes with the metrics rows of an uninterrupted run (all
//! columns but the timings).

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const OVERRIDES: [&str; 9] = [
    "trainer/dist=none",
    "compute.tasks_per_node=1",
    "trainer.max_steps=200",
    "trainer.global_batch_size=16",
    "trainer.micro_batch_size=8",
    "trainer.eval_every=50",
    "trainer.checkpoint_every=0",
    "trainer.log_every=1",
    "trainer.device=cpu",
];

fn command(run_dir: &Path) -> Command {
    common::train_binary();
    let mut c = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("train")
        .arg("--run-dir")
        .arg(run_dir)
        .args(OVERRIDES)
        .env("FLOTILLA_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run(run_dir: &Path) -> Output {
    command(run_dir).output().unwrap()
}

/// Data rows of metrics.csv (0 when missing).
fn row_count(run_dir: &Path) -> usize {
    std::fs::read_to_string(run_dir.join("metrics.csv"))
        .map(|t| t.lines().count().saturating_sub(1))
        .unwrap_or(0)
}

/// Starts a run, waits for its first metrics row, sends `signal`, and waits for the exit.
fn interrupt(run_dir: &Path, signal: libc::c_int) -> Output {
    let child: Child = command(run_dir).spawn().unwrap();
    let t0 = Instant::now();
    while row_count(run_dir) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no metrics row");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
    child.wait_with_output().unwrap()
}

/// metrics.csv as (header, rows) with the timing columns removed.
fn rows_without_timings(run_dir: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(run_dir.join("metrics.csv")).unwrap();
    let headers: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    let keep: Vec<usize> = (0..headers.len())
        .filter(|&i| headers[i] != "tokens_per_s" && headers[i] != "elapsed_s")
        .collect();
    let rows = r
        .records()
        .map(|x| {
            let x = x.unwrap();
            keep.iter().map(|&i| x[i].to_string()).collect()
        })
        .collect();
    (keep.iter().map(|&i| headers[i].clone()).collect(), rows)
}

/// The step N of "stopped by SIGNAL at step N; checkpoint written to DIR; ...".
fn stopped_step(stderr: &str, signal: &str) -> (u64, String) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with(&format!("stopped by {signal} at step ")))
        .unwrap_or_else(|| panic!("no stop message:\n{stderr}"));
    assert!(line.ends_with("; resume with the same command"), "{line}");
    let rest = &line[format!("stopped by {signal} at step ").len()..];
    let (step, rest) = rest.split_once("; checkpoint written to ").unwrap();
    let dir = rest.strip_suffix("; resume with the same command").unwrap();
    (step.parse().unwrap(), dir.to_string())
}

#[test]
fn sigusr2_stops_with_a_checkpoint_and_the_rerun_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (full, cut) = (tmp.path().join("full"), tmp.path().join("cut"));

    let o = interrupt(&cut, libc::SIGUSR2);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(75), "{err}");
    let (step, ckpt) = stopped_step(&err, "SIGUSR2");
    eprintln!("stopped at step {step}");
    assert!((1..200).contains(&step), "{err}");
    let ckpt_dir = cut.join(format!("checkpoints/step_{step}"));
    assert_eq!(Path::new(&ckpt), ckpt_dir, "{err}");
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(ckpt_dir.join("trainer_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["step"], step);
    assert!(ckpt_dir.join("model.safetensors").is_file());
    assert_eq!(row_count(&cut), step as usize);
    assert!(!cut.join("final").exists());
    assert!(!err.contains("done:"), "{err}");

    // The same command resumes at the checkpoint and completes.
    let o = run(&cut);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("resuming from {}", ckpt_dir.display())),
        "{err}"
    );
    assert!(err.contains("done: 200 steps"), "{err}");
    assert!(cut.join("final/model.safetensors").is_file());

    let o = run(&full);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (h_full, r_full) = rows_without_timings(&full);
    let (h_cut, r_cut) = rows_without_timings(&cut);
    assert_eq!(
        h_full,
        [
            "step",
            "loss",
            "grad_norm",
            "lr",
            "eval_loss",
            "eval_ppl",
            "eval_acc"
        ]
    );
    assert_eq!(h_cut, h_full);
    assert_eq!(r_full.len(), 200);
    // Evaluation rows are part of the comparison.
    assert_eq!(r_full.iter().filter(|r| !r[4].is_empty()).count(), 4);
    for (a, b) in r_cut.iter().zip(&r_full) {
        assert_eq!(a, b);
    }
    assert_eq!(r_cut.len(), r_full.len());
}

#[test]
fn sigterm_stops_with_exit_75() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let o = interrupt(&dir, libc::SIGTERM);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(75), "{err}");
    let (step, _) = stopped_step(&err, "SIGTERM");
    assert!(dir
        .join(format!("checkpoints/step_{step}/trainer_state.json"))
        .is_file());
}
