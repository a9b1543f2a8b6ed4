//! The key-value table and barrier bookkeeping behind both the TCP server and
//! [`MemoryStore`](super::MemoryStore): values, decimal counters for `add`, and barrier
//! generations. It holds data only; locking and waiting are its owners'.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::error::show_key;

#[derive(Default)]
pub(super) struct Table {
    pub(super) kv: HashMap<String, Arc<[u8]>>,
    barriers: HashMap<String, BarrierState>,
}

/// Generation counting: each rank numbers its calls of a barrier name 1, 2, 3, …; generation
/// `g` completes when all ranks arrived with `g`.
#[derive(Default)]
struct BarrierState {
    completed: u64,
    arrived: HashMap<u64, BTreeSet<usize>>,
}

impl Table {
    pub(super) fn add(&mut self, key: &str, delta: i64) -> Result<i64, String> {
        let current = match self.kv.get(key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    let shown = match std::str::from_utf8(v) {
                        Ok(s) if s.len() <= 40 => format!("'{s}'"),
                        _ => format!("{} bytes of data", v.len()),
                    };
                    format!(
                        "key {} holds {shown}, which is not a counter (add keeps a decimal integer)",
                        show_key(key)
                    )
                })?,
        };
        let new = current.checked_add(delta).ok_or_else(|| {
            format!(
                "adding {delta} to key {} (now {current}) overflows a 64-bit counter",
                show_key(key)
            )
        })?;
        self.kv
            .insert(key.to_string(), Arc::from(new.to_string().into_bytes()));
        Ok(new)
    }

    pub(super) fn missing_keys<'k>(&self, keys: &'k [String]) -> Vec<&'k str> {
        keys.iter()
            .filter(|k| !self.kv.contains_key(k.as_str()))
            .map(|k| k.as_str())
            .collect()
    }

    /// Record `rank`'s arrival at generation `generation`; true when it is complete.
    pub(super) fn arrive(
        &mut self,
        name: &str,
        generation: u64,
        rank: usize,
        world: usize,
    ) -> bool {
        let b = self.barriers.entry(name.to_string()).or_default();
        if generation <= b.completed {
            return true;
        }
        let set = b.arrived.entry(generation).or_default();
        set.insert(rank);
        if set.len() >= world {
            b.completed = b.completed.max(generation);
            let done = b.completed;
            b.arrived.retain(|g, _| *g > done);
            true
        } else {
            false
        }
    }

    pub(super) fn barrier_done(&self, name: &str, generation: u64) -> bool {
        self.barriers
            .get(name)
            .is_some_and(|b| b.completed >= generation)
    }

    pub(super) fn arrived(&self, name: &str, generation: u64) -> BTreeSet<usize> {
        self.barriers
            .get(name)
            .and_then(|b| b.arrived.get(&generation))
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_counters_and_barrier_generations() {
        let mut t = Table::default();
        assert_eq!(t.add("c", 2).unwrap(), 2);
        assert_eq!(t.add("c", -5).unwrap(), -3);
        assert_eq!(&*t.kv["c"], b"-3");
        t.kv.insert("s".into(), Arc::from(&b"hello"[..]));
        assert!(t
            .add("s", 1)
            .unwrap_err()
            .contains("holds 'hello', which is not a counter"));
        t.kv.insert("m".into(), Arc::from(i64::MAX.to_string().into_bytes()));
        assert!(t.add("m", 1).unwrap_err().contains("overflows"));
        assert!(!t.arrive("b", 1, 0, 2));
        assert!(!t.barrier_done("b", 1));
        assert!(t.arrive("b", 1, 1, 2));
        assert!(t.barrier_done("b", 1));
        assert!(
            t.arrive("b", 1, 0, 2),
            "a completed generation passes at once"
        );
        assert!(!t.arrive("b", 2, 1, 2));
    }
}
