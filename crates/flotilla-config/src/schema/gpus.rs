//! The GPU models `compute.gpu_type` may name, each with the memory one process sees on it.
//! The schema checks a `gpu_type` against this table (an unknown name is a problem with its
//! near misses); `flotilla-launch`'s memory estimate (`memory/gpu.rs`) measures a job against
//! the memory it gives.

/// One GPU model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuModel {
    /// The name `compute.gpu_type` takes (matched case-insensitively).
    pub name: &'static str,
    /// Total memory as `nvidia-smi` reports it, in MiB: what the CUDA driver can hand out
    /// (ECC and the firmware's share already taken off the nominal figure).
    pub mib: u64,
    /// The marketing name and nominal memory, for messages.
    pub label: &'static str,
}

impl GpuModel {
    /// Total memory in bytes.
    pub fn bytes(&self) -> u64 {
        self.mib << 20
    }
}

const fn gpu(name: &'static str, mib: u64, label: &'static str) -> GpuModel {
    GpuModel { name, mib, label }
}

/// Common data-centre and workstation GPUs, largest first within a family.
pub const GPU_MODELS: &[GpuModel] = &[
    gpu("b200", 183_359, "NVIDIA B200 (192 GB)"),
    gpu("h200", 143_771, "NVIDIA H200 (141 GB)"),
    gpu("gh200", 97_871, "NVIDIA GH200 (96 GB)"),
    gpu("h100-nvl", 95_830, "NVIDIA H100 NVL (94 GB)"),
    gpu("h100", 81_559, "NVIDIA H100 SXM/PCIe (80 GB)"),
    gpu("a100-80gb", 81_920, "NVIDIA A100 (80 GB)"),
    gpu("a100-40gb", 40_960, "NVIDIA A100 (40 GB)"),
    gpu("l40s", 46_068, "NVIDIA L40S (48 GB)"),
    gpu("l40", 46_068, "NVIDIA L40 (48 GB)"),
    gpu("rtx6000-ada", 49_140, "NVIDIA RTX 6000 Ada (48 GB)"),
    gpu("a6000", 49_140, "NVIDIA RTX A6000 (48 GB)"),
    gpu("a10g", 23_028, "NVIDIA A10G (24 GB)"),
    gpu("a10", 23_028, "NVIDIA A10 (24 GB)"),
    gpu("l4", 23_034, "NVIDIA L4 (24 GB)"),
    gpu("rtx4090", 24_564, "NVIDIA GeForce RTX 4090 (24 GB)"),
    gpu("v100-32gb", 32_768, "NVIDIA V100 (32 GB)"),
    gpu("v100-16gb", 16_384, "NVIDIA V100 (16 GB)"),
    gpu("t4", 15_360, "NVIDIA T4 (16 GB)"),
];

/// The model `name` names (case-insensitively), if the table has it.
pub fn gpu_model(name: &str) -> Option<&'static GpuModel> {
    GPU_MODELS
        .iter()
        .find(|g| g.name.eq_ignore_ascii_case(name.trim()))
}

/// Every name of the table, in table order.
pub fn gpu_names() -> Vec<&'static str> {
    GPU_MODELS.iter().map(|g| g.name).collect()
}
