//! Data as it arrives, against the real writers and transformers: tests/oracle/
//! data_formats_oracle.py writes the same conversations as JSONL, Parquet (pyarrow), a Hub
//! directory of shards and `datasets.save_to_disk` directories, plus prompt-completion, Alpaca,
//! mixture and broken files, and prints what transformers makes of the records (one Python
//! start-up for every test). `flotilla-train data show` must give identical examples from every
//! copy of the conversations, train prompt-completion records from where TRL's
//! `completion_only_loss` does, build Alpaca conversations as axolotl does, mix sources and hold
//! records out as configured (preference pairs too), and exit 2 naming the file and the fix
//! for broken data.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flotilla_config::schema::DataConfig;
use flotilla_train::data::record_sets::SourceStats;
use flotilla_train::data::{self, DataOptions, Dataset};
use serde_json::Value;

/// The oracle's directory and its JSON, made once per test binary.
fn fixtures() -> Option<&'static (PathBuf, Value)> {
    static DIR: std::sync::OnceLock<Option<(PathBuf, Value)>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        if !common::venv_imports("transformers, pyarrow, datasets") {
            return None;
        }
        let dir = common::scratch_dir("data_formats_fixtures");
        let expected: Value = common::run_oracle(
            common::python(common::oracle_file("data_formats_oracle.py")).arg(&dir),
        );
        Some((dir, expected))
    })
    .as_ref()
}

fn require_fixtures(test: &str) -> Option<(&'static Path, &'static Value)> {
    let f = fixtures();
    if f.is_none() {
        common::skip_or_fail(&format!(
            "{test}: `import transformers, pyarrow, datasets` fails in {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    }
    f.map(|(d, v)| (d.as_path(), v))
}

/// `flotilla-train data show --format json` of chat data with the fixtures' tokenizer.
fn data_show(dir: &Path, overrides: &[String]) -> Output {
    Command::new(common::target_profile_dir().join("flotilla-train"))
        .current_dir(common::repo_root())
        .args([
            "data",
            "show",
            "--num",
            "100",
            "--format",
            "json",
            "data=chat",
        ])
        .arg(format!(
            "data.tokenizer={}",
            dir.join("tok/llama3").display()
        ))
        .args([
            "data.seq_len=512",
            "model.vocab_size=1024",
            "model.max_position_embeddings=4096",
        ])
        .args(overrides)
        .output()
        .unwrap()
}

fn shown(dir: &Path, overrides: &[String]) -> Value {
    let out = data_show(dir, overrides);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn path_of(dir: &Path, name: &str) -> String {
    format!("data.path={}", dir.join(name).display())
}

/// The examples without the place each came from (a shard's rows restart at 1).
fn without_sources(shown: &Value) -> Vec<Value> {
    shown["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.as_object_mut().unwrap().remove("source");
            e
        })
        .collect()
}

#[test]
fn the_same_conversations_read_alike_from_jsonl_parquet_and_arrow() {
    let Some((dir, _)) =
        require_fixtures("the_same_conversations_read_alike_from_jsonl_parquet_and_arrow")
    else {
        return;
    };
    let jsonl = shown(dir, &[path_of(dir, "conv.jsonl")]);
    assert_eq!(jsonl["examples"].as_array().unwrap().len(), 12);
    assert!(jsonl["summary"]["trained_tokens"].as_u64().unwrap() > 0);
    for copy in ["conv.parquet", "saved", "saved_dict"] {
        let other = shown(dir, &[path_of(dir, copy)]);
        assert_eq!(other["examples"], jsonl["examples"], "{copy}");
        assert_eq!(
            other["summary"]["trained_tokens"], jsonl["summary"]["trained_tokens"],
            "{copy}"
        );
    }
    // The Hub's layout: the train split's two shards in order; the test split by name.
    let hub = shown(dir, &[path_of(dir, "hub")]);
    assert_eq!(without_sources(&hub), without_sources(&jsonl));
    let test_split = shown(dir, &[path_of(dir, "hub"), "data.split=test".into()]);
    assert_eq!(test_split["examples"].as_array().unwrap().len(), 2);
    let text = test_split["examples"][0]["text"].as_str().unwrap();
    assert!(text.contains("Held out?"), "{text}");
}

/// Labels of `ids` trained from `prompt_len` on (the first token is never a target).
fn completion_labels(ids: &Value, prompt_len: u64) -> Value {
    let ids = ids.as_array().unwrap();
    ids.iter()
        .enumerate()
        .map(|(j, id)| {
            if j as u64 >= prompt_len.max(1) {
                id.clone()
            } else {
                Value::from(-100)
            }
        })
        .collect()
}

#[test]
fn prompt_completion_records_train_the_completion_as_trl_does() {
    let Some((dir, expected)) =
        require_fixtures("prompt_completion_records_train_the_completion_as_trl_does")
    else {
        return;
    };
    for (file, key) in [("pc_chat.parquet", "pc_chat"), ("pc_text.jsonl", "pc_text")] {
        let got = shown(dir, &[path_of(dir, file)]);
        let want = expected[key].as_array().unwrap();
        let examples = got["examples"].as_array().unwrap();
        assert_eq!(examples.len(), want.len(), "{file}");
        for (ex, w) in examples.iter().zip(want) {
            assert_eq!(ex["input_ids"], w["input_ids"], "{file}");
            let prompt_len = w["prompt_len"].as_u64().unwrap();
            assert!(
                prompt_len > 0 && prompt_len < ex["input_ids"].as_array().unwrap().len() as u64
            );
            assert_eq!(
                ex["labels"],
                completion_labels(&w["input_ids"], prompt_len),
                "{file}"
            );
        }
    }
}

#[test]
fn alpaca_records_are_a_user_turn_and_an_assistant_turn() {
    let Some((dir, expected)) =
        require_fixtures("alpaca_records_are_a_user_turn_and_an_assistant_turn")
    else {
        return;
    };
    for format in ["auto", "alpaca"] {
        let got = shown(
            dir,
            &[
                path_of(dir, "alpaca.jsonl"),
                format!("data.format={format}"),
            ],
        );
        let examples = got["examples"].as_array().unwrap();
        let want = expected["alpaca"].as_array().unwrap();
        assert_eq!(examples.len(), want.len());
        for (ex, w) in examples.iter().zip(want) {
            assert_eq!(ex["text"], w["text"]);
            assert_eq!(ex["input_ids"], w["input_ids"]);
        }
        // The answer is trained, the instruction is not.
        let labels = examples[0]["labels"].as_array().unwrap();
        let ids = examples[0]["input_ids"].as_array().unwrap();
        let trained = labels.iter().filter(|l| l.as_i64() != Some(-100)).count();
        assert!(
            trained > 0 && trained < ids.len() / 2,
            "{trained} of {}",
            ids.len()
        );
    }
}

/// Chat data of the mixture fixtures, built in process.
fn mixture_config(dir: &Path, yaml: &str) -> DataConfig {
    let text = format!(
        "kind: chat\npath: null\nsources:\n  - {{path: {a}, weight: 1}}\n  - {{path: {b}, \
         weight: 1}}\ntokenizer: {tok}\nchat_template: null\nformat: auto\nmessages_key: \
         messages\nsystem: null\ntrain_on: assistant\noverflow: truncate\npacking: false\n\
         packed_attention: conversation\nskip_bad_records: false\nseq_len: 64\nshuffle: false\n\
         num_workers: 0\n",
        a = dir.join("mix_a.jsonl").display(),
        b = dir.join("mix_b.parquet").display(),
        tok = dir.join("tok/llama3").display(),
    );
    let mut value: serde_yaml::Mapping = serde_yaml::from_str(&text).unwrap();
    for (k, v) in serde_yaml::from_str::<serde_yaml::Mapping>(yaml).unwrap() {
        value.insert(k, v);
    }
    serde_yaml::from_value(serde_yaml::Value::Mapping(value)).unwrap()
}

/// `cfg`'s data, built in process (any vocabulary fits).
fn build_data(cfg: &DataConfig) -> data::Data {
    data::build(
        cfg,
        &DataOptions {
            model_vocab_size: 1 << 20,
            run_dir: None,
            init_from: None,
        },
    )
    .unwrap()
}

/// Each source's records, held-out records and records taken.
fn source_counts(sources: &[SourceStats]) -> Vec<(usize, usize, usize)> {
    sources
        .iter()
        .map(|s| (s.records, s.held_out, s.taken))
        .collect()
}

/// The decoded texts of every sample of a dataset.
fn texts(ds: &dyn Dataset, tok: &data::Tokenizer) -> Vec<String> {
    (0..ds.len())
        .map(|i| tok.decode(&ds.example(i).unwrap().ids, true).unwrap())
        .collect()
}

#[test]
fn mixtures_take_their_shares_and_hold_records_out() {
    let Some((dir, _)) = require_fixtures("mixtures_take_their_shares_and_hold_records_out") else {
        return;
    };
    let build = |yaml: &str| build_data(&mixture_config(dir, yaml));
    // Equal weights: as many of each as the smaller source (20) has; 10% of each held out.
    let mixed = build("eval_fraction: 0.1\nseed: 3");
    let stats = mixed.chat_stats.as_ref().unwrap();
    assert_eq!(source_counts(&stats.sources), [(40, 4, 18), (20, 2, 18)]);
    let tok = mixed.tokenizer.as_ref().unwrap();
    let train = texts(mixed.train.as_ref(), tok);
    let eval = texts(mixed.eval.as_ref().unwrap().as_ref(), tok);
    assert_eq!(train.len(), 36);
    assert_eq!(eval.len(), 6);
    for source in ["source a", "source b"] {
        assert_eq!(train.iter().filter(|t| t.contains(source)).count(), 18);
    }
    assert!(
        eval.iter().all(|e| !train.contains(e)),
        "a held-out record is trained on"
    );
    // The same seed picks the same records; another seed others.
    assert_eq!(
        texts(build("eval_fraction: 0.1\nseed: 3").train.as_ref(), tok),
        train
    );
    assert_ne!(
        texts(build("eval_fraction: 0.1\nseed: 4").train.as_ref(), tok),
        train
    );
    // Fractions and numbers of records, above a whole source repeating it.
    let sized = build(
        "sources:\n  - {path: MIX_A, fraction: 0.5}\n  - {path: MIX_B, records: 30}\n"
            .replace("MIX_A", &dir.join("mix_a.jsonl").display().to_string())
            .replace("MIX_B", &dir.join("mix_b.parquet").display().to_string())
            .as_str(),
    );
    let taken: Vec<usize> = sized
        .chat_stats
        .as_ref()
        .unwrap()
        .sources
        .iter()
        .map(|s| s.taken)
        .collect();
    assert_eq!(taken, [20, 30]);
    assert!(sized.eval.is_none());
}

/// Preference pairs mixed and held out as chat records are: a JSON-lines source and a `.json`
/// array source taking their shares, the same pairs for the same seed, held-out pairs never
/// trained on, and a number of pairs carved from a single path.
#[test]
fn preference_mixtures_take_their_shares_and_hold_pairs_out() {
    let Some((dir, _)) =
        require_fixtures("preference_mixtures_take_their_shares_and_hold_pairs_out")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let pair = |source: &str, i: usize| {
        serde_json::json!({
            "prompt": format!("Is {source} {i} blue?"),
            "chosen": format!(" Yes, {source} {i} is."),
            "rejected": format!(" No, {source} {i} is not."),
        })
    };
    let a = tmp.path().join("pairs_a.jsonl");
    let lines: Vec<String> = (0..40).map(|i| pair("source a", i).to_string()).collect();
    std::fs::write(&a, lines.join("\n") + "\n").unwrap();
    let b = tmp.path().join("pairs_b.json");
    let items: Vec<Value> = (0..20).map(|i| pair("source b", i)).collect();
    std::fs::write(&b, Value::Array(items).to_string()).unwrap();
    let build = |extra: &str| {
        let text = format!(
            "kind: preference\npath: null\nsplit: null\nsources:\n  - {{path: {a}, weight: 1}}\n  \
             - {{path: {b}, weight: 1}}\neval_path: null\neval_split: null\neval_fraction: \
             null\neval_records: null\nseed: 3\ntokenizer: {tok}\nchat_template: null\n\
             max_prompt_length: null\ntruncation_mode: keep_start\nskip_bad_records: false\n\
             seq_len: 64\nshuffle: false\nnum_workers: 0\n",
            a = a.display(),
            b = b.display(),
            tok = dir.join("tok/llama3").display(),
        );
        let mut value: serde_yaml::Mapping = serde_yaml::from_str(&text).unwrap();
        for (k, v) in serde_yaml::from_str::<serde_yaml::Mapping>(extra).unwrap() {
            value.insert(k, v);
        }
        build_data(&serde_yaml::from_value(serde_yaml::Value::Mapping(value)).unwrap())
    };
    // Equal weights: as many of each as the smaller source (20) has; 10% of each held out.
    let mixed = build("eval_fraction: 0.1");
    let stats = mixed.preference_stats.as_ref().unwrap();
    assert_eq!(source_counts(&stats.sources), [(40, 4, 18), (20, 2, 18)]);
    assert_eq!(stats.pairs, 36);
    let tok = mixed.tokenizer.as_ref().unwrap();
    let train = texts(mixed.train.as_ref(), tok);
    let eval = texts(mixed.eval.as_ref().unwrap().as_ref(), tok);
    assert_eq!((train.len(), eval.len()), (36, 6));
    for source in ["source a", "source b"] {
        assert_eq!(train.iter().filter(|t| t.contains(source)).count(), 18);
        let held = if source == "source a" { 4 } else { 2 };
        assert_eq!(eval.iter().filter(|t| t.contains(source)).count(), held);
    }
    assert!(
        eval.iter().all(|e| !train.contains(e)),
        "a held-out pair is trained on"
    );
    // The same seed picks the same pairs.
    assert_eq!(
        texts(build("eval_fraction: 0.1").train.as_ref(), tok),
        train
    );
    // A number of pairs held out, without a mixture: from the one path.
    let single = build(&format!(
        "path: {}\nsources: null\neval_records: 5",
        a.display()
    ));
    let stats = single.preference_stats.as_ref().unwrap();
    assert_eq!((stats.pairs, single.eval.as_ref().unwrap().len()), (35, 5));
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn broken_data_exits_2_naming_the_file_and_the_fix() {
    let Some((dir, _)) = require_fixtures("broken_data_exits_2_naming_the_file_and_the_fix") else {
        return;
    };
    let cases: [(&str, &[&str]); 4] = [
        (
            "corrupt.parquet",
            &["cannot be read as Parquet", "write it again"],
        ),
        (
            "wrong_type.parquet",
            &["row 1", "'messages' is a number, not a list of turns"],
        ),
        (
            "unknown.jsonl",
            &[
                ":1",
                "[question, answer]",
                "prompt_completion",
                "set data.format",
            ],
        ),
        ("preference.jsonl", &[":1", "data=preference"]),
    ];
    for (file, needles) in cases {
        let out = data_show(dir, &[path_of(dir, file)]);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{file}: {err}");
        let path: PathBuf = dir.join(file);
        assert!(err.contains(&path.display().to_string()), "{err}");
        for needle in needles {
            assert!(err.contains(needle), "{file}: no {needle:?} in {err}");
        }
    }
}

#[test]
fn text_and_jsonl_data_read_parquet_records() {
    let Some((dir, _)) = require_fixtures("text_and_jsonl_data_read_parquet_records") else {
        return;
    };
    let parquet = dir.join("mix_b.parquet");
    for kind in [
        vec![
            "data=text".to_string(),
            format!("data.paths=[{}]", parquet.display()),
        ],
        vec![
            "data=jsonl".to_string(),
            format!("data.path={}", parquet.display()),
        ],
    ] {
        let out = Command::new(common::target_profile_dir().join("flotilla-train"))
            .current_dir(common::repo_root())
            .args(["data", "show", "--num", "1", "--format", "json"])
            .args(&kind)
            .args(["data.tokenizer=byte", "data.seq_len=64", "model=small"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{kind:?}: {}", stderr_of(&out));
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = shown["examples"][0]["text"].as_str().unwrap();
        assert!(text.contains("source b record 0"), "{kind:?}: {text}");
    }
}
