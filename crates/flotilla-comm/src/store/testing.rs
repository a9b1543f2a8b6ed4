//! Helpers the store's unit tests share: a configuration on loopback and a group of connected
//! ranks.

use std::thread;
use std::time::Duration;

use super::{Store, StoreConfig};

/// Timeout of the tests' stores.
pub(super) const T: Duration = Duration::from_secs(10);

/// A configuration for `rank` of `world` on loopback, run id `test`.
pub(super) fn cfg(port: u16, rank: usize, world: usize, timeout: Duration) -> StoreConfig {
    StoreConfig {
        host: "127.0.0.1".into(),
        port,
        rank,
        world_size: world,
        run_id: "test".into(),
        timeout,
        bind_addr: None,
    }
}

/// Rank 0 on a free port, then ranks 1.. connected from threads.
pub(super) fn group(world: usize, timeout: Duration) -> Vec<Store> {
    let master = Store::connect(&cfg(0, 0, world, timeout)).unwrap();
    let port = master.port();
    let others: Vec<Store> = (1..world)
        .map(|r| thread::spawn(move || Store::connect(&cfg(port, r, world, timeout)).unwrap()))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    std::iter::once(master).chain(others).collect()
}
