//! Starting `flotilla train` as a torchrun-style world of local processes, for the
//! multi-process training tests. Each rank gets the torchrun variables of
//! `flotilla_contract::rank::RankEnv` (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//! `NODE_RANK`/`GROUP_RANK`, `GROUP_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) for a free
//! localhost port and `OMP_NUM_THREADS=1`, and writes its stdout and stderr to its own log
//! file. A [`World`] kills and reaps every rank still running when it is dropped (a failing or
//! panicking test leaves no process behind), and [`World::wait`] fails, after killing them
//! all, when the ranks do not all exit within a deadline, so that a hang fails the test.
//!
//! Included with `#[path = "common/world.rs"] mod world;` by the tests that need it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use flotilla_contract::rank::{free_port, RankEnv};

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
}

/// One rank's process.
pub struct RankProc {
    pub rank: usize,
    pub child: Child,
    pub log: PathBuf,
    pub status: Option<ExitStatus>,
}

/// The ranks of one world. Dropping it kills and reaps every rank still running.
pub struct World {
    pub name: String,
    pub ranks: Vec<RankProc>,
}

/// How each rank of a finished world exited.
pub struct Finished {
    pub name: String,
    pub statuses: Vec<ExitStatus>,
    pub logs: Vec<String>,
}

impl Finished {
    /// Panics with every rank's log unless every rank exited with status 0.
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

/// Starts `flotilla train --run-dir RUN_DIR ARGS...` as every rank of `shape`, logs in
/// `log_dir/<name>.rank<R>.log`.
pub fn spawn(
    exe: &Path,
    name: &str,
    shape: Shape,
    run_dir: &Path,
    log_dir: &Path,
    args: &[String],
) -> World {
    spawn_command(exe, name, shape, log_dir, |cmd| {
        cmd.arg("train").arg("--run-dir").arg(run_dir).args(args);
    })
}

/// Starts `exe` with the arguments `configure` adds as every rank of `shape`.
pub fn spawn_command(
    exe: &Path,
    name: &str,
    shape: Shape,
    log_dir: &Path,
    configure: impl Fn(&mut Command),
) -> World {
    std::fs::create_dir_all(log_dir).unwrap();
    let port = free_port().expect("a free port on 127.0.0.1");
    let world = shape.world_size();
    let mut out = World {
        name: name.to_string(),
        ranks: vec![],
    };
    for rank in 0..world {
        let log = log_dir.join(format!("{name}.rank{rank}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(exe);
        configure(&mut cmd);
        // Only the torchrun variables describe the rank: drop any SLURM/torchelastic ones the
        // test itself may run under.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().to_string();
            if k.starts_with("SLURM_") || k.starts_with("TORCHELASTIC_") || k == "NODE_RANK" {
                cmd.env_remove(&k);
            }
        }
        let mut env = RankEnv::on_this_host(rank, shape.nodes, shape.per_node, port);
        env.threads = Some(1);
        cmd.envs(env.vars())
            .env("RUST_BACKTRACE", "0")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting rank {rank} of `{name}`: {e}"));
        out.ranks.push(RankProc {
            rank,
            child,
            log,
            status: None,
        });
    }
    out
}

impl World {
    /// Polls every rank once; returns whether all have exited.
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

    /// Waits for rank `rank` alone, at most `limit`; `None` on expiry (nothing is killed).
    pub fn wait_rank(&mut self, rank: usize, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            let r = &mut self.ranks[rank];
            if let Some(st) = r.status {
                return Some(st);
            }
            if let Some(st) = r.child.try_wait().unwrap() {
                r.status = Some(st);
                return Some(st);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILLs rank `rank` and reaps it.
    pub fn kill_rank(&mut self, rank: usize) {
        let r = &mut self.ranks[rank];
        let _ = r.child.kill();
        r.status = Some(r.child.wait().unwrap());
    }

    pub fn log(&self, rank: usize) -> String {
        std::fs::read_to_string(&self.ranks[rank].log).unwrap_or_default()
    }

    pub fn all_logs(&self) -> String {
        (0..self.ranks.len())
            .map(|r| format!("--- rank {r} log:\n{}\n", self.log(r)))
            .collect()
    }

    /// Waits for every rank, at most `limit` in all; on expiry kills them all and panics with
    /// their logs.
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
            std::thread::sleep(Duration::from_millis(20));
        }
        Finished {
            name: self.name.clone(),
            statuses: self.ranks.iter().map(|r| r.status.unwrap()).collect(),
            logs: (0..self.ranks.len()).map(|r| self.log(r)).collect(),
        }
    }

    /// SIGKILLs and reaps every rank still running.
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
