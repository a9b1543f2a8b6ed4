//! The GPU a job's ranks get, as the fit check measures it: `compute.gpu_mem_gb` (GiB), else
//! `compute.gpu_type` looked up in the schema's GPU table (`flotilla_config::schema::
//! GPU_MODELS`, which validation checks names against), else a `compute.constraint` that names a
//! GPU of the table (SLURM features often do, e.g. `constraint=h100`), else unknown.

use flotilla_config::schema::{gpu_model, ComputeConfig};
use serde::Serialize;

/// The memory of one of a job's GPUs and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuMemory {
    /// Bytes one process can allocate on it at most.
    pub bytes: u64,
    /// The GPU (`NVIDIA H100 SXM/PCIe (80 GB)`), or `80 GiB` for a bare size.
    pub name: String,
    /// The setting it came from, as `key=value`.
    pub source: String,
}

/// The GPU of a job's `compute` section, when the config says which.
pub fn job_gpu(compute: &ComputeConfig) -> Option<GpuMemory> {
    if let Some(gb) = compute.gpu_mem_gb {
        return Some(GpuMemory {
            bytes: (gb * (1u64 << 30) as f64) as u64,
            name: format!("{gb} GiB GPU"),
            source: format!("compute.gpu_mem_gb={gb}"),
        });
    }
    let named = |key: &str, value: &str| {
        gpu_model(value).map(|g| GpuMemory {
            bytes: g.bytes(),
            name: g.label.to_string(),
            source: format!("compute.{key}={value}"),
        })
    };
    if let Some(t) = &compute.gpu_type {
        return named("gpu_type", t);
    }
    compute
        .constraint
        .as_deref()
        .and_then(|c| named("constraint", c))
}
