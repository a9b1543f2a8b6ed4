//! The precision a job trains in: `trainer.precision: auto` is `bf16-mixed` where the job
//! runs on GPUs and `32-true` on CPUs, decided by the same rule wherever it is asked (the
//! memory planner on the login node, the trainer on the node, where the device it got
//! decides).

use super::types::{Device, JobConfig, Precision};

impl Precision {
    /// This precision for a job that runs on a GPU (`gpu`) or a CPU: `auto` becomes
    /// `bf16-mixed` or `32-true`, the others stay as they are.
    pub fn on(self, gpu: bool) -> Precision {
        match (self, gpu) {
            (Precision::Auto, true) => Precision::Bf16Mixed,
            (Precision::Auto, false) => Precision::Full32,
            (p, _) => p,
        }
    }
}

impl JobConfig {
    /// Whether the job trains on GPUs: `trainer.device` `cuda`, or `auto` with
    /// `compute.gpus_per_node` above zero.
    pub fn runs_on_gpu(&self) -> bool {
        match self.trainer.device {
            Device::Cuda => true,
            Device::Cpu => false,
            Device::Auto => self.compute.gpus_per_node > 0,
        }
    }

    /// The precision the job trains in (`auto` resolved by [`JobConfig::runs_on_gpu`]).
    pub fn precision(&self) -> Precision {
        self.trainer.precision.on(self.runs_on_gpu())
    }
}
