//! Fixtures and helpers shared by the integration tests: the repository's config tree and a
//! composer over it, preparing runs, reading the environment a task wrote, a free port, small
//! model and trainer configs, the Python oracle, running the `flotilla` binary, copying a
//! project tree, and the Branin function the adaptive-sweep objectives compute. Included with `mod common;`; each test
//! uses what it needs.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flotilla_config::schema::{ModelConfig, TrainerConfig};
use flotilla_config::{ComposeOptions, Composer};
use flotilla_launch::rundir::{self, PreparedRun, RunDirError, RunRequest};

/// The repository's config tree.
pub fn conf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("conf")
}

/// A composer of the repository's `conf/config.yaml`.
pub fn composer() -> Composer {
    Composer::new(ComposeOptions {
        config_dir: conf_dir(),
        config_name: "config".into(),
    })
    .unwrap()
}

/// The command line prepared runs record (`meta.json`, `sweep.json`).
pub const ARGV: [&str; 3] = ["flotilla", "run", "--test"];

/// Prepares a run (or with `multirun`, a sweep) of `overrides` with `composer`.
pub fn prepare(
    composer: &Composer,
    overrides: &[String],
    multirun: bool,
) -> Result<PreparedRun, RunDirError> {
    rundir::prepare(
        composer,
        &RunRequest {
            overrides: overrides.to_vec(),
            sweep_file: None,
            multirun,
            argv: ARGV.iter().map(|s| s.to_string()).collect(),
            rerun_of: None,
        },
    )
}

/// Owned overrides.
pub fn ov(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `KEY=VALUE` lines of a file written by `env`.
pub fn read_env(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A free TCP port on 127.0.0.1 (the launcher's `MASTER_PORT` finder).
pub fn free_port() -> u16 {
    flotilla_contract::rank::free_port().expect("a free port on 127.0.0.1")
}

/// A small Llama configuration (2 layers, GQA 4:2) for fast model and engine tests.
pub fn tiny_model_config(tied: bool) -> ModelConfig {
    ModelConfig {
        name: "t".into(),
        vocab_size: 40,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_scaling: None,
        tie_word_embeddings: tied,
        initializer_range: 0.02,
        init_from: None,
    }
}

/// A complete `trainer:` section for tests: one process, fp32 on CPU, constant LR with no
/// warmup, no evaluation or checkpoints, with `overrides` (a YAML mapping such as
/// `{max_steps: 12, schedule: cosine}`) replacing keys of that base.
pub fn trainer_config(overrides: &str) -> TrainerConfig {
    const BASE: &str = "
dist: {mode: none}
max_steps: 10
global_batch_size: 8
micro_batch_size: 4
lr: 3.0e-3
min_lr: 0.0
warmup_steps: 0
schedule: constant
weight_decay: 0.1
betas: [0.9, 0.95]
eps: 1.0e-8
grad_clip: 1.0
precision: 32-true
device: cpu
eval_every: 0
eval_batches: 1
checkpoint_every: 0
keep_last_checkpoints: 0
resume: never
log_every: 1
activation_checkpointing: false
seed: 7
";
    let mut config: serde_yaml::Mapping = serde_yaml::from_str(BASE).unwrap();
    let overrides: serde_yaml::Mapping = serde_yaml::from_str(overrides)
        .unwrap_or_else(|e| panic!("trainer overrides {overrides}: {e}"));
    for (k, v) in overrides {
        assert!(config.contains_key(&k), "unknown trainer key {k:?}");
        config.insert(k, v);
    }
    serde_yaml::from_value(serde_yaml::Value::Mapping(config))
        .unwrap_or_else(|e| panic!("trainer config: {e}"))
}

/// Runs a Python oracle (`.venv/bin/python` with transformers quiet and offline), asserts that
/// it succeeded, and parses the JSON of its last line of output.
pub fn run_oracle<T: serde::de::DeserializeOwned>(cmd: &mut std::process::Command) -> T {
    let out = cmd
        .env("TRANSFORMERS_VERBOSITY", "error")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{cmd:?}: last line {last:?}: {e}"))
}

/// The project venv's python (`FLOTILLA_VENV`, else `.venv`).
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("FLOTILLA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    venv.join("bin").join("python")
}

/// The venv python, if transformers and safetensors import there.
pub fn oracle_python() -> Option<PathBuf> {
    let python = venv_python();
    let ok = std::process::Command::new(&python)
        .args(["-c", "import transformers, safetensors"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then_some(python)
}

/// Runs the `flotilla` binary with `args` in `cwd` (its log filter left at the default).
pub fn flotilla_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .current_dir(cwd)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla")
}

/// The standard output of a command that must have succeeded (else a panic showing its exit
/// status and both streams).
pub fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Copies the tree `src` into `dst`, leaving out `outputs/` and `__pycache__/`.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == "outputs" || name == "__pycache__" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst.join(&name));
        } else {
            std::fs::copy(e.path(), dst.join(&name)).unwrap();
        }
    }
}

/// The Branin function (the objectives' Python programs compute the same).
pub fn branin(x: f64, y: f64) -> f64 {
    use std::f64::consts::PI;
    let (a, b, c, r, s, t) = (
        1.0,
        5.1 / (4.0 * PI * PI),
        5.0 / PI,
        6.0,
        10.0,
        1.0 / (8.0 * PI),
    );
    a * (y - b * x * x + c * x - r).powi(2) + s * (1.0 - t) * x.cos() + s
}
