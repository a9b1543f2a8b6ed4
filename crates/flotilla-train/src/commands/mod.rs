//! The `flotilla-train` binary's commands, each over the library below it: [`train`] (one job
//! in a run directory, as every task runs it), [`generate`], [`data_show`] (`flotilla data
//! show`), [`comm_bench`] (`flotilla bench comm`), [`attention_bench`] (`flotilla bench
//! attention`), [`experts_bench`] (`flotilla bench experts`), and the task's error with its
//! exit status ([`task_error`]).

pub mod attention_bench;
pub mod comm_bench;
pub mod data_show;
pub mod experts_bench;
pub mod generate;
pub mod task_error;
pub mod train;
