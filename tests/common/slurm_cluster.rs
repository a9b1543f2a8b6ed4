//! The real Slurm test cluster of `scripts/slurm-cluster-start.sh`, for the tests that submit
//! to it: [`Cluster::start`] brings it up in the shape a test needs (one node, or several nodes
//! in network namespaces) and stops it when dropped, unless a cluster of that shape was running
//! before; [`all_jobs_terminal`] reads a `flotilla status --format json` document. Needs `std`,
//! `serde_json`, `flotilla-launch` and `tests/common/mod.rs`; included with
//! `#[path = "common/slurm_cluster.rs"] mod slurm_cluster;` beside `mod common;`.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use crate::common;

/// The directory holding the cluster's state, logs and pid files (the scripts' default).
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("SLURM_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("flotilla-slurm"))
}

/// The node names of a cluster of `nodes` nodes, as the start script names them.
pub fn node_names(nodes: usize) -> Vec<String> {
    if nodes == 1 {
        let out = Command::new("hostname").arg("-s").output().unwrap();
        vec![String::from_utf8_lossy(&out.stdout).trim().to_string()]
    } else {
        (1..=nodes).map(|k| format!("fltnode{k}")).collect()
    }
}

/// Stops the cluster at the end (also when the test panics), unless it was running before in
/// the same shape.
pub struct Cluster {
    stop: bool,
    /// Its number of nodes.
    pub nodes: usize,
}

impl Cluster {
    /// Starts the test cluster with `nodes` nodes (`SLURM_TEST_NODES`) and `env` for the start
    /// script; `None` (after [`common::skip_or_fail`]) when it cannot be installed or is
    /// skipped on purpose (`FLOTILLA_SKIP_SLURM=1`).
    pub fn start(nodes: usize, env: &[(&str, &str)]) -> Option<Cluster> {
        if std::env::var("FLOTILLA_SKIP_SLURM").is_ok_and(|v| v == "1") {
            common::skip_or_fail(
                "the real-Slurm tests: FLOTILLA_SKIP_SLURM=1 skips them on purpose (unset it)",
            );
            return None;
        }
        let script = common::repo_root().join("scripts/slurm-cluster-start.sh");
        let running_nodes = std::fs::read_to_string(cluster_dir().join("nodes"))
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(1);
        let was_running = running_nodes == nodes
            && Command::new("scontrol")
                .arg("ping")
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("is UP"))
                .unwrap_or(false);
        let mut cmd = Command::new("bash");
        cmd.arg(&script).env("SLURM_TEST_NODES", nodes.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run slurm-cluster-start.sh");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match out.status.code() {
            Some(0) => {}
            Some(3) => {
                common::skip_or_fail(&format!(
                    "the real-Slurm tests: Slurm cannot be installed here (run the tests as root \
                     on Debian with apt-get, which scripts/slurm-cluster-start.sh uses):\n{text}"
                ));
                return None;
            }
            _ => panic!("slurm-cluster-start.sh failed:\n{text}"),
        }
        println!("{text}");
        Some(Cluster {
            stop: !was_running,
            nodes,
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.stop {
            let out = Command::new("bash")
                .arg(common::repo_root().join("scripts/slurm-cluster-stop.sh"))
                .output();
            if let Ok(o) = out {
                println!("{}", String::from_utf8_lossy(&o.stdout));
            }
        }
    }
}

/// Whether every job of a `flotilla status --format json` document is in a terminal state.
pub fn all_jobs_terminal(status: &serde_json::Value) -> bool {
    use flotilla_launch::rundir::JobState;
    status["jobs"].as_array().unwrap().iter().all(|j| {
        j["state"]
            .as_str()
            .and_then(|s| s.parse::<JobState>().ok())
            .is_some_and(JobState::is_terminal)
    })
}
