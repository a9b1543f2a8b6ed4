//! A world of ranks inside one test process: threads over one `MemoryStore`, each with its own
//! CPU communicator.

use std::sync::Arc;
use std::time::Duration;

use flotilla_comm::comm::Communicator;
use flotilla_comm::cpu::{CpuComm, CpuOptions};
use flotilla_comm::store::MemoryStore;

/// `f` on `world` ranks, as threads over one `MemoryStore`; the ranks' results in rank order.
pub fn on_threads<T: Send + 'static>(
    world: usize,
    f: impl Fn(Arc<dyn Communicator>) -> T + Clone + Send + 'static,
) -> Vec<T> {
    let handles: Vec<_> = MemoryStore::group_with_timeout(world, Duration::from_secs(120))
        .into_iter()
        .map(|store| {
            let f = f.clone();
            std::thread::spawn(move || {
                let comm = CpuComm::new(
                    store,
                    CpuOptions {
                        timeout: Duration::from_secs(120),
                        ..CpuOptions::default()
                    },
                )
                .unwrap();
                f(Arc::new(comm))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
