//! How flotilla's ranks find each other and exchange data, without libtorch: the TCP rendezvous
//! store ([`store`]), the collective-communication API ([`comm`]: the [`Communicator`] trait,
//! element types, asynchronous [`Work`] handles) with its CPU backend over TCP ([`cpu`]) and its
//! NCCL backend through cudarc, loaded at run time ([`nccl`]), and the choice of backend for a
//! run ([`connect`]). Rank discovery is `flotilla_contract::rank`'s; collectives over tensors
//! are the trainer's.

#![warn(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod comm;
pub mod connect;
pub mod cpu;
pub mod nccl;
pub mod store;

pub use comm::{
    Backend, CommError, Communicator, CommunicatorExt, DType, Device, Element, ReduceOp, Work,
};
pub use connect::{init, CommOptions};
