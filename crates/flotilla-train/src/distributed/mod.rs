//! Distributed runtime (rank discovery lives in `flotilla_launch::rank`): the TCP rendezvous store
//! (`store`), the collective-communication API (`comm`) with its CPU (`cpu`, TCP) and NCCL
//! (`nccl`, through cudarc) backends, the choice of backend for a run (`connect`), and the
//! `flotilla bench comm` engine (`bench`).

pub mod bench;
pub mod comm;
pub mod connect;
pub mod cpu;
pub mod nccl;
pub mod store;

pub use comm::{
    Backend, CommError, Communicator, CommunicatorExt, DType, Device, Element, ReduceOp, Work,
};
pub use connect::{init, CommOptions};
