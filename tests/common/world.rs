//! The one multi-process harness of the tests: a [`World`] of local processes, each started as a
//! rank with the torchrun variables of `flotilla_contract::rank::RankEnv` (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `NODE_RANK`/`GROUP_RANK`,
//! `GROUP_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) and `OMP_NUM_THREADS=1`, with any
//! `SLURM_*`/`TORCHELASTIC_*`/`NODE_RANK` variable the test itself runs under removed, and its
//! stdout and stderr written to its own log file.
//!
//! - [`World::spawn`]: every rank of a [`Shape`] on one fresh free port, each running the
//!   command a closure builds for its rank: [`train`] (`flotilla-train train --run-dir …`),
//!   [`test_worker`] (this test executable re-run as an `#[ignore]`d worker test), or any other.
//! - [`World::new`] + [`World::start`]: processes placed one by one (several worlds, ports or
//!   world sizes in one test, ranks that claim a world that is not there).
//! - [`World::wait`] waits for every process within a deadline and, past it, panics with every
//!   log (a hang fails the test); [`World::wait_rank`], [`World::finish_rank`],
//!   [`World::wait_for_line`] and [`World::wait_until`] wait for one process or one condition,
//!   [`World::kill_rank`] SIGKILLs one.
//! - Dropping a `World` (a test that passed, failed or panicked) SIGKILLs and reaps every
//!   process still running: no test leaves one behind.
//!
//! Included with `#[path = "…/tests/common/world.rs"] mod world;` (`common/world.rs` from the
//! root tests/); it needs `flotilla_contract` and `tempfile` only.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use flotilla_contract::rank::{free_port, RankEnv};

/// How often the waits look at the processes and their logs.
const POLL: Duration = Duration::from_millis(10);

/// The shape of a world: `nodes × per_node` ranks (rank `r` is on node `r / per_node`).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub nodes: usize,
    pub per_node: usize,
}

impl Shape {
    /// One node of `n` ranks.
    pub fn single_node(n: usize) -> Self {
        Shape {
            nodes: 1,
            per_node: n,
        }
    }

    pub fn world_size(&self) -> usize {
        self.nodes * self.per_node
    }

    /// The environment of rank `rank` of this shape with rank 0's store on
    /// `127.0.0.1:master_port`, one thread.
    pub fn rank_env(&self, rank: usize, master_port: u16) -> RankEnv {
        let mut env = RankEnv::on_this_host(rank, self.nodes, self.per_node, master_port);
        env.threads = Some(1);
        env
    }
}

/// One process of a world.
pub struct RankProc {
    /// Its rank (`RANK`).
    pub rank: usize,
    /// What messages call it (and its log file's name).
    pub label: String,
    pub child: Child,
    pub log: PathBuf,
    pub status: Option<ExitStatus>,
}

/// The processes of one world. Dropping it kills and reaps every process still running.
pub struct World {
    pub name: String,
    pub ranks: Vec<RankProc>,
    log_dir: PathBuf,
    /// The log directory when the world made its own (removed after the processes are gone).
    _own_dir: Option<tempfile::TempDir>,
}

/// How each process of a finished world exited, and its log.
pub struct Finished {
    pub name: String,
    pub statuses: Vec<ExitStatus>,
    pub logs: Vec<String>,
}

impl Finished {
    /// Panics with every process's log unless every one exited with status 0.
    pub fn assert_success(&self) {
        if self.statuses.iter().all(ExitStatus::success) {
            return;
        }
        panic!(
            "world `{}`: not every rank succeeded: {:?}\n{}",
            self.name,
            self.statuses,
            self.all_logs()
        );
    }

    pub fn all_logs(&self) -> String {
        self.logs
            .iter()
            .enumerate()
            .map(|(r, l)| format!("--- rank {r} log:\n{l}\n"))
            .collect()
    }
}

/// `<exe> train --run-dir RUN_DIR ARGS...` (the training task, as `flotilla train` runs it)
/// as every rank of `shape`, logs in `log_dir/<name>.rank<R>.log`.
pub fn train(
    exe: &Path,
    name: &str,
    shape: Shape,
    run_dir: &Path,
    log_dir: &Path,
    args: &[String],
) -> World {
    World::spawn(name, shape, Some(log_dir), |_| {
        let mut cmd = Command::new(exe);
        cmd.arg("train").arg("--run-dir").arg(run_dir).args(args);
        cmd
    })
}

/// This test executable running only its `#[ignore]`d test `test` (a worker that does nothing
/// unless its scenario variable is set): `--exact TEST --nocapture --include-ignored
/// --test-threads=1`.
pub fn test_worker(test: &str) -> Command {
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        test,
        "--nocapture",
        "--include-ignored",
        "--test-threads=1",
    ]);
    cmd
}

impl World {
    /// A world with no process yet, logging into `log_dir` (created), or with `None` into a
    /// temporary directory of its own.
    pub fn new(name: &str, log_dir: Option<&Path>) -> World {
        let (log_dir, own) = match log_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
                (d.to_path_buf(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix(&format!("world-{name}-"))
                    .tempdir()
                    .expect("a temporary log directory");
                (t.path().to_path_buf(), Some(t))
            }
        };
        World {
            name: name.to_string(),
            ranks: vec![],
            log_dir,
            _own_dir: own,
        }
    }

    /// Every rank of `shape` on one fresh free port, rank `r` running `command(r)`; logs in
    /// `<log_dir>/<name>.rank<R>.log` (see [`World::new`] for `log_dir`).
    pub fn spawn(
        name: &str,
        shape: Shape,
        log_dir: Option<&Path>,
        mut command: impl FnMut(usize) -> Command,
    ) -> World {
        let mut world = World::new(name, log_dir);
        let port = free_port().expect("a free port on 127.0.0.1");
        for rank in 0..shape.world_size() {
            world.start(
                &format!("rank{rank}"),
                &shape.rank_env(rank, port),
                command(rank),
            );
        }
        world
    }

    /// Starts `cmd` as one more process, with the variables of `env` (an inherited
    /// `SLURM_*`, `TORCHELASTIC_*` or `NODE_RANK` that `cmd` does not set itself is removed),
    /// `RUST_BACKTRACE=0`, no `RUST_LOG`, stdin from /dev/null and stdout and stderr into
    /// `<log_dir>/<name>.<label>.log`. Returns its index in [`World::ranks`].
    pub fn start(&mut self, label: &str, env: &RankEnv, mut cmd: Command) -> usize {
        let index = self.ranks.len();
        let safe: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut log = self.log_dir.join(format!("{}.{safe}.log", self.name));
        if self.ranks.iter().any(|r| r.log == log) {
            log = self
                .log_dir
                .join(format!("{}.{safe}.{index}.log", self.name));
        }
        let file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let set: Vec<String> = cmd
            .get_envs()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        // Only the torchrun variables describe the rank: drop any SLURM/torchelastic ones the
        // test itself may run under.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            let foreign =
                k.starts_with("SLURM_") || k.starts_with("TORCHELASTIC_") || k == "NODE_RANK";
            if foreign && !set.contains(&k) {
                cmd.env_remove(&k);
            }
        }
        cmd.envs(env.vars())
            .env("RUST_BACKTRACE", "0")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {label} of `{}` ({cmd:?}): {e}", self.name));
        self.ranks.push(RankProc {
            rank: env.place.rank,
            label: label.to_string(),
            child,
            log,
            status: None,
        });
        index
    }

    /// Looks at every process once; returns whether all have exited.
    pub fn poll(&mut self) -> bool {
        for r in &mut self.ranks {
            if r.status.is_none() {
                if let Some(st) = r.child.try_wait().unwrap() {
                    r.status = Some(st);
                }
            }
        }
        self.ranks.iter().all(|r| r.status.is_some())
    }

    /// How process `i` exited, if it has.
    pub fn try_status(&mut self, i: usize) -> Option<ExitStatus> {
        let r = &mut self.ranks[i];
        if r.status.is_none() {
            r.status = r.child.try_wait().unwrap();
        }
        r.status
    }

    /// Waits for process `i` alone, at most `limit`; `None` on expiry (nothing is killed).
    pub fn wait_rank(&mut self, i: usize, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.try_status(i) {
                return Some(st);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits for process `i` alone, at most `limit`; on expiry kills every process and panics
    /// with its log.
    pub fn finish_rank(&mut self, i: usize, limit: Duration) -> ExitStatus {
        match self.wait_rank(i, limit) {
            Some(st) => st,
            None => {
                self.kill_all();
                panic!(
                    "`{}` {}: still running after {limit:?}; killed every process\n{}",
                    self.name,
                    self.ranks[i].label,
                    self.log(i)
                );
            }
        }
    }

    /// Waits, at most `limit`, for a line of process `i`'s log containing `needle`, and
    /// returns it. Panics (every process is killed as the world is dropped) when the process
    /// exits without writing one or the time is up.
    pub fn wait_for_line(&mut self, i: usize, needle: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            // Read the log before looking at the status: a line written just before exiting
            // is seen.
            let exited = self.try_status(i);
            let log = self.log(i);
            // Only whole lines while the process runs (one may be half written).
            let whole = match exited {
                Some(_) => &log[..],
                None => &log[..log.rfind('\n').map_or(0, |n| n + 1)],
            };
            if let Some(line) = whole.lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            if let Some(st) = exited {
                panic!(
                    "`{}` {}: exited ({st}) without a line containing {needle:?}:\n{}",
                    self.name,
                    self.ranks[i].label,
                    self.log(i)
                );
            }
            if start.elapsed() > limit {
                panic!(
                    "`{}` {}: no line containing {needle:?} within {limit:?}:\n{}",
                    self.name,
                    self.ranks[i].label,
                    self.log(i)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits, at most `limit`, until `ready(self)` holds. Panics with every log (every
    /// process is killed as the world is dropped) when a process exits first or the time is
    /// up; `what` says what was awaited.
    pub fn wait_until(
        &mut self,
        limit: Duration,
        what: &str,
        mut ready: impl FnMut(&World) -> bool,
    ) {
        let start = Instant::now();
        loop {
            if ready(self) {
                return;
            }
            self.poll();
            if let Some(r) = self.ranks.iter().find(|r| r.status.is_some()) {
                panic!(
                    "`{}`: {} exited ({}) before {what}\n{}",
                    self.name,
                    r.label,
                    r.status.unwrap(),
                    self.all_logs()
                );
            }
            if start.elapsed() > limit {
                panic!(
                    "`{}`: not {what} within {limit:?}\n{}",
                    self.name,
                    self.all_logs()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGKILLs process `i` and reaps it.
    pub fn kill_rank(&mut self, i: usize) {
        let r = &mut self.ranks[i];
        let _ = r.child.kill();
        r.status = Some(r.child.wait().unwrap());
    }

    /// Sends `signal` (a `kill -s` name: `STOP`, `CONT`, ...) to process `i`.
    pub fn signal_rank(&self, i: usize, signal: &str) {
        let pid = self.ranks[i].child.id().to_string();
        let status = Command::new("kill")
            .args(["-s", signal, &pid])
            .status()
            .expect("kill(1)");
        assert!(status.success(), "kill -s {signal} {pid}");
    }

    /// Process `i`'s log so far (stdout and stderr).
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.ranks[i].log).unwrap_or_default()
    }

    pub fn all_logs(&self) -> String {
        self.ranks
            .iter()
            .enumerate()
            .map(|(i, r)| format!("--- {} log:\n{}\n", r.label, self.log(i)))
            .collect()
    }

    /// Waits for every process, at most `limit` in all; on expiry kills them all and panics
    /// with their logs.
    pub fn wait(mut self, limit: Duration) -> Finished {
        let start = Instant::now();
        while !self.poll() {
            if start.elapsed() > limit {
                self.kill_all();
                panic!(
                    "world `{}` did not finish within {limit:?}; killed every rank\n{}",
                    self.name,
                    self.all_logs()
                );
            }
            std::thread::sleep(POLL);
        }
        Finished {
            name: self.name.clone(),
            statuses: self.ranks.iter().map(|r| r.status.unwrap()).collect(),
            logs: (0..self.ranks.len()).map(|i| self.log(i)).collect(),
        }
    }

    /// SIGKILLs and reaps every process still running.
    pub fn kill_all(&mut self) {
        for r in &mut self.ranks {
            if r.status.is_none() {
                let _ = r.child.kill();
                r.status = r.child.wait().ok();
            }
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.kill_all();
    }
}
