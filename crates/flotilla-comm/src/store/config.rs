//! Where the store is and who this process is ([`StoreConfig`]), and the `host:port` form of
//! the master's address that messages and connections use.

use std::time::Duration;

use flotilla_contract::rank::RankInfo;

/// Where the store is and who this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The master's host (MASTER_ADDR); clients connect here.
    pub host: String,
    /// The master's port (MASTER_PORT); 0 lets rank 0 pick a free one (see
    /// [`Store::port`](super::Store::port)).
    pub port: u16,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Identifies the job; a process with another run id is turned away.
    pub run_id: String,
    /// How long to wait to connect, and for blocking operations (`get`, `wait`, `barrier`).
    pub timeout: Duration,
    /// Where rank 0 listens; `None` means `host`. Use `0.0.0.0` to listen everywhere.
    pub bind_addr: Option<String>,
}

impl StoreConfig {
    /// The configuration for a discovered rank.
    pub fn from_rank_info(info: &RankInfo, run_id: impl Into<String>, timeout: Duration) -> Self {
        StoreConfig {
            host: info.master_addr.clone(),
            port: info.master_port,
            rank: info.rank,
            world_size: info.world_size,
            run_id: run_id.into(),
            timeout,
            bind_addr: None,
        }
    }
}

pub(super) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
