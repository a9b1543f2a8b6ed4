//! The [`KvStore`] trait: the store operations the communicators program against, implemented
//! by the TCP [`Store`](super::Store) and the in-process [`MemoryStore`](super::MemoryStore).

use super::error::StoreError;

/// The store operations communicators need, so they can be tested with
/// [`MemoryStore`](super::MemoryStore).
pub trait KvStore: Send + Sync {
    /// Store `value` under `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// The value of `key`, waiting (up to the store's timeout) until some rank sets it.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    /// Atomically add `delta` to the counter `key`; returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
    /// Wait for all ranks (reusable names, by generation counting).
    fn barrier(&self, name: &str) -> Result<(), StoreError>;
    /// This handle's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{cfg, T};
    use crate::store::{MemoryStore, Store};

    #[test]
    fn store_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Store>();
        check::<MemoryStore>();
        let _: Box<dyn KvStore> = Box::new(Store::connect(&cfg(0, 0, 1, T)).unwrap());
    }
}
