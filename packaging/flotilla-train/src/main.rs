//! `flotilla-train` as the `flotilla-train` wheel installs it: finds the torch installed in the
//! same Python environment, checks that it is the version the training binary was linked
//! against, and runs the training binary with torch's `lib` directory first on
//! `LD_LIBRARY_PATH`.
//!
//! The wheel puts this launcher in the environment's scripts directory (`<prefix>/bin`) and the
//! training binary in `<prefix>/libexec/flotilla/flotilla-train`; a virtual environment, a
//! conda environment and `pip install --user` (`~/.local`) all keep that relation. The training
//! binary carries no run path: libtorch (`libtorch_cpu`, `libc10`, and on a GPU node
//! `libtorch_cuda`, whose own run path finds the CUDA libraries and NCCL of the `nvidia-*`
//! wheels) comes from the directory found here, never from the machine that built the wheel.
//!
//! torch is looked for where the environment's Python would import it from:
//! `<prefix>/lib*/python3.*/site-packages/torch` (a venv, conda, `--user`), else by asking the
//! Python interpreter beside this launcher (a venv that sees the system's site-packages, a
//! distribution's `dist-packages`), or, when `bin/` holds none (`pip install --user`), the
//! `python3` on `PATH`. torch is never imported: its `version.py` gives the version.
//! A missing, unreadable or wrong torch is an error naming the version needed and the pip
//! command, with exit status 127, before the dynamic loader could fail.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The torch release whose libtorch the training binary is linked against.
const TORCH_VERSION: &str = "2.11.0";
/// The training binary, relative to the environment's prefix.
const TRAINING_BINARY: &str = "libexec/flotilla/flotilla-train";
/// The exit status when the training binary cannot be started (as a shell's "command not
/// found").
const CANNOT_START: u8 = 127;

/// A torch installation: its package directory and the version its `version.py` states.
#[derive(Debug)]
struct Torch {
    dir: PathBuf,
    version: String,
}

impl Torch {
    /// The release part of the version (`2.11.0` of `2.11.0+cu130`).
    fn release(&self) -> &str {
        self.version.split('+').next().unwrap_or(&self.version)
    }

    fn lib_dir(&self) -> PathBuf {
        self.dir.join("lib")
    }
}

fn main() -> ExitCode {
    match prepare() {
        Ok((binary, library_path)) => {
            let mut args = std::env::args_os();
            let arg0 = args
                .next()
                .unwrap_or_else(|| OsString::from("flotilla-train"));
            let error = Command::new(&binary)
                .arg0(arg0)
                .args(args)
                .env("LD_LIBRARY_PATH", library_path)
                .exec();
            eprintln!(
                "flotilla-train: cannot run the training binary {}: {error}",
                binary.display()
            );
            ExitCode::from(CANNOT_START)
        }
        Err(message) => {
            eprintln!("flotilla-train: {message}");
            ExitCode::from(CANNOT_START)
        }
    }
}

/// The training binary to run and the `LD_LIBRARY_PATH` to run it with.
fn prepare() -> Result<(PathBuf, OsString), String> {
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| format!("cannot tell where this launcher is installed: {e}"))?;
    let bin_dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    let prefix = bin_dir.parent().unwrap_or(bin_dir);
    let binary = prefix.join(TRAINING_BINARY);
    if !binary.is_file() {
        return Err(format!(
            "the training binary is missing at {}; reinstall the package: pip install \
             --force-reinstall flotilla-train",
            binary.display()
        ));
    }
    let torch = find_torch(prefix, bin_dir)?;
    let lib_dir = torch.lib_dir();
    if !lib_dir.join("libtorch_cpu.so").is_file() {
        return Err(format!(
            "torch {} at {} has no lib/libtorch_cpu.so (a torch without its C++ libraries); \
             reinstall it: {}",
            torch.version,
            torch.dir.display(),
            pip_command(bin_dir)
        ));
    }
    let mut dirs = vec![lib_dir];
    if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&existing).filter(|p| !p.as_os_str().is_empty()));
    }
    let library_path = std::env::join_paths(dirs)
        .map_err(|e| format!("torch's lib directory cannot go on LD_LIBRARY_PATH: {e}"))?;
    Ok((binary, library_path))
}

/// The torch of this environment at the needed version, or an error saying what was found and
/// how to install the right one.
fn find_torch(prefix: &Path, bin_dir: &Path) -> Result<Torch, String> {
    let mut found = torch_in_prefix(prefix);
    if !found.iter().any(|t| t.release() == TORCH_VERSION) {
        if let Some(torch) = torch_from_python(bin_dir) {
            if !found.iter().any(|t| t.dir == torch.dir) {
                found.push(torch);
            }
        }
    }
    if let Some(index) = found.iter().position(|t| t.release() == TORCH_VERSION) {
        return Ok(found.swap_remove(index));
    }
    let install = pip_command(bin_dir);
    if found.is_empty() {
        return Err(format!(
            "torch is not installed in this Python environment ({}), and the training binary \
             needs its libtorch: install torch {TORCH_VERSION} there: {install}",
            prefix.display()
        ));
    }
    let seen: Vec<String> = found
        .iter()
        .map(|t| format!("torch {} at {}", t.version, t.dir.display()))
        .collect();
    Err(format!(
        "the training binary is linked against libtorch {TORCH_VERSION}, but this Python \
         environment ({}) has {}; install torch {TORCH_VERSION}: {install}",
        prefix.display(),
        seen.join(" and ")
    ))
}

/// The pip command that installs the needed torch into this environment.
fn pip_command(bin_dir: &Path) -> String {
    let pip = bin_dir.join("pip");
    let pip = if pip.is_file() {
        pip.display().to_string()
    } else {
        "pip".to_string()
    };
    format!("{pip} install torch=={TORCH_VERSION}")
}

/// torch under `<prefix>/lib*/python3.*/{site,dist}-packages/`, the layout of a virtual
/// environment, a conda environment and a `--user` install (newest Python first).
fn torch_in_prefix(prefix: &Path) -> Vec<Torch> {
    let mut found = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(OsStr::to_str)
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort_by_key(|p| std::cmp::Reverse(python_minor(p)));
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let dir = python.join(packages).join("torch");
                if let Some(torch) = read_torch(&dir) {
                    let canonical = torch.dir.canonicalize().unwrap_or(torch.dir.clone());
                    if !found
                        .iter()
                        .any(|t: &Torch| t.dir.canonicalize().ok().as_ref() == Some(&canonical))
                    {
                        found.push(torch);
                    }
                }
            }
        }
    }
    found
}

/// The minor version of a `python3.N` directory (0 when it has none).
fn python_minor(dir: &Path) -> u32 {
    dir.file_name()
        .and_then(OsStr::to_str)
        .and_then(|n| n.strip_prefix("python3."))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Where a Python interpreter would import torch from (without importing it): the one beside
/// this launcher (a venv or conda environment), else, for a `--user` install whose `bin/` holds
/// none, the `python3` on `PATH`.
fn torch_from_python(bin_dir: &Path) -> Option<Torch> {
    let beside = ["python3", "python"]
        .iter()
        .map(|n| bin_dir.join(n))
        .find(|p| p.is_file());
    let python = beside.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
    })?;
    let output = Command::new(python)
        .args([
            "-c",
            "import importlib.util as u; s = u.find_spec('torch'); \
             print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')",
        ])
        .env_remove("PYTHONSTARTUP")
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let dir = text.trim();
    (!dir.is_empty()).then(|| read_torch(Path::new(dir)))?
}

/// The torch package at `dir`, with the version its `version.py` states.
fn read_torch(dir: &Path) -> Option<Torch> {
    let text = std::fs::read_to_string(dir.join("version.py")).ok()?;
    let version = text.lines().find_map(|line| {
        let value = line.strip_prefix("__version__")?.trim_start();
        let value = value.strip_prefix('=')?.trim();
        let quote = value.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let value = value.strip_prefix(quote)?;
        Some(value[..value.find(quote)?].to_string())
    })?;
    Some(Torch {
        dir: dir.to_path_buf(),
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_torch(site: &Path, version_line: &str) -> PathBuf {
        let dir = site.join("torch");
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(
            dir.join("version.py"),
            format!("from typing import Optional\n\n{version_line}\ndebug = False\n"),
        )
        .unwrap();
        dir
    }

    #[test]
    fn reads_the_version_with_either_quote_and_a_local_label() {
        let root = std::env::temp_dir().join(format!("flotilla-launcher-{}", std::process::id()));
        let a = fake_torch(&root.join("a"), "__version__ = '2.11.0+cu130'");
        let b = fake_torch(&root.join("b"), "__version__ = \"2.10.1\"");
        let torch = read_torch(&a).unwrap();
        assert_eq!(
            (torch.version.as_str(), torch.release()),
            ("2.11.0+cu130", "2.11.0")
        );
        assert_eq!(read_torch(&b).unwrap().release(), "2.10.1");
        assert!(read_torch(&root.join("missing")).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn finds_the_needed_version_among_the_prefix_pythons() {
        let prefix = std::env::temp_dir().join(format!("flotilla-prefix-{}", std::process::id()));
        fake_torch(
            &prefix.join("lib/python3.9/site-packages"),
            "__version__ = '2.11.0+cpu'",
        );
        fake_torch(
            &prefix.join("lib/python3.12/site-packages"),
            "__version__ = '2.9.0'",
        );
        let bin = prefix.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let found = torch_in_prefix(&prefix);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].release(), "2.9.0", "newest Python first");
        let torch = find_torch(&prefix, &bin).unwrap();
        assert!(torch.dir.ends_with("python3.9/site-packages/torch"));
        std::fs::remove_dir_all(prefix.join("lib/python3.9")).unwrap();
        let error = find_torch(&prefix, &bin).unwrap_err();
        assert!(error.contains("torch 2.9.0 at"), "{error}");
        assert!(error.contains("pip install torch==2.11.0"), "{error}");
        std::fs::remove_dir_all(&prefix).unwrap();
    }
}
