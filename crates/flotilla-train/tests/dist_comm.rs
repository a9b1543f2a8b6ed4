//! Multi-process tests of the collective-communication layer (`dist::comm` with the CPU/TCP
//! backend) on localhost. Each test starts a world (tests/common/world.rs) of copies of this
//! test binary as ranks: the copies run the `#[ignore]`d `worker` test (`--exact worker
//! --include-ignored`), which does nothing unless `FLOTILLA_TEST_SCENARIO` names a scenario.
//! Every rank checks its results against a naive computation; the parent waits on every child
//! within a deadline (killing all on expiry) and asserts on exit codes and output. Failure tests check that when a rank
//! exits, is killed or goes silent mid-collective, every other rank gets an error naming a
//! peer within the configured timeout (a few seconds here), and that nothing hangs.

#[path = "../../../tests/common/world.rs"]
mod world;

use flotilla_comm::comm::{CommError, Communicator, CommunicatorExt, Element, ReduceOp, Work};
use flotilla_comm::cpu::{CpuComm, CpuOptions};
use flotilla_comm::store::{KvStore, MemoryStore, Store, StoreConfig};
use flotilla_train::parallel::tensor_comm::TensorCollectives;
use half::{bf16, f16};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use world::{Finished, Shape, World};

const SCENARIO_ENV: &str = "FLOTILLA_TEST_SCENARIO";

// ---------------------------------------------------------------------------------------------
// Parent side: start ranks (tests/common/world.rs), wait for them

/// `size` ranks of this test binary's `worker` playing `scenario`, with collectives timing
/// out after `timeout_ms`.
fn spawn_world(scenario: &str, size: usize, timeout_ms: u64) -> World {
    World::spawn(scenario, Shape::single_node(size), None, |_| {
        let mut c = world::test_worker("worker");
        c.env(SCENARIO_ENV, scenario)
            .env("FLOTILLA_TEST_TIMEOUT_MS", timeout_ms.to_string());
        c
    })
}

/// Runs `scenario` on `size` ranks and requires every rank to succeed.
fn run_ok(scenario: &str, size: usize, limit: Duration) {
    let done = spawn_world(scenario, size, 60_000).wait(limit);
    for (rank, (status, log)) in done.statuses.iter().zip(&done.logs).enumerate() {
        assert!(
            status.success(),
            "rank {rank} of {scenario} failed ({status}):\n{log}"
        );
        assert!(
            log.contains("SCENARIO OK"),
            "rank {rank} did not finish:\n{log}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Worker side

/// The re-executed rank. Does nothing in a normal test run.
#[test]
#[ignore = "run by the multi-process tests as a worker"]
fn worker() {
    let Ok(scenario) = std::env::var(SCENARIO_ENV) else {
        return;
    };
    let code = match run_scenario(&scenario) {
        Ok(()) => {
            println!("SCENARIO OK");
            0
        }
        Err(e) => {
            eprintln!("SCENARIO FAILED: {e}");
            1
        }
    };
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

type R<T = ()> = Result<T, String>;

struct Env {
    rank: usize,
    world: usize,
    timeout: Duration,
    store: Arc<dyn KvStore>,
}

fn env_usize(k: &str) -> usize {
    std::env::var(k).unwrap().parse().unwrap()
}

fn setup() -> R<Env> {
    let rank = env_usize("RANK");
    let world = env_usize("WORLD_SIZE");
    let timeout = Duration::from_millis(env_usize("FLOTILLA_TEST_TIMEOUT_MS") as u64);
    let cfg = StoreConfig {
        host: "127.0.0.1".into(),
        port: env_usize("MASTER_PORT") as u16,
        rank,
        world_size: world,
        run_id: "dist-comm-test".into(),
        timeout: Duration::from_secs(60),
        bind_addr: None,
    };
    let store = Store::connect(&cfg).map_err(|e| format!("store: {e}"))?;
    Ok(Env {
        rank,
        world,
        timeout,
        store: Arc::new(store),
    })
}

fn comm(env: &Env, chunk_bytes: Option<usize>, small_bytes: Option<usize>) -> R<CpuComm> {
    let mut o = CpuOptions {
        timeout: env.timeout,
        route_to: Some("127.0.0.1".into()),
        ..CpuOptions::default()
    };
    if let Some(c) = chunk_bytes {
        o.chunk_bytes = c;
    }
    if let Some(s) = small_bytes {
        o.small_bytes = s;
    }
    CpuComm::new(env.store.clone(), o).map_err(|e| format!("creating the communicator: {e}"))
}

fn run_scenario(name: &str) -> R {
    let env = setup()?;
    match name {
        "matrix" => scenario_matrix(&env),
        "big" => scenario_big(&env),
        "many_small" => scenario_many_small(&env),
        "async" => scenario_async(&env),
        "split" => scenario_split(&env),
        "tensors" => scenario_tensors(&env),
        "exit_mid" => scenario_exit_mid(&env),
        "killed" => scenario_killed(&env),
        "silent" => scenario_silent(&env),
        other => Err(format!("unknown scenario {other}")),
    }
}

fn ok<T>(r: Result<T, CommError>, what: &str) -> R<T> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Element types under test, with exact conversions for the small integers used as data.
trait TestElem: Element + Debug + PartialEq {
    fn from_i64(v: i64) -> Self;
    fn to_f64(self) -> f64;
    /// Relative tolerance of an average (a division is not exact).
    const AVG_TOL: f64;
}

impl TestElem for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const AVG_TOL: f64 = 1e-6;
}
impl TestElem for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    const AVG_TOL: f64 = 1.0 / 128.0;
}
impl TestElem for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    const AVG_TOL: f64 = 1.0 / 1024.0;
}
impl TestElem for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const AVG_TOL: f64 = 0.0;
}

/// Input value of `rank` at index `i`: small integers in [-8, 8], exact in every dtype and
/// in every sum of up to four of them, so any reduction order gives the same bits.
fn val(rank: usize, i: usize, salt: usize) -> i64 {
    ((rank * 7 + i * 13 + salt * 3 + (i >> 7) * 5) % 17) as i64 - 8
}

fn naive(op: ReduceOp, vals: impl Iterator<Item = i64>, n: usize) -> f64 {
    let v: Vec<i64> = vals.collect();
    match op {
        ReduceOp::Sum => v.iter().sum::<i64>() as f64,
        ReduceOp::Max => *v.iter().max().unwrap() as f64,
        ReduceOp::Min => *v.iter().min().unwrap() as f64,
        ReduceOp::Avg => v.iter().sum::<i64>() as f64 / n as f64,
    }
}

fn check_value<T: TestElem>(what: &str, i: usize, got: T, op: ReduceOp, exact: f64) -> R {
    let g = got.to_f64();
    let good = if op == ReduceOp::Avg {
        if T::AVG_TOL == 0.0 {
            g == exact.trunc() // i64: integer division
        } else {
            (g - exact).abs() <= T::AVG_TOL * exact.abs().max(1.0)
        }
    } else {
        g == exact
    };
    if good {
        Ok(())
    } else {
        Err(format!("{what}: element {i} is {got:?}, expected {exact}"))
    }
}

fn matrix_for<T: TestElem>(c: &dyn Communicator, lens: &[usize], salt: usize) -> R {
    let (r, n) = (c.rank(), c.world_size());
    let dt = T::DTYPE;
    for &len in lens {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min] {
            if dt == flotilla_comm::comm::DType::I64 && op == ReduceOp::Avg && len > 1000 {
                continue; // integer average is covered by the short lengths
            }
            let what = format!("all_reduce {op:?} {dt} len {len}");
            let mut buf: Vec<T> = (0..len).map(|i| T::from_i64(val(r, i, salt))).collect();
            ok(c.all_reduce(&mut buf, op).and_then(Work::wait), &what)?;
            for (i, &g) in buf.iter().enumerate() {
                check_value(
                    &what,
                    i,
                    g,
                    op,
                    naive(op, (0..n).map(|q| val(q, i, salt)), n),
                )?;
            }
        }
        // reduce_scatter with shards of `len`, out of place and in place.
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            let input: Vec<T> = (0..n * len)
                .map(|j| T::from_i64(val(r, j, salt + 1)))
                .collect();
            let mut out = vec![T::from_i64(0); len];
            let what = format!("reduce_scatter {op:?} {dt} shard {len}");
            ok(
                c.reduce_scatter(&input, &mut out, op).and_then(Work::wait),
                &what,
            )?;
            let mut inplace = input.clone();
            ok(
                c.reduce_scatter_in_place(&mut inplace, op)
                    .and_then(Work::wait),
                &what,
            )?;
            for i in 0..len {
                let exact = naive(op, (0..n).map(|q| val(q, r * len + i, salt + 1)), n);
                check_value(&what, i, out[i], op, exact)?;
                check_value(
                    &format!("{what} (in place)"),
                    i,
                    inplace[r * len + i],
                    op,
                    exact,
                )?;
            }
        }
        // all_gather, out of place and in place.
        let input: Vec<T> = (0..len).map(|i| T::from_i64(val(r, i, salt + 2))).collect();
        let mut out = vec![T::from_i64(99); n * len];
        let what = format!("all_gather {dt} shard {len}");
        ok(c.all_gather(&input, &mut out).and_then(Work::wait), &what)?;
        let mut inplace = vec![T::from_i64(99); n * len];
        inplace[r * len..(r + 1) * len].copy_from_slice(&input);
        ok(
            c.all_gather_in_place(&mut inplace).and_then(Work::wait),
            &what,
        )?;
        for q in 0..n {
            for i in 0..len {
                let exact = val(q, i, salt + 2) as f64;
                check_value(&what, q * len + i, out[q * len + i], ReduceOp::Sum, exact)?;
                check_value(
                    &format!("{what} (in place)"),
                    q * len + i,
                    inplace[q * len + i],
                    ReduceOp::Sum,
                    exact,
                )?;
            }
        }
        // broadcast from every root.
        for root in 0..n {
            let mut buf: Vec<T> = (0..len).map(|i| T::from_i64(val(r, i, salt + 3))).collect();
            let what = format!("broadcast {dt} len {len} root {root}");
            ok(c.broadcast(&mut buf, root).and_then(Work::wait), &what)?;
            for (i, &g) in buf.iter().enumerate() {
                check_value(&what, i, g, ReduceOp::Sum, val(root, i, salt + 3) as f64)?;
            }
        }
    }
    Ok(())
}

/// Random (non-integer) f32 data: every rank must end with the same bits.
fn identical_on_all_ranks(c: &dyn Communicator, len: usize) -> R {
    let r = c.rank();
    let mut s = 0x9e37_79b9u32.wrapping_mul(r as u32 + 1);
    let mut buf: Vec<f32> = (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect();
    ok(
        c.all_reduce(&mut buf, ReduceOp::Sum).and_then(Work::wait),
        "all_reduce random",
    )?;
    let h = buf.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mine = [h as i64];
    let mut all = vec![0i64; c.world_size()];
    ok(
        c.all_gather(&mine, &mut all).and_then(Work::wait),
        "all_gather hash",
    )?;
    if all.iter().any(|&x| x != all[0]) {
        return Err(format!(
            "ranks disagree on the bits of a float all_reduce (len {len}): {all:?}"
        ));
    }
    Ok(())
}

fn scenario_matrix(env: &Env) -> R {
    // Lengths straddle the small-buffer threshold, the chunk size and the world size.
    let lens = [1usize, 2, 3, 5, 17, 1000, 4099, 65537, 200_003];
    // Default options, then tiny chunks and no small path, so the pipelined rings run with
    // many chunks and uneven segments even for short buffers.
    let variants = [(None, None), (Some(4096), Some(0))];
    for (vi, (chunk, small)) in variants.into_iter().enumerate() {
        let c = comm(env, chunk, small)?;
        let salt = vi * 10;
        matrix_for::<f32>(&c, &lens, salt)?;
        matrix_for::<bf16>(&c, &lens[..8], salt)?;
        matrix_for::<f16>(&c, &lens[..8], salt)?;
        matrix_for::<i64>(&c, &lens[..8], salt)?;
        for len in [1, 7, 4099, 100_001] {
            identical_on_all_ranks(&c, len)?;
        }
        ok(c.barrier(), "barrier")?;
    }
    Ok(())
}

fn scenario_big(env: &Env) -> R {
    let c = comm(env, None, None)?;
    let len = (256usize << 20) / 4;
    let r = env.rank as f32 + 1.0;
    let mut buf: Vec<f32> = (0..len).map(|i| (i % 251) as f32 * r).collect();
    let t = Instant::now();
    ok(
        c.all_reduce(&mut buf, ReduceOp::Sum).and_then(Work::wait),
        "256 MiB all_reduce",
    )?;
    let dt = t.elapsed();
    let n = env.world as f32;
    let factor = n * (n + 1.0) / 2.0;
    if let Some((i, g)) = buf
        .iter()
        .enumerate()
        .find(|(i, &g)| g != (i % 251) as f32 * factor)
    {
        return Err(format!(
            "256 MiB all_reduce: element {i} is {g}, expected {}",
            (i % 251) as f32 * factor
        ));
    }
    println!("256 MiB all_reduce took {dt:?}");
    Ok(())
}

fn scenario_many_small(env: &Env) -> R {
    let c = comm(env, None, None)?;
    let (r, n) = (env.rank, env.world);
    for it in 0..1500usize {
        let len = 1 + it % 8;
        let mut a: Vec<i64> = (0..len).map(|i| (r * 1000 + i + it) as i64).collect();
        ok(
            c.all_reduce(&mut a, ReduceOp::Sum).and_then(Work::wait),
            "small all_reduce",
        )?;
        for (i, &g) in a.iter().enumerate() {
            let want: i64 = (0..n).map(|q| (q * 1000 + i + it) as i64).sum();
            if g != want {
                return Err(format!(
                    "iteration {it}: element {i} is {g}, expected {want}"
                ));
            }
        }
        let root = it % n;
        let mut b = [r as f32, it as f32];
        ok(
            c.broadcast(&mut b, root).and_then(Work::wait),
            "small broadcast",
        )?;
        if b != [root as f32, it as f32] {
            return Err(format!("iteration {it}: broadcast gave {b:?}"));
        }
        if it % 100 == 0 {
            ok(c.barrier(), "barrier")?;
        }
    }
    Ok(())
}

fn scenario_async(env: &Env) -> R {
    let c = comm(env, Some(64 << 10), None)?;
    let (r, n) = (env.rank, env.world);
    let big_len = 1_000_003;
    let mut big: Vec<f32> = (0..big_len).map(|i| val(r, i, 0) as f32).collect();
    let mut small: Vec<i64> = vec![r as i64 + 1; 3];
    let shard: Vec<bf16> = (0..5000)
        .map(|i| bf16::from_f32(val(r, i, 1) as f32))
        .collect();
    let mut gathered = vec![bf16::ZERO; n * 5000];
    let rs_in: Vec<f32> = (0..n * 7777).map(|i| val(r, i, 2) as f32).collect();
    let mut rs_out = vec![0f32; 7777];
    let mut bc: Vec<f16> = (0..70_001)
        .map(|i| f16::from_f32(val(r, i, 3) as f32))
        .collect();

    // Five collectives in flight at once; compute while they run; wait in reverse order.
    let w1 = ok(c.all_reduce(&mut big, ReduceOp::Sum), "submit all_reduce")?;
    let w2 = ok(
        c.all_reduce(&mut small, ReduceOp::Max),
        "submit small all_reduce",
    )?;
    let w3 = ok(c.all_gather(&shard, &mut gathered), "submit all_gather")?;
    let w4 = ok(
        c.reduce_scatter(&rs_in, &mut rs_out, ReduceOp::Sum),
        "submit reduce_scatter",
    )?;
    let w5 = ok(c.broadcast(&mut bc, n - 1), "submit broadcast")?;
    let mut x = 0u64;
    for i in 0..2_000_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    std::hint::black_box(x);
    ok(w5.wait(), "broadcast")?;
    // Operations complete in submission order: the last one done means all are.
    for (k, w) in [&w1, &w2, &w3, &w4].iter().enumerate() {
        if !w.is_completed() {
            return Err(format!("operation {k} not complete after a later one"));
        }
    }
    ok(w4.wait(), "reduce_scatter")?;
    ok(w3.wait(), "all_gather")?;
    ok(w2.wait(), "small all_reduce")?;
    ok(w1.wait(), "all_reduce")?;

    for (i, &g) in big.iter().enumerate() {
        check_value(
            "async all_reduce",
            i,
            g,
            ReduceOp::Sum,
            naive(ReduceOp::Sum, (0..n).map(|q| val(q, i, 0)), n),
        )?;
    }
    if small != vec![n as i64; 3] {
        return Err(format!("async max: {small:?}"));
    }
    for q in 0..n {
        for i in 0..5000 {
            check_value(
                "async all_gather",
                i,
                gathered[q * 5000 + i],
                ReduceOp::Sum,
                val(q, i, 1) as f64,
            )?;
        }
    }
    for (i, &g) in rs_out.iter().enumerate() {
        let exact = naive(ReduceOp::Sum, (0..n).map(|q| val(q, r * 7777 + i, 2)), n);
        check_value("async reduce_scatter", i, g, ReduceOp::Sum, exact)?;
    }
    for (i, &g) in bc.iter().enumerate() {
        check_value(
            "async broadcast",
            i,
            g,
            ReduceOp::Sum,
            val(n - 1, i, 3) as f64,
        )?;
    }
    // Dropping an unwaited Work waits for it.
    let mut v = vec![1f32; 100_000];
    drop(ok(c.all_reduce(&mut v, ReduceOp::Sum), "submit")?);
    if v.iter().any(|&x| x != n as f32) {
        return Err("dropped Work did not complete its all_reduce".into());
    }
    Ok(())
}

fn scenario_split(env: &Env) -> R {
    let c = comm(env, Some(8192), Some(1024))?;
    let (r, n) = (env.rank, env.world);
    let local = 2;
    let (intra, inter) = ok(c.split_hybrid(local), "split_hybrid")?;
    if intra.world_size() != local || intra.rank() != r % local {
        return Err(format!(
            "intra group: rank {} of {}",
            intra.rank(),
            intra.world_size()
        ));
    }
    if inter.world_size() != n / local || inter.rank() != r / local {
        return Err(format!(
            "inter group: rank {} of {}",
            inter.rank(),
            inter.world_size()
        ));
    }
    // Within a node: sum over the node's ranks.
    let mut a: Vec<f32> = (0..10_001).map(|i| val(r, i, 0) as f32).collect();
    ok(
        intra.all_reduce(&mut a, ReduceOp::Sum).and_then(Work::wait),
        "intra all_reduce",
    )?;
    let node = r / local;
    for (i, &g) in a.iter().enumerate() {
        let exact: i64 = (node * local..(node + 1) * local)
            .map(|q| val(q, i, 0))
            .sum();
        check_value("intra all_reduce", i, g, ReduceOp::Sum, exact as f64)?;
    }
    // Hybrid sharding: reduce_scatter within the node, all_reduce of the shard across nodes
    // equals the shard of a full all_reduce.
    let k = 3001;
    let grad: Vec<f32> = (0..local * k).map(|i| val(r, i, 5) as f32).collect();
    let mut shard = vec![0f32; k];
    ok(
        intra
            .reduce_scatter(&grad, &mut shard, ReduceOp::Sum)
            .and_then(Work::wait),
        "intra reduce_scatter",
    )?;
    ok(
        inter
            .all_reduce(&mut shard, ReduceOp::Sum)
            .and_then(Work::wait),
        "inter all_reduce",
    )?;
    let lr = intra.rank();
    for (i, &g) in shard.iter().enumerate() {
        let exact: i64 = (0..n).map(|q| val(q, lr * k + i, 5)).sum();
        check_value("hybrid shard", i, g, ReduceOp::Sum, exact as f64)?;
    }
    // Custom keys reverse the order inside one group of everyone.
    let rev = ok(c.split(0, n - r), "split by key")?;
    if rev.rank() != n - 1 - r {
        return Err(format!(
            "reversed split: rank {} for world rank {r}",
            rev.rank()
        ));
    }
    let mut g = vec![0i64; n];
    ok(
        rev.all_gather(&[r as i64], &mut g).and_then(Work::wait),
        "all_gather in the reversed group",
    )?;
    let want: Vec<i64> = (0..n).rev().map(|q| q as i64).collect();
    if g != want {
        return Err(format!("reversed group gathered {g:?}, expected {want:?}"));
    }
    // The parent still works after the splits.
    let mut p = vec![1i64];
    ok(
        c.all_reduce(&mut p, ReduceOp::Sum).and_then(Work::wait),
        "parent all_reduce",
    )?;
    if p[0] != n as i64 {
        return Err(format!("parent all_reduce gave {}", p[0]));
    }
    Ok(())
}

fn scenario_tensors(env: &Env) -> R {
    use tch::{Device, Kind, Tensor};
    let c = comm(env, None, None)?;
    let (r, n) = (env.rank as i64, env.world as i64);
    // all_reduce on f32 and bf16 tensors.
    for kind in [Kind::Float, Kind::BFloat16, Kind::Half, Kind::Int64] {
        // Values below 64: exact in every dtype, and so are their sums.
        let base = Tensor::arange(1001, (Kind::Int64, Device::Cpu)).fmod(50);
        let t = (&base + r).to_kind(kind);
        ok(
            c.all_reduce_tensor(&t, ReduceOp::Sum).and_then(Work::wait),
            "all_reduce_tensor",
        )?;
        let want = (&base * n + n * (n - 1) / 2).to_kind(kind);
        if !t.equal(&want) {
            return Err(format!("all_reduce_tensor {kind:?} mismatch"));
        }
    }
    // all_gather into a [n, 4] tensor, out of place and in place (shard = a view of the output).
    let shard = Tensor::full([4], r as f64, (Kind::Float, Device::Cpu));
    let out = Tensor::zeros([n, 4], (Kind::Float, Device::Cpu));
    ok(
        c.all_gather_tensor(&shard, &out).and_then(Work::wait),
        "all_gather_tensor",
    )?;
    let want = Tensor::arange(n, (Kind::Float, Device::Cpu))
        .unsqueeze(1)
        .expand([n, 4], false);
    if !out.equal(&want) {
        return Err("all_gather_tensor mismatch".into());
    }
    let out2 = Tensor::zeros([n * 4], (Kind::Float, Device::Cpu));
    let mut view = out2.narrow(0, r * 4, 4);
    view.copy_(&shard);
    ok(
        c.all_gather_tensor(&view, &out2).and_then(Work::wait),
        "in-place all_gather_tensor",
    )?;
    if !out2.view([n, 4]).equal(&want) {
        return Err("in-place all_gather_tensor mismatch".into());
    }
    // reduce_scatter: each rank contributes arange(n*3) + r; keeps its 3-element shard.
    let input = Tensor::arange(n * 3, (Kind::Float, Device::Cpu)) + r as f64;
    let outp = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    ok(
        c.reduce_scatter_tensor(&input, &outp, ReduceOp::Sum)
            .and_then(Work::wait),
        "reduce_scatter_tensor",
    )?;
    let want = Tensor::arange_start(r * 3, r * 3 + 3, (Kind::Float, Device::Cpu)) * n as f64
        + (n * (n - 1) / 2) as f64;
    if !outp.equal(&want) {
        return Err(format!("reduce_scatter_tensor mismatch: {outp:?}"));
    }
    // broadcast from the last rank; the Work keeps the tensor alive even if we drop ours.
    let b = Tensor::full([2, 3], r as f64, (Kind::Float, Device::Cpu));
    let w = ok(c.broadcast_tensor(&b, (n - 1) as usize), "broadcast_tensor")?;
    ok(w.wait(), "broadcast_tensor")?;
    if !b.equal(&Tensor::full(
        [2, 3],
        (n - 1) as f64,
        (Kind::Float, Device::Cpu),
    )) {
        return Err("broadcast_tensor mismatch".into());
    }
    // Rejected inputs.
    let nc = Tensor::zeros([4, 4], (Kind::Float, Device::Cpu)).transpose(0, 1);
    expect_invalid(c.all_reduce_tensor(&nc, ReduceOp::Sum), "not contiguous")?;
    let f64t = Tensor::zeros([4], (Kind::Double, Device::Cpu));
    expect_invalid(
        c.all_reduce_tensor(&f64t, ReduceOp::Sum),
        "unsupported dtype",
    )?;
    let wrong = Tensor::zeros([n * 4 + 1], (Kind::Float, Device::Cpu));
    expect_invalid(c.all_gather_tensor(&shard, &wrong), "world_size")?;
    let bf = Tensor::zeros([n * 4], (Kind::BFloat16, Device::Cpu));
    expect_invalid(c.all_gather_tensor(&shard, &bf), "bf16")?;
    ok(c.barrier(), "barrier")
}

fn expect_invalid(r: Result<Work<'static>, CommError>, needle: &str) -> R {
    match r {
        Err(e @ CommError::InvalidArgument { .. }) if e.to_string().contains(needle) => Ok(()),
        Err(e) => Err(format!(
            "expected an invalid-argument error mentioning {needle:?}, got {e}"
        )),
        Ok(_) => Err(format!(
            "expected an invalid-argument error mentioning {needle:?}, got success"
        )),
    }
}

/// Rank 2 submits a large all_reduce and exits while it runs; the others must fail fast.
fn scenario_exit_mid(env: &Env) -> R {
    let c = comm(env, Some(64 << 10), None)?;
    let mut warm = vec![1f32; 1000];
    ok(
        c.all_reduce(&mut warm, ReduceOp::Sum).and_then(Work::wait),
        "warm-up",
    )?;
    let mut buf = vec![1f32; 4 << 20];
    let t = Instant::now();
    let w = ok(c.all_reduce(&mut buf, ReduceOp::Sum), "submit")?;
    if env.rank == 2 {
        std::thread::sleep(Duration::from_millis(2));
        // Leave mid-collective, at once (std::process::exit would first run libtorch's
        // static destructors, long enough for the all_reduce to finish).
        // SAFETY: terminates the process.
        unsafe { libc::_exit(0) };
    }
    match w.wait() {
        Ok(()) => Err("all_reduce succeeded although rank 2 left".into()),
        Err(e) => {
            let dt = t.elapsed();
            println!("ERROR after {} ms: {e}", dt.as_millis());
            if dt > env.timeout {
                return Err(format!(
                    "error came after {dt:?}, beyond the {:?} timeout",
                    env.timeout
                ));
            }
            // Later operations fail at once.
            let t2 = Instant::now();
            let mut again = vec![1f32; 10];
            match c.all_reduce(&mut again, ReduceOp::Sum).and_then(Work::wait) {
                Err(CommError::Aborted(_)) if t2.elapsed() < Duration::from_secs(1) => {}
                other => {
                    return Err(format!(
                        "expected an immediate Aborted error, got {other:?}"
                    ))
                }
            }
            Ok(())
        }
    }
}

/// Every rank loops on all_reduces until one fails; the parent kills rank 1 meanwhile.
fn scenario_killed(env: &Env) -> R {
    let c = comm(env, Some(64 << 10), None)?;
    let mut buf = vec![1f32; 256 << 10];
    let mut last_ok = Instant::now();
    for it in 0.. {
        if it == 3 {
            println!("LOOPING");
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        match c.all_reduce(&mut buf, ReduceOp::Avg).and_then(Work::wait) {
            Ok(()) => last_ok = Instant::now(),
            Err(e) => {
                println!("ERROR after {} ms: {e}", last_ok.elapsed().as_millis());
                return Ok(());
            }
        }
    }
    unreachable!()
}

/// Rank 1 never joins the collective but stays alive: rank 0 must time out.
fn scenario_silent(env: &Env) -> R {
    let c = comm(env, None, None)?;
    if env.rank == 1 {
        std::thread::sleep(Duration::from_secs(120));
        return Err("rank 1 was not killed".into());
    }
    let mut buf = vec![1f32; 1 << 20];
    let t = Instant::now();
    match c.all_reduce(&mut buf, ReduceOp::Sum).and_then(Work::wait) {
        Ok(()) => Err("all_reduce succeeded without rank 1".into()),
        Err(e) => {
            println!("ERROR after {} ms: {e}", t.elapsed().as_millis());
            // Leave now: dropping rank 0's store would wait for the silent rank to disconnect.
            println!("SCENARIO OK");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(0)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tests

#[test]
fn collectives_world_1() {
    run_ok("matrix", 1, Duration::from_secs(120));
}

#[test]
fn collectives_world_2() {
    run_ok("matrix", 2, Duration::from_secs(120));
}

#[test]
fn collectives_world_3() {
    run_ok("matrix", 3, Duration::from_secs(120));
}

#[test]
fn collectives_world_4() {
    run_ok("matrix", 4, Duration::from_secs(120));
}

/// 256 MiB f32 all_reduce on two ranks (about 6 s in a debug build).
#[test]
fn all_reduce_256mib_world_2() {
    run_ok("big", 2, Duration::from_secs(120));
}

#[test]
fn many_small_ops_world_3() {
    run_ok("many_small", 3, Duration::from_secs(120));
}

#[test]
fn async_ops_in_flight_world_4() {
    run_ok("async", 4, Duration::from_secs(120));
}

#[test]
fn split_hybrid_world_4() {
    run_ok("split", 4, Duration::from_secs(120));
}

#[test]
fn tensor_helpers_world_2() {
    run_ok("tensors", 2, Duration::from_secs(120));
}

const FAIL_TIMEOUT: Duration = Duration::from_secs(3);

/// The `ERROR after <ms> ms: …` line a failure scenario prints (the harness may prefix it).
fn error_line(log: &str) -> &str {
    log.lines()
        .find_map(|l| l.find("ERROR after").map(|i| &l[i..]))
        .unwrap_or("")
}

/// The milliseconds in an `ERROR after <ms> ms: …` line.
fn error_ms(line: &str) -> u64 {
    line.strip_prefix("ERROR after ")
        .and_then(|r| r.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Every rank's (rank, status, log).
fn outcomes(done: &Finished) -> impl Iterator<Item = (usize, &std::process::ExitStatus, &str)> {
    done.statuses
        .iter()
        .zip(&done.logs)
        .enumerate()
        .map(|(rank, (status, log))| (rank, status, log.as_str()))
}

#[test]
fn rank_exiting_mid_collective_fails_the_others_fast() {
    let done =
        spawn_world("exit_mid", 3, FAIL_TIMEOUT.as_millis() as u64).wait(Duration::from_secs(60));
    for (rank, status, log) in outcomes(&done) {
        assert!(status.success(), "rank {rank} ({status}):\n{log}");
        if rank != 2 {
            let e = error_line(log);
            assert!(
                e.contains("during all_reduce") && e.contains("rank "),
                "rank {rank}: {e:?}"
            );
            assert!(
                error_ms(e) < FAIL_TIMEOUT.as_millis() as u64,
                "rank {rank}: {e}"
            );
        }
    }
    // The first rank to notice names rank 2 (later ones may name the rank that gave up
    // before them: a failure cascades through the connections).
    assert!(
        done.logs.iter().any(|l| error_line(l).contains("rank 2 (")),
        "nobody named rank 2"
    );
}

#[test]
fn rank_killed_mid_collective_fails_the_others_within_the_timeout() {
    let mut ranks = spawn_world("killed", 4, FAIL_TIMEOUT.as_millis() as u64);
    // Wait until every rank is inside its all_reduce loop.
    ranks.wait_until(Duration::from_secs(60), "every rank is looping", |w| {
        (0..4).all(|r| w.log(r).contains("LOOPING"))
    });
    std::thread::sleep(Duration::from_millis(100));
    ranks.kill_rank(1);
    // No hang: everyone is gone well within the timeout plus process exit.
    let done = ranks.wait(FAIL_TIMEOUT + Duration::from_secs(15));
    assert!(!done.statuses[1].success(), "rank 1 was killed");
    for (rank, status, log) in outcomes(&done).filter(|o| o.0 != 1) {
        assert!(status.success(), "rank {rank} ({status}):\n{log}");
        let e = error_line(log);
        assert!(
            e.contains("during all_reduce") && e.contains("rank "),
            "rank {rank}: {e:?}"
        );
        // From its last successful all_reduce (milliseconds before the kill) to the error.
        let ms = error_ms(e);
        assert!(
            ms < FAIL_TIMEOUT.as_millis() as u64,
            "rank {rank} failed only after {ms} ms"
        );
    }
    // The first rank to notice names rank 1.
    assert!(
        done.logs.iter().any(|l| error_line(l).contains("rank 1 (")),
        "nobody named rank 1"
    );
}

#[test]
fn silent_rank_times_out() {
    let mut ranks = spawn_world("silent", 2, 2000);
    let start = Instant::now();
    // Rank 0 must give up on its own, after about the 2 s timeout.
    let Some(st) = ranks.wait_rank(0, Duration::from_secs(60)) else {
        panic!("rank 0 hung\n{}", ranks.all_logs());
    };
    let dt = start.elapsed();
    ranks.kill_rank(1);
    let o = ranks.log(0);
    assert!(st.success(), "rank 0 ({st}):\n{o}");
    assert!(
        o.contains("timed out after 2s waiting for rank 1 (") && o.contains("all_reduce"),
        "{o}"
    );
    // The error comes at the timeout, not long after.
    let ms = o
        .lines()
        .find_map(|l| l.find("ERROR after").map(|i| error_ms(&l[i..])));
    assert!(ms.is_some_and(|ms| (1900..6000).contains(&ms)), "{o}");
    assert!(dt < Duration::from_secs(20), "rank 0 took {dt:?}");
}

// ---------------------------------------------------------------------------------------------
// In-process tests (no child processes)

#[test]
fn world_of_one_and_invalid_arguments() {
    let store = MemoryStore::group(1).pop().unwrap();
    let c = CpuComm::new(
        store,
        CpuOptions {
            timeout: Duration::from_secs(5),
            ..CpuOptions::default()
        },
    )
    .unwrap();
    let mut a = vec![1f32, 2.0, 3.0];
    c.all_reduce(&mut a, ReduceOp::Avg).unwrap().wait().unwrap();
    assert_eq!(a, vec![1.0, 2.0, 3.0]);
    let mut out = vec![0i64; 2];
    c.all_gather(&[4i64, 5], &mut out).unwrap().wait().unwrap();
    assert_eq!(out, vec![4, 5]);
    c.reduce_scatter(&[6i64, 7], &mut out, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out, vec![6, 7]);
    c.barrier().unwrap();
    let err = c.broadcast(&mut a, 1).unwrap_err();
    assert!(err.to_string().contains("root 1"), "{err}");
    let err = c.all_gather(&[1f32, 2.0], &mut [0f32; 3]).unwrap_err();
    assert!(matches!(err, CommError::InvalidArgument { .. }), "{err}");
    let mut empty: Vec<f32> = Vec::new();
    c.all_reduce(&mut empty, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
}

#[test]
fn ranks_as_threads_over_a_memory_store() {
    let stores = MemoryStore::group(3);
    let handles: Vec<_> = stores
        .into_iter()
        .map(|store| {
            std::thread::spawn(move || {
                let opts = CpuOptions {
                    timeout: Duration::from_secs(30),
                    chunk_bytes: 4096,
                    small_bytes: 64,
                    ..CpuOptions::default()
                };
                let c = CpuComm::new(store, opts).unwrap();
                let r = c.rank();
                let mut a: Vec<f32> = (0..10_007).map(|i| (i % 13) as f32 + r as f32).collect();
                c.all_reduce(&mut a, ReduceOp::Sum).unwrap().wait().unwrap();
                for (i, &x) in a.iter().enumerate() {
                    assert_eq!(x, 3.0 * (i % 13) as f32 + 3.0);
                }
                let sub = c.split(r % 2, r).unwrap();
                let mut b = vec![1i64];
                sub.all_reduce(&mut b, ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(b[0], if r.is_multiple_of(2) { 2 } else { 1 });
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
