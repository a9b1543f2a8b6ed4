//! `flotilla bench attention`: packed attention by the sequences' bounds (flash attention's
//! variable lengths, the path packed rows take on a GPU in half precision) against the masked
//! path on the same random bf16 inputs: the largest differences of the outputs and input
//! gradients, and each path's forward-and-backward time. The GPU proof runs it as the check of
//! the CUDA-only kernel; on a CPU it is refused (the kernel is CUDA's).

use anyhow::bail;

use super::generate::{parse_device, DeviceChoice};
use crate::model::layers::varlen::compare_with_masked;

#[derive(clap::Args, Debug)]
pub struct AttentionBenchArgs {
    /// The GPU: cuda or cuda:N.
    #[arg(long, default_value = "cuda", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Packed rows.
    #[arg(long, default_value_t = 2)]
    pub rows: i64,
    /// Tokens a row.
    #[arg(long, default_value_t = 4096)]
    pub seq_len: i64,
    /// Sequences a row (cut at random points).
    #[arg(long, default_value_t = 8)]
    pub sequences: i64,
    #[arg(long, default_value_t = 32)]
    pub heads: i64,
    #[arg(long, default_value_t = 8)]
    pub kv_heads: i64,
    #[arg(long, default_value_t = 128)]
    pub head_dim: i64,
    /// A sliding window (each query sees itself and the window - 1 keys before it).
    #[arg(long)]
    pub window: Option<i64>,
    /// Timed repetitions (the best is reported).
    #[arg(long, default_value_t = 10)]
    pub repeat: usize,
}

/// Runs the comparison and prints one JSON object.
pub fn run(args: &AttentionBenchArgs) -> anyhow::Result<()> {
    let kernel = "flash attention by sequence bounds is a CUDA kernel";
    if crate::cuda::device_count() == 0 {
        bail!("{kernel}, and libtorch sees no CUDA GPU on this machine: run it where one is");
    }
    let device = match args.device.resolve() {
        Ok(d) if d.is_cuda() => d,
        Ok(_) => bail!("{kernel}: use --device cuda or cuda:N"),
        Err(e) => bail!("{e}"),
    };
    if args.sequences < 1 || args.sequences > args.seq_len {
        bail!(
            "--sequences {} must be between 1 and --seq-len {}",
            args.sequences,
            args.seq_len
        );
    }
    if args.kv_heads < 1 || args.heads % args.kv_heads != 0 {
        bail!(
            "--kv-heads {} must divide --heads {}",
            args.kv_heads,
            args.heads
        );
    }
    let c = compare_with_masked(
        device,
        args.rows,
        args.seq_len,
        args.sequences,
        args.heads,
        args.kv_heads,
        args.head_dim,
        args.window,
        args.repeat,
    );
    println!("{}", serde_json::to_string(&c)?);
    Ok(())
}
