//! The estimate in words: the per-job table of `flotilla plan --memory`, its JSON object, and
//! the message of `flotilla run`'s refusal.

use super::{Advice, Estimate, GpuMemory, GIB};

/// `12.34 GiB`, `3.21 MiB`, `1.5 KiB` or `12 B`.
pub fn gib(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= 100.0 * GIB {
        format!("{:.1} GiB", b / GIB)
    } else if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.2} MiB", b / MIB)
    } else if bytes >= 1024 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// The table of one job, every line indented by two spaces.
pub fn table(est: &Estimate, advice: &[Advice]) -> String {
    let mut s = String::new();
    let nodes = est.world_size / est.ranks_per_node.max(1);
    s.push_str(&format!(
        "  {} rank{} ({} node{} x {}), {}, {}, micro batch {} x {} tokens, {} accumulation step{}{}\n",
        est.world_size,
        plural(est.world_size),
        nodes,
        plural(nodes),
        est.ranks_per_node,
        est.strategy,
        est.precision,
        est.micro_batch_size,
        est.seq_len,
        est.accumulation_steps,
        plural(est.accumulation_steps),
        if est.activation_checkpointing {
            ", activation checkpointing"
        } else {
            ""
        }
    ));
    // Term labels are indented two more than the header.
    let width = est
        .terms
        .iter()
        .chain(&est.host_terms)
        .map(|t| t.label.chars().count())
        .max()
        .unwrap_or(20)
        .max(20)
        + 2;
    let device = if est.gpu_job { "per GPU" } else { "per rank" };
    s.push_str(&format!(
        "  {:<width$}  {:>11}  {:>11}\n",
        device, "largest", "at peak"
    ));
    for t in &est.terms {
        s.push_str(&format!(
            "    {:<w$}  {:>11}  {:>11}\n",
            t.label,
            gib(t.bytes),
            if t.at_peak > 0 {
                gib(t.at_peak)
            } else {
                "-".into()
            },
            w = width - 2
        ));
    }
    s.push_str(&format!(
        "  peak {device}: {} at {}{}\n",
        gib(est.peak_bytes),
        est.peak_phase.label(),
        match (&est.gpu, est.fits) {
            (Some(g), Some(true)) => format!(
                "; fits one {} ({} GiB, {})",
                g.name,
                fmt_gib(g.bytes),
                g.source
            ),
            (Some(g), _) => format!(
                "; DOES NOT FIT one {} ({} GiB, {})",
                g.name,
                fmt_gib(g.bytes),
                g.source
            ),
            (None, _) if est.gpu_job => {
                "; GPU unknown: set compute.gpu_type or compute.gpu_mem_gb to check it".into()
            }
            (None, _) => String::new(),
        }
    ));
    s.push_str(&format!(
        "  host RAM per node: {}{}\n",
        gib(est.host_bytes_per_node),
        match est.host_limit_bytes {
            Some(limit) if est.host_bytes_per_node > limit =>
                format!("; MORE than compute.mem_gb={}", limit >> 30),
            Some(limit) => format!("; within compute.mem_gb={}", limit >> 30),
            None => String::new(),
        }
    ));
    for t in &est.host_terms {
        s.push_str(&format!(
            "    {:<w$}  {:>11}\n",
            t.label,
            gib(t.bytes),
            w = width - 2
        ));
    }
    if !advice.is_empty() {
        s.push_str("  advice (ranked):\n");
        s.push_str(&advice_lines(advice, "    "));
    }
    s
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn fmt_gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / GIB)
}

/// `1. OVERRIDES: 36.20 GiB per GPU, fits — what changes`, one per line.
pub fn advice_lines(advice: &[Advice], indent: &str) -> String {
    advice
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "{indent}{}. {}: {} per GPU, {} ({})\n",
                i + 1,
                a.overrides.join(" "),
                gib(a.peak_bytes),
                if a.fits { "fits" } else { "does not fit" },
                a.change
            )
        })
        .collect()
}

/// The JSON object of one job's estimate with its advice.
pub fn json(est: &Estimate, advice: &[Advice]) -> serde_json::Value {
    let mut v = serde_json::to_value(est).expect("the estimate serialises");
    v["advice"] = serde_json::to_value(advice).expect("advice serialises");
    v
}

/// The message of `flotilla run`'s refusal of `what` (the job).
pub fn refusal(what: &str, est: &Estimate, gpu: &GpuMemory, advice: &[Advice]) -> String {
    let largest = est
        .largest_term()
        .map(|t| format!("; the largest term is {}: {}", t.label, gib(t.at_peak)))
        .unwrap_or_default();
    let mut s = format!(
        "{what} does not fit in GPU memory: its estimated peak is {} per GPU (at {}), over the {} GiB of one {} ({}){largest}.",
        gib(est.peak_bytes),
        est.peak_phase.label(),
        fmt_gib(gpu.bytes),
        gpu.name,
        gpu.source,
    );
    if advice.is_empty() {
        s.push('\n');
    } else {
        s.push_str(" Ranked advice, each with its new estimate:\n");
        s.push_str(&advice_lines(advice, "  "));
    }
    s.push_str(
        "`flotilla plan --memory` shows every term; compute.check_memory=false starts it anyway",
    );
    s
}
