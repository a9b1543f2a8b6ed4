//! `flotilla-train generate` end to end: greedy decoding with the key/value cache equals
//! transformers' `generate` token for token on tiny random models of each family
//! (tests/oracle/generate_oracle.py), for a text prompt and a chat; the stop at an
//! end-of-sequence id from generation_config.json or config.json; a PEFT adapter equals
//! transformers+peft; the prompt's ids equal transformers' `tokenizer(text)`; seeded sampling is
//! reproducible; checkpoints (full and FSDP-sharded, the tokenizer found from the run directory)
//! generate what their final/ generates; bad input exits non-zero naming the culprit and the
//! fix. The tests without Python build their models with flotilla itself.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/world.rs"]
mod world;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use flotilla_config::schema::ModelConfig;
use flotilla_train::commands::generate::prompt_ids;
use flotilla_train::data::tokenizer::Tokenizer;
use flotilla_train::model::{CausalLm, HfLlamaConfig};
use flotilla_train::state::hf_weights::save_hf;
use serde_json::{json, Value};
use tch::{Device, Kind};

/// The model families the greedy oracle covers, each with whether transformers tokenizes the
/// test's character-level tokenizer generically (its `Qwen2Tokenizer` class rebuilds it and
/// drops whitespace, so Qwen's and Gemma's greedy tokens are compared on flotilla's prompt ids,
/// as their tokenizer classes may rebuild it). Adding a
/// family is one line here and one in FAMILIES of generate_oracle.py.
const FAMILIES: &[(&str, bool)] = &[
    ("llama", true),
    ("mistral", true),
    ("qwen2", false),
    ("qwen3", false),
    ("gemma2", false),
    ("gemma3_text", false),
    ("phi3", false),
    ("mixtral", true),
    ("qwen3_moe", false),
];

fn oracle() -> Option<PathBuf> {
    common::oracle_python()
}

fn skip(test: &str) {
    common::skip_or_fail(&format!(
        "{test}: `import transformers, safetensors` fails in {}; run scripts/setup.sh",
        common::venv_python().display()
    ));
}

/// Runs generate_oracle.py with `args` and parses its last line.
fn run_oracle(args: &[&str]) -> Value {
    common::run_oracle(common::python(common::oracle_file("generate_oracle.py")).args(args))
}

fn generate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla-train"))
        .arg("generate")
        .args(args)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla-train generate")
}

/// The JSON object of a `generate --format json` that must succeed.
fn generate_json(model: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        model.to_str().unwrap(),
        "--format",
        "json",
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    let out = generate(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "generate {args:?} exited {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status.code()
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let value: Value = serde_json::from_str(stdout.trim()).unwrap();
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["prompt_ids", "output_ids", "text", "tokens_per_s"]);
    value
}

fn ids(v: &Value) -> Vec<i64> {
    serde_json::from_value(v.clone()).unwrap()
}

/// A copy of a model directory (its files, not its subdirectories).
fn copy_model(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// One test per family, so that the test harness runs them side by side.
macro_rules! greedy_tests {
    ($($test:ident: $family:literal,)+) => {$(
        #[test]
        fn $test() {
            greedy_equals_transformers_and_stops_at_eos($family);
        }
    )+};
}

greedy_tests! {
    greedy_llama: "llama",
    greedy_mistral: "mistral",
    greedy_qwen2: "qwen2",
    greedy_qwen3: "qwen3",
    greedy_gemma2: "gemma2",
    greedy_gemma3_text: "gemma3_text",
    greedy_phi3: "phi3",
    greedy_mixtral: "mixtral",
    greedy_qwen3_moe: "qwen3_moe",
}

/// Every family of [`FAMILIES`] has a test above.
#[test]
fn every_family_has_a_greedy_test() {
    let source = include_str!("generate.rs");
    for (family, _) in FAMILIES {
        assert!(
            source.contains(&format!("greedy_{family}: \"{family}\"")),
            "{family}"
        );
    }
}

/// Greedy generation of `family` equals transformers' (text and chat prompts); Llama's stops
/// after an end-of-sequence id of generation_config.json, else of config.json.
fn greedy_equals_transformers_and_stops_at_eos(family: &str) {
    let Some(_python) = oracle() else {
        return skip("greedy_equals_transformers_and_stops_at_eos");
    };
    let generic_tokenizer = FAMILIES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, g)| *g)
        .expect("a family of FAMILIES");
    let tmp = tempfile::tempdir().unwrap();
    let messages = json!([
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2+2?"}
    ]);
    let messages_file = tmp.path().join("messages.json");
    std::fs::write(&messages_file, messages.to_string()).unwrap();
    let n = "24";
    {
        let dir = tmp.path().join(family);
        run_oracle(&["make", dir.to_str().unwrap(), family]);
        let text = generate_json(&dir, &["--prompt", "Hello world", "--max-new-tokens", n]);
        let chat = generate_json(
            &dir,
            &[
                "--messages",
                messages_file.to_str().unwrap(),
                "--max-new-tokens",
                n,
            ],
        );
        let prompts = match generic_tokenizer {
            true => json!([{"text": "Hello world"}, {"messages": messages}]),
            false => json!([{"ids": text["prompt_ids"]}, {"ids": chat["prompt_ids"]}]),
        };
        let theirs = run_oracle(&[
            "generate",
            dir.to_str().unwrap(),
            "-",
            &prompts.to_string(),
            n,
        ]);
        for (what, ours, theirs) in [("text", &text, &theirs[0]), ("chat", &chat, &theirs[1])] {
            assert_eq!(
                ids(&ours["prompt_ids"]),
                ids(&theirs["prompt_ids"]),
                "{family} {what}: prompt ids"
            );
            assert_eq!(
                ids(&ours["output_ids"]),
                ids(&theirs["output_ids"]),
                "{family} {what}: greedy tokens"
            );
            assert!(ours["tokens_per_s"].as_f64().unwrap() > 0.0);
        }
        let out = ids(&text["output_ids"]);
        assert_eq!(
            out.len(),
            24,
            "{family}: no end-of-sequence id (2) expected: {out:?}"
        );
        assert_eq!(
            ids(&text["prompt_ids"])[0],
            1,
            "{family}: the post-processor's <s>"
        );

        // The end-of-sequence stop (the same code for every family: checked on one): make a
        // token greedy decoding emits (first at position k) an end-of-sequence id; generation
        // must end right after it.
        if family != "llama" {
            return;
        }
        let k = (3..out.len())
            .find(|&k| !out[..k].contains(&out[k]))
            .expect("a token new at some position");
        let other = (0..128).find(|t| !out.contains(t)).unwrap();
        let stopped = tmp.path().join(format!("{family}_eos"));
        copy_model(&dir, &stopped);
        edit_json(&stopped.join("generation_config.json"), |c| {
            c["eos_token_id"] = json!([other, out[k]])
        });
        let ours = generate_json(
            &stopped,
            &["--prompt", "Hello world", "--max-new-tokens", n],
        );
        assert_eq!(
            ids(&ours["output_ids"]),
            out[..=k],
            "{family}: stop after {}",
            out[k]
        );
        // Without generation_config.json, config.json's eos_token_id (an int) decides.
        std::fs::remove_file(stopped.join("generation_config.json")).unwrap();
        edit_json(&stopped.join("config.json"), |c| {
            c["eos_token_id"] = json!(out[k])
        });
        let ours = generate_json(
            &stopped,
            &["--prompt", "Hello world", "--max-new-tokens", n],
        );
        assert_eq!(ids(&ours["output_ids"]), out[..=k], "{family}: config.json");
    }
}

#[test]
fn adapter_equals_transformers_and_peft() {
    let Some(_python) = oracle() else {
        return skip("adapter_equals_transformers_and_peft");
    };
    if !common::venv_imports("peft") {
        return common::skip_or_fail(
            "adapter_equals_transformers_and_peft: `import peft` fails in the venv; run \
             scripts/setup.sh",
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let adapter = tmp.path().join("adapter");
    run_oracle(&["make", base.to_str().unwrap(), "llama"]);
    run_oracle(&["adapter", base.to_str().unwrap(), adapter.to_str().unwrap()]);
    let prompts = json!([{"text": "Hello world"}]).to_string();
    let theirs = run_oracle(&[
        "generate",
        base.to_str().unwrap(),
        adapter.to_str().unwrap(),
        &prompts,
        "16",
    ]);
    let theirs_base = run_oracle(&["generate", base.to_str().unwrap(), "-", &prompts, "16"]);
    let ours = generate_json(
        &base,
        &[
            "--adapter",
            adapter.to_str().unwrap(),
            "--prompt",
            "Hello world",
            "--max-new-tokens",
            "16",
        ],
    );
    assert_eq!(
        ids(&ours["output_ids"]),
        ids(&theirs[0]["output_ids"]),
        "greedy tokens with the adapter"
    );
    assert_ne!(
        ids(&theirs[0]["output_ids"]),
        ids(&theirs_base[0]["output_ids"]),
        "the adapter must change the tokens for this test to mean anything"
    );
    // An adapter directory given as the model names the command to use.
    let out = generate(&[adapter.to_str().unwrap(), "--prompt", "x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is a LoRA adapter") && stderr.contains("--adapter"),
        "{stderr}"
    );
}

#[test]
fn prompt_ids_equal_transformers_tokenizer_call() {
    let Some(_python) = oracle() else {
        return skip("prompt_ids_equal_transformers_tokenizer_call");
    };
    let tmp = tempfile::tempdir().unwrap();
    let texts = ["Hello world", "2+2=\n<|im_start|>x</s>", " "];
    let texts_json = serde_json::to_string(&texts).unwrap();
    // bos: the post-processor adds <s>; flag: tokenizer_config.json says add_bos_token and
    // add_eos_token, which transformers 5 ignores beside a tokenizer.json; none: nothing.
    for (variant, first) in [("bos", Some(1)), ("flag", None), ("none", None)] {
        let dir = tmp.path().join(variant);
        run_oracle(&["tokenizer", dir.to_str().unwrap(), variant]);
        let theirs: Vec<Vec<i64>> = serde_json::from_value(run_oracle(&[
            "tokenize",
            dir.to_str().unwrap(),
            &texts_json,
        ]))
        .unwrap();
        let tok = Tokenizer::from_file(dir.join("tokenizer.json"), "--tokenizer").unwrap();
        for (text, want) in texts.iter().zip(&theirs) {
            assert_eq!(
                &prompt_ids(&tok, text).unwrap(),
                want,
                "{variant}: {text:?}"
            );
            assert_eq!(
                want.first().copied().filter(|&i| i == 1),
                first,
                "{variant}"
            );
        }
    }
}

/// A tiny random model saved by flotilla with the byte tokenizer (no Python needed).
fn byte_model(dir: &Path, max_positions: usize) {
    let text = json!({
        "vocab_size": 260, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5,
        "initializer_range": 0.5, "rope_theta": 10000.0
    })
    .to_string();
    let hf = HfLlamaConfig::from_json(&text, Path::new("config.json")).unwrap();
    let config = ModelConfig::try_from(&hf).unwrap();
    let model = CausalLm::new(&config).unwrap();
    let params = model.init_params(9, Device::Cpu, Kind::Float);
    save_hf(dir, &model, &params, Kind::Float).unwrap();
    Tokenizer::byte().save(dir.join("tokenizer.json")).unwrap();
}

#[test]
fn seeded_sampling_is_reproducible() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    byte_model(&dir, 128);
    let sample = |seed: &str, extra: &[&str]| {
        let mut args = vec!["--prompt", "abc", "--max-new-tokens", "32", "--seed", seed];
        args.extend_from_slice(extra);
        ids(&generate_json(&dir, &args)["output_ids"])
    };
    let warped = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95"];
    let a = sample("1", &warped);
    assert_eq!(a.len(), 32, "{a:?}");
    assert_eq!(a, sample("1", &warped), "same seed, same tokens");
    assert_ne!(a, sample("2", &warped), "another seed, other tokens");
    // Top-k 1 is greedy whatever the seed and temperature.
    let greedy =
        ids(&generate_json(&dir, &["--prompt", "abc", "--max-new-tokens", "32"])["output_ids"]);
    assert_eq!(sample("5", &["--temperature", "3", "--top-k", "1"]), greedy);
    // The byte tokenizer's <eos> (258) ends generation when the model emits it: the
    // output never goes on past it.
    if let Some(i) = greedy.iter().position(|&t| t == 258) {
        assert_eq!(i, greedy.len() - 1);
    }
}

fn train_run(run_dir: &Path, extra: &[&str]) {
    let conf = common::repo_root().join("conf");
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla-train"))
        .args(["train", "--config-dir"])
        .arg(&conf)
        .arg("--run-dir")
        .arg(run_dir)
        .args([
            "trainer.max_steps=4",
            "trainer.checkpoint_every=4",
            "trainer.eval_every=4",
            "data.num_train=64",
            "data.num_eval=8",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "training failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn checkpoints_generate_what_their_final_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--prompt", "012+340=", "--max-new-tokens", "12"];

    // One process: a full checkpoint.
    let run = tmp.path().join("run");
    train_run(&run, &[]);
    let from_final = generate_json(&run.join("final"), &args);
    assert_eq!(
        ids(&from_final["prompt_ids"]),
        [1, 4, 5, 6, 14, 7, 8, 4, 15],
        "<bos> from the arithmetic tokenizer's post-processor"
    );
    let step = run.join("checkpoints/step_4");
    assert!(!step.join("sharded_meta.json").exists());
    let from_step = generate_json(&step, &args);
    for key in ["prompt_ids", "output_ids", "text"] {
        assert_eq!(from_step[key], from_final[key], "{key}");
    }
    // Without final/, the tokenizer comes from the run's config.yaml (the arithmetic one).
    std::fs::remove_dir_all(run.join("final")).unwrap();
    let again = generate_json(&step, &args);
    assert_eq!(again["output_ids"], from_final["output_ids"]);

    // Two FSDP ranks: a sharded checkpoint.
    let sharded = tmp.path().join("fsdp");
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_flotilla-train"));
    let conf = common::repo_root().join("conf");
    let overrides: Vec<String> = [
        "--config-dir",
        conf.to_str().unwrap(),
        "trainer/dist=fsdp",
        "trainer.dist.state_dict_type=sharded",
        "trainer.max_steps=4",
        "trainer.checkpoint_every=4",
        "trainer.eval_every=4",
        "data.num_train=64",
        "data.num_eval=8",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let w = world::train(
        &exe,
        "fsdp",
        world::Shape::single_node(2),
        &sharded,
        tmp.path(),
        &overrides,
    );
    w.wait(Duration::from_secs(180));
    let step = sharded.join("checkpoints/step_4");
    assert!(step.join("sharded_meta.json").is_file());
    let from_final = generate_json(&sharded.join("final"), &args);
    let from_step = generate_json(&step, &args);
    assert_eq!(from_step["output_ids"], from_final["output_ids"]);
    assert_eq!(from_step["text"], from_final["text"]);
}

/// A failure with exit status `status` that names what `expect` lists, with no panic.
fn fails(args: &[&str], status: i32, expect: &[&str]) {
    let out = generate(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(status), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for e in expect {
        assert!(stderr.contains(e), "{args:?}: expected `{e}` in:\n{stderr}");
    }
}

#[test]
fn bad_input_names_the_culprit_and_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    byte_model(&dir, 16);
    let d = dir.to_str().unwrap();
    let missing = tmp.path().join("nope");
    fails(
        &[missing.to_str().unwrap(), "--prompt", "x"],
        2,
        &["nope does not exist", "final/", "checkpoints/step_N"],
    );
    fails(
        &[d, "--prompt", "x", "--device", "tpu"],
        2,
        &["unknown device `tpu`", "cuda:N"],
    );
    fails(&[d], 2, &["--prompt"]);
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "[{\"role\": \"user\", ").unwrap();
    fails(
        &[d, "--messages", bad.to_str().unwrap()],
        2,
        &["bad.json", "not valid JSON"],
    );
    std::fs::write(&bad, r#"{"turns": []}"#).unwrap();
    fails(
        &[d, "--messages", bad.to_str().unwrap()],
        2,
        &["bad.json", "expected a JSON list"],
    );
    // The byte tokenizer file has no chat template.
    std::fs::write(&bad, r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    fails(
        &[d, "--messages", bad.to_str().unwrap()],
        2,
        &["chat_template"],
    );
    fails(
        &[d, "--prompt", "a prompt of many bytes"],
        2,
        &["prompt is 22 tokens", "max_position_embeddings", "shorten"],
    );
    fails(
        &[d, "--prompt", "x", "--top-p", "0.5"],
        2,
        &["--temperature"],
    );
    let no_tok = tmp.path().join("no_tok");
    copy_model(&dir, &no_tok);
    std::fs::remove_file(no_tok.join("tokenizer.json")).unwrap();
    fails(
        &[no_tok.to_str().unwrap(), "--prompt", "x"],
        2,
        &["no tokenizer", "tokenizer.json", "--tokenizer"],
    );
    // --tokenizer supplies one.
    let v = generate_json(
        &no_tok,
        &["--prompt", "x", "--tokenizer", d, "--max-new-tokens", "3"],
    );
    assert_eq!(ids(&v["prompt_ids"]), [120]);
    fails(
        &[
            d,
            "--prompt",
            "x",
            "--adapter",
            tmp.path().to_str().unwrap(),
        ],
        2,
        &["no adapter_config.json"],
    );
    if !tch::Cuda::is_available() {
        fails(
            &[d, "--prompt", "x", "--device", "cuda:1"],
            2,
            &["--device cpu"],
        );
    }
}

/// A model directory of a kind flotilla does not run, or a rope type it does not implement, is
/// bad input to `generate` and `consolidate`: exit 2, one line naming the file, the field, the
/// value and what is supported, no message written twice.
#[test]
fn an_unsupported_model_directory_is_bad_input_named_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"{"model_type": "gpt2", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4}"#,
            "field `model_type`: `gpt2` is not supported; flotilla implements",
        ),
        (
            r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4,
               "rope_scaling": {"rope_type": "ntk", "factor": 2.0}}"#,
            "field `rope_scaling.rope_type`: `ntk` is not a rope type flotilla implements",
        ),
    ];
    for (k, (config, want)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("m{k}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        std::fs::write(
            dir.join("tokenizer.json"),
            r#"{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}"#,
        )
        .unwrap();
        let runs = [
            generate(&[dir.to_str().unwrap(), "--prompt", "x"]),
            Command::new(env!("CARGO_BIN_EXE_flotilla-train"))
                .args(["consolidate", dir.to_str().unwrap(), "--out"])
                .arg(tmp.path().join(format!("out{k}")))
                .output()
                .unwrap(),
        ];
        for out in runs {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert_eq!(stderr.matches(want).count(), 1, "{stderr}");
            assert!(stderr.contains("config.json"), "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
        }
    }
}
