//! The world communicator of a run: [`CommOptions`] (which backend, its timeout, the rank's
//! local GPU and the master's address) and [`init`], which builds that backend
//! ([`CpuComm`] or [`NcclComm`]) over the rendezvous store. Kept apart from `comm.rs`, which
//! the backends implement, so that the API does not depend on its implementations.

use std::sync::Arc;
use std::time::Duration;

use super::comm::{Backend, CommError, Communicator};
use super::cpu::{CpuComm, CpuOptions};
use super::nccl::{NcclComm, NcclOptions};
use super::store::KvStore;

/// How to build a communicator (see [`init`]).
#[derive(Debug, Clone)]
pub struct CommOptions {
    pub backend: Backend,
    /// How long a collective may wait on a silent peer before failing (also connection set-up).
    pub timeout: Duration,
    /// Local rank: picks the GPU for NCCL (`LOCAL_RANK`).
    pub local_rank: usize,
    /// Host the other ranks reach (`MASTER_ADDR`); the CPU backend listens on the interface
    /// that routes there.
    pub master_addr: Option<String>,
}

impl CommOptions {
    /// Options for a rank discovered by `flotilla_contract::rank`: its local rank and master
    /// address.
    pub fn for_rank(
        info: &flotilla_contract::rank::RankInfo,
        backend: Backend,
        timeout: Duration,
    ) -> CommOptions {
        CommOptions {
            backend,
            timeout,
            local_rank: info.local_rank,
            master_addr: Some(info.master_addr.clone()),
        }
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            backend: Backend::Cpu,
            timeout: Duration::from_secs(1800),
            local_rank: 0,
            master_addr: None,
        }
    }
}

/// Builds the world communicator over `store` (whose rank and world size it takes).
/// Collective: every rank calls it.
pub fn init(
    store: Arc<dyn KvStore>,
    opts: &CommOptions,
) -> Result<Box<dyn Communicator>, CommError> {
    match opts.backend {
        Backend::Cpu => {
            let cpu = CpuOptions {
                timeout: opts.timeout,
                route_to: opts.master_addr.clone(),
                ..CpuOptions::default()
            };
            Ok(Box::new(CpuComm::new(store, cpu)?))
        }
        Backend::Nccl => {
            let nccl = NcclOptions {
                timeout: opts.timeout,
                local_rank: opts.local_rank,
            };
            Ok(Box::new(NcclComm::new(store, &nccl)?))
        }
    }
}
