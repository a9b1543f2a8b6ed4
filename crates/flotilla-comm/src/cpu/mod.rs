//! CPU backend: collectives over TCP between ranks, for CPU training and for every multi-rank
//! test on machines without GPUs.
//!
//! Set-up: each rank listens on the interface that routes to the master (or `listen_ip`),
//! publishes `ip:port` in the store under `cpu/<group>/addr/<rank>`, connects to every higher
//! rank and accepts every lower one (one full-duplex TCP connection per peer pair, TCP_NODELAY,
//! read and write timeouts from the configured timeout).
//!
//! Execution: a communicator owns one communication thread that runs submitted operations in
//! FIFO order (so `Work`s are truly asynchronous and complete in submission order), and one
//! writer thread per peer, so a rank can stream its outgoing chunks while it reads and reduces
//! incoming ones: both ends of a link sending large buffers at once never deadlock. Large
//! reads sleep in `poll()` until up to 1 MiB has arrived (SO_RCVLOWAT) rather than waking for
//! every TCP segment.
//!
//! Algorithms:
//! - small buffers (≤ `small_bytes`): direct exchange — every rank sends its data to every
//!   peer and reduces all contributions in rank order (one round trip; the same result bits on
//!   every rank); tiny messages are written by the communication thread itself;
//! - large buffers: ring reduce-scatter then ring all-gather (all_reduce), ring reduce-scatter,
//!   ring all-gather, and a pipelined chain for broadcast, each in chunks of `chunk_bytes` so a
//!   rank forwards chunk i while chunk i+1 is still arriving.
//!
//! Copies: data is sent straight from the caller's buffer and, where the algorithm allows,
//! received straight into it (all-gather phases, broadcast); reductions read an incoming chunk
//! from a small scratch buffer and combine it in place. bf16/f16 are combined in f32, rounded
//! once per hop as NCCL does; the small path accumulates all ranks in f32 and rounds once.
//!
//! Tuning (environment): `FLOTILLA_CPU_CHUNK_BYTES` (default 1 MiB), `FLOTILLA_CPU_SMALL_BYTES`
//! (default 64 KiB), `FLOTILLA_CPU_LISTEN_IP` (the address to listen on and advertise).
//!
//! Failures: a read or write error, EOF or timeout names the peer's rank, host and address
//! (`rank 2 (gpu-node-2, 10.0.0.3:41234) closed the connection during all_reduce`); the
//! communicator then shuts all its connections so its other peers fail at once instead of
//! waiting for their timeout, and every later operation returns `CommError::Aborted`. The
//! first rank to fail records its error in the store before shutting; a peer that fails
//! because of that shutdown reports the recorded error first (`CommError::AfterPeerFailure`),
//! so every survivor names the rank really lost.
//!
//! Its parts, one file each: `communicator` ([`CpuComm`] and its jobs), `mesh` (connection
//! set-up), `transport` (peers, their writer threads, and point-to-point send and receive),
//! `engine` (the communication thread and the choice of algorithm), `direct` and `ring` (the
//! algorithms), `kernels` (reductions per element type) and `scratch` (the engine's scratch
//! memory).
//!
//! Memory safety: a submitted operation carries raw pointers to the caller's buffers, which
//! [`Communicator::submit`](crate::comm::Communicator::submit)'s contract keeps valid and
//! untouched by anyone else until its `Work` completes. Every algorithm stays within the
//! lengths [`RawOp`](crate::comm::RawOp) documents, and waits until the writer threads have
//! sent every chunk it queued before it returns (or, after a failure, the engine waits for the
//! writers to drain), so no thread touches those buffers after the `Work` completes.

use std::net::IpAddr;
use std::time::Duration;

mod communicator;
mod direct;
mod engine;
mod kernels;
mod mesh;
mod ring;
mod scratch;
mod transport;

pub use communicator::CpuComm;

/// Options of the CPU backend.
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// How long any single read or write may wait on a peer, and the connection set-up limit.
    pub timeout: Duration,
    /// Host to route to when picking the interface to listen on (usually `MASTER_ADDR`).
    pub route_to: Option<String>,
    /// Listen on this address instead (`FLOTILLA_CPU_LISTEN_IP` overrides both).
    pub listen_ip: Option<IpAddr>,
    /// Pipelining granularity of the ring algorithms.
    pub chunk_bytes: usize,
    /// Buffers up to this size use the direct-exchange algorithms.
    pub small_bytes: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            timeout: Duration::from_secs(1800),
            route_to: None,
            listen_ip: None,
            chunk_bytes: env_bytes("FLOTILLA_CPU_CHUNK_BYTES").unwrap_or(1 << 20),
            small_bytes: env_bytes("FLOTILLA_CPU_SMALL_BYTES").unwrap_or(64 << 10),
        }
    }
}

/// A positive byte count from the environment variable `name`.
fn env_bytes(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&v: &usize| v > 0)
}
