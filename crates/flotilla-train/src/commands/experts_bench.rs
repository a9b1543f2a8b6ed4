//! `flotilla bench experts`: one sparse layer's experts as grouped matrix products (one
//! `torch._grouped_mm` a projection, nothing read to the host) against one product per expert
//! (the experts' row counts read to the host), on the same routed random rows: the largest
//! differences of the outputs and gradients, and each path's forward-and-backward time. Runs on
//! a CPU or a GPU; the GPU proof runs it at a Qwen3-MoE layer's shape in bf16.

use anyhow::bail;
use tch::Kind;

use super::generate::{parse_device, parse_dtype, DeviceChoice};
use crate::model::layers::moe::compare_expert_paths;

#[derive(clap::Args, Debug)]
pub struct ExpertsBenchArgs {
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// float32, bfloat16 or float16.
    #[arg(long, default_value = "bfloat16", value_parser = parse_dtype)]
    pub dtype: Kind,
    /// Tokens routed.
    #[arg(long, default_value_t = 4096)]
    pub tokens: i64,
    #[arg(long, default_value_t = 2048)]
    pub hidden: i64,
    /// Each expert's width (`moe_intermediate_size`).
    #[arg(long, default_value_t = 768)]
    pub inter: i64,
    #[arg(long, default_value_t = 128)]
    pub experts: i64,
    /// Experts a token.
    #[arg(long, default_value_t = 8)]
    pub top_k: i64,
    /// Timed repetitions (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
}

/// Runs the comparison and prints one JSON object.
pub fn run(args: &ExpertsBenchArgs) -> anyhow::Result<()> {
    let device = match args.device.resolve() {
        Ok(d) => d,
        Err(e) => bail!("{e}"),
    };
    for (name, v) in [
        ("--tokens", args.tokens),
        ("--hidden", args.hidden),
        ("--inter", args.inter),
        ("--experts", args.experts),
        ("--top-k", args.top_k),
    ] {
        if v < 1 {
            bail!("{name} {v} must be at least 1");
        }
    }
    if args.top_k > args.experts {
        bail!(
            "--top-k {} must be at most --experts {}",
            args.top_k,
            args.experts
        );
    }
    let bytes = args.dtype.elt_size_in_bytes() as i64;
    for (name, v) in [("--hidden", args.hidden), ("--inter", args.inter)] {
        if (v * bytes) % 16 != 0 {
            bail!(
                "{name} {v}: the grouped product takes rows of a multiple of 16 bytes ({} \
                 elements in {:?})",
                16 / bytes,
                args.dtype
            );
        }
    }
    let c = compare_expert_paths(
        device,
        args.dtype,
        args.tokens,
        args.hidden,
        args.inter,
        args.experts,
        args.top_k,
        args.repeat,
    );
    println!("{}", serde_json::to_string(&c)?);
    Ok(())
}
