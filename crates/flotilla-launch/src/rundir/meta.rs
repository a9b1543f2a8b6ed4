//! `meta.json`: what made a job directory — command line, time, user, host, the git commit (and
//! whether the working tree had uncommitted changes), and the flotilla and libtorch versions.

use serde::{Deserialize, Serialize};
use std::path::Path;
use std::process::{Command, Stdio};

/// The content of a job's `meta.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The command line that prepared the job (`flotilla run ...`).
    pub argv: Vec<String>,
    /// The working directory the command ran in.
    pub cwd: String,
    /// When the job directory was prepared (RFC 3339, local time with offset).
    pub time: String,
    pub user: String,
    pub host: String,
    /// `git rev-parse HEAD` of the working directory's repository; `null` outside a repository
    /// or without git.
    pub git_commit: Option<String>,
    /// Whether tracked files had uncommitted changes (`git status --porcelain
    /// --untracked-files=no` printed anything); `null` when `git_commit` is.
    pub git_dirty: Option<bool>,
    pub flotilla_version: String,
    pub libtorch_version: String,
    /// The job's number (0 for a single run).
    pub job_num: usize,
    /// `local` or `slurm`.
    pub launcher: String,
    /// The job's task overrides.
    pub overrides: Vec<String>,
    /// The config directory the job was composed from (absolute); `null` in run directories
    /// of older versions.
    #[serde(default)]
    pub config_dir: Option<String>,
    /// The primary config's name (`--config-name`).
    #[serde(default)]
    pub config_name: Option<String>,
    /// The copy of the config directory kept with the run, relative to the job directory
    /// (`.flotilla/conf`, or `../.flotilla/conf` in a sweep); `null` when none was kept.
    #[serde(default)]
    pub conf_snapshot: Option<String>,
    /// Whether the known sections were validated (`--no-validate` turns it off).
    #[serde(default = "validated_by_default")]
    pub validate: bool,
    /// The overrides of the runtime node (`flotilla.…`/`hydra.…`) other than the run and sweep
    /// directories, which `flotilla run --from` applies again (e.g. a `flotilla.task` set on
    /// the command line).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtime_overrides: Vec<String>,
    /// The job directory this job was composed again from (`flotilla run --from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<String>,
}

fn validated_by_default() -> bool {
    true
}

/// How the jobs of one command were composed: recorded in every job's `meta.json`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ComposeSource {
    pub config_dir: Option<String>,
    pub config_name: Option<String>,
    pub validate: bool,
    pub rerun_of: Option<String>,
}

/// The facts shared by every job of one command: collected once.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    pub argv: Vec<String>,
    pub cwd: String,
    pub time: String,
    pub user: String,
    pub host: String,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
    pub source: ComposeSource,
}

impl Provenance {
    /// Collects the facts for `argv` in the current directory.
    pub fn collect(argv: Vec<String>) -> Provenance {
        let cwd = std::env::current_dir().unwrap_or_default();
        let (git_commit, git_dirty) = match git_state(&cwd) {
            Some((c, d)) => (Some(c), Some(d)),
            None => (None, None),
        };
        Provenance {
            argv,
            cwd: cwd.display().to_string(),
            time: super::now_rfc3339(),
            user: user_name(),
            host: host_name(),
            git_commit,
            git_dirty,
            source: ComposeSource::default(),
        }
    }

    /// The `meta.json` of one job.
    pub fn meta(
        &self,
        job_num: usize,
        launcher: &str,
        overrides: &[String],
        runtime_overrides: &[String],
        conf_snapshot: Option<String>,
    ) -> Meta {
        Meta {
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            time: self.time.clone(),
            user: self.user.clone(),
            host: self.host.clone(),
            git_commit: self.git_commit.clone(),
            git_dirty: self.git_dirty,
            flotilla_version: env!("CARGO_PKG_VERSION").to_string(),
            libtorch_version: flotilla_contract::LIBTORCH_VERSION.to_string(),
            job_num,
            launcher: launcher.to_string(),
            overrides: overrides.to_vec(),
            config_dir: self.source.config_dir.clone(),
            config_name: self.source.config_name.clone(),
            conf_snapshot,
            validate: self.source.validate,
            runtime_overrides: runtime_overrides.to_vec(),
            rerun_of: self.source.rerun_of.clone(),
        }
    }
}

/// The commit and dirty flag of the repository holding `dir`, or `None` (no repository, no
/// git, or git failing).
pub fn git_state(dir: &Path) -> Option<(String, bool)> {
    let run = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let commit = run(&["rev-parse", "--verify", "HEAD"])?.trim().to_string();
    if commit.is_empty() {
        return None;
    }
    let dirty = !run(&["status", "--porcelain", "--untracked-files=no"])?
        .trim()
        .is_empty();
    Some((commit, dirty))
}

/// `$USER`, `$LOGNAME`, the password database's name for the uid, or `uid <n>`.
pub fn user_name() -> String {
    for var in ["USER", "LOGNAME"] {
        if let Ok(v) = std::env::var(var) {
            if !v.trim().is_empty() {
                return v;
            }
        }
    }
    // SAFETY: getuid cannot fail; getpwuid_r writes into the buffers passed to it.
    unsafe {
        let uid = libc::getuid();
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 4096];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc == 0 && !result.is_null() && !pwd.pw_name.is_null() {
            return std::ffi::CStr::from_ptr(pwd.pw_name)
                .to_string_lossy()
                .into_owned();
        }
        format!("uid {uid}")
    }
}

pub use flotilla_contract::host_name;
