//! flotilla's model of every family against the real transformers, both directions:
//! tests/oracle/make_hf_fixtures.py makes small random models with `save_pretrained` (Llama tied
//! and untied, GQA/MHA/MQA, llama3 rope scaling, legacy config.json, sharded, f16, bf16, with
//! attention biases; Mistral with a window shorter than the sequence and with Nemo's head size;
//! Qwen2 with random q/k/v biases, tied and untied; Qwen3 with its q/k norms, alone and with a
//! window on one layer; Gemma 2 with soft-capping and alternating windows; Gemma 3 with q/k norms
//! and local rotary tables; Phi-3 with its fused projections and a window, Phi-4-mini's partial
//! rotary embeddings; SmolLM3 with a layer without rotary embeddings) and transformers' logits and loss for a token batch, and its logits
//! for the batch as packed rows (position ids restarting at each sequence); flotilla loads each,
//! matches the logits, the loss and the packed logits, saves its own directory, and
//! transformers loads that as the same class and matches flotilla's logits. Every family but
//! plain Llama also trains through `flotilla-train` with `model.init_from` on sequences longer
//! than its window: `final/` loads in transformers as the same class with flotilla's logits.
//! The other tests need no Python: save/load round trips and the loader's error messages.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use flotilla_config::schema::ModelConfig;
use flotilla_train::model::{causal_lm_loss, CausalLm, ModelError, Params, TokenInput};
use flotilla_train::state::hf_weights::{load_hf, save_hf};
use tch::{Device, Kind, Tensor};

fn oracle_script() -> PathBuf {
    common::oracle_file("make_hf_fixtures.py")
}

fn kind_of(dtype: &str) -> Kind {
    match dtype {
        "float32" => Kind::Float,
        "bfloat16" => Kind::BFloat16,
        "float16" => Kind::Half,
        other => panic!("unknown dtype {other}"),
    }
}

fn read_tensors(path: &Path) -> std::collections::HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

fn max_rel_err(ours: &Tensor, theirs: &Tensor) -> f64 {
    let ours = ours.to_kind(Kind::Float);
    let diff = (&ours - theirs).abs().max().double_value(&[]);
    diff / theirs.abs().max().double_value(&[])
}

#[test]
fn transformers_oracle_both_directions() {
    let Some(_) = common::oracle_python() else {
        return common::skip_or_fail(&format!(
            "transformers_oracle_both_directions: `import transformers, safetensors` fails in \
             {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    };
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    common::python(oracle_script())
        .arg("make")
        .arg(tmp.path())
        .run();
    eprintln!("fixtures made in {:.1} s", start.elapsed().as_secs_f64());

    let manifest: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest.len(), 21);
    let mut checks = Vec::new();
    let mut failures = Vec::new();
    for fx in &manifest {
        let name = fx["name"].as_str().unwrap();
        let dir = PathBuf::from(fx["dir"].as_str().unwrap());
        let dtype = fx["dtype"].as_str().unwrap();
        let compute = kind_of(fx["compute"].as_str().unwrap());
        let tol = fx["tol"].as_f64().unwrap();
        let reference = read_tensors(Path::new(fx["reference"].as_str().unwrap()));

        // transformers -> flotilla
        let (model, params) = load_hf(&dir, Device::Cpu, Some(compute))
            .unwrap_or_else(|e| panic!("{name}: loading the transformers directory: {e}"));
        assert_eq!(params.get("model.norm.weight").unwrap().kind(), compute);
        // The architecture, window and biases transformers built are the ones flotilla read.
        assert_eq!(
            model.config().architecture().as_str(),
            fx["model_type"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(
            model.config().sliding_window.map(|w| w as u64),
            fx["sliding_window"].as_u64(),
            "{name}"
        );
        let mut biases: Vec<&str> = params.names().filter(|n| n.ends_with(".bias")).collect();
        biases.sort();
        let want: Vec<&str> = fx["biases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap())
            .collect();
        assert_eq!(biases, want, "{name}");
        for b in &biases {
            let t = params.get(b).unwrap();
            assert!(t.abs().max().double_value(&[]) > 0.1, "{name}: {b} is ~0");
        }
        let tokens = &reference["input_ids"];
        let logits = model.forward(&params, tokens).unwrap();
        assert_eq!(logits.size(), reference["logits"].size(), "{name}");
        let err = max_rel_err(&logits, &reference["logits"]);
        let loss = causal_lm_loss(&logits, &reference["labels"]).double_value(&[]);
        let ref_loss = reference["loss"].double_value(&[0]);
        let loss_err = (loss - ref_loss).abs() / ref_loss;
        eprintln!(
            "{name:<26} transformers->flotilla: max rel logits err {err:.2e} (tol {tol:.0e}), \
             loss {loss:.6} vs {ref_loss:.6} (rel {loss_err:.1e})"
        );
        if err > tol || loss_err > tol {
            failures.push(format!(
                "{name}: logits err {err:.3e}, loss err {loss_err:.3e}"
            ));
        }
        // The same batch as packed rows: position ids restarting at each sequence.
        let packed_input = TokenInput::packed(
            tokens.shallow_clone(),
            reference["positions"].shallow_clone(),
        );
        let packed = model.forward_input(&params, &packed_input).unwrap();
        let packed_err = max_rel_err(&packed, &reference["packed_logits"]);
        let unpacked_err = max_rel_err(&logits, &reference["packed_logits"]);
        eprintln!(
            "{name:<26} packed rows: max rel logits err {packed_err:.2e} (unpacked logits are \
             {unpacked_err:.2e} away)"
        );
        if packed_err > tol {
            failures.push(format!("{name}: packed logits err {packed_err:.3e}"));
        }
        assert!(
            unpacked_err > 10.0 * tol,
            "{name}: packing changes the logits by only {unpacked_err:.2e}"
        );
        if !biases.is_empty() {
            // The fixture must exercise the biases: without them the logits are far off.
            let mut no_bias = Params::new();
            for (n, t) in params.iter() {
                let t = if biases.contains(&n) {
                    t.zeros_like()
                } else {
                    t.shallow_clone()
                };
                no_bias.insert(n, t);
            }
            let err = max_rel_err(
                &model.forward(&no_bias, tokens).unwrap(),
                &reference["logits"],
            );
            assert!(
                err > 100.0 * tol,
                "{name}: without biases err is only {err:.2e}"
            );
        }
        if model.config().rope_scaling.is_some() {
            // The fixture must exercise the scaling: plain RoPE would be far off.
            let mut plain = model.config().clone();
            plain.rope_scaling = None;
            let plain_logits = CausalLm::new(&plain)
                .unwrap()
                .forward(&params, tokens)
                .unwrap();
            let plain_err = max_rel_err(&plain_logits, &reference["logits"]);
            assert!(
                plain_err > 100.0 * tol,
                "{name}: without rope scaling err is only {plain_err:.2e}"
            );
        }

        // flotilla -> transformers: save in the fixture's dtype, with flotilla's logits.
        let saved = tmp.path().join(name).join("flotilla");
        save_hf(&saved, &model, &params, kind_of(dtype)).unwrap();
        let (reloaded_model, reloaded) = load_hf(&saved, Device::Cpu, Some(compute)).unwrap();
        assert_eq!(
            reloaded_model.config().num_parameters(),
            model.config().num_parameters()
        );
        for (n, t) in params.iter() {
            assert!(
                t.equal(reloaded.get(n).unwrap()),
                "{name}: {n} changed on save/load"
            );
        }
        let logits_file = tmp.path().join(name).join("flotilla_logits.safetensors");
        Tensor::write_safetensors(
            &[
                ("input_ids", tokens.shallow_clone()),
                ("logits", logits.to_kind(Kind::Float).contiguous()),
            ],
            &logits_file,
        )
        .unwrap();
        checks.push(serde_json::json!({
            "name": name, "dir": saved, "logits": logits_file, "dtype": dtype,
            "compute": fx["compute"], "tol": tol, "cls": fx["cls"],
            "sliding_window": fx["sliding_window"],
        }));
    }

    let checks_file = tmp.path().join("checks.json");
    std::fs::write(&checks_file, serde_json::to_string(&checks).unwrap()).unwrap();
    let out = common::python(oracle_script())
        .arg("check")
        .arg(&checks_file)
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        eprintln!(
            "{:<26} flotilla->transformers: max rel logits err {:.2e}, loading problems {}",
            r["name"].as_str().unwrap(),
            r["max_rel_err"].as_f64().unwrap(),
            r["problems"]
        );
        if r["ok"] != true {
            failures.push(format!("transformers loading flotilla's save: {line}"));
        }
    }
    assert!(
        out.status.success() && stdout.lines().count() == manifest.len(),
        "make_hf_fixtures.py check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

fn tiny(tied: bool) -> ModelConfig {
    compose::tiny_model_config(tied)
}

#[test]
fn save_load_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    for tied in [true, false] {
        for kind in [Kind::Float, Kind::BFloat16, Kind::Half] {
            let model = CausalLm::new(&tiny(tied)).unwrap();
            let params = model.init_params(3, Device::Cpu, kind);
            let dir = tmp.path().join(format!("m-{tied}-{kind:?}"));
            save_hf(&dir, &model, &params, kind).unwrap();
            let names = read_tensors(&dir.join("model.safetensors"));
            assert_eq!(names.contains_key("lm_head.weight"), !tied);
            assert_eq!(names.len(), model.param_specs().len());
            // None: the dtype config.json declares.
            let (loaded_model, loaded) = load_hf(&dir, Device::Cpu, None).unwrap();
            let mut expect = tiny(tied);
            expect.name = dir.file_name().unwrap().to_string_lossy().into_owned();
            expect.init_from = Some(dir.to_string_lossy().into_owned());
            assert_eq!(loaded_model.config(), &expect);
            for (n, t) in params.iter() {
                let l = loaded.get(n).unwrap();
                assert_eq!(l.kind(), kind);
                assert!(t.equal(l), "{n}");
            }
            let tokens = Tensor::from_slice(&[1i64, 2, 3, 39]).reshape([1, 4]);
            let a = model.forward(&params, &tokens).unwrap();
            let b = loaded_model.forward(&loaded, &tokens).unwrap();
            assert!(a.equal(&b));
        }
    }
}

/// Saves a tiny model, lets `edit` change the directory, and returns the loader's error.
fn load_error(edit: impl FnOnce(&Path, &Params)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let model = CausalLm::new(&tiny(false)).unwrap();
    let params = model.init_params(0, Device::Cpu, Kind::Float);
    save_hf(tmp.path(), &model, &params, Kind::Float).unwrap();
    edit(tmp.path(), &params);
    let err: ModelError = load_hf(tmp.path(), Device::Cpu, None).unwrap_err();
    err.to_string()
}

fn rewrite_weights(
    dir: &Path,
    params: &Params,
    f: impl Fn(&str, &Tensor) -> Option<(String, Tensor)>,
) {
    let tensors: Vec<(String, Tensor)> = params.iter().filter_map(|(n, t)| f(n, t)).collect();
    Tensor::write_safetensors(&tensors, dir.join("model.safetensors")).unwrap();
}

#[test]
fn loader_errors_name_the_culprit() {
    let err = load_error(|dir, p| {
        rewrite_weights(dir, p, |n, t| {
            (n != "model.layers.1.mlp.up_proj.weight").then(|| (n.to_string(), t.shallow_clone()))
        })
    });
    assert!(
        err.contains("tensor `model.layers.1.mlp.up_proj.weight` is missing from")
            && err.contains("model.safetensors"),
        "{err}"
    );

    let err = load_error(|dir, p| {
        rewrite_weights(dir, p, |n, t| {
            let t = if n == "model.layers.0.self_attn.k_proj.weight" {
                t.narrow(0, 0, 8).contiguous()
            } else {
                t.shallow_clone()
            };
            Some((n.to_string(), t))
        })
    });
    assert!(
        err.contains("`model.layers.0.self_attn.k_proj.weight`")
            && err.contains("expected shape [16, 32], found [8, 32]"),
        "{err}"
    );

    let err = load_error(|dir, p| {
        rewrite_weights(dir, p, |n, t| {
            let t = if n == "model.norm.weight" {
                t.to_kind(Kind::Int8)
            } else {
                t.shallow_clone()
            };
            Some((n.to_string(), t))
        })
    });
    assert!(
        err.contains("`model.norm.weight`") && err.contains("unsupported dtype"),
        "{err}"
    );

    let err = load_error(|dir, p| {
        rewrite_weights(dir, p, |n, t| {
            Some((n.replace("lm_head", "lm_head2"), t.shallow_clone()))
        })
    });
    assert!(
        err.contains("`lm_head2.weight`") && err.contains("not a LlamaForCausalLM weight"),
        "{err}"
    );

    let err = load_error(|dir, _| {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"silu\"", "\"gelu\"")).unwrap();
    });
    assert!(
        err.contains("config.json: field `hidden_act`") && err.contains("gelu"),
        "{err}"
    );

    let err = load_error(|dir, _| {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"2\""),
        )
        .unwrap();
    });
    assert!(
        err.contains("config.json") && err.contains("\"num_hidden_layers\": \"2\""),
        "{err}"
    );

    let err = load_error(|dir, _| std::fs::remove_file(dir.join("model.safetensors")).unwrap());
    assert!(err.contains("no model.safetensors"), "{err}");
}

/// Makes the fixtures into `dir` and returns the manifest.
fn make_fixtures(dir: &Path) -> Vec<serde_json::Value> {
    common::python(oracle_script()).arg("make").arg(dir).run();
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn fixture<'a>(manifest: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    manifest
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no fixture {name}"))
}

/// A few CPU steps of the arithmetic data (16 ids, within every fixture's 128) on one process.
const TRAIN: &[&str] = &[
    "trainer/dist=none",
    "compute.tasks_per_node=1",
    "compute.gpus_per_node=0",
    "trainer.device=cpu",
    "trainer.precision=32-true",
    "trainer.max_steps=4",
    "trainer.global_batch_size=4",
    "trainer.micro_batch_size=4",
    "trainer.lr=1e-2",
    "trainer.warmup_steps=0",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=0",
    "trainer.resume=never",
    "data.num_train=64",
    "data.num_eval=0",
];

/// `flotilla-train train` of `base` in `run` with `overrides` after [`TRAIN`].
fn train(base: &Path, run: &Path, overrides: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla-train"))
        .args(["train", "--config-dir"])
        .arg(common::conf_dir())
        .arg("--run-dir")
        .arg(run)
        .arg(format!("model.init_from={}", base.display()))
        .args(TRAIN)
        .args(overrides)
        .env("FLOTILLA_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn every_family_trains_and_final_loads_as_the_same_class() {
    let Some(_) = common::oracle_python() else {
        return common::skip_or_fail(&format!(
            "every_family_trains_and_final_loads_as_the_same_class: `import \
             transformers, safetensors` fails in {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    };
    let tmp = tempfile::tempdir().unwrap();
    let manifest = make_fixtures(tmp.path());
    let mut checks = Vec::new();
    for name in [
        "mistral_window",
        "mistral_nemo_head_dim",
        "qwen2_tied",
        "qwen2_untied_window",
        "qwen3",
        "qwen3_tied_window",
        "gemma2",
        "gemma3",
        "phi3",
        "phi4_mini_partial_rotary",
        "smollm3_nope",
        "mixtral",
        "qwen3_moe",
    ] {
        let fx = fixture(&manifest, name);
        let base = PathBuf::from(fx["dir"].as_str().unwrap());
        let run = tmp.path().join(name).join("run");
        // data.seq_len 16: beyond the sliding windows (5 and 6) of those that have one.
        let out = train(&base, &run, &["data.seq_len=16"]);
        assert!(
            out.status.success(),
            "{name}: training failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let final_dir = run.join("final");
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(final_dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["architectures"][0], fx["cls"], "{name}: {config}");
        assert_eq!(config["model_type"], fx["model_type"], "{name}: {config}");
        let (model, trained) = load_hf(&final_dir, Device::Cpu, Some(Kind::Float)).unwrap();
        let (_, initial) = load_hf(&base, Device::Cpu, Some(Kind::Float)).unwrap();
        assert_eq!(trained.len(), initial.len(), "{name}");
        // Every parameter trained, the q/k/v biases included, and saved under its HF name.
        for (n, t) in initial.iter() {
            let after = trained.get(n).unwrap();
            assert!(!after.equal(t), "{name}: {n} did not change in training");
        }
        let biases = fx["biases"].as_array().unwrap();
        assert_eq!(biases.is_empty(), !name.starts_with("qwen2"), "{name}");
        for b in biases {
            assert!(trained.get(b.as_str().unwrap()).is_some(), "{name}: {b}");
        }
        let reference = read_tensors(Path::new(fx["reference"].as_str().unwrap()));
        let tokens = &reference["input_ids"];
        let logits = model.forward(&trained, tokens).unwrap();
        let logits_file = tmp.path().join(name).join("final_logits.safetensors");
        Tensor::write_safetensors(
            &[
                ("input_ids", tokens.shallow_clone()),
                ("logits", logits.contiguous()),
            ],
            &logits_file,
        )
        .unwrap();
        checks.push(serde_json::json!({
            "name": name, "dir": final_dir, "logits": logits_file, "dtype": "float32",
            "compute": "float32", "tol": 1e-4, "cls": fx["cls"],
            "sliding_window": fx["sliding_window"],
        }));
    }
    let checks_file = tmp.path().join("final_checks.json");
    std::fs::write(&checks_file, serde_json::to_string(&checks).unwrap()).unwrap();
    let out = common::python(oracle_script())
        .arg("check")
        .arg(&checks_file)
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut seen = 0;
    for line in stdout.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        eprintln!(
            "{:<22} final/ in transformers as {}: max rel logits err {:.2e}, problems {}",
            r["name"].as_str().unwrap(),
            r["cls"].as_str().unwrap(),
            r["max_rel_err"].as_f64().unwrap(),
            r["problems"]
        );
        assert_eq!(r["ok"], true, "{line}");
        seen += 1;
    }
    assert!(
        out.status.success() && seen == checks.len(),
        "make_hf_fixtures.py check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
