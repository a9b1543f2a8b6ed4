//! The command-line contract: output formats, exit codes, and errors that name their culprit.

use std::path::Path;
use std::process::{Command, Output};

fn flotilla(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run flotilla")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "flotilla failed: {}", stderr(o));
    serde_json::from_str(&stdout(o)).expect("valid JSON on stdout")
}

fn assert_config_error(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "stderr: {}", stderr(o));
    let err = stderr(o);
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in: {err}");
    }
}

#[test]
fn compose_default_config_as_json() {
    let cfg = json(&flotilla(&["compose", "--format", "json"]));
    let keys: Vec<&str> = cfg
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "model",
            "peft",
            "trainer",
            "data",
            "objective",
            "compute",
            "seed"
        ]
    );
    assert_eq!(cfg["objective"]["kind"], "sft");
    assert!(cfg.get("flotilla").is_none() && cfg.get("hydra").is_none());
    assert_eq!(cfg["trainer"]["dist"]["mode"], "ddp");
    assert_eq!(cfg["compute"]["tasks_per_node"], 2);
    // trainer.seed interpolates the top-level seed.
    assert_eq!(cfg["trainer"]["seed"], cfg["seed"]);
}

#[test]
fn compose_applies_overrides_with_hydra_typing() {
    let cfg = json(&flotilla(&[
        "compose",
        "--format",
        "json",
        "trainer.lr=1e-4",
        "trainer/dist=fsdp",
        "+extra.tag='007'",
        "seed=7",
    ]));
    assert_eq!(cfg["trainer"]["lr"], serde_json::json!(0.0001));
    assert_eq!(cfg["trainer"]["dist"]["mode"], "fsdp");
    assert_eq!(cfg["extra"]["tag"], "007");
    assert_eq!(cfg["seed"], 7);
    assert_eq!(cfg["trainer"]["seed"], 7);
}

#[test]
fn compose_yaml_with_provenance_names_files_and_overrides() {
    let out = flotilla(&["compose", "--provenance", "trainer.max_steps=5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("max_steps: 5  # override 'trainer.max_steps=5'"),
        "{text}"
    );
    assert!(text.contains("conf/model/tiny.yaml:"), "{text}");
}

#[test]
fn unknown_key_suggests_near_miss() {
    let out = flotilla(&["compose", "trainer.lrr=0.1"]);
    assert_config_error(
        &out,
        &[
            "trainer.lrr",
            "did you mean 'trainer.lr'?",
            "+trainer.lrr=0.1",
        ],
    );
}

#[test]
fn misspelt_group_path_suggests_the_group() {
    for (given, meant) in [
        ("trainr/dist=fsdp", "trainer/dist=fsdp"),
        ("trainer/dst=fsdp", "trainer/dist=fsdp"),
    ] {
        let out = flotilla(&["compose", given]);
        assert_config_error(
            &out,
            &[
                &format!(
                    "did you mean the config group '{}'",
                    meant.split('=').next().unwrap()
                ),
                meant,
            ],
        );
        assert!(!stderr(&out).contains("trainer.dist"), "{}", stderr(&out));
    }
}

#[test]
fn dict_over_list_is_refused_naming_the_key() {
    let out = flotilla(&["compose", "trainer.betas={a:1}"]);
    assert_config_error(
        &out,
        &[
            "trainer.betas={a:1}",
            "cannot merge a dictionary into the list at 'trainer.betas'",
        ],
    );
}

#[test]
fn unknown_group_option_lists_options() {
    let out = flotilla(&["compose", "model=tiny2"]);
    assert_config_error(&out, &["model/tiny2", "tiny"]);
}

#[test]
fn malformed_override_is_a_clean_error() {
    let out = flotilla(&["compose", "trainer.lr=[1,2"]);
    assert_config_error(&out, &["trainer.lr=[1,2"]);
}

#[test]
fn sweep_without_multirun_is_refused() {
    let out = flotilla(&["compose", "trainer.lr=1,2"]);
    assert_config_error(&out, &["--multirun"]);
}

#[test]
fn missing_config_dir_is_a_config_error() {
    let out = flotilla(&["compose", "--config-dir", "no/such/dir"]);
    assert_config_error(&out, &["no/such/dir"]);
}

#[test]
fn malformed_yaml_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), "a: 1\nb: [1, 2\nc: 3\n").unwrap();
    let out = flotilla(&["compose", "--config-dir", dir.path().to_str().unwrap()]);
    assert_config_error(&out, &["config.yaml:"]);
}

#[test]
fn plan_multirun_orders_jobs_like_hydra() {
    let plan = json(&flotilla(&[
        "plan",
        "-m",
        "--format",
        "json",
        "trainer.lr=0.1,0.2",
        "+tag=a,b,c",
    ]));
    let jobs = plan["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 6);
    let overrides: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            j["overrides"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(overrides[0], ["trainer.lr=0.1", "+tag=a"]);
    assert_eq!(overrides[1], ["trainer.lr=0.1", "+tag=b"]);
    assert_eq!(overrides[5], ["trainer.lr=0.2", "+tag=c"]);
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(j["num"], i);
    }
    assert_eq!(jobs[4]["config"]["trainer"]["lr"], 0.2);
    assert_eq!(jobs[4]["config"]["tag"], "b");
}

/// A sweep large enough to be composed on several threads, varying a group choice (so jobs share
/// merged defaults trees per choice) and a value: every job's config equals the config
/// `flotilla compose` prints for its overrides alone, in BasicSweeper order.
#[test]
fn a_large_sweep_plans_in_order_and_each_job_equals_its_own_composition() {
    let plan = json(&flotilla(&[
        "plan",
        "-m",
        "--format",
        "json",
        "model=tiny,small",
        "+a=range(0,60)",
        "trainer.lr=0.1,0.2",
    ]));
    let jobs = plan["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 240);
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job["num"], i);
        let model = if i < 120 { "tiny" } else { "small" };
        let a = (i / 2) % 60;
        let lr = if i % 2 == 0 { "0.1" } else { "0.2" };
        let expected = [
            format!("model={model}"),
            format!("+a={a}"),
            format!("trainer.lr={lr}"),
        ];
        assert_eq!(job["overrides"], serde_json::json!(expected), "job {i}");
        assert_eq!(job["config"]["a"], a, "job {i}");
    }
    for i in [0usize, 1, 119, 120, 239] {
        let overrides: Vec<&str> = jobs[i]["overrides"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let mut args = vec!["compose", "--format", "json"];
        args.extend(overrides);
        let alone = json(&flotilla(&args));
        assert_eq!(jobs[i]["config"], alone, "job {i}");
    }
    assert_ne!(jobs[0]["config"]["model"], jobs[120]["config"]["model"]);
}

/// A broken job deep in a large sweep: the error names the first broken job in job order and
/// nothing is printed on stdout.
#[test]
fn a_large_sweep_reports_its_first_broken_job_and_prints_nothing() {
    let out = flotilla(&[
        "plan",
        "-m",
        "--format",
        "json",
        "trainer.max_steps=5,-1",
        "+a=range(0,100)",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("job 100 (trainer.max_steps=-1 +a=0)") && err.contains("trainer.max_steps"),
        "{err}"
    );
}

#[test]
fn plan_with_named_sweep_file() {
    assert!(Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("sweeps/lr.yaml")
        .exists());
    let plan = json(&flotilla(&[
        "plan",
        "-m",
        "--sweep",
        "sweeps/lr.yaml",
        "--format",
        "json",
    ]));
    assert!(plan["jobs"].as_array().unwrap().len() >= 2);
}

#[test]
fn plan_table_lists_one_line_per_job() {
    let out = flotilla(&["plan", "-m", "+x=range(0,3)"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("+x=0") && text.contains("+x=2"), "{text}");
    assert!(text.trim_end().ends_with("3 jobs"), "{text}");
}

/// `plan -m` of a SLURM sweep prints the `sbatch` submissions `run` would make: one per job
/// array, the jobs grouped by compute and task kind (here the user's program per rank and per
/// node, from a config group) and split at the cluster's `MaxArraySize` (2, from a stand-in
/// `scontrol` on `PATH`); packed, one array of allocations per group, at most `MaxArraySize`.
#[test]
fn plan_prints_the_sbatch_submissions_of_a_slurm_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let proj = tmp.path();
    std::fs::create_dir_all(proj.join("conf/kind")).unwrap();
    std::fs::create_dir_all(proj.join("bin")).unwrap();
    std::fs::write(
        proj.join("conf/config.yaml"),
        "x: 0\ncompute:\n  launcher: slurm\n  tasks_per_node: 1\n  gpus_per_node: 1\n  \
         cpus_per_task: 1\n  timeout_min: 5\nflotilla:\n  task:\n    \
         command: [bash, job.sh, '${x}']\n",
    )
    .unwrap();
    std::fs::write(
        proj.join("conf/kind/task.yaml"),
        "# @package _global_\n{}\n",
    )
    .unwrap();
    std::fs::write(
        proj.join("conf/kind/node.yaml"),
        "# @package _global_\nflotilla:\n  task:\n    ranks: per_node\n",
    )
    .unwrap();
    std::fs::write(proj.join("job.sh"), "").unwrap();
    let scontrol = proj.join("bin/scontrol");
    std::fs::write(
        &scontrol,
        "#!/bin/sh\necho 'MaxJobCount             = 10000'\necho 'MaxArraySize            = 2'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        proj.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let plan = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("plan")
            .arg("-m")
            .args(args)
            .current_dir(proj)
            .env("PATH", &path)
            .output()
            .expect("run flotilla");
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        text[text.find(" jobs\n").expect("the job count") + 6..].to_string()
    };
    assert_eq!(
        plan(&["x=range(0,3)", "+kind=task,node"]),
        "sbatch: 4 submissions (MaxArraySize 2)\n\
         \x20 1. job array --array=0-1%256: 2 jobs (0,2), 1 node x 1 task each, 1 GPU per node; your program, one process per rank\n\
         \x20 2. job array --array=0-0%256: 1 job (4), 1 node x 1 task each, 1 GPU per node; your program, one process per rank\n\
         \x20 3. job array --array=0-1%256: 2 jobs (1,3), 1 node x 1 task each, 1 GPU per node; your program, one process per node\n\
         \x20 4. job array --array=0-0%256: 1 job (5), 1 node x 1 task each, 1 GPU per node; your program, one process per node\n"
    );
    // Packed 2 at a time, 6 jobs of a kind need 3 allocations; an array holds 2.
    let packed = plan(&["x=range(0,6)", "+kind=task,node", "+compute.pack=2"]);
    assert!(
        packed.starts_with("sbatch: 2 submissions (MaxArraySize 2)\n"),
        "{packed}"
    );
    assert!(
        packed.contains(
            "  1. job array --array=0-1, packed: 6 jobs (0,2,4,6,8,10) into 2 allocations of 1 \
             node (2 slots: 2 CPUs, 2 GPUs), 2 jobs at a time in each (1 rank per job; your \
             program, one process per rank)\n"
        ),
        "{packed}"
    );
    assert!(
        packed.contains(
            "  2. job array --array=0-1, packed: 6 jobs (1,3,5,7,9,11) into 2 allocations"
        ),
        "{packed}"
    );
}

/// Composes a primary config holding `text` in a fresh directory.
fn compose_text(text: &[u8]) -> (Output, std::time::Duration) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), text).unwrap();
    let start = std::time::Instant::now();
    let out = flotilla(&["compose", "--config-dir", dir.path().to_str().unwrap()]);
    (out, start.elapsed())
}

/// The "billion laughs" document: 9 levels of anchors, each a list of 9 aliases of the last.
fn billion_laughs() -> String {
    let mut text = String::from("lol0: &lol0 \"lol\"\n");
    for level in 1..=9 {
        let aliases = vec![format!("*lol{}", level - 1); 9].join(", ");
        text.push_str(&format!("lol{level}: &lol{level} [{aliases}]\n"));
    }
    text
}

#[test]
fn alias_bomb_is_refused_naming_file_and_anchor() {
    let (out, _) = compose_text(billion_laughs().as_bytes());
    assert_config_error(&out, &["config.yaml:", "alias *lol", "anchor &lol"]);
    // Aliases that stay small keep working.
    let (out, _) = compose_text(b"base: &b {x: 1, y: [1, 2]}\nuse1: *b\nuse2:\n  <<: *b\n  y: 3\n");
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("use1:\n  x: 1") && text.contains("use2:\n  x: 1\n  'y': 3"),
        "{text}"
    );
}

#[test]
fn very_deep_nesting_is_a_clean_error() {
    let depth = 100_000;
    let text = format!("a: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    let (out, _) = compose_text(text.as_bytes());
    assert_config_error(&out, &["config.yaml:1:", "recursion limit"]);
    let text = format!("a: {}1{}\n", "{b: ".repeat(600), "}".repeat(600));
    let (out, _) = compose_text(text.as_bytes());
    assert_config_error(&out, &["config.yaml:1:", "recursion limit"]);
}

#[test]
fn huge_scalar_and_junk_bytes_are_handled() {
    let big = "x".repeat(8 << 20);
    let (out, _) = compose_text(format!("a: {big}\n").as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).len(), big.len() + "a: \n".len());
    let (out, _) = compose_text(b"a: 1\n\xff\xfe\x00junk: [\n");
    assert_config_error(&out, &["config.yaml"]);
}

#[test]
fn merge_keys_order_and_precedence_follow_pyyaml() {
    // As PyYAML 6.0.4 + OmegaConf load it (checked with OmegaConf.load): merged pairs first in
    // source order, explicit keys win and keep the merged place; between sources a
    // 1-character key keeps the first source's value, a longer key takes the last one's.
    let (out, _) = compose_text(
        b"a: &a {p: 1, q: 1, pp: 1, qq: 1}\nb: &b {q: 2, r: 2, qq: 2, rr: 2}\nm:\n  s: 0\n  <<: [*a, *b]\n  r: 9\nn:\n  <<: *a\n  <<: *b\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let expected_m = "m:\n  p: 1\n  q: 1\n  pp: 1\n  qq: 2\n  r: 9\n  rr: 2\n  s: 0\n";
    let expected_n = "'n':\n  p: 1\n  q: 1\n  pp: 1\n  qq: 2\n  r: 2\n  rr: 2\n";
    assert!(
        text.contains(expected_m) && text.ends_with(expected_n),
        "{text}"
    );
}

/// Runs flotilla in `cwd` with the settings layers pointed into `home` (site file
/// `home/site.yaml`, user file `home/flotilla/settings.yaml`) and the extra variables `env`.
fn flotilla_with_settings(cwd: &Path, home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flotilla"));
    cmd.args(args)
        .current_dir(cwd)
        .env("FLOTILLA_SITE_SETTINGS", home.join("site.yaml"))
        .env("XDG_CONFIG_HOME", home);
    for var in [
        "FLOTILLA_ACCOUNT",
        "FLOTILLA_PARTITION",
        "FLOTILLA_QOS",
        "FLOTILLA_SETUP",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run flotilla")
}

#[test]
fn settings_layers_fill_unset_compute_keys_with_their_origin() {
    let home = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    std::fs::write(
        home.path().join("site.yaml"),
        "account: site-acct\npartition: site-part\nqos: site-qos\nsetup: [module load site]\n",
    )
    .unwrap();
    std::fs::create_dir_all(home.path().join("flotilla")).unwrap();
    std::fs::write(
        home.path().join("flotilla/settings.yaml"),
        "# mine\npartition: user-part\nqos: user-qos\n",
    )
    .unwrap();
    std::fs::create_dir_all(project.path().join(".flotilla")).unwrap();
    std::fs::write(
        project.path().join(".flotilla/settings.yaml"),
        "qos: project-qos\n",
    )
    .unwrap();
    let args = [
        "compose",
        "--config-dir",
        conf.to_str().unwrap(),
        "--format",
        "json",
        "--provenance",
        "compute=slurm",
        "compute.tasks_per_node=2",
    ];
    let out = flotilla_with_settings(project.path(), home.path(), &[], &args);
    let doc = json(&out);
    let compute = &doc["config"]["compute"];
    assert_eq!(compute["account"], "site-acct");
    assert_eq!(compute["partition"], "user-part");
    assert_eq!(compute["qos"], "project-qos");
    assert_eq!(compute["setup"], serde_json::json!(["module load site"]));
    let origin = |key: &str| doc["provenance"][key].as_str().unwrap().to_string();
    assert!(origin("compute.account").ends_with("site.yaml:1"), "{doc}");
    assert!(
        origin("compute.partition").ends_with("flotilla/settings.yaml:2"),
        "{doc}"
    );
    assert!(
        origin("compute.qos").ends_with(".flotilla/settings.yaml:1"),
        "{doc}"
    );
    // The environment is the last layer; a config value or an override beats every layer.
    let out = flotilla_with_settings(
        project.path(),
        home.path(),
        &[("FLOTILLA_QOS", "env-qos")],
        &[&args[..], &["compute.account=cli-acct"]].concat(),
    );
    let doc = json(&out);
    assert_eq!(doc["config"]["compute"]["qos"], "env-qos");
    assert_eq!(
        doc["provenance"]["compute.qos"],
        "environment variable FLOTILLA_QOS"
    );
    assert_eq!(doc["config"]["compute"]["account"], "cli-acct");
}

#[test]
fn malformed_or_unknown_settings_are_config_errors_naming_file_and_line() {
    let home = tempfile::tempdir().unwrap();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let args = ["compose", "--config-dir", conf.to_str().unwrap()];
    std::fs::write(home.path().join("site.yaml"), "account: ok\nacount: typo\n").unwrap();
    let out = flotilla_with_settings(home.path(), home.path(), &[], &args);
    assert_config_error(
        &out,
        &[
            "site.yaml:2",
            "unknown setting 'acount'",
            "did you mean 'account'",
        ],
    );
    std::fs::write(home.path().join("site.yaml"), "account: [unclosed\n").unwrap();
    let out = flotilla_with_settings(home.path(), home.path(), &[], &args);
    assert_config_error(&out, &["site.yaml:2:", "malformed YAML"]);
    std::fs::write(home.path().join("site.yaml"), "setup: 3\n").unwrap();
    let out = flotilla_with_settings(home.path(), home.path(), &[], &args);
    assert_config_error(&out, &["setup"]);
}

#[test]
fn a_missing_training_binary_is_refused_before_anything_is_created() {
    let home = tempfile::tempdir().unwrap();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let out = flotilla_with_settings(
        home.path(),
        home.path(),
        &[("FLOTILLA_TRAIN_BINARY", "/nonexistent/flotilla-train")],
        &["run", "--config-dir", conf.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("/nonexistent/flotilla-train")
            && err.contains("cargo build --release -p flotilla-train"),
        "{err}"
    );
    assert!(
        !home.path().join("outputs").exists(),
        "nothing may be created"
    );
    // A lone `flotilla` with no task binary beside it or on PATH says where it looked.
    let lone = home.path().join("bin");
    std::fs::create_dir_all(&lone).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_flotilla"), lone.join("flotilla")).unwrap();
    let out = Command::new(lone.join("flotilla"))
        .args(["run", "--config-dir", conf.to_str().unwrap()])
        .current_dir(home.path())
        .env("PATH", "/usr/bin:/bin")
        .env("FLOTILLA_SITE_SETTINGS", home.path().join("site.yaml"))
        .env("XDG_CONFIG_HOME", home.path())
        .env_remove("FLOTILLA_TRAIN_BINARY")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("`flotilla-train` was not found") && err.contains(lone.to_str().unwrap()),
        "{err}"
    );
    assert!(
        !home.path().join("outputs").exists(),
        "nothing may be created"
    );
}

#[test]
fn the_cli_links_no_libtorch_and_works_beside_a_task_binary_it_never_loads() {
    let readelf = Command::new("readelf")
        .args(["-d", env!("CARGO_BIN_EXE_flotilla")])
        .output()
        .expect("readelf (binutils) runs");
    let dynamic = String::from_utf8_lossy(&readelf.stdout);
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "{dynamic}");
    for lib in ["torch", "c10", "cuda", "nccl"] {
        assert!(
            !needed.iter().any(|l| l.contains(lib)),
            "links {lib}: {needed:?}"
        );
    }
    // A login node: `flotilla` and a `flotilla-train` that cannot even start (no libtorch there),
    // no LD_LIBRARY_PATH. Composing, planning and preparing a run never touch the task binary.
    let node = tempfile::tempdir().unwrap();
    let bin = node.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_flotilla"), bin.join("flotilla")).unwrap();
    std::fs::write(
        bin.join("flotilla-train"),
        "#!/bin/sh\necho 'no libtorch here' >&2\nexit 127\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        bin.join("flotilla-train"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let run = |args: &[&str]| {
        Command::new(bin.join("flotilla"))
            .args(args)
            .arg("--config-dir")
            .arg(&conf)
            .current_dir(node.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", node.path())
            .env("FLOTILLA_SITE_SETTINGS", node.path().join("none.yaml"))
            .output()
            .unwrap()
    };
    let out = run(&["compose"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["plan", "-m", "trainer.lr=1e-4,3e-4"]);
    assert!(
        out.status.success() && stdout(&out).ends_with("2 jobs\n"),
        "{}",
        stderr(&out)
    );
    let out = run(&[
        "run",
        "--dry-run",
        "--format",
        "json",
        "flotilla.run.dir=outputs/dry",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(node.path().join("outputs/dry/config.yaml").is_file());
}

#[test]
fn a_run_that_ends_inside_its_warmup_is_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("short");
    let out = flotilla(&[
        "run",
        "--dry-run",
        "trainer.max_steps=20",
        &format!("flotilla.run.dir={}", dir.display()),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("trainer.max_steps=20 < trainer.warmup_steps=50")
            && err.contains("trainer.warmup_steps=2"),
        "{err}"
    );
    // A warmup that ends in time says nothing.
    let out = flotilla(&[
        "run",
        "--dry-run",
        "trainer.max_steps=60",
        &format!("flotilla.run.dir={}", tmp.path().join("long").display()),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warmup"), "{}", stderr(&out));
}

/// `flotilla <args>` run in `cwd` (the repository's `conf/` named by path).
fn flotilla_in_dir(cwd: &Path, args: &[&str]) -> Output {
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let (command, rest) = args.split_first().expect("a subcommand");
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg(command)
        .arg("--config-dir")
        .arg(conf)
        .args(rest)
        .current_dir(cwd)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla")
}

/// A job that can only fail once it has started (CUDA ranks on the cpu backend), or that
/// hydra-core refuses before it starts (a `???` Hydra reads itself), is refused alike by
/// `compose`, `plan` and `run`, single or multirun: exit 2, naming the keys and the fix, with
/// nothing created.
#[test]
fn contradictions_and_mandatory_runtime_values_are_refused_before_anything_is_created() {
    // No task binary is needed: nothing is started.
    let run = ["run", "--dry-run", "--task-exec", "/bin/true"];
    let single: [&[&str]; 3] = [&["compose"], &["plan"], &run];
    let multi: [&[&str]; 2] = [&["plan", "-m"], &[&run[..], &["-m"]].concat()];
    let cases: [(&[&str], &[&str], bool); 4] = [
        (
            &["trainer.device=cuda", "trainer.dist.backend=cpu"],
            &[
                "trainer.dist.backend: cpu exchanges CPU tensors only",
                "trainer.device is cuda (set by override 'trainer.device=cuda')",
                "set trainer.dist.backend=nccl",
            ],
            true,
        ),
        (
            &["hydra.job.chdir=???"],
            &[
                "hydra.job.chdir is mandatory (???)",
                "MissingMandatoryValue",
                "set it, e.g. hydra.job.chdir=false",
            ],
            true,
        ),
        (
            &["+flotilla.job.env_set.WANDB_API_KEY=???"],
            &["flotilla.job.env_set.WANDB_API_KEY is mandatory (???)"],
            true,
        ),
        // Only a multirun reads the sweep directory.
        (
            &["flotilla.sweep.dir=???"],
            &["flotilla.sweep.dir is mandatory (???)"],
            false,
        ),
    ];
    for (overrides, needles, in_single_runs) in cases {
        let commands = multi.iter().chain(single.iter().filter(|_| in_single_runs));
        for command in commands {
            let tmp = tempfile::tempdir().unwrap();
            let args = [*command, overrides].concat();
            let out = flotilla_in_dir(tmp.path(), &args);
            assert_config_error(&out, needles);
            let created: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
            assert!(created.is_empty(), "{args:?} created {created:?}");
        }
    }
    // A single run reads no sweep directory; one process has no collective.
    for overrides in [
        &["flotilla.sweep.dir=???"][..],
        &[
            "trainer.device=cuda",
            "trainer.dist.backend=cpu",
            "compute.tasks_per_node=1",
        ],
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let out = flotilla_in_dir(tmp.path(), &[&["compose"][..], overrides].concat());
        assert!(out.status.success(), "{overrides:?}: {}", stderr(&out));
    }
}

/// `bench experts` on a CPU: the grouped products give what one product per expert gives (up to
/// rounding), with experts that no token chose; a width the grouped product cannot take is
/// refused naming it and the rule.
#[test]
fn bench_experts_compares_the_grouped_and_per_expert_products() {
    let args = [
        "bench",
        "experts",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--tokens",
        "48",
        "--hidden",
        "32",
        "--inter",
        "16",
        "--experts",
        "64",
        "--top-k",
        "2",
        "--repeat",
        "1",
    ];
    let v = json(&flotilla(&args));
    for key in ["output", "gradients"] {
        let d = v[key].as_f64().unwrap();
        assert!(d <= 1e-6, "{key}: {d} in {v}");
    }
    for key in ["time_grouped", "time_per_expert"] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key} in {v}");
    }
    // 96 assignments over 64 experts.
    let unchosen = v["unchosen_experts"].as_i64().unwrap();
    assert!((1..64).contains(&unchosen), "{v}");

    let mut bad = args.to_vec();
    bad[9] = "30";
    let o = flotilla(&bad);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("--hidden 30") && err.contains("multiple of 16 bytes"),
        "{err}"
    );
}
