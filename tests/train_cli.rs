//! `flotilla train` end to end on the default config (a few steps): the run directory's files,
//! `metrics.csv`, resuming with a larger `trainer.max_steps`, and exit 2 on a config error.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn train(run_dir: &Path, overrides: &[&str]) -> Output {
    common::train_binary();
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("train")
        .arg("--run-dir")
        .arg(run_dir)
        .args(overrides)
        .env("FLOTILLA_LOG", "warn")
        .output()
        .unwrap()
}

fn losses(run_dir: &Path) -> Vec<(u64, f64)> {
    let mut r = csv::Reader::from_path(run_dir.join("metrics.csv")).unwrap();
    r.records()
        .map(|x| {
            let x = x.unwrap();
            (x[0].parse().unwrap(), x[1].parse().unwrap())
        })
        .collect()
}

#[test]
fn train_writes_a_run_dir_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let base = [
        "trainer.eval_every=3",
        "trainer.checkpoint_every=3",
        "trainer.device=cpu",
    ];
    let o = train(&dir, &[&base[..], &["trainer.max_steps=6"]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("done: 6 steps"), "{err}");
    for f in [
        "config.yaml",
        "overrides.yaml",
        "metrics.csv",
        "checkpoints/step_3/trainer_state.json",
        "checkpoints/step_6/model.safetensors",
        "final/config.json",
        "final/model.safetensors",
        "final/tokenizer.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let ov = std::fs::read_to_string(dir.join("overrides.yaml")).unwrap();
    assert!(ov.contains("trainer.max_steps=6"), "{ov}");
    let rows = losses(&dir);
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );
    assert!(rows[5].1 < rows[0].1, "{rows:?}");
    let header = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    assert!(header.starts_with(
        "step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc\n"
    ));

    // Same run dir, more steps: resumes at 6 and appends rows 6..8.
    let o = train(&dir, &[&base[..], &["trainer.max_steps=9"]].concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("resuming from"), "{err}");
    let again = losses(&dir);
    assert_eq!(
        again.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..9).collect::<Vec<_>>()
    );
    assert_eq!(&again[..6], &rows[..]);
}

#[test]
fn train_config_error_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let o = train(&tmp.path().join("run"), &["trainer.no_such_key=1"]);
    assert_eq!(o.status.code(), Some(2));
}
