//! Helpers shared by the integration tests of every crate, needing only `std`, `serde`,
//! `serde_json` and `flotilla_contract`: the repository's root and config tree, overrides, the
//! environment a task wrote, a free port, the Python oracles and [`skip_or_fail`] for a
//! missing one, the `flotilla` and `flotilla-train` binaries of this build, running a command
//! that must succeed, copying a project tree, the README's chat example, and the Branin
//! function the adaptive-sweep objectives compute.
//!
//! The root tests include it with `mod common;`, a crate's tests with
//! `#[path = "../../../tests/common/mod.rs"] mod common;`. Helpers with heavier dependencies
//! live beside it, each included the same way by the tests that can compile it:
//! `compose.rs` (flotilla_config: the composer, tiny model and trainer configs), `launch.rs`
//! (flotilla_launch: preparing runs), `world.rs` (the multi-process harness) and
//! `chromium.rs` (headless Chromium, the HTML report's oracle).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

#[path = "python.rs"]
mod python;
pub use python::{python, Python};

/// The environment variable that turns every skip for a missing oracle into a failure.
pub const REQUIRE_ORACLES: &str = "FLOTILLA_REQUIRE_ORACLES";

/// The repository's root (the directory holding `conf/` and `tests/oracle/`), whichever
/// crate's tests ask.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| d.join("conf/config.yaml").is_file() && d.join("tests/oracle").is_dir())
        .unwrap_or_else(|| {
            panic!(
                "no repository root (with conf/config.yaml and tests/oracle/) above {}",
                manifest.display()
            )
        })
        .to_path_buf()
}

/// The repository's config tree.
pub fn conf_dir() -> PathBuf {
    repo_root().join("conf")
}

/// A file of tests/oracle/.
pub fn oracle_file(name: &str) -> PathBuf {
    repo_root().join("tests/oracle").join(name)
}

/// `name`, a fixed directory under this build's `target/tmp`, empty: for fixtures a test binary
/// makes once and keeps in a static, which is never dropped (a `TempDir` there would never be
/// removed); the next run of the binary empties it.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
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

/// Whether a missing oracle fails the test: `FLOTILLA_REQUIRE_ORACLES` set, non-empty and
/// not `0`.
pub fn oracles_required() -> bool {
    std::env::var_os(REQUIRE_ORACLES).is_some_and(|v| !v.is_empty() && v != "0")
}

/// What a test does when an oracle or a tool it compares against is missing: with
/// `FLOTILLA_REQUIRE_ORACLES` set it panics with `reason` (which says what is missing and how
/// to provide it); otherwise it prints `SKIPPED: reason`, and the caller returns.
pub fn skip_or_fail(reason: &str) {
    if oracles_required() {
        panic!(
            "{reason}\n({REQUIRE_ORACLES} is set, so a missing oracle fails the test instead of \
             skipping it: provide it as said above, or unset {REQUIRE_ORACLES})"
        );
    }
    eprintln!("SKIPPED: {reason}");
}

/// Runs a Python oracle on a warm interpreter (transformers quiet and offline), asserts that it
/// succeeded, and parses the JSON of its last line of output.
pub fn run_oracle<T: serde::de::DeserializeOwned>(call: Python) -> T {
    let stdout = call.run();
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{call:?}: last line {last:?}: {e}"))
}

/// The project venv's python (`FLOTILLA_VENV`, else the repository's `.venv`).
pub fn venv_python() -> PathBuf {
    let venv = std::env::var_os("FLOTILLA_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv"));
    venv.join("bin").join("python")
}

/// Whether the venv python can run `import <modules>` (asked once per process and list).
pub fn venv_imports(modules: &str) -> bool {
    static ASKED: Mutex<BTreeMap<String, bool>> = Mutex::new(BTreeMap::new());
    if let Some(&known) = ASKED.lock().unwrap().get(modules) {
        return known;
    }
    let imports = venv_python().is_file()
        && Python::default()
            .args(["-c", &format!("import {modules}")])
            .output()
            .status
            .success();
    ASKED.lock().unwrap().insert(modules.to_string(), imports);
    imports
}

/// The venv python, if transformers and safetensors import there.
pub fn oracle_python() -> Option<PathBuf> {
    venv_imports("transformers, safetensors").then(venv_python)
}

/// The README's chat example in `dir`, made by `examples/chat/make_example.py` (a tiny random
/// Llama in `base/` with a ChatML tokenizer, 2000 conversations in `chats.jsonl`), with its
/// first 40 conversations also in `eval.jsonl` as held-out data.
pub fn make_chat_example(dir: &Path) {
    python(repo_root().join("examples/chat/make_example.py"))
        .arg(dir)
        .run();
    let chats = std::fs::read_to_string(dir.join("chats.jsonl")).unwrap();
    let held_out: String = chats.lines().take(40).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("eval.jsonl"), held_out).unwrap();
}

/// The directory of this build's binaries (`target/<profile>`): the test executable runs from
/// its `deps/`.
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the test executable's directory");
    deps.parent().unwrap_or(deps).to_path_buf()
}

/// The `flotilla` CLI of this build: Cargo's own path in the root package's tests, else
/// `target/<profile>/flotilla` (panicking, with the command that builds it, when absent).
pub fn flotilla_bin() -> PathBuf {
    if let Some(exe) = option_env!("CARGO_BIN_EXE_flotilla") {
        return PathBuf::from(exe);
    }
    let exe = target_profile_dir().join("flotilla");
    assert!(
        exe.is_file(),
        "this test runs the `flotilla` CLI, which is not built at {}: build it with \
         `cargo build -p flotilla` (with the same profile), or run the whole workspace's tests",
        exe.display()
    );
    exe
}

/// The `flotilla-train` beside [`flotilla_bin`], which `flotilla run` and `flotilla train`
/// start (a test that needs it fails, naming the command that builds it, when it is absent,
/// rather than finding another one on `PATH`). Cargo's own path in the train crate's tests.
pub fn train_binary() -> PathBuf {
    if let Some(exe) = option_env!("CARGO_BIN_EXE_flotilla-train") {
        return PathBuf::from(exe);
    }
    let exe = flotilla_bin().with_file_name("flotilla-train");
    assert!(
        exe.is_file(),
        "this test trains through `flotilla`, which starts the `flotilla-train` beside it, but \
         {} is not built: build it with `cargo build -p flotilla-train` (with the same \
         profile), or run the whole workspace's tests",
        exe.display()
    );
    exe
}

/// Runs the `flotilla` binary with `args` in `cwd` (its log filter left at the default).
pub fn flotilla_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(flotilla_bin())
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
