//! The detached driver of a study whose trials are SLURM jobs: `flotilla run -m ... compute=slurm`
//! (and `--resume-sweep` of such a study) starts `flotilla study-drive SWEEP_DIR` in a new
//! session, its stdin closed and its output appended to `SWEEP_DIR/driver.log`, and returns.
//! The driver holds `SWEEP_DIR/driver.pid` (its pid) as a lock for as long as it runs: a second
//! driver of the same study refuses to start; the lock of a driver that died (a pid no longer
//! alive) is taken over.

use crate::LaunchError;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The driver's pid, and its lock.
pub const PID_FILE: &str = "driver.pid";
/// The driver's stdout and stderr.
pub const LOG_FILE: &str = "driver.log";
/// The hidden subcommand that drives a study.
pub const SUBCOMMAND: &str = "study-drive";

fn io(what: String, e: std::io::Error) -> LaunchError {
    LaunchError::io(what, e)
}

/// Whether process `pid` is alive (a zombie is not).
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let rc = unsafe { libc::kill(pid, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // A killed driver whose parent has not reaped it yet still answers signal 0.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// The pid recorded in a study's lock, if any.
pub fn read_pid(sweep_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(sweep_dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The pid of the study's driver when one is running.
pub fn live_driver(sweep_dir: &Path) -> Option<i32> {
    read_pid(sweep_dir).filter(|p| pid_alive(*p))
}

/// The study lock held by this process; released (the file removed, if still ours) on drop.
#[derive(Debug)]
pub struct DriverLock {
    path: PathBuf,
    pid: i32,
}

impl DriverLock {
    /// Takes the lock of the study in `sweep_dir` for process `pid` (normally this one). Fails
    /// when a live process holds it; a dead holder's lock is taken over.
    pub fn acquire(sweep_dir: &Path, pid: i32) -> Result<DriverLock, LaunchError> {
        let path = sweep_dir.join(PID_FILE);
        for _ in 0..20 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    f.write_all(format!("{pid}\n").as_bytes())
                        .and_then(|_| f.sync_all())
                        .map_err(|e| io(format!("writing {}", path.display()), e))?;
                    return Ok(DriverLock { path, pid });
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<i32>().ok());
                    match holder {
                        Some(h) if h == pid => return Ok(DriverLock { path, pid }),
                        Some(h) if pid_alive(h) => {
                            return Err(LaunchError::Unsupported(format!(
                                "the study {} is already driven by process {h} ({} holds its pid); \
                                 watch it with `flotilla status {} --watch`",
                                sweep_dir.display(),
                                path.display(),
                                sweep_dir.display()
                            )))
                        }
                        // A dead driver's lock: removed, unless another driver has just
                        // taken it over.
                        Some(h) => {
                            if read_pid(sweep_dir) == Some(h) {
                                let _ = std::fs::remove_file(&path);
                            }
                        }
                        // One being written: retry.
                        None => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
                Err(e) => return Err(io(format!("creating {}", path.display()), e)),
            }
        }
        Err(LaunchError::Unsupported(format!(
            "cannot take the study lock {}: it keeps changing",
            path.display()
        )))
    }
}

impl Drop for DriverLock {
    fn drop(&mut self) {
        if read_pid(self.path.parent().unwrap_or(Path::new("."))) == Some(self.pid) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A driver started by [`spawn_driver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spawned {
    pub pid: i32,
    pub log: PathBuf,
}

/// Starts `EXE study-drive SWEEP_DIR EXTRA...` detached: a new session, stdin from
/// `/dev/null`, stdout and stderr appended to `SWEEP_DIR/driver.log`, in the current directory.
/// Returns once the driver holds the study's lock (or fails with the log's tail when it exits
/// first).
pub fn spawn_driver(
    exe: &Path,
    sweep_dir: &Path,
    extra: &[String],
) -> Result<Spawned, LaunchError> {
    use std::os::unix::process::CommandExt;
    let log = sweep_dir.join(LOG_FILE);
    let open = || {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| io(format!("opening {}", log.display()), e))
    };
    let (out, err) = (open()?, open()?);
    let mut cmd = Command::new(exe);
    cmd.arg(SUBCOMMAND)
        .arg(sweep_dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: setsid is async-signal-safe; the child calls nothing else before exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child: Child = cmd
        .spawn()
        .map_err(|e| io(format!("starting {} {SUBCOMMAND}", exe.display()), e))?;
    let pid = child.id() as i32;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if read_pid(sweep_dir) == Some(pid) {
            return Ok(Spawned { pid, log });
        }
        if let Ok(Some(status)) = child.try_wait() {
            if status.success() {
                // Nothing left to do (a finished study): it has come and gone.
                return Ok(Spawned { pid, log });
            }
            let tail = crate::local::log_tail(&log, 10).join("\n  | ");
            return Err(LaunchError::Unsupported(format!(
                "the study driver exited at once ({status}); the last lines of {}:\n  | {tail}",
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Spawned { pid, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_driver_is_refused_and_a_dead_ones_lock_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let lock = DriverLock::acquire(dir.path(), me).unwrap();
        assert_eq!(read_pid(dir.path()), Some(me));
        assert_eq!(live_driver(dir.path()), Some(me));
        // Another process while this one lives: refused, naming the holder.
        let e = DriverLock::acquire(dir.path(), me + 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("process {me}")), "{e}");
        drop(lock);
        assert_eq!(read_pid(dir.path()), None, "released on drop");

        // A lock left by a process that has exited (and been reaped) is taken over.
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id() as i32;
        child.wait().unwrap();
        std::fs::write(dir.path().join(PID_FILE), format!("{dead}\n")).unwrap();
        assert_eq!(live_driver(dir.path()), None);
        let lock = DriverLock::acquire(dir.path(), me).unwrap();
        assert_eq!(read_pid(dir.path()), Some(me));
        drop(lock);
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let child = Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Not yet reaped: a zombie once it has exited.
        let t0 = Instant::now();
        while pid_alive(pid) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!pid_alive(pid));
        drop(child);
    }
}
