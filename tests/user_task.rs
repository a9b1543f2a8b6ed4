//! The user's own program as the task (`flotilla.task`), end to end through the CLI with the
//! programs of `examples/`: a plain PyTorch DDP script over gloo swept 2×2 (what every rank saw,
//! its losses against a single-process oracle, `flotilla report`), an unchanged Hydra app (its
//! config equals what `flotilla compose` says the job's config is), one torchrun per simulated
//! node (`ranks: per_node`), and what must fail: a missing program, a failing rank, a command
//! given as a string, `per_node` with a program that starts no workers, Ctrl-C — never leaving
//! a process behind.
//!
//! Each test copies its example into a temporary directory and runs `flotilla` there with the
//! project venv's `bin/` first in PATH (so `python` and `torchrun` are the venv's). Skipped, with
//! a `SKIPPED:` line, only when that python cannot import torch, hydra and omegaconf (a failure
//! instead with `FLOTILLA_REQUIRE_ORACLES` set).

mod common;
use common::copy_dir;

use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_flotilla");

/// The venv's `bin/` when its python imports torch, hydra and omegaconf; `None` after
/// [`common::skip_or_fail`] otherwise.
fn venv_bin(test: &str) -> Option<PathBuf> {
    let python = common::venv_python();
    if !common::venv_imports("torch, hydra, omegaconf") {
        common::skip_or_fail(&format!(
            "{test}: {} cannot import torch, hydra and omegaconf (run scripts/setup.sh)",
            python.display()
        ));
        return None;
    }
    // `flotilla run` finds the training task binary before anything else, whatever the task.
    common::train_binary();
    Some(python.parent().unwrap().to_path_buf())
}

/// PATH with `bin` first.
fn path_with(bin: &Path) -> OsString {
    let mut dirs = vec![bin.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(dirs).unwrap()
}

/// A copy of `examples/<name>` under `root`.
fn example(name: &str, root: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    let dst = root.join(name);
    copy_dir(&src, &dst);
    dst
}

/// `flotilla` run in `cwd` with the venv first in PATH and none of the variables of a rank
/// inherited from the test's own environment.
fn flotilla(cwd: &Path, bin: &Path) -> Command {
    let mut c = Command::new(EXE);
    c.current_dir(cwd)
        .env("PATH", path_with(bin))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("FLOTILLA_LOG");
    for v in [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "FLOTILLA_JOB_DIR",
        "FLOTILLA_CONFIG",
        "FLOTILLA_SWEEP_DIR",
        "FLOTILLA_JOB_NUM",
        "TORCHELASTIC_RUN_ID",
    ] {
        c.env_remove(v);
    }
    c
}

/// Starts `cmd` in its own process group with its output captured.
fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Waits at most `limit` for `child`; past it kills its process group (and every process whose
/// command line holds `marker`, when given) and panics with its output.
fn finish(mut child: Child, limit: Duration, marker: Option<&str>) -> (Output, Duration) {
    let t0 = Instant::now();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stdout.read_to_end(&mut b);
        b
    });
    let err_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    let status: Option<ExitStatus> = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > limit {
            // SAFETY: signalling the process group of the child this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            if let Some(m) = marker {
                for (pid, _) in processes_with(m) {
                    // SAFETY: a process started for this test (its argv holds the marker).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = t0.elapsed();
    let out = Output {
        status: status.unwrap_or_default(),
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    };
    if status.is_none() {
        panic!(
            "flotilla did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (out, elapsed)
}

/// Runs `cmd` to the end (at most 10 minutes).
fn run(cmd: &mut Command) -> Output {
    finish(spawn(cmd), Duration::from_secs(600), None).0
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", text(&o));
    o
}

fn read_json(path: &Path) -> Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", path.display()))
}

fn canon(p: impl AsRef<Path>) -> PathBuf {
    let p = p.as_ref();
    p.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A variable a rank recorded (`null` when it was not set).
fn var<'a>(seen: &'a Value, name: &str) -> Option<&'a str> {
    seen["env"][name].as_str()
}

fn var_path(seen: &Value, name: &str) -> PathBuf {
    canon(var(seen, name).unwrap_or_else(|| panic!("{name} not set: {seen:#}")))
}

/// `value` of the override `key=value` among a job's overrides.
fn override_value<'a>(job: &'a Value, key: &str) -> &'a str {
    job["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o.as_str()?.strip_prefix(&format!("{key}=")))
        .next()
        .unwrap_or_else(|| panic!("no override {key} in {job}"))
}

/// `(step, loss)` rows of a metrics.csv.
fn metrics(path: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("step,loss"), "{}", path.display());
    lines
        .map(|l| {
            let (s, v) = l.split_once(',').unwrap();
            (s.parse().unwrap(), v.parse().unwrap())
        })
        .collect()
}

/// Live (not zombie) processes, other than this one, whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(marker) {
            continue;
        }
        let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let state = state.rsplit(')').next().unwrap_or("").trim_start();
        if state.is_empty() || state.starts_with('Z') || state.starts_with('X') {
            continue;
        }
        found.push((pid, cmdline));
    }
    found
}

/// Asserts that no process holding `marker` is alive (allowing a moment for the kernel to
/// reap what was killed just before flotilla returned).
fn assert_none_left(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for (pid, _) in &left {
                // SAFETY: processes started for this test (their argv holds the marker).
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            panic!("processes of the job left behind: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A marker unique to one test run, put into a task's argv to find its processes.
fn marker(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("--flotilla-test-{name}-{}-{nanos}", std::process::id())
}

/// A local `compute:` section, its keys spelled out.
fn compute_yaml(nodes: usize, tasks_per_node: usize) -> String {
    format!(
        "compute:
  launcher: local
  nodes: {nodes}
  tasks_per_node: {tasks_per_node}
  gpus_per_node: 0
  cpus_per_task: 1
  mem_gb: null
  timeout_min: 10
  partition: null
  account: null
  qos: null
  constraint: null
  array_parallelism: 256
  signal_delay_s: 90
  max_num_timeout: 3
  setup: []
  additional_parameters: {{}}
  template: null
  max_parallel: 1
"
    )
}

/// Writes `root/conf/config.yaml` and returns `root`.
fn write_conf(root: &Path, config: &str) -> PathBuf {
    std::fs::create_dir_all(root.join("conf")).unwrap();
    std::fs::write(root.join("conf/config.yaml"), config).unwrap();
    root.to_path_buf()
}

/// The losses and final weights of the DDP example trained in one process on the whole of
/// every global batch, which is what 2 DDP ranks averaging their gradients compute; by `lr,steps`.
fn oracle_losses(example: &Path, runs: &[(f64, u64)]) -> Value {
    let script = r#"
import json, sys
import torch, torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import train
out = {}
for lr, steps in json.loads(sys.argv[2]):
    args = train.parse_args([f"--lr={lr}", f"--steps={steps}"])
    x, y = train.make_data(args.seed)
    model = train.make_model(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        xb, yb = train.global_batch(x, y, step, args.batch_size)
        opt.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out[f"{lr},{steps}"] = {"losses": losses, "weight": model.weight.detach().flatten().tolist()}
print(json.dumps(out))
"#;
    let runs: Vec<Value> = runs.iter().map(|(lr, s)| json!([lr, s])).collect();
    common::run_oracle(
        common::python("-c")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .arg(script)
            .arg(example)
            .arg(serde_json::to_string(&runs).unwrap()),
    )
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

// ---------------------------------------------------------------------------------------------
// the examples
// ---------------------------------------------------------------------------------------------

/// `examples/ddp_gloo` as a 2×2 local sweep: every job COMPLETED with 2 ranks that saw their
/// own rank, the job's values and directories and one port; their losses are a single
/// process's on the whole batch; `flotilla report` lists the jobs with their final loss.
#[test]
fn ddp_example_sweeps_and_every_rank_sees_its_job() {
    let Some(bin) = venv_bin("ddp_example_sweeps_and_every_rank_sees_its_job") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ex = example("ddp_gloo", tmp.path());
    let sweep = tmp.path().join("sweep");
    let out = ok(run(flotilla(&ex, &bin)
        .args(["run", "-m", "--config-dir", "conf", "--format", "json"])
        .args(["lr=0.1,0.2", "steps=3,5"])
        .arg(format!("flotilla.sweep.dir={}", sweep.display()))));
    let printed: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(canon(printed["sweep_dir"].as_str().unwrap()), canon(&sweep));
    let sweep = canon(&sweep);

    let plan = read_json(&sweep.join("sweep.json"));
    let jobs = plan["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4, "{plan:#}");
    let mut combos = BTreeSet::new();
    let mut expected = Vec::new();
    for job in jobs {
        let lr: f64 = override_value(job, "lr").parse().unwrap();
        let steps: u64 = override_value(job, "steps").parse().unwrap();
        combos.insert((override_value(job, "lr"), steps));
        expected.push((lr, steps));
    }
    assert_eq!(
        combos,
        BTreeSet::from([("0.1", 3), ("0.1", 5), ("0.2", 3), ("0.2", 5)])
    );
    let oracle = oracle_losses(&ex, &expected);

    let mut last_loss = std::collections::BTreeMap::new();
    for (job, &(lr, steps)) in jobs.iter().zip(&expected) {
        let num = job["num"].as_u64().unwrap();
        let dir = canon(sweep.join(job["dir"].as_str().unwrap()));
        assert_eq!(job["state"], "COMPLETED", "{job}");
        let seen: Vec<Value> = (0..2)
            .map(|r| read_json(&dir.join(format!("seen_rank{r}.json"))))
            .collect();
        for (r, s) in seen.iter().enumerate() {
            let r = r.to_string();
            assert_eq!(var(s, "RANK"), Some(r.as_str()), "{s:#}");
            assert_eq!(var(s, "LOCAL_RANK"), Some(r.as_str()), "{s:#}");
            assert_eq!(var(s, "ROLE_RANK"), Some(r.as_str()), "{s:#}");
            assert_eq!(var(s, "WORLD_SIZE"), Some("2"), "{s:#}");
            assert_eq!(var(s, "LOCAL_WORLD_SIZE"), Some("2"), "{s:#}");
            assert_eq!(var(s, "ROLE_WORLD_SIZE"), Some("2"), "{s:#}");
            assert_eq!(var(s, "GROUP_RANK"), Some("0"), "{s:#}");
            assert_eq!(var(s, "NODE_RANK"), Some("0"), "{s:#}");
            assert_eq!(var(s, "GROUP_WORLD_SIZE"), Some("1"), "{s:#}");
            assert_eq!(s["world_size"], 2, "the process group has 2 ranks");
            assert_eq!(
                s["allreduce_sum"], 3.0,
                "all_reduce of rank + 1 over 2 ranks"
            );
            let threads: u32 = var(s, "OMP_NUM_THREADS").unwrap().parse().unwrap();
            assert!(threads >= 1, "{s:#}");
            assert_eq!(
                var(s, "CUDA_VISIBLE_DEVICES"),
                None,
                "no GPUs asked for: {s:#}"
            );
            assert!(var(s, "TORCHELASTIC_RUN_ID").is_some_and(|v| !v.is_empty()));
            assert!(var(s, "MASTER_ADDR").is_some_and(|v| !v.is_empty()));
            // The job's own values reached its command line.
            assert_eq!(s["args"]["lr"].as_f64(), Some(lr), "{s:#}");
            assert_eq!(s["args"]["steps"].as_u64(), Some(steps), "{s:#}");
            // Its directories.
            assert_eq!(var_path(s, "FLOTILLA_JOB_DIR"), dir);
            assert_eq!(var_path(s, "FLOTILLA_CONFIG"), dir.join("config.yaml"));
            assert_eq!(var_path(s, "FLOTILLA_SWEEP_DIR"), sweep);
            assert_eq!(var(s, "FLOTILLA_JOB_NUM"), Some(num.to_string().as_str()));
            // cwd: null runs the program where flotilla was started.
            assert_eq!(canon(s["cwd"].as_str().unwrap()), canon(&ex));
        }
        for v in ["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"] {
            assert_eq!(
                var(&seen[0], v),
                var(&seen[1], v),
                "{v} differs across ranks"
            );
        }
        let port: u16 = var(&seen[0], "MASTER_PORT").unwrap().parse().unwrap();
        assert!(port > 0);
        assert_eq!(
            seen[0]["weight"], seen[1]["weight"],
            "DDP keeps the weights equal"
        );

        // FLOTILLA_CONFIG is the job's resolved config.
        let config: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join("config.yaml")).unwrap())
                .unwrap();
        assert_eq!(config["lr"].as_f64(), Some(lr));
        assert_eq!(config["steps"].as_u64(), Some(steps));
        assert_eq!(config["compute"]["tasks_per_node"].as_u64(), Some(2));
        assert!(
            config.get("flotilla").is_none(),
            "the runtime node stays out"
        );

        // Rank 0's metrics: one row per step, the losses of one process on the whole batch.
        let rows = metrics(&dir.join("metrics.csv"));
        let want = &oracle[format!("{lr},{steps}")];
        let want_losses: Vec<f64> = want["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..steps).collect::<Vec<_>>()
        );
        for ((step, got), want) in rows.iter().zip(&want_losses) {
            assert!(
                close(*got, *want, 1e-5),
                "job {num} step {step}: loss {got}, one process on the whole batch: {want}"
            );
        }
        assert!(
            rows.last().unwrap().1 < rows[0].1,
            "the loss falls: {rows:?}"
        );
        let got_w: Vec<f64> = seen[0]["weight"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        for (g, w) in got_w.iter().zip(want["weight"].as_array().unwrap()) {
            assert!(close(*g, w.as_f64().unwrap(), 1e-5), "{got_w:?} vs {want}");
        }
        last_loss.insert(num, (lr, steps, rows.last().unwrap().1));

        // One log per rank; rank 0's holds what it printed.
        let log0 = std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap();
        assert!(log0.contains("step 0: loss"), "{log0}");
        assert!(dir.join("logs/rank_1.log").is_file());
    }

    // `flotilla status` agrees with the plan.
    let st = ok(run(flotilla(&ex, &bin)
        .args(["status", "--format", "json"])
        .arg(&sweep)));
    let st: Value = serde_json::from_slice(&st.stdout).unwrap();
    let states: Vec<&str> = st["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["COMPLETED"; 4], "{st:#}");

    // The report reads the program's metrics.csv: params and final loss per job.
    let rep = ok(run(flotilla(&ex, &bin)
        .args(["report", "--format", "json"])
        .arg(&sweep)));
    let rep: Value = serde_json::from_slice(&rep.stdout).unwrap();
    assert_eq!(rep["metric"], "loss", "{rep:#}");
    let rows = rep["jobs"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rep:#}");
    for row in rows {
        let num = row["num"].as_u64().unwrap();
        let (lr, steps, last) = last_loss[&num];
        assert_eq!(row["state"], "COMPLETED", "{row:#}");
        assert_eq!(row["params"], json!({"lr": lr, "steps": steps}), "{row:#}");
        let fin = row["final"].as_f64().unwrap_or_else(|| panic!("{row:#}"));
        assert!(
            close(fin, last, 1e-12),
            "job {num}: final {fin}, metrics.csv {last}"
        );
        assert_eq!(row["steps"].as_u64(), Some(steps), "{row:#}");
    }
}

/// `examples/hydra_app`, an unchanged `@hydra.main` app, swept over a config group: the config
/// the app received is what `flotilla compose` says the job's config is, Hydra's output
/// directory is the job directory, and the job context `HydraConfig.get()` gives (mode,
/// job.num, job.id, overrides.task, job.override_dirname) is what hydra-core itself gives the
/// same app for the same command (`python app.py -m db=mysql,postgres`, run here too).
#[test]
fn hydra_app_gets_the_config_flotilla_composed() {
    let Some(bin) = venv_bin("hydra_app_gets_the_config_flotilla_composed") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ex = example("hydra_app", tmp.path());
    let sweep = tmp.path().join("sweep");
    let out = ok(run(flotilla(&ex, &bin)
        .args(["run", "-m", "--config-dir", "conf", "--format", "json"])
        .arg("db=mysql,postgres")
        .arg(format!("flotilla.sweep.dir={}", sweep.display()))));
    let sweep = canon(&sweep);
    let plan = read_json(&sweep.join("sweep.json"));
    let jobs = plan["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{plan:#}\n{}", text(&out));
    let mut dbs = Vec::new();
    for job in jobs {
        assert_eq!(job["state"], "COMPLETED", "{job}");
        let db = override_value(job, "db");
        dbs.push(db.to_string());
        let dir = canon(sweep.join(job["dir"].as_str().unwrap()));
        let result = read_json(&dir.join("app_result.json"));
        let composed = ok(run(flotilla(&ex, &bin).args([
            "compose",
            "--format",
            "json",
            &format!("db={db}"),
            "--config-dir",
            "conf",
        ])));
        let composed: Value = serde_json::from_slice(&composed.stdout).unwrap();
        assert_eq!(
            result["cfg"], composed,
            "job {db}: the app's cfg vs flotilla compose"
        );
        let driver = if db == "mysql" { "mysql" } else { "postgresql" };
        assert_eq!(result["cfg"]["db"]["driver"], driver);
        assert_eq!(
            result["cfg"]["app"]["url"],
            format!(
                "{driver}://{}:{}/inventory",
                result["cfg"]["db"]["host"].as_str().unwrap(),
                result["cfg"]["db"]["port"]
            )
        );
        assert!(result["cfg"].get("flotilla").is_none(), "{result:#}");
        // Hydra's output directory is the job directory; the program ran where flotilla did.
        assert_eq!(canon(result["output_dir"].as_str().unwrap()), dir);
        assert_eq!(canon(result["cwd"].as_str().unwrap()), canon(&ex));
        assert!(
            dir.join(".hydra/config.yaml").is_file(),
            "Hydra wrote into the job dir"
        );
        let log = std::fs::read_to_string(dir.join("logs/rank_0.log")).unwrap();
        assert!(log.contains(&format!("connecting to {driver}://")), "{log}");
    }
    dbs.sort();
    assert_eq!(dbs, ["mysql", "postgres"]);

    // The same multirun through Hydra itself.
    let hydra_sweep = tmp.path().join("hydra_sweep");
    let out = Command::new(bin.join("python"))
        .current_dir(&ex)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("FLOTILLA_JOB_DIR")
        .args(["app.py", "-m", "db=mysql,postgres"])
        .arg(format!("hydra.sweep.dir={}", hydra_sweep.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    for job in jobs {
        let num = job["num"].as_u64().unwrap();
        let dir = canon(sweep.join(job["dir"].as_str().unwrap()));
        let ours = read_json(&dir.join("app_result.json"));
        let theirs = read_json(&hydra_sweep.join(format!("{num}/app_result.json")));
        assert_eq!(
            ours["hydra"], theirs["hydra"],
            "job {num}: HydraConfig under flotilla vs under hydra-core"
        );
        assert_eq!(ours["hydra"]["mode"], "MULTIRUN");
        assert_eq!(ours["hydra"]["num"], num);
        let db = override_value(job, "db");
        assert_eq!(
            ours["hydra"]["task"],
            serde_json::json!([format!("db={db}")])
        );
        assert_eq!(ours["hydra"]["override_dirname"], format!("db={db}"));
        assert_eq!(
            ours["cfg"],
            theirs["cfg"]
                .as_object()
                .map(|c| {
                    let mut c = c.clone();
                    c.remove("flotilla");
                    Value::Object(c)
                })
                .unwrap()
        );
    }
}

/// `examples/torchrun` (`ranks: per_node`): one torchrun per simulated node, 2 workers each,
/// one world of 4.
#[test]
fn torchrun_example_forms_one_world_over_two_nodes() {
    let Some(bin) = venv_bin("torchrun_example_forms_one_world_over_two_nodes") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ex = example("torchrun", tmp.path());
    let run_dir = tmp.path().join("run");
    let out = ok(run(flotilla(&ex, &bin)
        .args(["run", "--config-dir", "conf", "--format", "json"])
        .arg(format!("flotilla.run.dir={}", run_dir.display()))));
    let run_dir = canon(&run_dir);
    let plan = read_json(&run_dir.join("job.json"));
    assert_eq!(
        plan["jobs"][0]["state"],
        "COMPLETED",
        "{plan:#}\n{}",
        text(&out)
    );
    let seen: Vec<Value> = (0..4)
        .map(|r| read_json(&run_dir.join(format!("worker_rank{r}.json"))))
        .collect();
    let mut ranks = BTreeSet::new();
    for s in &seen {
        let rank: usize = var(s, "RANK").unwrap().parse().unwrap();
        ranks.insert(rank);
        assert_eq!(var(s, "WORLD_SIZE"), Some("4"), "{s:#}");
        assert_eq!(var(s, "LOCAL_WORLD_SIZE"), Some("2"), "{s:#}");
        assert_eq!(var(s, "GROUP_WORLD_SIZE"), Some("2"), "{s:#}");
        let node = (rank / 2).to_string();
        assert_eq!(var(s, "GROUP_RANK"), Some(node.as_str()), "{s:#}");
        assert_eq!(
            var(s, "NODE_RANK"),
            Some(node.as_str()),
            "flotilla's NODE_RANK: {s:#}"
        );
        assert_eq!(
            var(s, "LOCAL_RANK"),
            Some((rank % 2).to_string().as_str()),
            "{s:#}"
        );
        assert_eq!(s["allreduce_sum"], 6.0, "0 + 1 + 2 + 3");
        assert_eq!(var_path(s, "FLOTILLA_JOB_DIR"), run_dir);
        assert_eq!(var_path(s, "FLOTILLA_CONFIG"), run_dir.join("config.yaml"));
        for v in ["TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"] {
            assert!(var(s, v).is_some(), "{v}: {s:#}");
            assert_eq!(var(s, v), var(&seen[0], v), "{v} differs across workers");
        }
        assert_eq!(
            s["weight"], seen[0]["weight"],
            "DDP keeps the weights equal"
        );
    }
    assert_eq!(ranks, BTreeSet::from([0, 1, 2, 3]));
    // One process (torchrun) per node, one log each, holding its workers' output.
    for node in 0..2 {
        let log = std::fs::read_to_string(run_dir.join(format!("logs/rank_{node}.log"))).unwrap();
        for local in 0..2 {
            let line = format!("worker {}/4 (node {node})", 2 * node + local);
            assert!(
                log.contains(&line),
                "{line:?} not in node {node}'s log:\n{log}"
            );
        }
    }
    assert!(!run_dir.join("logs/rank_2.log").exists());
}

/// Without a `compute` section one local process runs; `cwd`, `env` and the `{job_dir}`
/// placeholder reach it.
#[test]
fn one_process_without_compute_with_cwd_env_and_placeholders() {
    let Some(bin) = venv_bin("one_process_without_compute_with_cwd_env_and_placeholders") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work dir");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(
        work.join("probe.py"),
        r#"
import json, os, sys
out = sys.argv[1]
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "PROBE_VAR", "FLOTILLA_JOB_DIR", "FLOTILLA_CONFIG"]
json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": {k: os.environ.get(k) for k in keys}},
          open(out, "w"))
"#,
    )
    .unwrap();
    let root = write_conf(
        &tmp.path().join("proj"),
        &format!(
            "greeting: hello
flotilla:
  task:
    command: [python, probe.py, '{{job_dir}}/probe.json', '--greeting=${{greeting}}']
    cwd: '{}'
    env: {{PROBE_VAR: 'a b'}}
",
            work.display()
        ),
    );
    let run_dir = tmp.path().join("run");
    let out = ok(run(flotilla(&root, &bin)
        .args(["run", "--config-dir", "conf", "greeting=bonjour"])
        .arg(format!("flotilla.run.dir={}", run_dir.display()))));
    let run_dir = canon(&run_dir);
    let probe = read_json(&run_dir.join("probe.json"));
    let argv = probe["argv"].as_array().unwrap();
    assert_eq!(argv.len(), 2, "{probe:#}\n{}", text(&out));
    assert_eq!(canon(argv[0].as_str().unwrap()), run_dir.join("probe.json"));
    assert_eq!(argv[1], "--greeting=bonjour");
    assert_eq!(canon(probe["cwd"].as_str().unwrap()), canon(&work));
    assert_eq!(var(&probe, "RANK"), Some("0"));
    assert_eq!(var(&probe, "LOCAL_RANK"), Some("0"));
    assert_eq!(var(&probe, "WORLD_SIZE"), Some("1"));
    assert_eq!(var(&probe, "PROBE_VAR"), Some("a b"));
    assert_eq!(var_path(&probe, "FLOTILLA_JOB_DIR"), run_dir);
    assert_eq!(
        var_path(&probe, "FLOTILLA_CONFIG"),
        run_dir.join("config.yaml")
    );
    let plan = read_json(&run_dir.join("job.json"));
    assert_eq!(plan["jobs"][0]["state"], "COMPLETED");
}

// ---------------------------------------------------------------------------------------------
// what must fail
// ---------------------------------------------------------------------------------------------

/// A program that is not there is refused before anything is created.
#[test]
fn a_missing_program_is_refused_before_anything_is_created() {
    let Some(bin) = venv_bin("a_missing_program_is_refused_before_anything_is_created") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = write_conf(
        tmp.path(),
        "flotilla:\n  task:\n    command: [flotilla-test-no-such-program, --lr=1]\n",
    );
    for multirun in [false, true] {
        let mut cmd = flotilla(&root, &bin);
        cmd.args(["run", "--config-dir", "conf"]);
        if multirun {
            cmd.args(["-m", "+x=1,2"]);
        }
        let out = run(&mut cmd);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("flotilla-test-no-such-program"), "{err}");
        assert!(!root.join("outputs").exists(), "nothing is created: {err}");
    }
}

/// A rank exiting 3 while the other sleeps: the job FAILED naming rank 1 and status 3, well
/// before the sleeper would have ended, and no process of the job left.
#[test]
fn a_failing_rank_fails_the_job_and_stops_the_others() {
    let Some(bin) = venv_bin("a_failing_rank_fails_the_job_and_stops_the_others") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mark = marker("fail");
    std::fs::write(
        tmp.path().join("fail.py"),
        r#"
import os, sys, time
rank = int(os.environ["RANK"])
job = os.environ["FLOTILLA_JOB_DIR"]
open(os.path.join(job, f"started_{rank}"), "w").write(str(os.getpid()))
if rank == 1:
    # Fail once rank 0 is surely sleeping.
    t0 = time.time()
    while not os.path.exists(os.path.join(job, "started_0")) and time.time() - t0 < 60:
        time.sleep(0.05)
    print("rank 1: the data is gone (boom)", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(300)
"#,
    )
    .unwrap();
    let root = write_conf(
        tmp.path(),
        &format!(
            "{}flotilla:\n  task:\n    command: [python, fail.py, '{mark}']\n",
            compute_yaml(1, 2)
        ),
    );
    let run_dir = tmp.path().join("run");
    let child = spawn(
        flotilla(&root, &bin)
            .args(["run", "--config-dir", "conf", "--format", "json"])
            .arg(format!("flotilla.run.dir={}", run_dir.display())),
    );
    let (out, elapsed) = finish(child, Duration::from_secs(280), Some(&mark));
    assert!(
        elapsed < Duration::from_secs(150),
        "flotilla waited for the sleeping rank ({elapsed:?})"
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_none_left(&mark);
    let plan = read_json(&run_dir.join("job.json"));
    let job = &plan["jobs"][0];
    assert_eq!(job["state"], "FAILED", "{plan:#}");
    let msg = job["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("rank 1 exited with status 3") || msg.contains("rank 1 exited with code 3"),
        "{msg}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rank 1") && err.contains("(boom)"), "{err}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["jobs"][0]["state"], "FAILED");
    // Both ranks had started.
    assert!(run_dir.join("started_0").is_file() && run_dir.join("started_1").is_file());
}

/// Ctrl-C during a long-running program: flotilla exits, the job is CANCELLED, nothing is left.
#[test]
fn ctrl_c_cancels_the_job_and_leaves_no_process() {
    let Some(bin) = venv_bin("ctrl_c_cancels_the_job_and_leaves_no_process") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mark = marker("ctrlc");
    std::fs::write(
        tmp.path().join("sleep.py"),
        r#"
import os, time
rank = os.environ["RANK"]
open(os.path.join(os.environ["FLOTILLA_JOB_DIR"], f"started_{rank}"), "w").write(str(os.getpid()))
time.sleep(300)
"#,
    )
    .unwrap();
    let root = write_conf(
        tmp.path(),
        &format!(
            "{}flotilla:\n  task:\n    command: [python, sleep.py, '{mark}']\n",
            compute_yaml(1, 2)
        ),
    );
    let run_dir = tmp.path().join("run");
    let child = spawn(
        flotilla(&root, &bin)
            .args(["run", "--config-dir", "conf", "--format", "json"])
            .arg(format!("flotilla.run.dir={}", run_dir.display())),
    );
    let t0 = Instant::now();
    while !(run_dir.join("started_0").exists() && run_dir.join("started_1").exists()) {
        if t0.elapsed() > Duration::from_secs(120) {
            let (out, _) = finish(child, Duration::from_secs(1), Some(&mark));
            panic!("the program never started: {}", text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(processes_with(&mark).len() >= 2, "both ranks run");
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let (out, _) = finish(child, Duration::from_secs(60), Some(&mark));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_none_left(&mark);
    let plan = read_json(&run_dir.join("job.json"));
    assert_eq!(plan["jobs"][0]["state"], "CANCELLED", "{plan:#}");
}

/// Task settings that cannot work are config errors (exit 2) before anything is created: a
/// command given as one string, and `per_node` with a program that starts no workers.
#[test]
fn bad_task_settings_are_config_errors() {
    let Some(bin) = venv_bin("bad_task_settings_are_config_errors") else {
        return;
    };
    let cases = [
        (
            "flotilla:\n  task:\n    command: python train.py\n".to_string(),
            "command",
        ),
        (
            format!(
                "{}flotilla:\n  task:\n    command: [python, worker.py]\n    ranks: per_node\n",
                compute_yaml(1, 2)
            ),
            "per_node",
        ),
    ];
    for (config, needle) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let root = write_conf(tmp.path(), &config);
        let out = run(flotilla(&root, &bin).args(["run", "--config-dir", "conf"]));
        assert_eq!(out.status.code(), Some(2), "{config}\n{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{config}\n{err}");
        assert!(!root.join("outputs").exists(), "nothing is created: {err}");
    }
}
