//! flotilla's rotary embeddings against the real transformers (tests/oracle/rope_oracle.py).
//!
//! `tables_equal_transformers`: for every rope type (`default`, `linear`, `dynamic`, `yarn` with
//! its attention factor from `factor`, from `mscale`/`mscale_all_dim` and given, `longrope`,
//! `llama3`), with and without `partial_rotary_factor` (read as Phi-3's, where transformers
//! applies it), in the legacy `rope_scaling` and the
//! transformers-5 `rope_parameters` forms, flotilla reads the `config.json` dict transformers
//! reads and its [`Rope`] gives the initial inverse frequencies and attention scaling of
//! transformers' rotary-embedding module, and for successive forwards (longer and shorter than
//! the original context, packed rows among them) the cos/sin tables and the frequencies that
//! module's `dynamic_rope_update` chose.
//!
//! `models_equal_transformers`: small random models transformers saves (Llama with yarn,
//! dynamic and longrope; a Phi-3 with longrope and `partial_rotary_factor` 0.5) load in flotilla with transformers' logits for batches beyond and
//! within the original context, and a cached forward (a prefill, then one token at a time across
//! the original context) gives transformers' cached logits at every step.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use flotilla_config::schema::hf_config::HfLlamaConfig;
use flotilla_config::schema::ModelConfig;
use flotilla_train::model::layers::rope::Rope;
use flotilla_train::model::{CausalLm, KvCache};
use flotilla_train::state::hf_weights::load_hf;
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

fn python_or_skip(test: &str) -> Option<PathBuf> {
    let python = common::oracle_python();
    if python.is_none() {
        common::skip_or_fail(&format!(
            "{test}: `import transformers, safetensors` fails in {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    }
    python
}

fn numbers(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| numbers(i, out)),
        Value::Number(n) => out.push(n.as_f64().unwrap()),
        other => panic!("not a number: {other}"),
    }
}

fn flat(v: &Value) -> Vec<f64> {
    let mut out = Vec::new();
    numbers(v, &mut out);
    out
}

/// `max |ours - theirs| / max |theirs|`.
fn rel_diff(ours: &[f64], theirs: &[f64]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    let diff = ours
        .iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let scale = theirs.iter().map(|b| b.abs()).fold(0.0, f64::max);
    diff / scale
}

fn tensor_values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).reshape([-1])).unwrap()
}

/// The position ids of one forward: `[T]` or `[B, T]` as a JSON list.
fn positions(v: &Value) -> Tensor {
    let rows: Vec<Vec<i64>> = match &v[0] {
        Value::Array(_) => serde_json::from_value(v.clone()).unwrap(),
        _ => vec![serde_json::from_value(v.clone()).unwrap()],
    };
    let batch = rows.len() as i64;
    let tensor = Tensor::from_slice(&rows.concat()).reshape([batch, -1]);
    match &v[0] {
        Value::Array(_) => tensor,
        _ => tensor.squeeze_dim(0),
    }
}

fn range(a: i64, b: i64) -> Vec<i64> {
    (a..b).collect()
}

/// Packed rows: position ids restarting at each sequence of `lengths`.
fn packed(lengths: &[i64]) -> Vec<i64> {
    lengths.iter().flat_map(|n| 0..*n).collect()
}

/// The `ModelConfig` of a case's `config.json` dict; one with a partial rotary factor is read as
/// Phi-3's, the one family transformers rotates part of each head in.
fn model_config(config: &Value) -> ModelConfig {
    let mut config = config.clone();
    let partial = config.get("partial_rotary_factor").is_some()
        || config["rope_parameters"]
            .get("partial_rotary_factor")
            .is_some();
    if partial {
        config["model_type"] = json!("phi3");
    }
    let hf = HfLlamaConfig::from_json(&config.to_string(), Path::new("config.json")).unwrap();
    ModelConfig::try_from(&hf).unwrap_or_else(|e| panic!("{config}: {e}"))
}

/// Every case: (name, transformers config class, config.json dict, forwards).
fn cases() -> Vec<(&'static str, &'static str, Value, Vec<Value>)> {
    let base = |extra: Value| {
        let mut c = json!({"vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
                           "num_hidden_layers": 1, "num_attention_heads": 4,
                           "max_position_embeddings": 32});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let short8 = json!([1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.6, 3.2]);
    let long8 = json!([1.0, 1.2, 1.6, 2.4, 3.6, 5.0, 7.0, 9.0]);
    vec![
        (
            "default",
            "llama",
            base(json!({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})),
            vec![json!(range(0, 40))],
        ),
        (
            "default_partial_0.5",
            "phi3",
            base(json!({"partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                        "pad_token_id": 0})),
            vec![json!(range(0, 40))],
        ),
        (
            "linear_legacy",
            "llama",
            base(json!({"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 4.0}})),
            vec![json!(range(0, 40))],
        ),
        (
            "dynamic",
            "llama",
            base(
                json!({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                            "rope_theta": 10000.0}}),
            ),
            // Growth and resets in an order where transformers' state and flotilla's
            // per-forward rule agree (see rope.rs): within, growing, one token at a time,
            // back within (reset), growing again, packed rows within and beyond.
            vec![
                json!(range(0, 20)),
                json!(range(0, 40)),
                json!([40]),
                json!([41]),
                json!(range(0, 8)),
                json!(range(0, 36)),
                json!([packed(&[10, 14]), range(0, 24)]),
                json!([packed(&[20, 20]), range(0, 40)]),
            ],
        ),
        (
            "dynamic_partial_0.75",
            "llama",
            base(json!({"partial_rotary_factor": 0.75,
                        "rope_scaling": {"rope_type": "dynamic", "factor": 3.0}})),
            vec![json!(range(0, 50)), json!([50])],
        ),
        (
            "yarn",
            "llama",
            base(json!({"max_position_embeddings": 64,
                        "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 16,
                                            "rope_theta": 10000.0}})),
            vec![json!(range(0, 40))],
        ),
        (
            "yarn_attention_factor_null_factor",
            "llama",
            base(json!({"max_position_embeddings": 64,
                        "rope_parameters": {"rope_type": "yarn", "factor": null,
                                            "attention_factor": 0.8,
                                            "original_max_position_embeddings": 16,
                                            "rope_theta": 10000.0}})),
            vec![json!(range(0, 40))],
        ),
        (
            "longrope",
            "llama",
            base(json!({"max_position_embeddings": 64,
                        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                            "short_factor": short8, "long_factor": long8,
                                            "original_max_position_embeddings": 16}})),
            // Short within 16 positions, long beyond, per forward.
            vec![
                json!(range(0, 10)),
                json!(range(0, 24)),
                json!([24]),
                json!(range(0, 16)),
                json!([16]),
                json!([packed(&[12, 8]), range(0, 20)]),
                json!([packed(&[10, 6]), range(0, 16)]),
            ],
        ),
        (
            "longrope_partial_0.5_phi3",
            "phi3",
            // Phi-3 takes its top-level original_max_position_embeddings over the dict's.
            base(
                json!({"max_position_embeddings": 64, "partial_rotary_factor": 0.5,
                        "pad_token_id": 0, "original_max_position_embeddings": 16,
                        "rope_scaling": {"type": "longrope",
                                         "short_factor": [1.0, 1.1, 1.5, 2.0],
                                         "long_factor": [1.2, 2.0, 4.0, 8.0],
                                         "attention_factor": 1.2,
                                         "original_max_position_embeddings": 16}}),
            ),
            vec![json!(range(0, 12)), json!(range(0, 30))],
        ),
        (
            "llama3",
            "llama",
            base(json!({"max_position_embeddings": 256,
                        "rope_parameters": {"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64,
                                            "rope_theta": 500000.0}})),
            vec![json!(range(0, 40))],
        ),
    ]
}

#[test]
fn tables_equal_transformers() {
    let Some(_) = python_or_skip("tables_equal_transformers") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cases = cases();
    let file = tmp.path().join("cases.json");
    let listed: Vec<Value> = cases
        .iter()
        .map(|(name, arch, config, forwards)| {
            json!({"name": name, "arch": arch, "config": config, "forwards": forwards})
        })
        .collect();
    std::fs::write(&file, serde_json::to_string(&listed).unwrap()).unwrap();
    let results: Vec<Value> = common::run_oracle(
        common::python(common::oracle_file("rope_oracle.py"))
            .arg("tables")
            .arg(&file),
    );
    assert_eq!(results.len(), cases.len());

    let mut failures = Vec::new();
    for ((name, _, config, forwards), theirs) in cases.iter().zip(&results) {
        assert_eq!(theirs["name"], *name);
        let c = model_config(config);
        let rope = Rope::new(&c);
        // The plain rope of the whole head: a case whose tables equal it exercises nothing.
        let plain = Rope::new(&ModelConfig {
            rope_scaling: None,
            partial_rotary_factor: None,
            ..c.clone()
        });
        let inv: Vec<f64> = rope.inv_freq().iter().map(|v| *v as f64).collect();
        let mut worst = rel_diff(&inv, &flat(&theirs["inv_freq"]));
        let scaling = theirs["attention_scaling"].as_f64().unwrap();
        let scaling_diff = (rope.attention_scaling() - scaling).abs() / scaling;
        let mut exercised = false;
        for (f, (pos, t)) in forwards
            .iter()
            .zip(theirs["forwards"].as_array().unwrap())
            .enumerate()
        {
            let pos = positions(pos);
            let (cos, sin) = rope.tables(&pos, None);
            worst = worst
                .max(rel_diff(&tensor_values(&cos), &flat(&t["cos"])))
                .max(rel_diff(&tensor_values(&sin), &flat(&t["sin"])));
            let seq_len = pos.max().int64_value(&[]) + 1;
            let used: Vec<f64> = rope
                .inv_freq_for(seq_len)
                .iter()
                .map(|v| *v as f64)
                .collect();
            let used_diff = rel_diff(&used, &flat(&t["inv_freq"]));
            if used_diff > 1e-6 {
                failures.push(format!(
                    "{name} forward {f}: frequencies differ by {used_diff:.2e}"
                ));
            }
            let (plain_cos, _) = plain.tables(&pos, None);
            exercised |= plain_cos.size() != cos.size()
                || (&plain_cos - &cos).abs().max().double_value(&[]) > 1e-3;
        }
        eprintln!(
            "{name:<36} max rel diff {worst:.2e} (inv_freq and every forward's cos/sin), \
             attention scaling {:.6} (rel diff {scaling_diff:.1e})",
            rope.attention_scaling()
        );
        if worst > 1e-6 || scaling_diff > 1e-12 {
            failures.push(format!(
                "{name}: tables differ by {worst:.2e}, attention scaling by {scaling_diff:.2e}"
            ));
        }
        if *name != "default" && !exercised {
            failures.push(format!("{name}: its tables equal plain RoPE's"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn read_tensors(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

fn max_rel_err(ours: &Tensor, theirs: &Tensor) -> f64 {
    let diff = (ours.to_kind(Kind::Float) - theirs)
        .abs()
        .max()
        .double_value(&[]);
    diff / theirs.abs().max().double_value(&[])
}

const TOL: f64 = 1e-5;

#[test]
fn models_equal_transformers() {
    let Some(_) = python_or_skip("models_equal_transformers") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    common::python(common::oracle_file("rope_oracle.py"))
        .arg("model")
        .arg(tmp.path())
        .run();
    let manifest: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest.len(), 4);
    let _no_grad = tch::no_grad_guard();
    let mut failures = Vec::new();
    for fx in &manifest {
        let name = fx["name"].as_str().unwrap();
        let reference = read_tensors(Path::new(fx["reference"].as_str().unwrap()));
        // A partial rotary factor under Llama's names is refused (transformers rotates whole
        // heads in Llama): that fixture is checked as the Phi-3 it is.
        let as_llama = fx["phi3_dir"].as_str().is_none();
        if as_llama {
            check_model(
                name,
                name,
                fx["dir"].as_str().unwrap(),
                fx,
                &reference,
                &mut failures,
            );
        }
        if let Some(dir) = fx["phi3_dir"].as_str() {
            let label = format!("{name} (Phi3ForCausalLM)");
            check_model(name, &label, dir, fx, &reference, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Loads the model directory `dir` of fixture `name` and checks its logits, and its cached
/// forward's, against transformers' `reference`, with the scaling exercised; `label` names it
/// in messages.
fn check_model(
    name: &str,
    label: &str,
    dir: &str,
    fx: &Value,
    reference: &HashMap<String, Tensor>,
    failures: &mut Vec<String>,
) {
    let (model, params) =
        load_hf(dir, Device::Cpu, Some(Kind::Float)).unwrap_or_else(|e| panic!("{label}: {e}"));
    let c = model.config();
    assert!(c.rope_scaling.is_some(), "{label}");
    if name == "longrope_partial" {
        assert_eq!((c.partial_rotary_factor, c.rotary_dim()), (Some(0.5), 8));
    }
    // The same weights with plain RoPE over the whole head.
    let plain = CausalLm::new(&ModelConfig {
        rope_scaling: None,
        partial_rotary_factor: None,
        ..c.clone()
    })
    .unwrap();
    for length in fx["lengths"].as_array().unwrap() {
        let length = length.as_i64().unwrap();
        let ids = &reference[&format!("input_ids_{length}")];
        let theirs = &reference[&format!("logits_{length}")];
        let err = max_rel_err(&model.forward(&params, ids).unwrap(), theirs);
        let plain_err = max_rel_err(&plain.forward(&params, ids).unwrap(), theirs);
        eprintln!(
            "{label:<18} {length} tokens: max rel logits err {err:.2e} (plain RoPE: \
             {plain_err:.2e})"
        );
        if err > TOL {
            failures.push(format!("{label} {length} tokens: logits err {err:.3e}"));
        }
        if length > 16 && plain_err < 100.0 * TOL {
            failures.push(format!(
                "{label} {length} tokens: plain RoPE is only {plain_err:.2e} away"
            ));
        }
    }

    // A cached forward: a prefill, then one token at a time past the original context.
    let ids = &reference["cached_ids"];
    let theirs = &reference["cached_logits"];
    let chunks: Vec<i64> = serde_json::from_value(fx["chunks"].clone()).unwrap();
    let total: i64 = chunks.iter().sum();
    let mut cache = KvCache::new(&model, total as usize);
    let mut steps = Vec::new();
    let mut start = 0;
    for n in &chunks {
        steps.push(
            model
                .forward_cached(&params, &ids.narrow(1, start, *n), &mut cache)
                .unwrap(),
        );
        start += n;
    }
    let ours = Tensor::cat(&steps, 0);
    let err = max_rel_err(&ours, theirs);
    // The whole sequence in one forward: its frequencies are the full length's at every
    // position, where the cached forward's earlier keys kept theirs.
    let whole = model.forward(&params, ids).unwrap();
    let whole_last = whole
        .select(0, 0)
        .narrow(0, chunks[0] - 1, chunks.len() as i64);
    let whole_err = max_rel_err(&whole_last, theirs);
    eprintln!(
        "{label:<18} cached forward, {} steps to {total} tokens: max rel logits err \
         {err:.2e} (one whole forward: {whole_err:.2e})",
        chunks.len()
    );
    if err > TOL {
        failures.push(format!("{label} cached forward: logits err {err:.3e}"));
    }
    let sequence_dependent = matches!(name, "dynamic" | "longrope" | "longrope_partial");
    if sequence_dependent && whole_err < 100.0 * TOL {
        failures.push(format!(
            "{label}: the cached forward equals one whole forward ({whole_err:.2e}); it \
             does not exercise the frequencies' update"
        ));
    }
    if !sequence_dependent && whole_err > TOL {
        failures.push(format!(
            "{label}: static frequencies, yet the cached forward differs from one whole \
             forward by {whole_err:.2e}"
        ));
    }
}
