//! The TCP rendezvous key-value store: rank 0 serves, every rank (rank 0 included) is a client.
//!
//! It is what ranks use to exchange the little they must agree on before they can talk directly
//! (an NCCL unique id, the CPU backend's addresses) and to wait for one another
//! ([`Store::barrier`]). Its parts, one file each:
//!
//! - `wire`: the wire codec (frames, opcodes, limits, payload encoding and decoding);
//! - `server`: the server, threads in rank 0's process;
//! - `client`: the client, [`Store`];
//! - `kv`: the [`KvStore`] trait the communicators program against;
//! - `memory`: [`MemoryStore`], an in-process store for single-process groups and tests;
//! - `table`: the key-value table and barrier bookkeeping the server and [`MemoryStore`] share;
//! - `config` and `error`: [`StoreConfig`] and [`StoreError`].
//!
//! Everything public is re-exported here, so paths are `flotilla_comm::store::Store` and so on.
//!
//! # Protocol
//!
//! Every message is a frame: a little-endian `u32` length, then that many bytes: one opcode
//! byte and the payload. Strings and byte strings inside payloads are `u32`-length-prefixed;
//! integers are little-endian. A client's first frame is a hello: [`PROTOCOL_MAGIC`],
//! [`PROTOCOL_VERSION`], world size, rank, flags and run id. The server checks each against
//! its own and answers OK or an error that says what differs; a connection whose first bytes
//! are not a hello (an HTTP request, a port scanner, garbage) is logged and closed, and the
//! server goes on serving. Keys are at most [`MAX_KEY_LEN`] bytes, values at most
//! [`MAX_VALUE_LEN`].
//!
//! Blocking operations (`get`, `wait`, `barrier`) carry their timeout; the server parks the
//! request until it can answer or the timeout passes, and then answers with who is missing
//! (ranks that never joined, ranks that disconnected, ranks that have not reached the barrier,
//! hellos it rejected), so timeouts name the culprits. Nothing polls over the network.
//!
//! # Life cycle
//!
//! Rank 0's [`Store::connect`] binds, starts the server (an accept thread and one thread per
//! connection), and connects to itself. Other ranks connect with exponential backoff until the
//! configured timeout. When a rank's connection closes, the server notes it; ranks waiting in
//! a barrier for it fail at once. When rank 0's process dies, the other ranks' connections
//! close and their next (or current) operation fails with "the master closed the connection".
//! Dropping rank 0's [`Store`] waits up to a short grace period (the store timeout, at most
//! 5 s) for the other ranks to disconnect, then closes every connection and joins every
//! server thread; dropping never hangs.
//!
//! A [`Store`] is `Send + Sync`. It keeps a small pool of connections: a thread that calls
//! while another thread's call is in flight (say, parked in `get`) opens another connection
//! instead of waiting behind it.

use std::sync::{Mutex, MutexGuard};

mod client;
mod config;
mod error;
mod kv;
mod memory;
mod server;
mod table;
#[cfg(test)]
mod testing;
mod wire;

pub use client::Store;
pub use config::StoreConfig;
pub use error::StoreError;
pub use kv::KvStore;
pub use memory::MemoryStore;
pub use wire::{MAX_KEY_LEN, MAX_RUN_ID_LEN, MAX_VALUE_LEN, PROTOCOL_MAGIC, PROTOCOL_VERSION};

/// Locks `m`, recovering the data if a thread panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}
