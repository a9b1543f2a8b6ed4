//! The built-in trainer across nodes, on the multi-node Slurm test cluster that
//! `scripts/slurm-cluster-start.sh` starts with `SLURM_TEST_NODES=2`: two slurmd, each in its
//! own network and UTS namespace (host names `fltnode1`, `fltnode2`, addresses on a private
//! bridge), so that a job's ranks on the second node reach the first only through the bridge.
//!
//! Through `flotilla run compute=slurm compute.nodes=2 compute.tasks_per_node=2` (4 ranks on the
//! CPU backend): DDP and FSDP FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD (shard within a node,
//! replicate across) each give the loss and grad_norm of one process at every step (within
//! 1e-5 relative, as crates/flotilla-train/tests/train_dist.rs on one host); every rank's log
//! names its real host and node (`[rank 3] on host fltnode2: node 1 of 2, ...`) and the master
//! as the first host of the node list; bytes cross the second node's link. The sharded
//! checkpoint that FULL_SHARD wrote at step 10 on 2 nodes × 2 resumes on 1 node × 2 and on
//! 2 nodes × 1 to the same curve.
//!
//! The user's own program across the same 2 nodes × 2: `examples/torchrun` (`ranks: per_node`,
//! a bare `torchrun` per node) and `examples/ddp_gloo` (`ranks: per_task`, a plain gloo script):
//! every process records RANK, LOCAL_RANK, NODE_RANK, WORLD_SIZE and its host, consistent with
//! its place, MASTER_ADDR is the first node's host, and an all-reduce needs every rank.
//!
//! A DDP job preempted with SIGUSR2 after step 5: every rank checkpoints the same step, the
//! job requeues itself and resumes to the uninterrupted job's rows, bit for bit.
//!
//! Faults ([`a_lost_node_fails_the_job_or_requeues_it`]): node 2 loses every process under two
//! running jobs; the survivors name the lost rank and its host, nothing is left on any node,
//! `compute.requeue=false` ends NODE_FAIL with that reason, the requeued job resumes from its
//! checkpoint once node 2 is back. A sweep ([`a_sweep_of_two_node_jobs_on_three_nodes`]):
//! 4 exclusive 2-node jobs on 3 nodes, one at a time, each job's node list in `status`.
//!
//! The tests take the cluster one at a time ([`serial`]). Skipped like tests/slurm.rs when the
//! cluster cannot be installed (not root, no apt-get); a failure under
//! `FLOTILLA_REQUIRE_ORACLES=1`.

mod common;
#[path = "common/slurm_cluster.rs"]
mod slurm_cluster;

use flotilla_contract::metrics::MetricsRow;
use slurm_cluster::Cluster;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests of this file share the one test cluster (and change its shape or take a node
/// down): they run one at a time.
static CLUSTER: Mutex<()> = Mutex::new(());

/// Takes [`CLUSTER`] for the rest of a test (also after another test panicked holding it).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    CLUSTER.lock().unwrap_or_else(|e| e.into_inner())
}

const STEPS: usize = 30;
/// Relative tolerance of every multi-process-vs-one-process comparison (fp32), as on one host.
const TOL: f64 = 1e-5;
/// The host-side end of the second node's veth pair (the start script's naming).
const NODE2_LINK: &str = "flt-v2";

/// The overrides every run shares: the tiny model on the built-in arithmetic data, unshuffled,
/// fp32, 30 steps at a peak learning rate of 1e-3 (the single-host parity tests' settings).
fn training(dir: &Path) -> Vec<String> {
    let mut o: Vec<String> = [
        "model=tiny",
        "data=arithmetic",
        "data.shuffle=false",
        "trainer.device=cpu",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=2",
        "trainer.eval_every=0",
        "trainer.log_every=10",
        "trainer.checkpoint_every=0",
        "trainer.keep_last_checkpoints=0",
        "trainer.precision=32-true",
        "trainer.lr=1e-3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    o.push(format!("trainer.max_steps={STEPS}"));
    o.push(format!("flotilla.run.dir={}", dir.display()));
    o
}

/// `flotilla ARGS` in the repository (its config tree); panics unless it succeeded.
fn flotilla(args: &[String]) -> String {
    common::ok(common::flotilla_in(
        &common::repo_root(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    ))
}

/// Submits one SLURM job of `nodes` × `per_node` ranks training into `dir`.
fn submit(dir: &Path, nodes: usize, per_node: usize, extra: &[&str]) {
    let mut args: Vec<String> = [
        "run",
        "compute=slurm",
        "compute.gpus_per_node=0",
        "compute.cpus_per_task=1",
        "compute.mem_gb=null",
        "compute.timeout_min=10",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("compute.nodes={nodes}"));
    args.push(format!("compute.tasks_per_node={per_node}"));
    args.extend(training(dir));
    args.extend(extra.iter().map(|s| s.to_string()));
    flotilla(&args);
}

/// Polls `flotilla status --format json DIR` until its job has ended; its final state.
fn wait_job(dir: &Path, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let out = flotilla(&[
            "status".into(),
            "--format".into(),
            "json".into(),
            dir.display().to_string(),
        ]);
        let st: serde_json::Value = serde_json::from_str(&out).unwrap();
        let state = st["jobs"][0]["state"].as_str().unwrap_or("").to_string();
        if matches!(
            state.as_str(),
            "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY"
        ) {
            return state;
        }
        if t0.elapsed() > limit {
            let _ = Command::new("squeue").args(["-t", "all"]).status();
            panic!("{} not finished after {limit:?}: {st:#}", dir.display());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn read_rows(dir: &Path) -> Vec<MetricsRow> {
    let path = dir.join("metrics.csv");
    let mut reader =
        csv::Reader::from_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader
        .deserialize::<MetricsRow>()
        .map(|r| r.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(f64::MIN_POSITIVE)
    }
}

/// Every rank's log of a finished job, for failure messages.
fn logs(dir: &Path) -> String {
    let mut text = String::new();
    let Ok(entries) = std::fs::read_dir(dir.join("logs")) else {
        return text;
    };
    let mut paths: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths {
        text += &format!(
            "--- {}\n{}\n",
            p.display(),
            std::fs::read_to_string(&p).unwrap_or_default()
        );
    }
    text
}

/// The rows of `dir` (steps `first..30`) against the single process's: the same steps and
/// learning rates, loss and grad_norm within [`TOL`]. Prints the worst errors.
fn assert_matches(name: &str, dir: &Path, base: &[MetricsRow], first: usize) -> Vec<MetricsRow> {
    assert_rows(name, read_rows(dir), base, first)
}

/// As [`assert_matches`], for rows already read.
fn assert_rows(
    name: &str,
    rows: Vec<MetricsRow>,
    base: &[MetricsRow],
    first: usize,
) -> Vec<MetricsRow> {
    assert_eq!(
        rows.iter().map(|r| r.step).collect::<Vec<_>>(),
        (first as u64..STEPS as u64).collect::<Vec<_>>(),
        "{name}: steps in metrics.csv"
    );
    let (mut loss_err, mut gn_err) = (0f64, 0f64);
    for (ours, theirs) in rows.iter().zip(&base[first..]) {
        assert_eq!(ours.lr, theirs.lr, "{name} step {}: lr", ours.step);
        let (l, g) = (
            rel(ours.loss, theirs.loss),
            rel(ours.grad_norm, theirs.grad_norm),
        );
        assert!(
            l <= TOL && g <= TOL,
            "{name} step {}: loss {} vs {} ({l:.2e}), grad_norm {} vs {} ({g:.2e})",
            ours.step,
            ours.loss,
            theirs.loss,
            ours.grad_norm,
            theirs.grad_norm
        );
        loss_err = loss_err.max(l);
        gn_err = gn_err.max(g);
    }
    println!(
        "  {name}: steps {first}..{STEPS} vs one process: max rel err loss {loss_err:.2e}, \
         grad_norm {gn_err:.2e}"
    );
    rows
}

/// Each rank of a `nodes` × `per_node` job says where it ran: rank r is local rank
/// `r % per_node` of node `r / per_node`, the ranks of one node share a host of the cluster,
/// different nodes have different hosts, and the master is node 0's host (the first of the
/// job's node list).
fn assert_placement(name: &str, dir: &Path, nodes: usize, per_node: usize) {
    let running: usize = std::fs::read_to_string(slurm_cluster::cluster_dir().join("nodes"))
        .ok()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(2);
    let cluster_hosts = slurm_cluster::node_names(running);
    let mut node_hosts: Vec<Option<String>> = vec![None; nodes];
    let mut masters = vec![];
    for rank in 0..nodes * per_node {
        let path = dir.join(format!("logs/rank_{rank}.log"));
        let log = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}", path.display()));
        let prefix = format!("[rank {rank}] on host ");
        let line = log
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{name}: rank {rank} did not say where it runs:\n{log}"));
        let (host, rest) = line.split_once(": ").unwrap();
        let node = rank / per_node;
        let want = format!(
            "node {node} of {nodes}, local rank {} of {per_node}, master ",
            rank % per_node
        );
        assert!(
            rest.starts_with(&want),
            "{name}: rank {rank}: {line:?}, want {want:?}"
        );
        assert!(
            cluster_hosts.iter().any(|h| h == host),
            "{name}: rank {rank} on {host:?}"
        );
        match &node_hosts[node] {
            Some(h) => assert_eq!(h, host, "{name}: node {node}'s ranks on two hosts"),
            None => node_hosts[node] = Some(host.to_string()),
        }
        masters.push(rest[want.len()..].rsplit_once(':').unwrap().0.to_string());
    }
    let hosts: Vec<String> = node_hosts.into_iter().map(Option::unwrap).collect();
    let mut distinct = hosts.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), nodes, "{name}: nodes on hosts {hosts:?}");
    assert!(
        masters.iter().all(|m| *m == hosts[0]),
        "{name}: masters {masters:?}, want {} (node 0)",
        hosts[0]
    );
    println!("  {name}: ranks on {hosts:?}, master {}", hosts[0]);
}

/// Bytes received plus sent on a host-side link (`/sys/class/net/LINK/statistics`).
fn link_bytes(link: &str) -> u64 {
    ["rx_bytes", "tx_bytes"]
        .iter()
        .map(|f| {
            let p = format!("/sys/class/net/{link}/statistics/{f}");
            std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{p}: {e}"))
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// `flotilla run --config-dir conf ARGS` in the copy of an example, with the venv's `bin/`
/// first in PATH (sbatch passes the environment on, so the job's `python` and `torchrun` are
/// the venv's); the run directory is `dir`.
fn submit_example(example: &Path, dir: &Path, args: &[&str]) {
    let mut dirs = vec![common::venv_python().parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let out = Command::new(common::flotilla_bin())
        .args(["run", "--config-dir", "conf"])
        .args(args)
        .arg(format!("flotilla.run.dir={}", dir.display()))
        .current_dir(example)
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("FLOTILLA_LOG")
        .output()
        .unwrap();
    common::ok(out);
}

/// What the 4 processes of a user's program on 2 nodes × 2 recorded (`<prefix><rank>.json`):
/// consistent ranks, node ranks and world size, the ranks of one node on one host of the
/// cluster and the two nodes on different hosts, MASTER_ADDR the first node's host, and an
/// all-reduce that needs every rank: `sum` (torchrun's worker sums the ranks, 0 + 1 + 2 + 3;
/// ddp_gloo sums rank + 1, 1 + 2 + 3 + 4).
fn assert_user_ranks(name: &str, dir: &Path, prefix: &str, sum: f64) {
    let cluster_hosts = slurm_cluster::node_names(2);
    let mut hosts = [None::<String>, None];
    for rank in 0..4usize {
        let path = dir.join(format!("{prefix}{rank}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{name}: {}: {e}\n{}", path.display(), logs(dir)));
        let seen: serde_json::Value = serde_json::from_str(&text).unwrap();
        let env = |k: &str| seen["env"][k].as_str().map(str::to_string);
        let node = rank / 2;
        assert_eq!(env("RANK"), Some(rank.to_string()), "{name}: {seen:#}");
        assert_eq!(
            env("LOCAL_RANK"),
            Some((rank % 2).to_string()),
            "{name}: {seen:#}"
        );
        assert_eq!(env("WORLD_SIZE").as_deref(), Some("4"), "{name}: {seen:#}");
        assert_eq!(env("NODE_RANK"), Some(node.to_string()), "{name}: {seen:#}");
        assert_eq!(
            env("GROUP_RANK"),
            Some(node.to_string()),
            "{name}: {seen:#}"
        );
        assert_eq!(seen["allreduce_sum"], sum, "{name}: {seen:#}");
        let host = seen["host"].as_str().unwrap().to_string();
        assert!(
            cluster_hosts.contains(&host),
            "{name}: rank {rank} on {host:?}"
        );
        match &hosts[node] {
            Some(h) => assert_eq!(*h, host, "{name}: node {node}'s ranks on two hosts"),
            None => hosts[node] = Some(host),
        }
        let master = env("MASTER_ADDR");
        assert_eq!(master, hosts[0], "{name}: rank {rank}'s MASTER_ADDR");
    }
    assert_ne!(hosts[0], hosts[1], "{name}: both nodes on one host");
    println!("  {name}: ranks on {hosts:?}, all_reduce {sum} on every rank");
}

/// Starts one process on this host in the background (`flotilla train` in `dir`, no
/// scheduler): the baseline every multi-rank curve is compared with ([`one_process_rows`]).
fn start_one_process(dir: &Path) -> std::process::Child {
    let mut args = vec![
        "train".to_string(),
        "--run-dir".into(),
        dir.display().to_string(),
        "trainer/dist=none".into(),
        "compute.nodes=1".into(),
        "compute.tasks_per_node=1".into(),
    ];
    args.extend(
        training(dir)
            .into_iter()
            .filter(|o| !o.starts_with("flotilla.run.dir")),
    );
    Command::new(common::flotilla_bin())
        .args(&args)
        .current_dir(common::repo_root())
        .env_remove("FLOTILLA_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.with_extension("log")).unwrap())
        .spawn()
        .expect("start flotilla train")
}

/// Waits for the process [`start_one_process`] started; its rows.
fn one_process_rows(dir: &Path, child: std::process::Child) -> Vec<MetricsRow> {
    let mut child = child;
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "flotilla train in {}: {status}\n{}",
        dir.display(),
        std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default()
    );
    let base = read_rows(dir);
    assert_eq!(base.len(), STEPS);
    assert!(
        base[STEPS - 1].loss < 0.75 * base[0].loss,
        "the single process did not train: {base:?}"
    );
    base
}

/// All scenarios in one test: they share the cluster and the single-process baseline.
#[test]
fn built_in_trainer_across_two_nodes() {
    let _serial = serial();
    let Some(_cluster) = Cluster::start(2, &[]) else {
        return;
    };
    common::train_binary();
    let t_all = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("flotilla-multinode")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let root = tmp.path();
    let link_before = link_bytes(NODE2_LINK);

    // Four 2 × 2 jobs at once (the cluster runs two at a time: 4 CPUs per node, 1 per rank),
    // and meanwhile the single process on this host.
    let fsdp = |s: &'static str| vec!["trainer/dist=fsdp", s];
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("ddp", vec!["trainer/dist=ddp"], "DDP, 4 ranks"),
        (
            "full_shard",
            vec![
                "trainer/dist=fsdp",
                "trainer.dist.sharding_strategy=FULL_SHARD",
                "trainer.dist.state_dict_type=sharded",
                "trainer.checkpoint_every=10",
            ],
            "FSDP FULL_SHARD, 4 ranks",
        ),
        (
            "shard_grad_op",
            fsdp("trainer.dist.sharding_strategy=SHARD_GRAD_OP"),
            "FSDP SHARD_GRAD_OP, 4 ranks",
        ),
        (
            "hybrid_shard",
            fsdp("trainer.dist.sharding_strategy=HYBRID_SHARD"),
            "FSDP HYBRID_SHARD, 4 ranks",
        ),
    ];
    for (name, extra, _) in &cases {
        submit(&root.join(name), 2, 2, extra);
    }
    // The user's own programs, 2 nodes × 2 each: a bare `torchrun` per node (`ranks:
    // per_node`) and a plain torch.distributed gloo script per rank (`ranks: per_task`).
    let user = common::venv_imports("torch");
    if user {
        for ex in ["torchrun", "ddp_gloo"] {
            common::copy_dir(
                &common::repo_root().join("examples").join(ex),
                &root.join(ex),
            );
        }
        let shape = [
            "compute.nodes=2",
            "compute.tasks_per_node=2",
            "compute.cpus_per_task=1",
            "compute.mem_gb=null",
        ];
        let mut args = vec!["compute.launcher=slurm"];
        args.extend(shape);
        submit_example(&root.join("torchrun"), &root.join("torchrun_run"), &args);
        let mut args = vec!["compute=slurm", "steps=3"];
        args.extend(shape);
        submit_example(&root.join("ddp_gloo"), &root.join("ddp_gloo_run"), &args);
    } else {
        common::skip_or_fail(&format!(
            "the user-program scenarios: {} cannot import torch (run scripts/setup.sh)",
            common::venv_python().display()
        ));
    }
    let base_dir = root.join("one_process");
    let baseline = start_one_process(&base_dir);

    // A preemption of a 2-node job: SIGUSR2 to its batch shell once it wrote a checkpoint
    // reaches every rank (srun forwards it to both nodes); each checkpoints the step the ranks
    // agree on and exits 75, the job requeues itself and resumes. (Not on a line of the ranks'
    // logs: srun writes them in bursts.)
    // The DDP job again, checkpointing every 5 steps (which changes no number), to be preempted
    // (SIGUSR2) once it wrote a checkpoint. Submitted last, so that its steps are not spent
    // while this test submits the others.
    let preempted = root.join("preempted");
    let mut extra = cases[0].1.clone();
    extra.extend([
        "trainer.checkpoint_every=5",
        "trainer.keep_last_checkpoints=3",
    ]);
    submit(&preempted, 2, 2, &extra);
    let checkpointed = || {
        std::fs::read_dir(preempted.join("checkpoints")).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.path().join("trainer_state.json").is_file())
        })
    };
    let id = preempt_held(&preempted, 4, checkpointed);
    let base = one_process_rows(&base_dir, baseline);

    for (name, _, mode) in &cases {
        let dir = root.join(name);
        let state = wait_job(&dir, Duration::from_secs(600));
        assert_eq!(state, "COMPLETED", "{name}:\n{}", logs(&dir));
        let rank0 = std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap();
        assert!(rank0.contains(mode), "{name}: no {mode:?} in\n{rank0}");
        assert_placement(name, &dir, 2, 2);
        assert_matches(name, &dir, &base, 0);
    }
    let state = wait_job(&preempted, Duration::from_secs(600));
    assert_eq!(state, "COMPLETED", "preempted:\n{}", logs(&preempted));
    let batch = std::fs::read_to_string(preempted.join(format!("logs/slurm-{id}.out"))).unwrap();
    assert!(
        batch.contains("requeueing (restart 1"),
        "preempted: not requeued:\n{}",
        logs(&preempted)
    );
    let mut stopped_at = vec![];
    for rank in 0..4 {
        let log = std::fs::read_to_string(preempted.join(format!("logs/rank_{rank}.log"))).unwrap();
        let line = log
            .lines()
            .find(|l| l.contains("stopped by SIGUSR2 at step "))
            .unwrap_or_else(|| panic!("preempted: rank {rank} did not checkpoint:\n{log}"));
        let step: u64 = line
            .split("stopped by SIGUSR2 at step ")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("preempted: rank {rank}: {line}"));
        stopped_at.push(step);
    }
    assert!(
        stopped_at
            .iter()
            .all(|s| *s == stopped_at[0] && *s >= 5 && *s < STEPS as u64),
        "preempted: ranks stopped at steps {stopped_at:?}"
    );
    // Stopped and resumed, the job's rows are the uninterrupted DDP job's, bit for bit.
    let (whole, resumed) = (read_rows(&root.join("ddp")), read_rows(&preempted));
    assert_eq!(resumed.len(), STEPS, "preempted: {resumed:?}");
    for (a, b) in whole.iter().zip(&resumed) {
        assert_eq!(
            (a.step, a.loss.to_bits(), a.grad_norm.to_bits()),
            (b.step, b.loss.to_bits(), b.grad_norm.to_bits()),
            "preempted at step {}: step {} differs from the uninterrupted run",
            stopped_at[0],
            a.step
        );
    }
    println!(
        "  preempted: every rank checkpointed step {} on SIGUSR2, requeued, resumed: the \
         uninterrupted curve bit for bit",
        stopped_at[0]
    );
    if user {
        for (name, prefix, sum) in [
            ("torchrun_run", "worker_rank", 6.0),
            ("ddp_gloo_run", "seen_rank", 10.0),
        ] {
            let dir = root.join(name);
            let state = wait_job(&dir, Duration::from_secs(300));
            assert_eq!(state, "COMPLETED", "{name}:\n{}", logs(&dir));
            assert_user_ranks(name, &dir, prefix, sum);
        }
    }
    // The ranks of node 2 live in another network namespace: what they exchanged with node 1
    // crossed node 2's link. Four jobs of 30 steps each all-reduce (or reduce-scatter) at least
    // one copy of the gradients per step: ~0.74M fp32 parameters.
    let crossed = link_bytes(NODE2_LINK) - link_before;
    let floor = 4 * STEPS as u64 * 740_000 * 4;
    println!("  node 2's link carried {:.1} MB", crossed as f64 / 1e6);
    assert!(
        crossed >= floor,
        "node 2's link carried {crossed} bytes, less than {floor}: did the collectives cross the bridge?"
    );

    // The sharded checkpoint of 2 × 2 resumes on 1 × 2 and on 2 × 1.
    let ckpt = root.join("full_shard/checkpoints/step_10");
    assert!(
        ckpt.join("trainer_state.json").is_file(),
        "{} is not a complete checkpoint",
        ckpt.display()
    );
    assert!(ckpt.join("shard_00003.safetensors").is_file());
    let resume = format!("trainer.resume={}", ckpt.display());
    let shapes = [("resume_1x2", 1, 2), ("resume_2x1", 2, 1)];
    for (name, nodes, per_node) in shapes {
        submit(
            &root.join(name),
            nodes,
            per_node,
            &[
                "trainer/dist=fsdp",
                "trainer.dist.state_dict_type=sharded",
                &resume,
            ],
        );
    }
    let mut curves = vec![];
    for (name, nodes, per_node) in shapes {
        let dir = root.join(name);
        let state = wait_job(&dir, Duration::from_secs(600));
        assert_eq!(state, "COMPLETED", "{name}:\n{}", logs(&dir));
        let rank0 = std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap();
        assert!(
            rank0.contains("resuming from") && rank0.contains("(step 10)"),
            "{name}: no resume in\n{rank0}"
        );
        assert_placement(name, &dir, nodes, per_node);
        curves.push(assert_matches(name, &dir, &base, 10));
    }
    // The same world size (2) and strategy: the same sums in the same order, bit for bit.
    for (a, b) in curves[0].iter().zip(&curves[1]) {
        assert_eq!(
            (a.loss.to_bits(), a.grad_norm.to_bits()),
            (b.loss.to_bits(), b.grad_norm.to_bits()),
            "step {}: 1 × 2 gave loss {} grad_norm {}, 2 × 1 loss {} grad_norm {}",
            a.step,
            a.loss,
            a.grad_norm,
            b.loss,
            b.grad_norm
        );
    }
    println!("multi-node trainer scenarios: {:.1?}", t_all.elapsed());
}

/// The processes (any node: the nodes share this host's process table) whose command line
/// names `dir`: a job's ranks, its srun and its step's shells; with each, its program name
/// (`/proc/PID/comm`) and command line.
fn processes_of(dir: &Path) -> Vec<(u32, String, String)> {
    let needle = dir.display().to_string();
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmd.contains(&needle) {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_string(), cmd.trim().to_string()));
        }
    }
    found
}

/// The `flotilla-train` processes of a job (run directory `dir`), held still with SIGSTOP.
/// A step takes a fraction of a second, while `flotilla status`, the test's polling and Slurm's
/// signals can take seconds on a loaded machine: a job held at the right step cannot run past
/// the point a scenario needs while the test acts on it.
struct HeldRanks {
    pids: Vec<libc::pid_t>,
    /// Rows in the job's metrics.csv when it was held.
    rows: usize,
}

impl HeldRanks {
    /// Finds the job's `ranks` processes, then holds them the moment `ready` (polled every
    /// millisecond).
    fn when(dir: &Path, ranks: usize, ready: impl Fn() -> bool) -> HeldRanks {
        let t0 = Instant::now();
        let waited = |what: &str| {
            assert!(
                t0.elapsed() < Duration::from_secs(600),
                "{}: {what} after 600 s:\n{}",
                dir.display(),
                logs(dir)
            );
        };
        let pids: Vec<libc::pid_t> = loop {
            let pids: Vec<libc::pid_t> = processes_of(dir)
                .into_iter()
                .filter(|(_, comm, _)| comm == "flotilla-train")
                .map(|(pid, _, _)| pid as libc::pid_t)
                .collect();
            if pids.len() == ranks {
                break pids;
            }
            waited(&format!("{} of {ranks} ranks running", pids.len()));
            std::thread::sleep(Duration::from_millis(20));
        };
        while !ready() {
            waited("not ready");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut held = HeldRanks { pids, rows: 0 };
        held.signal(libc::SIGSTOP);
        held.rows = std::fs::read_to_string(dir.join("metrics.csv"))
            .map_or(0, |t| t.lines().count().saturating_sub(1));
        held
    }

    /// Sends `signal` to every held process still alive.
    fn signal(&self, signal: libc::c_int) {
        for &pid in &self.pids {
            // SAFETY: kill(2) with a pid of this job and a standard signal number.
            let rc = unsafe { libc::kill(pid, signal) };
            let error = std::io::Error::last_os_error();
            assert!(
                rc == 0 || error.raw_os_error() == Some(libc::ESRCH),
                "kill({pid}, {signal}): {error}"
            );
        }
    }

    /// Whether `signal` is pending in every held process (/proc/PID/status's masks).
    fn pending(&self, signal: libc::c_int) -> bool {
        self.pids.iter().all(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status.lines().any(|l| {
                (l.starts_with("ShdPnd:") || l.starts_with("SigPnd:"))
                    && l.split_whitespace()
                        .nth(1)
                        .and_then(|mask| u64::from_str_radix(mask, 16).ok())
                        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
            })
        })
    }
}

impl Drop for HeldRanks {
    /// Lets the processes go on (SIGCONT), also when the test fails while holding them.
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: as in `signal`; a process that has gone is no error here.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }
}

/// SIGUSR2 to the job of run directory `dir` as Slurm sends it ahead of a time limit:
/// `scancel --signal=USR2 --batch`, to the batch shell, which forwards it to the step's `ranks`
/// processes; returns the job's id. The ranks are held the moment `ready` (a checkpoint
/// written, so their handlers are installed) and let go once the signal is pending in every one
/// of them: however long its way through slurmctld, slurmd, the batch shell and srun takes,
/// they cannot finish their remaining steps before it arrives.
fn preempt_held(dir: &Path, ranks: usize, ready: impl Fn() -> bool) -> String {
    let held = HeldRanks::when(dir, ranks, ready);
    let id = job_status(dir)["job_id"].as_str().unwrap().to_string();
    let sc = Command::new("scancel")
        .args(["--signal=USR2", "--batch", &id])
        .output()
        .unwrap();
    assert!(sc.status.success(), "{sc:?}");
    let t1 = Instant::now();
    while !held.pending(libc::SIGUSR2) {
        assert!(
            t1.elapsed() < Duration::from_secs(120),
            "{}: SIGUSR2 not pending in every rank {:?} 120 s after scancel:\n{}",
            dir.display(),
            held.pids,
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    println!(
        "  preempted: ranks held after {} rows; SIGUSR2 reached all {ranks} {:.1?} after scancel",
        held.rows,
        t1.elapsed()
    );
    id
}

/// Loses node `k` as a power cut would: every process in its network namespace (its slurmd,
/// the job steps' slurmstepd and their ranks) killed at once, with SIGKILL. Returns how many.
fn kill_node(k: usize) -> usize {
    let ns = format!("flotilla-fltnode{k}");
    let mut killed = 0;
    for _ in 0..20 {
        let out = Command::new("ip")
            .args(["netns", "pids", &ns])
            .output()
            .unwrap();
        let pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        if pids.is_empty() {
            return killed;
        }
        killed += pids.len();
        let _ = Command::new("kill").arg("-KILL").args(&pids).status();
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("processes of {ns} survive SIGKILL");
}

/// `flotilla status --format json DIR`'s first job.
fn job_status(dir: &Path) -> serde_json::Value {
    let out = flotilla(&[
        "status".into(),
        "--format".into(),
        "json".into(),
        dir.display().to_string(),
    ]);
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    st["jobs"][0].clone()
}

/// A node lost mid-step. Two 2 × 2 jobs run at once, `fail` with `compute.requeue=false` and
/// `requeue` with the shipped `compute.requeue=true` and a checkpoint every 10 steps; once
/// `requeue` has checkpointed step 10, node 2 loses every process (slurmd included). The ranks
/// on node 1 fail at their next collective, naming a rank of node 2 and its host; no process
/// of either job is left on any node within 60 s; `fail` ends NODE_FAIL with that error as its
/// reason in `status` and `report`. `requeue` is requeued, waits for two nodes,
/// and once node 2's slurmd is back runs again, resumes from step 10 and ends with the curve of
/// one process.
#[test]
fn a_lost_node_fails_the_job_or_requeues_it() {
    let _serial = serial();
    let Some(_cluster) = Cluster::start(2, &[]) else {
        return;
    };
    common::train_binary();
    let t_all = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("flotilla-multinode-fault")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let root = tmp.path();
    let (fail, requeue) = (root.join("fail"), root.join("requeue"));
    // The baseline meanwhile, on this host.
    let base_dir = root.join("one_process");
    let baseline = start_one_process(&base_dir);
    // Long enough to be killed mid-run: the kill comes at step 10 of 30 of `requeue`, and
    // `fail` runs 100000 steps.
    submit(
        &fail,
        2,
        2,
        &[
            "trainer/dist=ddp",
            "trainer.max_steps=100000",
            "trainer.log_every=1",
            "compute.requeue=false",
        ],
    );
    submit(
        &requeue,
        2,
        2,
        &[
            "trainer/dist=ddp",
            "trainer.checkpoint_every=10",
            "trainer.keep_last_checkpoints=3",
        ],
    );
    let script = std::fs::read_dir(fail.join("slurm"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "sbatch"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .expect("fail's sbatch script");
    assert!(script.contains("#SBATCH --no-requeue"), "{script}");

    // Both running, `requeue` checkpointed at step 10 and held there (it must not reach step
    // 20, or finish, while `fail`'s log comes through srun's bursts).
    let ckpt = requeue.join("checkpoints/step_10/trainer_state.json");
    let t0 = Instant::now();
    let held = HeldRanks::when(&requeue, 4, || ckpt.is_file());
    let fail_stepping = || {
        std::fs::read_to_string(fail.join("logs/rank_0.log"))
            .is_ok_and(|l| l.contains("step 5/100000"))
    };
    while !fail_stepping() {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "fail: not at step 5 after 300 s:\n{}",
            logs(&fail)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = kill_node(2);
    // Node 1's ranks of `requeue` go on, into a collective with the lost node.
    drop(held);
    let t_kill = Instant::now();
    println!(
        "  node 2 lost {:.1?} after the submissions: {killed} processes killed",
        t0.elapsed()
    );

    // The surviving ranks exit at their next collective; srun, which waits for node 2's
    // tasks, ends when Slurm marks node 2 down (SlurmdTimeout=20). Nothing of either job is
    // left on any node within 60 s.
    let mut ranks_gone = None;
    loop {
        let left: Vec<(u32, String, String)> = [&fail, &requeue]
            .iter()
            .flat_map(|d| processes_of(d))
            .collect();
        if ranks_gone.is_none() && !left.iter().any(|(_, comm, _)| comm == "flotilla-train") {
            ranks_gone = Some(t_kill.elapsed());
            println!(
                "  the surviving ranks exited {:.1?} after the loss",
                t_kill.elapsed()
            );
        }
        if left.is_empty() {
            break;
        }
        assert!(
            t_kill.elapsed() < Duration::from_secs(60),
            "60 s after node 2 was lost, processes remain: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "  every process of both jobs ended {:.1?} after the loss",
        t_kill.elapsed()
    );

    // The survivors on node 1 (ranks 0 and 1) name a rank of node 2 and its host.
    for dir in [&fail, &requeue] {
        for rank in 0..2 {
            let log = std::fs::read_to_string(dir.join(format!("logs/rank_{rank}.log"))).unwrap();
            assert!(
                (log.contains("rank 2 (fltnode2, ") || log.contains("rank 3 (fltnode2, "))
                    && log.contains("closed the connection"),
                "{}: rank {rank} does not name the lost rank and its host:\n{log}",
                dir.display()
            );
        }
    }
    let state = wait_job(&fail, Duration::from_secs(120));
    let st = job_status(&fail);
    let message = st["message"].as_str().unwrap_or_default().to_string();
    println!(
        "  fail: {state} {:.1?} after the loss, message:\n{message}",
        t_kill.elapsed()
    );
    // Slurm's word for a job whose node failed; with --no-requeue it stays ended.
    assert_eq!(state, "NODE_FAIL", "{st:#}");
    assert!(
        message.contains("(fltnode2, ") && message.contains("closed the connection"),
        "fail's reason does not name the lost rank's host: {st:#}"
    );
    let report = flotilla(&["report".into(), fail.display().to_string()]);
    assert!(
        report.contains(&state) && report.contains("(fltnode2, "),
        "report of fail:\n{report}"
    );

    // Node 2 comes back (its slurmd restarted; ReturnToService=2): `requeue` runs again.
    let _back = Cluster::start(2, &[]).expect("node 2 back");
    let t_back = Instant::now();
    let state = wait_job(&requeue, Duration::from_secs(300));
    assert_eq!(state, "COMPLETED", "requeue:\n{}", logs(&requeue));
    println!(
        "  requeue: COMPLETED {:.1?} after node 2 came back",
        t_back.elapsed()
    );
    let rank0 = std::fs::read_to_string(requeue.join("logs/rank_0.log")).unwrap();
    assert!(
        rank0.contains("resuming from") && rank0.contains("(step 10)"),
        "requeue: no resume from step 10 in\n{rank0}"
    );
    let batch = std::fs::read_dir(requeue.join("logs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect::<String>();
    assert!(
        batch.contains("(restart 1)"),
        "requeue's batch log:\n{batch}"
    );
    // The rows the resumed run wrote: from its step 10 on (the lost run's steps 10.. before
    // the loss, if it kept any, come first).
    let base = one_process_rows(&base_dir, baseline);
    let mut rows = read_rows(&requeue);
    let from = rows
        .iter()
        .rposition(|r| r.step == 10)
        .expect("a row of step 10");
    let resumed = rows.split_off(from);
    assert_rows("requeued and resumed", resumed, &base, 10);
    println!("node-loss scenarios: {:.1?}", t_all.elapsed());
}

/// A sweep of 2-node jobs on 3 nodes: `flotilla run -m` with 4 values submits one array of 4
/// jobs of 2 whole nodes (`--exclusive`) × 1 rank, so that one job fits at a time (a second
/// would need 2 of the 1 node left). Every job
/// completes with a curve of its own; squeue never shows two of them running at once; every
/// job ran on 2 distinct nodes of the 3, and `flotilla status` shows each job's node list (a
/// nodes column, `"nodes"` in the JSON).
#[test]
fn a_sweep_of_two_node_jobs_on_three_nodes() {
    let _serial = serial();
    let Some(_cluster) = Cluster::start(3, &[]) else {
        return;
    };
    common::train_binary();
    let t_all = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("flotilla-multinode-sweep")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let sweep = tmp.path().join("sweep");
    let mut args: Vec<String> = [
        "run",
        "-m",
        "compute=slurm",
        "compute.gpus_per_node=0",
        "compute.cpus_per_task=1",
        "compute.mem_gb=null",
        "compute.timeout_min=10",
        "compute.nodes=2",
        "compute.tasks_per_node=1",
        "+compute.additional_parameters.exclusive=true",
        "trainer/dist=ddp",
        "trainer.max_steps=10",
        "trainer.lr=1e-3,2e-3,3e-3,4e-3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(
        training(&sweep)
            .into_iter()
            .filter(|o| !o.starts_with("flotilla.run.dir") && !o.starts_with("trainer.lr=")),
    );
    args.retain(|a| a != &format!("trainer.max_steps={STEPS}"));
    args.push(format!("flotilla.sweep.dir={}", sweep.display()));
    flotilla(&args);

    // Watch the array: which of its tasks run, and on which nodes.
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sweep.join("sweep.json")).unwrap()).unwrap();
    let ids: Vec<String> = plan["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 4, "{plan:#}");
    let array = ids[0].split('_').next().unwrap().to_string();
    assert!(
        ids.iter().all(|i| i.starts_with(&format!("{array}_"))),
        "one array: {ids:?}"
    );
    let mut most_at_once = 0;
    let mut seen_nodes: std::collections::BTreeMap<String, String> = Default::default();
    let t0 = Instant::now();
    loop {
        let out = Command::new("squeue")
            .args(["-j", &array, "-h", "-t", "RUNNING", "-o", "%i|%N"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let running: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.split_once('|'))
            .map(|(i, n)| (i.trim().to_string(), n.trim().to_string()))
            .collect();
        most_at_once = most_at_once.max(running.len());
        for (id, nodes) in running {
            seen_nodes.insert(id, nodes);
        }
        let st: serde_json::Value = serde_json::from_str(&flotilla(&[
            "status".into(),
            "--format".into(),
            "json".into(),
            sweep.display().to_string(),
        ]))
        .unwrap();
        let states: Vec<&str> = st["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["state"].as_str().unwrap())
            .collect();
        if states.iter().all(|s| *s == "COMPLETED") {
            break;
        }
        assert!(
            !states
                .iter()
                .any(|s| matches!(*s, "FAILED" | "CANCELLED" | "NODE_FAIL")),
            "{st:#}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "the sweep did not complete in 600 s: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("  squeue: at most {most_at_once} job(s) running at once; nodes {seen_nodes:?}");
    assert_eq!(
        most_at_once, 1,
        "exclusive 2-node jobs on 3 nodes: one at a time"
    );

    let text = flotilla(&["status".into(), sweep.display().to_string()]);
    println!("{text}");
    let st: serde_json::Value = serde_json::from_str(&flotilla(&[
        "status".into(),
        "--format".into(),
        "json".into(),
        sweep.display().to_string(),
    ]))
    .unwrap();
    let mut finals = vec![];
    for job in st["jobs"].as_array().unwrap() {
        let id = job["job_id"].as_str().unwrap();
        let nodes = job["nodes"]
            .as_str()
            .unwrap_or_else(|| panic!("job {id} has no node list: {job:#}"));
        // The scheduler's list expanded: 2 distinct nodes of the cluster.
        let out = Command::new("scontrol")
            .args(["show", "hostnames", nodes])
            .output()
            .unwrap();
        let hosts: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(hosts.len(), 2, "job {id} on {nodes}");
        assert!(
            hosts
                .iter()
                .all(|h| slurm_cluster::node_names(3).contains(h)),
            "job {id} on {hosts:?}"
        );
        if let Some(seen) = seen_nodes.get(id) {
            assert_eq!(seen, nodes, "job {id}: squeue said {seen}, status {nodes}");
        }
        let line = text
            .lines()
            .find(|l| l.contains(&format!(" {id} ")))
            .unwrap_or_else(|| panic!("job {id} not in\n{text}"));
        assert!(line.contains(nodes), "no node list in {line:?}");
        let dir = PathBuf::from(job["dir"].as_str().unwrap());
        let rows = read_rows(&dir);
        assert_eq!(rows.len(), 10, "{}", dir.display());
        assert_placement(id, &dir, 2, 1);
        finals.push(rows[9].loss);
    }
    assert!(
        text.lines().next().unwrap().contains("4 COMPLETED"),
        "{text}"
    );
    // Four learning rates, four curves.
    finals.sort_by(f64::total_cmp);
    finals.dedup();
    assert_eq!(finals.len(), 4, "final losses {finals:?}");
    println!("sweep of 2-node jobs on 3 nodes: {:.1?}", t_all.elapsed());
}
