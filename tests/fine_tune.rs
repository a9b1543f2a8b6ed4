//! A user's first fine-tune, end to end through the CLI: `flotilla run model.init_from=BASE
//! data=jsonl data.path=X` on a bf16 base that transformers saved in several shards with a
//! tokenizer and a generation config, with no precision, tokenizer or dtype setting. The job
//! trains on the base's tokenizer (its ids, not bytes) in 32-true on the CPU (what
//! `trainer.precision: auto` chooses there, and says), and writes a `final/` that transformers
//! loads with no missing or unexpected weight, in bfloat16, with the base's config,
//! generation config and tokenizer files; its `model.generate()` stops at the base's eos once
//! the completion is written (tests/oracle/final_dir_oracle.py).

mod common;

use std::process::Command;

use serde_json::Value;

/// `final_dir_oracle.py ARGS`'s answer.
fn oracle(args: &[&str]) -> Value {
    common::run_oracle(common::python(common::oracle_file("final_dir_oracle.py")).args(args))
}

#[test]
fn fine_tuning_a_bf16_base_writes_a_final_dir_transformers_generates_from() {
    let Some(_) = common::oracle_python() else {
        return common::skip_or_fail("fine_tune: no transformers; run scripts/setup.sh");
    };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let made = oracle(&["base", base.to_str().unwrap()]);
    assert!(made["shards"].as_u64().unwrap() > 1, "the base is sharded");
    // One record, learnt by heart: "t5 t6 t7" is answered "t9 t10 t11", then the end of text.
    let data = tmp.path().join("train.jsonl");
    let record = r#"{"prompt": "t5 t6 t7", "completion": "t9 t10 t11"}"#;
    std::fs::write(&data, format!("{record}\n").repeat(32)).unwrap();
    let run_dir = tmp.path().join("run");
    common::train_binary();
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .current_dir(tmp.path())
        .arg("run")
        .arg("--config-dir")
        .arg(common::conf_dir())
        .args([
            &format!("model.init_from={}", base.display()),
            "data=jsonl",
            &format!("data.path={}", data.display()),
            "data.prompt_template='{prompt} '",
            "data.seq_len=16",
            "trainer.max_steps=40",
            "trainer.warmup_steps=4",
            "trainer.lr=0.01",
            &format!("flotilla.run.dir={}", run_dir.display()),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // `precision: auto` on the CPU, said where the user reads it.
    let intro = format!("training {} on Cpu", base.display());
    assert!(stderr.contains(&intro), "{stderr}");
    assert!(stderr.contains(", 32-true)"), "{stderr}");

    let fin = run_dir.join("final");
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(fin.join(name)).unwrap(),
            std::fs::read(base.join(name)).unwrap(),
            "{name} is the base's"
        );
    }
    let loaded = oracle(&["load", fin.to_str().unwrap(), "t5 t6 t7"]);
    assert_eq!(loaded["dtypes"], serde_json::json!(["torch.bfloat16"]));
    assert_eq!(loaded["generation_eos"], serde_json::json!([2, 7]));
    assert_eq!(loaded["config_eos"], 2);
    // The base's tokenizer made the training ids: the fine-tune answers the prompt with the
    // completion's ids and stops at the eos the base's generation config names (the base
    // itself answers 19 38 7).
    assert_eq!(loaded["prompt"], serde_json::json!([5, 6, 7]));
    assert_eq!(
        loaded["output"],
        serde_json::json!([5, 6, 7, 9, 10, 11, 2]),
        "the completion, then eos, then no more"
    );
}
