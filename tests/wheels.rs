//! The wheels, installed as a user installs them: `scripts/build-wheels.sh` (from this build's
//! profile), then fresh virtual environments outside the repository: one with only
//! `torch==2.11.0` from PyPI and both wheels (`flotilla init`, `compose`, `plan -m`, `run
//! --dry-run`, a short real `flotilla run` of the default job, `python -m flotilla`, and the
//! libtorch the training binary loads, and `run compute=slurm` on the real test cluster of
//! `scripts/slurm-cluster-start.sh`), and one without torch (the CLI works; a missing
//! `flotilla-train`, a missing torch and a wrong torch version are errors naming the fix). Every
//! command runs from a temporary directory with `LD_LIBRARY_PATH` unset and `PATH` holding only
//! the environment's `bin/` and the system's directories.

mod common;
#[path = "common/slurm_cluster.rs"]
mod slurm_cluster;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{ok, repo_root, skip_or_fail, target_profile_dir};
use slurm_cluster::Cluster;

/// The torch release the training binary is linked against.
const TORCH_VERSION: &str = "2.11.0";

/// The built wheels: (`flotilla`, `flotilla-train`).
struct Wheels {
    cli: PathBuf,
    train: PathBuf,
}

/// Builds the wheels once per test binary, with the profile this test was built with (so the
/// dev build `cargo test` made is reused), into `wheels/` of the build's scratch directory
/// (replaced on each run, so nothing is left in the system's temporary directory).
fn wheels() -> &'static Wheels {
    static WHEELS: OnceLock<Wheels> = OnceLock::new();
    WHEELS.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wheels");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        let profile = match target_profile_dir().file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => "dev",
        }
        .to_string();
        let out = Command::new(repo_root().join("scripts/build-wheels.sh"))
            .args(["--profile", &profile, "--out"])
            .arg(&dir)
            .current_dir(repo_root())
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .expect("scripts/build-wheels.sh starts");
        assert!(
            out.status.success(),
            "scripts/build-wheels.sh --profile {profile} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let find = |prefix: &str| {
            std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".whl"))
                })
                .unwrap_or_else(|| panic!("no {prefix}*.whl in {}", dir.display()))
        };
        let cli = find("flotilla-0.1.0-py3-none-");
        let train = find("flotilla_train-0.1.0-py3-none-");
        Wheels { cli, train }
    })
}

/// A fresh virtual environment in a temporary directory (outside the repository).
struct Env {
    root: tempfile::TempDir,
}

impl Env {
    fn new(name: &str) -> Env {
        let root = tempfile::Builder::new()
            .prefix(&format!("flotilla-{name}-"))
            .tempdir()
            .unwrap();
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        ok(Command::new(&python)
            .args(["-m", "venv"])
            .arg(root.path().join("venv"))
            .output()
            .unwrap_or_else(|e| panic!("cannot start {python}: {e}")));
        std::fs::create_dir(root.path().join("work")).unwrap();
        Env { root }
    }

    fn bin(&self) -> PathBuf {
        self.root.path().join("venv/bin")
    }

    /// The working directory the commands run in.
    fn work(&self) -> PathBuf {
        self.root.path().join("work")
    }

    /// `program` of this environment (or of the system) with a clean environment: no
    /// `LD_LIBRARY_PATH`, no flotilla or cargo variable, `PATH` = this environment's `bin/` and
    /// the system's directories, settings only from here.
    fn command(&self, program: &str) -> Command {
        let candidate = self.bin().join(program);
        let mut cmd = Command::new(if candidate.exists() {
            candidate
        } else {
            PathBuf::from(program)
        });
        cmd.env_clear()
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", self.bin().display()),
            )
            .env("HOME", self.root.path())
            .env("XDG_CONFIG_HOME", self.root.path().join("config"))
            .env(
                "FLOTILLA_SITE_SETTINGS",
                self.root.path().join("no-site.yaml"),
            )
            .env("VIRTUAL_ENV", self.root.path().join("venv"))
            .env("LANG", "C.UTF-8")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
            .current_dir(self.work());
        for var in [
            "PIP_CERT",
            "SSL_CERT_FILE",
            "PIP_INDEX_URL",
            "PIP_DEFAULT_TIMEOUT",
        ] {
            if let Some(value) = std::env::var_os(var) {
                cmd.env(var, value);
            }
        }
        cmd
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
    }

    /// Installs `torch==TORCH_VERSION` from PyPI. With the uv that `scripts/setup.sh` puts in
    /// the repository's `.venv`, and that uv's cache, the environment's 4.5 GB of torch and CUDA
    /// libraries are hardlinks to the copy the cache already holds for `.venv`, not a second copy
    /// (pip would download the wheels again and unpack them beside them); without it, pip.
    fn install_torch(&self) -> Output {
        let requirement = format!("torch=={TORCH_VERSION}");
        let uv = repo_root().join(".venv/bin/uv");
        if !uv.is_file() {
            return self.pip_install(&[requirement.as_ref()]);
        }
        let cache = ok(Command::new(&uv)
            .args(["cache", "dir"])
            .output()
            .expect("uv starts"));
        let mut cmd = self.command(uv.to_str().unwrap());
        cmd.args(["pip", "install", "--quiet", "--python"])
            .arg(self.bin().join("python"))
            .arg(&requirement)
            .env("UV_CACHE_DIR", cache.trim())
            .env("UV_LINK_MODE", "hardlink");
        for var in ["UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_NATIVE_TLS"] {
            if let Some(value) = std::env::var_os(var) {
                cmd.env(var, value);
            }
        }
        cmd.output().unwrap()
    }

    fn pip_install(&self, args: &[&std::ffi::OsStr]) -> Output {
        self.command("python")
            .args(["-m", "pip", "install", "--quiet"])
            .args(args)
            .output()
            .unwrap()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts that a command failed and returns its stderr.
fn failed(o: Output, what: &str) -> String {
    assert!(
        !o.status.success(),
        "{what} should have failed:\n{}{}",
        stdout(&o),
        stderr(&o)
    );
    stderr(&o)
}

#[test]
fn both_wheels_in_a_torch_environment_run_the_default_job_without_the_build_tree() {
    let wheels = wheels();
    let env = Env::new("torch-env");
    let torch = env.install_torch();
    if !torch.status.success() {
        skip_or_fail(&format!(
            "cannot install torch=={TORCH_VERSION} from PyPI into a fresh environment (the \
             wheels' test needs the network to PyPI):\n{}",
            stderr(&torch)
        ));
        return;
    }
    // Both wheels from their directory alone: flotilla-train's dependency on flotilla is
    // resolved there, torch is already satisfied.
    let wheel_dir = wheels.cli.parent().unwrap();
    let o = env.pip_install(&[
        "--no-index".as_ref(),
        "--find-links".as_ref(),
        wheel_dir.as_os_str(),
        "flotilla-train".as_ref(),
    ]);
    assert!(
        o.status.success(),
        "pip install flotilla-train:\n{}",
        stderr(&o)
    );
    let prefix = env.root.path().join("venv");
    let training_binary = prefix.join("libexec/flotilla/flotilla-train");
    for file in [
        env.bin().join("flotilla"),
        env.bin().join("flotilla-train"),
        training_binary.clone(),
    ] {
        assert!(file.is_file(), "{} not installed", file.display());
    }

    // Neither binary names a directory of this machine to load libraries from.
    for file in [env.bin().join("flotilla"), training_binary.clone()] {
        let dynamic = ok(env.run("readelf", &["-d", file.to_str().unwrap()]));
        assert!(
            !dynamic.contains("RPATH") && !dynamic.contains("RUNPATH"),
            "{}: {dynamic}",
            file.display()
        );
        assert!(
            !dynamic.contains("libtorch") || file == training_binary,
            "the CLI links libtorch: {dynamic}"
        );
    }

    // The launcher runs the training binary with this environment's libtorch.
    let o = env
        .command("flotilla-train")
        .arg("--version")
        .env("LD_DEBUG", "libs")
        .output()
        .unwrap();
    let loader = stderr(&o);
    assert!(o.status.success(), "flotilla-train --version:\n{loader}");
    let torch_lib = prefix.join(format!(
        "lib/python3.{}/site-packages/torch/lib/libtorch_cpu.so",
        python_minor(&env)
    ));
    assert!(
        loader.contains(&format!("calling init: {}", torch_lib.display())),
        "libtorch_cpu.so not loaded from {}:\n{}",
        torch_lib.display(),
        loader
            .lines()
            .filter(|l| l.contains("libtorch"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !loader.contains(repo_root().to_str().unwrap()),
        "a library of the build tree was loaded"
    );

    // `python -m flotilla` is the installed binary.
    let version = ok(env.run("flotilla", &["--version"]));
    assert_eq!(
        ok(env.run("python", &["-m", "flotilla", "--version"])),
        version
    );
    assert!(version.starts_with("flotilla 0.1.0"), "{version}");

    // Starting without the repository.
    let init = ok(env.run("flotilla", &["init"]));
    assert!(init.contains("wrote conf/config.yaml"), "{init}");
    assert!(
        env.work().join("launchers/slurm.sbatch.j2").is_file()
            && env.work().join("sweeps/lr.yaml").is_file()
    );
    let again = failed(env.run("flotilla", &["init"]), "a second flotilla init");
    assert!(
        again.contains("conf/config.yaml") && again.contains("launchers/slurm.sbatch.j2"),
        "{again}"
    );

    let composed = ok(env.run("flotilla", &["compose", "trainer.max_steps=7"]));
    assert!(composed.contains("max_steps: 7"), "{composed}");
    let plan = ok(env.run(
        "flotilla",
        &[
            "plan",
            "-m",
            "--format",
            "json",
            "trainer.lr=1e-3,3e-3",
            "seed=1,2",
        ],
    ));
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    let overrides: Vec<String> = plan["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["overrides"].as_array().unwrap().len().to_string())
        .collect();
    assert_eq!(overrides, ["2", "2", "2", "2"]);
    assert_eq!(
        plan["jobs"][1]["overrides"],
        serde_json::json!(["trainer.lr=0.001", "seed=2"])
    );

    let dry = ok(env.run("flotilla", &["run", "--dry-run", "--format", "json"]));
    let dry: serde_json::Value = serde_json::from_str(&dry).unwrap();
    let dry_dir = PathBuf::from(dry["jobs"][0]["dir"].as_str().unwrap());
    let dry_dir = env.work().join(dry_dir);
    assert!(dry_dir.join("config.yaml").is_file(), "{dry}");
    assert!(!dry_dir.join("metrics.csv").exists());

    // The default job (2 local ranks under DDP), a few steps.
    let steps = 6;
    let o = env.run(
        "flotilla",
        &[
            "run",
            "--format",
            "json",
            &format!("trainer.max_steps={steps}"),
            "trainer.eval_every=3",
            "trainer.log_every=1",
        ],
    );
    assert!(o.status.success(), "flotilla run:\n{}", stderr(&o));
    let run: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(run["jobs"][0]["state"], "COMPLETED", "{run}");
    let job = env.work().join(run["jobs"][0]["dir"].as_str().unwrap());
    let metrics = std::fs::read_to_string(job.join("metrics.csv")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), steps, "{metrics}");
    assert!(
        losses.iter().all(|l| l.is_finite()) && losses[steps - 1] < losses[0],
        "{metrics}"
    );
    assert!(job.join("final/model.safetensors").is_file());
    assert!(job.join("logs/rank_1.log").is_file());

    // The same environment submitting to the real test cluster: the sbatch script runs the
    // installed launcher, which finds torch on the compute node as it did here.
    let Some(_cluster) = Cluster::start(1, &[]) else {
        return;
    };
    let o = env.run(
        "flotilla",
        &[
            "run",
            "--format",
            "json",
            "compute=slurm",
            "compute.tasks_per_node=2",
            "compute.gpus_per_node=0",
            "compute.cpus_per_task=1",
            "compute.mem_gb=null",
            "compute.timeout_min=5",
            "trainer.max_steps=4",
            "trainer.eval_every=2",
        ],
    );
    assert!(
        o.status.success(),
        "flotilla run compute=slurm:\n{}",
        stderr(&o)
    );
    let run: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let job = env.work().join(run["jobs"][0]["dir"].as_str().unwrap());
    assert!(run["jobs"][0]["job_id"].is_string(), "{run}");
    let started = Instant::now();
    let state = loop {
        let shown = ok(env.run(
            "flotilla",
            &["status", "--format", "json", job.to_str().unwrap()],
        ));
        let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
        let jobs = shown
            .get("jobs")
            .or_else(|| shown.get("status").and_then(|s| s.get("jobs")))
            .unwrap_or_else(|| panic!("no jobs in {shown}"));
        let state = jobs[0]["state"].as_str().unwrap().to_string();
        if !["PENDING", "RUNNING", "REQUEUED", "UNKNOWN"].contains(&state.as_str()) {
            break state;
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "the Slurm job is still {state} after 240 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let rank0 = std::fs::read_to_string(job.join("logs/rank_0.log")).unwrap_or_default();
    let logs: String = std::fs::read_dir(job.join("logs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            format!("--- {}:\n{text}\n", e.path().display())
        })
        .collect();
    assert_eq!(state, "COMPLETED", "{logs}");
    assert!(rank0.contains("done: 4 steps"), "{rank0}");
    assert!(job.join("final/model.safetensors").is_file());
}

/// The minor version of the environment's Python.
fn python_minor(env: &Env) -> String {
    ok(env.run("python", &["-c", "import sys; print(sys.version_info[1])"]))
        .trim()
        .to_string()
}

#[test]
fn without_torch_the_cli_works_and_the_training_task_names_what_to_install() {
    let wheels = wheels();
    let env = Env::new("no-torch-env");
    let o = env.pip_install(&["--no-index".as_ref(), wheels.cli.as_os_str()]);
    assert!(o.status.success(), "pip install flotilla:\n{}", stderr(&o));
    ok(env.run("flotilla", &["init"]));
    let composed = ok(env.run("flotilla", &["compose", "model=small"]));
    assert!(composed.contains("name: small"), "{composed}");
    let plan = ok(env.run("flotilla", &["plan", "-m", "trainer.lr=1e-3,3e-3"]));
    assert!(
        plan.contains("trainer.lr=0.003") && plan.contains("2 jobs"),
        "{plan}"
    );

    // No flotilla-train: `run` says where it looked and how to install it, and creates nothing.
    let error = failed(
        env.run("flotilla", &["run"]),
        "flotilla run without flotilla-train",
    );
    assert!(
        error.contains("`flotilla-train` was not found")
            && error.contains("pip install flotilla-train"),
        "{error}"
    );
    assert!(!env.work().join("outputs").exists());

    // flotilla-train forced in without its torch: the launcher names the version and the pip
    // command, before the dynamic loader could fail.
    let o = env.pip_install(&[
        "--no-index".as_ref(),
        "--no-deps".as_ref(),
        wheels.train.as_os_str(),
    ]);
    assert!(
        o.status.success(),
        "pip install --no-deps flotilla-train:\n{}",
        stderr(&o)
    );
    let pip = env.bin().join("pip");
    let o = env.run("flotilla-train", &["--version"]);
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    let error = stderr(&o);
    assert!(
        error.contains("torch is not installed in this Python environment")
            && error.contains(&format!("{} install torch=={TORCH_VERSION}", pip.display()))
            && !error.contains("error while loading shared libraries"),
        "{error}"
    );
    // ... and `flotilla run` fails with that message in the rank's output.
    let o = env.run("flotilla", &["run", "trainer.max_steps=2"]);
    let error = failed(o, "flotilla run without torch");
    assert!(error.contains("torch is not installed"), "{error}");

    // A torch of another version (its version.py, as a wheel installs it).
    let site = env.root.path().join(format!(
        "venv/lib/python3.{}/site-packages/torch",
        python_minor(&env)
    ));
    std::fs::create_dir_all(site.join("lib")).unwrap();
    std::fs::write(
        site.join("version.py"),
        "from typing import Optional\n\n__version__ = '2.10.0+cpu'\ndebug = False\n",
    )
    .unwrap();
    let o = env.run("flotilla-train", &["--version"]);
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    let error = stderr(&o);
    assert!(
        error.contains(&format!("linked against libtorch {TORCH_VERSION}"))
            && error.contains("torch 2.10.0+cpu at")
            && error.contains(&format!("install torch=={TORCH_VERSION}")),
        "{error}"
    );
}

#[test]
fn the_wheels_carry_no_libtorch_and_state_their_platform() {
    let wheels = wheels();
    let auditwheel = repo_root().join("target/wheel-tools/bin/auditwheel");
    for wheel in [&wheels.cli, &wheels.train] {
        let listing = zip_listing(wheel);
        assert!(
            !listing
                .iter()
                .any(|n| n.contains("libtorch") || n.contains("libc10")),
            "{} vendors libtorch: {listing:?}",
            wheel.display()
        );
        let name = wheel.file_name().unwrap().to_str().unwrap();
        assert!(name.contains("manylinux"), "{name}");
        let shown = Command::new(&auditwheel)
            .arg("show")
            .arg(wheel)
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .unwrap();
        let shown = stdout(&shown);
        eprintln!("auditwheel show {name}:\n{shown}");
        let said = shown.split_whitespace().collect::<Vec<_>>().join(" ");
        if wheel == &wheels.cli {
            assert!(
                said.contains("is consistent with the following platform tag: \"manylinux_"),
                "{said}"
            );
        } else {
            // The training binary needs libtorch_cpu and libc10 from the torch wheel, which
            // `auditwheel show` counts as outside the policy; build-wheels.sh's `auditwheel
            // repair --exclude` checked everything else.
            assert!(said.contains("libstdc++.so.6"), "{said}");
        }
    }
    let listing = zip_listing(&wheels.train);
    assert!(
        listing
            .iter()
            .any(|n| n.ends_with(".data/data/libexec/flotilla/flotilla-train")),
        "{listing:?}"
    );
    let metadata = zip_file(&wheels.train, "flotilla_train-0.1.0.dist-info/METADATA");
    assert!(
        metadata.contains(&format!("Requires-Dist: torch=={TORCH_VERSION}"))
            && metadata.contains("Requires-Dist: flotilla==0.1.0"),
        "{metadata}"
    );
    let metadata = zip_file(&wheels.cli, "flotilla-0.1.0.dist-info/METADATA");
    assert!(!metadata.contains("Requires-Dist"), "{metadata}");
    // The torch version is pinned alike wherever it is named.
    let setup = std::fs::read_to_string(repo_root().join("scripts/setup.sh")).unwrap();
    assert!(setup.contains(&format!("TORCH_VERSION={TORCH_VERSION}")));
    let launcher =
        std::fs::read_to_string(repo_root().join("packaging/flotilla-train/src/main.rs")).unwrap();
    assert!(launcher.contains(&format!("const TORCH_VERSION: &str = \"{TORCH_VERSION}\";")));
}

/// The names of a wheel's files.
fn zip_listing(wheel: &Path) -> Vec<String> {
    let script = "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))";
    let out = ok(Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .output()
        .unwrap());
    out.lines().map(str::to_string).collect()
}

/// One file of a wheel, as text.
fn zip_file(wheel: &Path, name: &str) -> String {
    let script = "import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]).decode())";
    ok(Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .arg(name)
        .output()
        .unwrap())
}
