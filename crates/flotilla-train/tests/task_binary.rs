//! The `flotilla-train` binary as a launcher starts it: its exit statuses for a bad config and
//! a missing prepared directory. (Training itself is tested by the other tests here.)

use std::process::Command;

fn train_binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flotilla-train"))
}

#[test]
fn unknown_override_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let conf = concat!(env!("CARGO_MANIFEST_DIR"), "/../../conf");
    let out = train_binary()
        .args(["train", "--config-dir", conf, "--run-dir"])
        .arg(dir.path().join("run"))
        .arg("trainer.lrr=1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("trainer.lrr"), "{stderr}");
}

#[test]
fn prepared_without_config_exits_1_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = train_binary()
        .args(["train", "--prepared", "--run-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("config.yaml") && stderr.contains("flotilla run"),
        "{stderr}"
    );
}
