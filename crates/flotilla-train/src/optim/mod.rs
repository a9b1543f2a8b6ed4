//! The optimizer's math, the same whatever the parallelism: AdamW and gradient clipping
//! ([`adamw`], by libtorch's multi-tensor kernels in [`fused`]), the learning-rate [`schedule`],
//! and fp16 dynamic loss scaling ([`loss_scale`]).
//! The weights of each strategy (`parallel/`) apply them to the tensors they hold.

pub mod adamw;
pub mod fused;
pub mod loss_scale;
pub mod schedule;

pub use adamw::{clip_grad_norm, AdamW, AdamWConfig};
pub use loss_scale::LossScaler;
pub use schedule::Schedule;
