//! The detached driver of a study whose trials are SLURM jobs: `flotilla run -m ... compute=slurm`
//! (and `--resume-sweep` of such a study) starts `flotilla study-drive SWEEP_DIR` in a new
//! session, its stdin closed and its output appended to `SWEEP_DIR/driver.log`, and returns.
//! The driver holds an exclusive `flock` on `SWEEP_DIR/driver.lock` for as long as it runs, with
//! its pid in `SWEEP_DIR/driver.pid`: a second driver of the same study refuses to start, and
//! the lock of a driver that died is free again, so that of several drivers started at the same
//! instant exactly one proceeds.

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

/// The study lock held by this process: an exclusive `flock(2)` on `SWEEP_DIR/driver.lock`,
/// held for the driver's life (the kernel releases it when the process dies, however it dies),
/// and the holder's pid in `driver.pid` for people and for [`live_driver`]. On drop the pid
/// file is removed (if still ours) and the lock released.
#[derive(Debug)]
pub struct DriverLock {
    path: PathBuf,
    pid: i32,
    _file: std::fs::File,
}

/// The file whose `flock` is the study lock.
pub const LOCK_FILE: &str = "driver.lock";

impl DriverLock {
    /// Takes the lock of the study in `sweep_dir` for process `pid` (normally this one). Fails
    /// when another driver holds it; a dead driver's lock is free (its `flock` died with it), so
    /// of any number of drivers started at the same instant exactly one proceeds.
    pub fn acquire(sweep_dir: &Path, pid: i32) -> Result<DriverLock, LaunchError> {
        use std::os::fd::AsRawFd;
        let lock_path = sweep_dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io(format!("opening {}", lock_path.display()), e))?;
        let path = sweep_dir.join(PID_FILE);
        loop {
            // SAFETY: flock on a descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                ErrorKind::Interrupted => continue,
                ErrorKind::WouldBlock => {
                    let holder = read_pid(sweep_dir)
                        .map(|h| format!("process {h}"))
                        .unwrap_or_else(|| "another process".into());
                    return Err(LaunchError::Unsupported(format!(
                        "the study {} is already driven by {holder} (it holds {}); watch it \
                         with `flotilla status {} --watch`",
                        sweep_dir.display(),
                        lock_path.display(),
                        sweep_dir.display()
                    )));
                }
                _ => return Err(io(format!("locking {}", lock_path.display()), e)),
            }
        }
        // Ours now: record the pid (atomically, over a dead driver's).
        let tmp = sweep_dir.join(format!(".{PID_FILE}.{pid}"));
        std::fs::File::create(&tmp)
            .and_then(|mut f| {
                f.write_all(format!("{pid}\n").as_bytes())?;
                f.sync_all()
            })
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| io(format!("writing {}", path.display()), e))?;
        Ok(DriverLock {
            path,
            pid,
            _file: file,
        })
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
            let tail = crate::launcher::log_tail(&log, 10).join("\n  | ");
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
        // (Unless the system has given the dead process's id to a new one meanwhile.)
        if live_driver(dir.path()).is_some() {
            std::fs::write(dir.path().join(PID_FILE), "999999999\n").unwrap();
        }
        assert_eq!(live_driver(dir.path()), None);
        // A child that another test of this process forks holds the released lock until it
        // execs: try again for a moment.
        let mut lock = DriverLock::acquire(dir.path(), me);
        for _ in 0..50 {
            if lock.is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            lock = DriverLock::acquire(dir.path(), me);
        }
        let lock = lock.unwrap();
        assert_eq!(read_pid(dir.path()), Some(me));
        drop(lock);
    }

    #[test]
    fn of_drivers_started_at_once_exactly_one_wins() {
        for _round in 0..5 {
            // A fresh study each round: a child that another test of this process forks
            // shares the winner's lock until it execs, so the same lock may outlive a drop by
            // a moment.
            let dir = tempfile::tempdir().unwrap();
            // A dead driver's pid left behind.
            std::fs::write(dir.path().join(PID_FILE), "999999999\n").unwrap();
            let n = 8;
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
            let wins: Vec<_> = (0..n)
                .map(|i| {
                    let (b, d) = (barrier.clone(), dir.path().to_path_buf());
                    std::thread::spawn(move || {
                        b.wait();
                        DriverLock::acquire(&d, 1_000_000 + i as i32).ok()
                    })
                })
                .collect();
            let held: Vec<DriverLock> =
                wins.into_iter().filter_map(|h| h.join().unwrap()).collect();
            assert_eq!(held.len(), 1, "exactly one driver proceeds");
            assert_eq!(read_pid(dir.path()), Some(held[0].pid));
            drop(held);
            assert_eq!(read_pid(dir.path()), None, "released on drop");
        }
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
