//! Preference tuning end to end through the CLI (`flotilla run objective=dpo data=preference`),
//! against PyPI trl's `DPOTrainer` (tests/oracle/dpo_oracle.py) on a tiny local Llama with a
//! word-level tokenizer and a chat template:
//!
//! - every loss type (sigmoid, ipo, hinge, robust with label smoothing, sigmoid_norm,
//!   apo_zero), conversational and standard pairs, and LoRA retraining an adapter (TRL's "ref"
//!   adapter as the reference):
//!   loss, grad_norm and every metric TRL logs equal TRL's at every step (rel 1e-4, fp32);
//!   step 0 of a full fine-tune has loss ln 2 and zero rewards;
//! - gradient accumulation, activation checkpointing, DDP x2, FSDP x2 (FULL_SHARD and
//!   SHARD_GRAD_OP) and the precomputed reference equal one process; a new LoRA adapter's
//!   reference is the base (adapters off), precomputed or not, under FSDP too;
//! - the implicit-prompt form, a Parquet file and a split of a Hub-style directory of shards
//!   give the same pairs as the explicit JSON lines (`data show`); bad records and a wrong
//!   objective/data pairing are refused naming the fix (exit 2).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{json, Value};

/// Where `dpo_oracle.py make` put the base, the adapter and the pairs (made once per test
/// process, under Cargo's scratch directory for tests).
fn fixture() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if !common::venv_imports("trl, peft, transformers") {
            return None;
        }
        let dir = common::scratch_dir("dpo_fixture");
        let made: Value = common::run_oracle(
            common::python(common::oracle_file("dpo_oracle.py"))
                .args(["make", dir.to_str().unwrap()]),
        );
        assert_eq!(made["pairs"], 12);
        Some(dir)
    })
    .as_deref()
}

fn need_fixture(test: &str) -> Option<&'static Path> {
    let f = fixture();
    if f.is_none() {
        common::skip_or_fail(&format!(
            "{test}: `import trl, peft, transformers` fails in {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    }
    f
}

/// 3 steps of 4 pairs, as the oracle trains them.
const STEPS: usize = 3;

/// `flotilla ARGS` in `dir`, on the repository's configs.
fn flotilla(dir: &Path, args: &[&str]) -> Output {
    common::train_binary();
    // The subcommand (`run`, `compose`, `data show`), then the options.
    let words = if args.first() == Some(&"data") { 2 } else { 1 };
    Command::new(common::flotilla_bin())
        .current_dir(dir)
        .args(&args[..words])
        .arg("--config-dir")
        .arg(common::conf_dir())
        .args(&args[words..])
        .env_remove("FLOTILLA_LOG")
        .output()
        .unwrap()
}

/// The overrides of a DPO job of the fixture's base: 3 steps of 4 pairs as the oracle trains
/// them, then `extra`.
fn dpo_overrides(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        format!("model.init_from={}", dir.join("base").display()),
        "objective=dpo".into(),
        "data=preference".into(),
        format!("data.path={}", dir.join("pairs.jsonl").display()),
        "data.seq_len=64".into(),
        "data.shuffle=false".into(),
        format!("trainer.max_steps={STEPS}"),
        "trainer.global_batch_size=4".into(),
        "trainer.micro_batch_size=4".into(),
        "trainer.lr=0.01".into(),
        "trainer.schedule=constant".into(),
        "trainer.warmup_steps=0".into(),
        "trainer.weight_decay=0.0".into(),
        "trainer/dist=none".into(),
        "compute.tasks_per_node=1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `metrics.csv` of `run_dir`, its rows by column.
fn metrics(run_dir: &Path) -> Vec<HashMap<String, f64>> {
    let mut reader = csv::Reader::from_path(run_dir.join("metrics.csv")).unwrap();
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            header
                .iter()
                .zip(r.iter())
                .filter_map(|(k, v)| Some((k.clone(), v.parse::<f64>().ok()?)))
                .collect()
        })
        .collect()
}

/// A DPO job of the fixture's base through `flotilla run` (`name`: its run directory) with
/// `extra` overrides; its `metrics.csv`.
fn run(dir: &Path, name: &str, extra: &[&str]) -> Vec<HashMap<String, f64>> {
    let run_dir = dir.join("runs").join(name);
    let _ = std::fs::remove_dir_all(&run_dir);
    let mut args = vec!["run".to_string()];
    args.extend(dpo_overrides(dir, extra));
    args.push(format!("flotilla.run.dir={}", run_dir.display()));
    let o = flotilla(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    metrics(&run_dir)
}

/// `flotilla train --run-dir RUN_DIR` of the DPO job with `extra` overrides (a second call on
/// the same directory resumes it); its `metrics.csv`.
fn train(dir: &Path, run_dir: &Path, extra: &[&str]) -> Vec<HashMap<String, f64>> {
    let mut args = vec![
        "train".to_string(),
        "--run-dir".into(),
        run_dir.display().to_string(),
    ];
    args.extend(dpo_overrides(dir, extra));
    let o = flotilla(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        o.status.success(),
        "{}: {}",
        run_dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    metrics(run_dir)
}

/// TRL's columns that flotilla logs too.
const COMPARED: [&str; 10] = [
    "loss",
    "grad_norm",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
];

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs() + 1e-6
}

/// Every compared column of every step of `ours` is `theirs`'s within `rel`.
fn assert_rows_equal(
    what: &str,
    ours: &[HashMap<String, f64>],
    theirs: &[HashMap<String, f64>],
    rel: f64,
) {
    assert_eq!(ours.len(), theirs.len(), "{what}: steps");
    for (step, (a, b)) in ours.iter().zip(theirs).enumerate() {
        for k in COMPARED {
            let (x, y) = (a[k], b[k]);
            assert!(close(x, y, rel), "{what}: step {step} {k}: {x} vs {y}");
        }
    }
}

#[test]
fn dpo_equals_trl_for_every_loss_type_format_and_lora() {
    let Some(dir) = need_fixture("dpo_equals_trl") else {
        return;
    };
    let adapter = format!("peft.init_from={}", dir.join("adapter").display());
    let standard = format!("data.path={}", dir.join("standard.jsonl").display());
    let lora = [
        "peft=lora",
        adapter.as_str(),
        "peft.r=4",
        "peft.alpha=8",
        "peft.target_modules=[q_proj,v_proj]",
        "peft.dropout=0.0",
    ];
    // (TRL's run, flotilla's overrides)
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (json!({"loss_type": "sigmoid", "beta": 0.1}), vec![]),
        (
            json!({"loss_type": "ipo", "beta": 0.5}),
            vec!["objective.loss_type=ipo", "objective.beta=0.5"],
        ),
        (
            json!({"loss_type": "hinge", "beta": 0.1}),
            vec!["objective.loss_type=hinge"],
        ),
        (
            json!({"loss_type": "robust", "beta": 0.1, "label_smoothing": 0.1}),
            vec![
                "objective.loss_type=robust",
                "objective.label_smoothing=0.1",
            ],
        ),
        (
            json!({"loss_type": "sigmoid_norm", "beta": 0.5}),
            vec!["objective.loss_type=sigmoid_norm", "objective.beta=0.5"],
        ),
        (
            json!({"loss_type": "apo_zero", "beta": 0.1}),
            vec!["objective.loss_type=apo_zero"],
        ),
        (
            json!({"loss_type": "sigmoid", "beta": 0.1, "data": dir.join("standard.jsonl")}),
            vec![standard.as_str()],
        ),
        (
            json!({"loss_type": "sigmoid", "beta": 0.1, "lora": true}),
            lora.to_vec(),
        ),
    ];
    let runs: Vec<Value> = cases.iter().map(|(r, _)| r.clone()).collect();
    let trl: Vec<Vec<HashMap<String, f64>>> =
        common::run_oracle(common::python(common::oracle_file("dpo_oracle.py")).args([
            "train",
            dir.to_str().unwrap(),
            dir.join("pairs.jsonl").to_str().unwrap(),
            &STEPS.to_string(),
            "4",
            "0.01",
            "64",
            &Value::from(runs).to_string(),
        ]));
    for (k, ((case, extra), theirs)) in cases.iter().zip(&trl).enumerate() {
        let ours = run(dir, &format!("trl-{k}"), extra);
        assert_rows_equal(&case.to_string(), &ours, theirs, 1e-4);
    }
    // The policy starts as the reference: loss ln 2, no reward.
    let first = &run(dir, "trl-0", &[])[0];
    assert!(
        (first["loss"] - 2f64.ln()).abs() < 1e-7,
        "{}",
        first["loss"]
    );
    for k in ["rewards/chosen", "rewards/rejected", "rewards/margins"] {
        assert_eq!(first[k], 0.0, "{k}");
    }
}

#[test]
fn every_strategy_and_reference_equals_one_process() {
    let Some(dir) = need_fixture("every_strategy") else {
        return;
    };
    let one = run(dir, "one", &[]);
    let two_ranks = ["compute.tasks_per_node=2", "trainer.micro_batch_size=2"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = extra.to_vec();
        v.extend(two_ranks);
        v
    };
    for (name, extra) in [
        ("accumulation", vec!["trainer.micro_batch_size=1"]),
        (
            "checkpointing",
            vec!["trainer.activation_checkpointing=true"],
        ),
        ("precomputed", vec!["objective.reference=precomputed"]),
        ("ddp", with(&["trainer/dist=ddp"])),
        ("fsdp", with(&["trainer/dist=fsdp"])),
        (
            "fsdp-grad-op",
            with(&[
                "trainer/dist=fsdp",
                "trainer.dist.sharding_strategy=SHARD_GRAD_OP",
            ]),
        ),
        (
            "fsdp-precomputed",
            with(&["trainer/dist=fsdp", "objective.reference=precomputed"]),
        ),
    ] {
        let rows = run(dir, name, &extra);
        assert_rows_equal(name, &rows, &one, 1e-5);
    }
    // The precomputed reference is kept in the run directory: two fp32 per pair.
    let table = dir.join("runs/precomputed/reference_logps/train.f32");
    assert_eq!(std::fs::metadata(&table).unwrap().len(), 12 * 8);

    // A new adapter (B zero): the policy starts as the base, which is its reference (the
    // adapters off), whether precomputed or not, in one process or sharded.
    let lora = [
        "peft=lora",
        "peft.r=4",
        "peft.target_modules=[q_proj,v_proj]",
        "peft.dropout=0.0",
    ];
    let fresh = run(dir, "lora", &lora);
    assert!((fresh[0]["loss"] - 2f64.ln()).abs() < 1e-7);
    assert_eq!(fresh[0]["rewards/chosen"], 0.0);
    assert!(close(
        fresh[0]["logps/chosen"],
        one[0]["logps/chosen"],
        1e-6
    ));
    assert!(
        fresh[2]["rewards/chosen"] != 0.0,
        "the adapter moved the policy from the base"
    );
    let mut precomputed = lora.to_vec();
    precomputed.push("objective.reference=precomputed");
    assert_rows_equal(
        "lora precomputed",
        &run(dir, "lora-pre", &precomputed),
        &fresh,
        1e-5,
    );
    let mut sharded = lora.to_vec();
    sharded.extend(["trainer/dist=fsdp"]);
    sharded.extend(two_ranks);
    assert_rows_equal("lora fsdp", &run(dir, "lora-fsdp", &sharded), &fresh, 1e-5);
}

#[test]
fn pairs_are_read_in_every_format_and_bad_input_is_refused() {
    let Some(dir) = need_fixture("pairs_are_read") else {
        return;
    };
    let base = format!("model.init_from={}", dir.join("base").display());
    // `data show --format json` of the pairs `data.path=FILE` (and `extra`) names.
    let show = |file: &str, extra: &[&str]| -> Value {
        let path = format!("data.path={}", dir.join(file).display());
        let mut args = vec![
            "data",
            "show",
            "--format",
            "json",
            "--num",
            "12",
            &base,
            "objective=dpo",
            "data=preference",
            &path,
            "data.seq_len=64",
        ];
        args.extend(extra);
        serde_json::from_str(&common::ok(flotilla(dir, &args))).unwrap()
    };
    let explicit = show("pairs.jsonl", &[]);
    assert_eq!(explicit["examples"].as_array().unwrap().len(), 12);
    // Each other form gives the explicit pairs: the same ids and labels, both sequences.
    let same = |other: &Value, what: &str| {
        for (a, b) in explicit["examples"]
            .as_array()
            .unwrap()
            .iter()
            .zip(other["examples"].as_array().unwrap())
        {
            for side in [a, b] {
                assert!(side["rejected"]["input_ids"].is_array(), "{what}: {side}");
            }
            assert_eq!(a["input_ids"], b["input_ids"], "{what}");
            assert_eq!(a["labels"], b["labels"], "{what}");
            assert_eq!(a["rejected"]["labels"], b["rejected"]["labels"], "{what}");
        }
    };
    // The implicit prompt (shared first turns), Parquet, and a split of a Hub-style directory
    // of shards.
    same(&show("implicit.jsonl", &[]), "implicit prompt");
    same(&show("pairs.parquet", &[]), "parquet");
    same(&show("hub", &["data.split=train_prefs"]), "hub split");
    // The text view shows each pair's prompt with its two completions, trained ones marked.
    let text = common::ok(flotilla(
        dir,
        &[
            "data",
            "show",
            "--num",
            "1",
            &base,
            "objective=dpo",
            "data=preference",
            &format!("data.path={}", dir.join("pairs.jsonl").display()),
            "data.seq_len=64",
        ],
    ));
    assert!(text.contains("── pair 1 of 12"), "{text}");
    assert!(
        text.contains("chosen (") && text.contains("rejected ("),
        "{text}"
    );
    assert!(text.contains("<|assistant|>⟦"), "{text}");

    // A record without its rejected completion: the file, the line and the way out.
    let bad = dir.join("bad.jsonl");
    let good = std::fs::read_to_string(dir.join("pairs.jsonl")).unwrap();
    let first = good.lines().next().unwrap();
    std::fs::write(
        &bad,
        format!("{first}\n{{\"prompt\": \"t7\", \"chosen\": \"t8\"}}\n"),
    )
    .unwrap();
    let o = flotilla(
        dir,
        &[
            "data",
            "show",
            &base,
            "objective=dpo",
            "data=preference",
            &format!("data.path={}", bad.display()),
            "data.seq_len=64",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.jsonl:2: a preference record needs 'chosen' and 'rejected'"),
        "{err}"
    );
    assert!(err.contains("data.skip_bad_records=true"), "{err}");
    let o = flotilla(
        dir,
        &[
            "data",
            "show",
            &base,
            "objective=dpo",
            "data=preference",
            &format!("data.path={}", bad.display()),
            "data.seq_len=64",
            "data.skip_bad_records=true",
        ],
    );
    assert!(common::ok(o).contains("1 pairs from 2 records, 1 bad records skipped"));

    // Each objective takes its own data.
    for (args, needle) in [
        (
            vec!["objective=dpo", "data=chat", "data.path=x"],
            "select data=preference",
        ),
        (
            vec!["data=preference", "data.path=x"],
            "select objective=dpo",
        ),
        (
            vec![
                "objective=dpo",
                "data=preference",
                "data.path=x",
                "objective.beta=0",
            ],
            "objective.beta",
        ),
        (
            vec![
                "objective=dpo",
                "data=preference",
                "data.path=x",
                "objective.loss_type=hinge",
                "objective.label_smoothing=0.1",
            ],
            "has no label noise",
        ),
    ] {
        let mut all = vec!["compose", base.as_str()];
        all.extend(args);
        let o = flotilla(dir, &all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(needle), "{all:?}: {err}");
    }
}

#[test]
fn a_resumed_dpo_run_keeps_its_reference() {
    let Some(dir) = need_fixture("a_resumed_dpo_run") else {
        return;
    };
    let adapter = format!("peft.init_from={}", dir.join("adapter").display());
    let lora = [
        "peft=lora",
        adapter.as_str(),
        "peft.r=4",
        "peft.alpha=8",
        "peft.target_modules=[q_proj,v_proj]",
        "peft.dropout=0.0",
    ];
    let mut lora_precomputed = lora.to_vec();
    lora_precomputed.push("objective.reference=precomputed");
    // The reference is the starting weights (or adapter), not the checkpoint's: rebuilt from
    // model.init_from (peft.init_from), or read back from the run directory.
    for (name, extra) in [
        ("copy", vec![]),
        ("precomputed", vec!["objective.reference=precomputed"]),
        ("lora", lora.to_vec()),
        ("lora-precomputed", lora_precomputed),
    ] {
        let runs = dir.join("resume").join(name);
        let _ = std::fs::remove_dir_all(&runs);
        let mut whole = extra.clone();
        whole.push("trainer.max_steps=4");
        let straight = train(dir, &runs.join("straight"), &whole);
        let mut half = extra.clone();
        half.extend(["trainer.max_steps=2", "trainer.checkpoint_every=2"]);
        train(dir, &runs.join("resumed"), &half);
        let resumed = train(dir, &runs.join("resumed"), &whole);
        assert_rows_equal(name, &resumed, &straight, 1e-6);
        assert!(
            straight[3]["rewards/chosen"] != 0.0,
            "{name}: the policy moved from the reference"
        );
    }
}
