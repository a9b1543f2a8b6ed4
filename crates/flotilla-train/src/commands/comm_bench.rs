//! `flotilla bench comm`: the collective-communication benchmark. [`run`] starts `--nprocs`
//! local ranks (copies of the current executable in a hidden worker mode:
//! `FLOTILLA_BENCH_WORKER=1` plus the torchrun variables of `flotilla_contract::rank::RankEnv`
//! on a free port), each with its share of the cores; [`worker_main`] is that worker. With
//! `--ranks-from-env` the process is itself one rank of a world another launcher started
//! (`srun -N2 --ntasks-per-node=2 flotilla bench comm --ranks-from-env`, or torchrun): the
//! way to measure across nodes. Every
//! rank times each iteration between two barriers; rank 0 takes, per iteration, the slowest
//! rank's time, and prints per size the median of those with nccl-tests' bandwidths:
//! algbw = bytes / time, busbw = algbw × 2(n−1)/n (all_reduce), × (n−1)/n (all_gather,
//! reduce_scatter), × 1 (broadcast). `bytes` is the all_reduce / broadcast buffer, the
//! all_gather output, the reduce_scatter input.

use anyhow::{bail, Context};
use flotilla_comm::comm::{Communicator, CommunicatorExt, DType, OpKind, RawOp, ReduceOp};
use flotilla_comm::cpu::{CpuComm, CpuOptions};
use flotilla_comm::nccl::{NcclComm, NcclOptions};
use flotilla_comm::store::{KvStore, Store, StoreConfig};
use flotilla_contract::rank::{discover_from_process, free_port, RankEnv};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable that turns the executable into a benchmark worker.
pub const WORKER_ENV: &str = "FLOTILLA_BENCH_WORKER";
const ARGS_ENV: &str = "FLOTILLA_BENCH_ARGS";

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum BenchBackend {
    Cpu,
    Nccl,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum BenchOp {
    #[value(name = "all_reduce", alias = "all-reduce")]
    AllReduce,
    #[value(name = "all_gather", alias = "all-gather")]
    AllGather,
    #[value(name = "reduce_scatter", alias = "reduce-scatter")]
    ReduceScatter,
    #[value(name = "broadcast")]
    Broadcast,
}

impl BenchOp {
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter => (n - 1.0) / n,
            BenchOp::Broadcast => 1.0,
        }
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum BenchDtype {
    F32,
    Bf16,
    F16,
    I64,
}

impl BenchDtype {
    fn dtype(self) -> DType {
        match self {
            BenchDtype::F32 => DType::F32,
            BenchDtype::Bf16 => DType::BF16,
            BenchDtype::F16 => DType::F16,
            BenchDtype::I64 => DType::I64,
        }
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
pub enum BenchFormat {
    Table,
    Json,
}

/// Arguments of `flotilla bench comm`.
#[derive(Debug, Clone, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct CommBenchArgs {
    /// Number of local ranks to start.
    #[arg(long, default_value_t = 2)]
    pub nprocs: usize,
    /// Communication backend.
    #[arg(long, value_enum, default_value_t = BenchBackend::Cpu)]
    pub backend: BenchBackend,
    /// Collective to time.
    #[arg(long, value_enum, default_value_t = BenchOp::AllReduce)]
    pub op: BenchOp,
    /// Buffer sizes in bytes, comma-separated; K, M, G are powers of 1024 (4K = 4096).
    #[arg(long, value_delimiter = ',', default_value = "4K,64K,1M,16M,64M")]
    pub sizes: Vec<String>,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed iterations per size before timing.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Element type.
    #[arg(long, value_enum, default_value_t = BenchDtype::F32)]
    pub dtype: BenchDtype,
    /// Output format.
    #[arg(long, value_enum, default_value_t = BenchFormat::Table)]
    pub format: BenchFormat,
    /// Communication timeout in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout_s: u64,
    /// Be one rank of a world that a launcher started (srun's SLURM_PROCID and friends, or
    /// torchrun's RANK/WORLD_SIZE/MASTER_ADDR) instead of starting --nprocs local ranks: e.g.
    /// `srun -N2 --ntasks-per-node=1 flotilla bench comm --ranks-from-env` across two nodes.
    #[arg(long)]
    #[serde(default)]
    pub ranks_from_env: bool,
}

/// One line of the results.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BenchResult {
    pub op: String,
    pub bytes: usize,
    pub time_s: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
}

/// Parses `4096`, `4K`, `4KiB`, `1M`, `2G` (powers of 1024).
pub fn parse_size(s: &str) -> anyhow::Result<usize> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: usize = num.parse().with_context(|| format!("bad size `{s}`"))?;
    let mult: usize = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => bail!("bad size `{s}` (expected e.g. 4096, 4K, 1M, 1G)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("size `{s}` too large"))
}

/// Elements per rank-shard (`count` of the RawOp) and actual bytes for a requested size.
fn shape(op: BenchOp, bytes: usize, elem: usize, n: usize) -> (usize, usize) {
    match op {
        BenchOp::AllReduce | BenchOp::Broadcast => {
            let count = (bytes / elem).max(1);
            (count, count * elem)
        }
        BenchOp::AllGather | BenchOp::ReduceScatter => {
            let k = (bytes / (elem * n)).max(1);
            (k, k * n * elem)
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Bandwidths of one size from each rank's per-iteration times.
pub fn summarize(op: BenchOp, bytes: usize, n: usize, per_rank: &[Vec<f64>]) -> BenchResult {
    let iters = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    let mut slowest: Vec<f64> = (0..iters)
        .map(|i| per_rank.iter().map(|t| t[i]).fold(0.0, f64::max))
        .collect();
    let time_s = if slowest.is_empty() {
        f64::NAN
    } else {
        median(&mut slowest)
    };
    let algbw = bytes as f64 / time_s / 1e9;
    BenchResult {
        op: op.name().into(),
        bytes,
        time_s,
        algbw_gbps: algbw,
        busbw_gbps: algbw * op.bus_factor(n),
    }
}

/// Starts `args.nprocs` workers, waits for them, and fails if any fails (killing the rest).
pub fn run(args: &CommBenchArgs) -> anyhow::Result<()> {
    if args.nprocs == 0 {
        bail!("--nprocs must be at least 1");
    }
    if args.iters == 0 {
        bail!("--iters must be at least 1");
    }
    for s in &args.sizes {
        parse_size(s)?;
    }
    if args.ranks_from_env {
        return worker(args);
    }
    let exe = std::env::current_exe().context("locating the flotilla executable")?;
    let port = free_port().context("finding a free port for MASTER_PORT")?;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads = (cores / args.nprocs).max(1);
    let encoded = serde_json::to_string(args)?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..args.nprocs {
        let mut env = RankEnv::on_this_host(rank, 1, args.nprocs, port);
        env.threads = Some(threads);
        if args.backend == BenchBackend::Nccl {
            env.visible_devices = Some(gpu_for(
                rank,
                std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            )?);
        }
        let mut cmd = Command::new(&exe);
        cmd.env(WORKER_ENV, "1")
            .env(ARGS_ENV, &encoded)
            .envs(env.vars())
            .stdin(Stdio::null());
        if rank != 0 {
            cmd.stdout(Stdio::null());
        }
        match cmd.spawn() {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                kill_all(&mut children);
                return Err(e)
                    .with_context(|| format!("starting bench rank {rank} ({})", exe.display()));
            }
        }
    }
    let mut failure: Option<String> = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() && failure.is_none() {
                        failure = Some(format!("bench rank {rank} failed ({status})"));
                    }
                }
                Ok(None) => i += 1,
                Err(e) => {
                    failure.get_or_insert(format!("waiting for rank {}: {e}", children[i].0));
                    i += 1;
                }
            }
        }
        if failure.is_some() {
            kill_all(&mut children);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match failure {
        Some(f) => bail!(f),
        None => Ok(()),
    }
}

/// The device a local rank gets: the rank-th entry of an inherited `CUDA_VISIBLE_DEVICES`,
/// else the rank itself.
fn gpu_for(rank: usize, visible: Option<&str>) -> anyhow::Result<String> {
    match visible.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(rank.to_string()),
        Some(v) => {
            let ids: Vec<&str> = v.split(',').map(str::trim).collect();
            match ids.get(rank) {
                Some(id) => Ok(id.to_string()),
                None => bail!(
                    "--nprocs {} needs more GPUs than CUDA_VISIBLE_DEVICES={v} lists",
                    rank + 1
                ),
            }
        }
    }
}

fn kill_all(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
    children.clear();
}

/// The hidden worker mode (call from `main` when [`WORKER_ENV`] is set).
pub fn worker_main() -> anyhow::Result<()> {
    let args: CommBenchArgs =
        serde_json::from_str(&std::env::var(ARGS_ENV).context("FLOTILLA_BENCH_ARGS is not set")?)?;
    worker(&args)
}

/// One rank of the benchmark, its place in the world read from the environment.
fn worker(args: &CommBenchArgs) -> anyhow::Result<()> {
    let args = args.clone();
    let info = discover_from_process().context("reading the rank from the environment")?;
    let (rank, world, local_rank) = (info.rank, info.world_size, info.local_rank);
    let host = info.master_addr.clone();
    let timeout = Duration::from_secs(args.timeout_s);
    let cfg = StoreConfig::from_rank_info(&info, "bench-comm", timeout);
    let store: Arc<dyn KvStore> =
        Arc::new(Store::connect(&cfg).context("connecting to the rendezvous store")?);
    let dtype = args.dtype.dtype();
    let elem = dtype.size();
    let mut results = Vec::new();
    match args.backend {
        BenchBackend::Cpu => {
            let opts = CpuOptions {
                timeout,
                route_to: Some(host),
                ..CpuOptions::default()
            };
            let comm = CpuComm::new(store.clone(), opts)?;
            for (i, s) in args.sizes.iter().enumerate() {
                let (count, bytes) = shape(args.op, parse_size(s)?, elem, world);
                let (send_len, recv_len) = lens(args.op, count, world);
                let mut send = host_buffer(send_len * elem, dtype);
                let mut recv = host_buffer(recv_len * elem, dtype);
                let raw = raw_op(
                    args.op,
                    dtype,
                    send.as_mut_ptr() as *mut u8,
                    recv.as_mut_ptr() as *mut u8,
                    count,
                );
                let times = time_op(&comm, raw, &args)?;
                results.push(gather(
                    store.as_ref(),
                    i,
                    rank,
                    world,
                    args.op,
                    bytes,
                    &times,
                )?);
            }
        }
        BenchBackend::Nccl => {
            let comm = NcclComm::new(
                store.clone(),
                &NcclOptions {
                    timeout,
                    local_rank,
                },
            )?;
            for (i, s) in args.sizes.iter().enumerate() {
                let (count, bytes) = shape(args.op, parse_size(s)?, elem, world);
                let (send_len, recv_len) = lens(args.op, count, world);
                let send = comm.alloc(send_len * elem)?;
                let recv = comm.alloc(recv_len * elem)?;
                let raw = raw_op(args.op, dtype, send.ptr(), recv.ptr(), count);
                let times = time_op(&comm, raw, &args)?;
                results.push(gather(
                    store.as_ref(),
                    i,
                    rank,
                    world,
                    args.op,
                    bytes,
                    &times,
                )?);
            }
        }
    }
    if rank == 0 {
        print_results(
            &args,
            world,
            &results.into_iter().flatten().collect::<Vec<_>>(),
        );
    }
    Ok(())
}

fn lens(op: BenchOp, count: usize, n: usize) -> (usize, usize) {
    match op {
        BenchOp::AllReduce | BenchOp::Broadcast => (count, count),
        BenchOp::AllGather => (count, count * n),
        BenchOp::ReduceScatter => (count * n, count),
    }
}

/// A host buffer of `bytes` filled with ones of `dtype` (8-byte aligned).
fn host_buffer(bytes: usize, dtype: DType) -> Vec<u64> {
    let word: u64 = match dtype {
        DType::F32 => 0x3f80_0000_3f80_0000,
        DType::BF16 => 0x3f80_3f80_3f80_3f80,
        DType::F16 => 0x3c00_3c00_3c00_3c00,
        DType::I64 => 1,
    };
    vec![word; bytes.div_ceil(8).max(1)]
}

fn raw_op(op: BenchOp, dtype: DType, send: *mut u8, recv: *mut u8, count: usize) -> RawOp {
    let (kind, send) = match op {
        BenchOp::AllReduce => (OpKind::AllReduce(ReduceOp::Sum), recv),
        BenchOp::Broadcast => (OpKind::Broadcast { root: 0 }, recv),
        BenchOp::AllGather => (OpKind::AllGather, send),
        BenchOp::ReduceScatter => (OpKind::ReduceScatter(ReduceOp::Sum), send),
    };
    RawOp {
        kind,
        dtype,
        send,
        recv,
        count,
    }
}

fn time_op(comm: &dyn Communicator, raw: RawOp, args: &CommBenchArgs) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        comm.barrier()?;
        let t0 = Instant::now();
        // SAFETY: the buffers of `raw` live in the caller for the whole loop and are not
        // touched while the operation runs (we wait right away).
        unsafe { comm.submit(raw) }?.wait()?;
        comm.synchronize()?;
        let dt = t0.elapsed().as_secs_f64();
        if i >= args.warmup {
            times.push(dt);
        }
    }
    Ok(times)
}

/// Rank 0 collects every rank's times for size `i` through the store and summarises them.
fn gather(
    store: &dyn KvStore,
    i: usize,
    rank: usize,
    world: usize,
    op: BenchOp,
    bytes: usize,
    times: &[f64],
) -> anyhow::Result<Option<BenchResult>> {
    store.set(
        &format!("bench/{i}/{rank}"),
        serde_json::to_string(times)?.as_bytes(),
    )?;
    if rank != 0 {
        return Ok(None);
    }
    let mut per_rank = Vec::with_capacity(world);
    for r in 0..world {
        let v = store.get(&format!("bench/{i}/{r}"))?;
        per_rank.push(serde_json::from_slice::<Vec<f64>>(&v)?);
    }
    Ok(Some(summarize(op, bytes, world, &per_rank)))
}

fn print_results(args: &CommBenchArgs, world: usize, results: &[BenchResult]) {
    match args.format {
        BenchFormat::Json => {
            let v = serde_json::json!({
                "backend": match args.backend { BenchBackend::Cpu => "cpu", BenchBackend::Nccl => "nccl" },
                "nprocs": world,
                "dtype": args.dtype.dtype().name(),
                "iters": args.iters,
                "results": results,
            });
            println!("{v}");
        }
        BenchFormat::Table => {
            println!(
                "# flotilla bench comm: {} backend={} nprocs={world} dtype={} iters={} (median over iterations of the slowest rank)",
                args.op.name(),
                match args.backend {
                    BenchBackend::Cpu => "cpu",
                    BenchBackend::Nccl => "nccl",
                },
                args.dtype.dtype().name(),
                args.iters
            );
            println!(
                "{:>14} {:>12} {:>12} {:>12}",
                "bytes", "time_us", "algbw_GB/s", "busbw_GB/s"
            );
            for r in results {
                println!(
                    "{:>14} {:>12.1} {:>12.3} {:>12.3}",
                    r.bytes,
                    r.time_s * 1e6,
                    r.algbw_gbps,
                    r.busbw_gbps
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size(" 2g").unwrap(), 2 << 30);
        assert!(parse_size("4X").is_err());
        assert!(parse_size("K").is_err());
    }

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.bus_factor(2), 1.0);
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
        let r = summarize(
            BenchOp::AllReduce,
            1_000_000,
            4,
            &[vec![1e-3, 3e-3, 2e-3], vec![2e-3, 1e-3, 4e-3]],
        );
        // Slowest per iteration: 2, 3, 4 ms -> median 3 ms.
        assert!((r.time_s - 3e-3).abs() < 1e-12);
        assert!((r.algbw_gbps - 1e6 / 3e-3 / 1e9).abs() < 1e-9);
        assert!((r.busbw_gbps - r.algbw_gbps * 1.5).abs() < 1e-9);
    }

    #[test]
    fn shapes_fit_the_group() {
        assert_eq!(shape(BenchOp::AllReduce, 4096, 4, 3), (1024, 4096));
        assert_eq!(shape(BenchOp::AllGather, 4096, 4, 3), (341, 4092));
        assert_eq!(shape(BenchOp::ReduceScatter, 4, 4, 2), (1, 8));
        assert_eq!(lens(BenchOp::ReduceScatter, 5, 3), (15, 5));
    }

    #[test]
    fn gpus_follow_the_inherited_visible_devices() {
        assert_eq!(gpu_for(1, None).unwrap(), "1");
        assert_eq!(gpu_for(1, Some("4,5")).unwrap(), "5");
        assert!(gpu_for(2, Some("4,5")).is_err());
    }

    #[test]
    fn args_flatten_into_a_cli() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: CommBenchArgs,
        }
        let c = Cli::parse_from([
            "x",
            "--nprocs",
            "3",
            "--op",
            "reduce_scatter",
            "--sizes",
            "4K,1M",
            "--format",
            "json",
        ]);
        assert_eq!(c.args.nprocs, 3);
        assert_eq!(c.args.op, BenchOp::ReduceScatter);
        assert_eq!(c.args.sizes, vec!["4K", "1M"]);
        assert_eq!(c.args.format, BenchFormat::Json);
        let back: CommBenchArgs =
            serde_json::from_str(&serde_json::to_string(&c.args).unwrap()).unwrap();
        assert_eq!(back.sizes, c.args.sizes);
        assert!(!c.args.ranks_from_env);
        let c = Cli::parse_from(["x", "--ranks-from-env"]);
        assert!(c.args.ranks_from_env);
        // Arguments encoded without the flag (an older parent) read as local ranks.
        let mut v = serde_json::to_value(&c.args).unwrap();
        v.as_object_mut().unwrap().remove("ranks_from_env");
        let back: CommBenchArgs = serde_json::from_value(v).unwrap();
        assert!(!back.ranks_from_env);
    }
}
