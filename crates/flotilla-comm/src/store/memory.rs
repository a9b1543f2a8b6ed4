//! [`MemoryStore`], an in-process store for single-process groups and tests: one handle per
//! rank over a shared table, with the semantics of the TCP [`Store`](super::Store) (blocking
//! `get` with a timeout, counters, generation barriers) and no sockets or threads.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::error::{check_key, ranks_of, show_key, StoreError};
use super::kv::KvStore;
use super::lock;
use super::table::Table;
use super::wire::{MAX_TIMEOUT, MAX_VALUE_LEN};

struct MemShared {
    world_size: usize,
    timeout: Duration,
    table: Mutex<Table>,
    changed: Condvar,
}

/// An in-process store for single-process groups and tests: one handle per rank over a shared
/// table, with the same semantics as [`Store`](super::Store) (blocking `get` with a timeout,
/// counters, generation barriers).
pub struct MemoryStore {
    shared: Arc<MemShared>,
    rank: usize,
    generations: Mutex<HashMap<String, u64>>,
}

impl MemoryStore {
    /// Timeout of [`MemoryStore::group`]'s handles.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// One handle per rank, sharing one table; blocking operations time out after 30 s.
    pub fn group(world_size: usize) -> Vec<Arc<dyn KvStore>> {
        Self::group_with_timeout(world_size, Self::DEFAULT_TIMEOUT)
    }

    /// As [`MemoryStore::group`], with the given timeout.
    pub fn group_with_timeout(world_size: usize, timeout: Duration) -> Vec<Arc<dyn KvStore>> {
        Self::handles(world_size, timeout)
            .into_iter()
            .map(|h| h as Arc<dyn KvStore>)
            .collect()
    }

    /// As [`MemoryStore::group_with_timeout`], typed (for the inherent methods).
    pub fn handles(world_size: usize, timeout: Duration) -> Vec<Arc<MemoryStore>> {
        let shared = Arc::new(MemShared {
            world_size,
            timeout,
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| {
                Arc::new(MemoryStore {
                    shared: Arc::clone(&shared),
                    rank,
                    generations: Mutex::new(HashMap::new()),
                })
            })
            .collect()
    }

    /// The value of `key`, waiting up to `t`.
    pub fn get_timeout(&self, key: &str, t: Duration) -> Result<Vec<u8>, StoreError> {
        check_key("key", key)?;
        let deadline = Instant::now() + t.min(MAX_TIMEOUT);
        let mut table = lock(&self.shared.table);
        loop {
            if let Some(v) = table.kv.get(key) {
                return Ok(v.to_vec());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Timeout {
                    op: format!("get {}", show_key(key)),
                    waited: t,
                    detail: "no rank set it".into(),
                    missing: Vec::new(),
                });
            }
            table = self
                .shared
                .changed
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Remove `key`; true if it was there.
    pub fn delete(&self, key: &str) -> bool {
        lock(&self.shared.table).kv.remove(key).is_some()
    }
}

impl KvStore for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key("key", key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StoreError::TooLarge {
                what: format!("the value for key {}", show_key(key)),
                len: value.len(),
                limit: MAX_VALUE_LEN,
            });
        }
        lock(&self.shared.table)
            .kv
            .insert(key.to_string(), Arc::from(value));
        self.shared.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.get_timeout(key, self.shared.timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        check_key("key", key)?;
        let result = lock(&self.shared.table).add(key, delta);
        self.shared.changed.notify_all();
        result.map_err(|reason| StoreError::Refused {
            op: format!("add {delta} to {}", show_key(key)),
            reason,
        })
    }

    fn barrier(&self, name: &str) -> Result<(), StoreError> {
        check_key("barrier name", name)?;
        let generation = {
            let mut g = lock(&self.generations);
            let n = g.entry(name.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let world = self.shared.world_size;
        let deadline = Instant::now() + self.shared.timeout;
        let mut table = lock(&self.shared.table);
        if table.arrive(name, generation, self.rank, world) {
            drop(table);
            self.shared.changed.notify_all();
            return Ok(());
        }
        loop {
            if table.barrier_done(name, generation) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let arrived = table.arrived(name, generation);
                let missing: Vec<usize> = (0..world).filter(|r| !arrived.contains(r)).collect();
                return Err(StoreError::Timeout {
                    op: format!("barrier {}", show_key(name)),
                    waited: self.shared.timeout,
                    detail: format!("{} did not reach the barrier", ranks_of(&missing, world)),
                    missing,
                });
            }
            table = self
                .shared
                .changed
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::T;
    use std::thread;

    #[test]
    fn memory_store_semantics() {
        let g = MemoryStore::group_with_timeout(3, Duration::from_millis(300));
        assert_eq!(g[2].rank(), 2);
        assert_eq!(g[0].world_size(), 3);
        thread::scope(|sc| {
            for s in &g {
                sc.spawn(move || {
                    if s.rank() == 1 {
                        thread::sleep(Duration::from_millis(50));
                        s.set("k", b"v").unwrap();
                    }
                    assert_eq!(s.get("k").unwrap(), b"v");
                    s.add("n", 1).unwrap();
                    s.barrier("b").unwrap();
                    assert_eq!(s.get("n").unwrap(), b"3");
                    s.barrier("b").unwrap();
                });
            }
        });
        let e = g[0].get("absent").unwrap_err().to_string();
        assert_eq!(e, "get 'absent' timed out after 0.3 s: no rank set it");
        let e = g[0].barrier("lonely").unwrap_err();
        assert_eq!(
            e.to_string(),
            "barrier 'lonely' timed out after 0.3 s: ranks 1,2 of 3 did not reach the barrier"
        );
        g[0].set("text", b"abc").unwrap();
        assert!(matches!(
            g[1].add("text", 1),
            Err(StoreError::Refused { .. })
        ));
        let typed = MemoryStore::handles(1, T);
        typed[0].set("x", b"1").unwrap();
        assert!(typed[0].delete("x"));
        assert!(!typed[0].delete("x"));
    }
}
