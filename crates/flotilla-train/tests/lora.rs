//! LoRA against PyPI peft (tests/oracle/peft_oracle.py): a tiny untied Llama base made by
//! transformers and an initial adapter made and saved by PEFT; flotilla starts from them
//! (`model.init_from`, `peft.init_from`).
//!
//! - Training: 30 steps of flotilla's single-process trainer and of a PyTorch + PEFT loop on
//!   the same batches give the same loss, grad_norm and lr (relative 1e-4) and the same trained
//!   adapter, for `[q_proj, v_proj]`, `all-linear`, and `[q_proj, v_proj]` with
//!   `modules_to_save: [lm_head]`.
//! - Files: flotilla's `final/` loads with `PeftModel.from_pretrained` without a missing- or
//!   unexpected-key warning and gives flotilla's logits; `final/merged/` loads in
//!   transformers with the same logits, and merging `final/` into the base after the fact
//!   (`lora::merge_into_base`, `flotilla consolidate --base`) writes the same tensors.
//! - Bad input: an adapter made for a base of another size is refused naming the tensor, by
//!   the task and by `flotilla run` before it creates anything (exit 2); so are an unknown
//!   target module, `r: 0`, a dropout of 1.5, `all-linear` with others and `modules_to_save`
//!   on a tied base, each naming the fix.
//! - Dropout: changes the run, draws the same masks for the same seed, and the same masks in
//!   a block recomputed under activation checkpointing (bit-identical rows).
//! - Families: `all-linear` on a Phi-4-mini-shaped base (fused projections), and on Mixtral
//!   and Qwen3-MoE (the experts and router as PEFT adapts transformers 5's fused parameters),
//!   trains as PEFT's loop and loads in PEFT; the mixtures' `final/merged/` in transformers.
//!
//! DDP and resume are proven through the training binary in train_dist.rs.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;
#[path = "support/replay.rs"]
mod replay;

use std::path::Path;
use std::process::Command;

use flotilla_config::schema::{DataConfig, LoraConfig, TrainerConfig};
use flotilla_train::data::{self, BatchLayout, DataLoader, DataOptions};
use flotilla_train::model::{read_model_config, CausalLm};
use flotilla_train::state::hf_weights::{save_hf, HfWeights};
use flotilla_train::state::param_source::Overlay;
use flotilla_train::state::peft::{self, PeftAdapter, MERGED_DIR};
use flotilla_train::{MetricsRow, Trainer};
use tch::{Device, Kind, Tensor};

const STEPS: u64 = 30;

/// The venv python with peft, or a skip/fail as the oracle policy says.
fn peft_python() -> bool {
    if common::venv_imports("peft, transformers, safetensors") {
        return true;
    }
    common::skip_or_fail("peft is not importable from .venv; run scripts/setup.sh");
    false
}

/// A base and an initial adapter made by transformers and PEFT in `dir` (`base/`,
/// `adapter/`); returns the adapter's keys.
fn make_fixture(dir: &Path, targets: &str, save: &str, random_b: bool) -> Vec<String> {
    make_family_fixture(dir, targets, save, random_b, "llama")
}

/// [`make_fixture`] with a base of `family` (llama, qwen3, phi3, mixtral, qwen3_moe: see
/// peft_oracle.py).
fn make_family_fixture(
    dir: &Path,
    targets: &str,
    save: &str,
    random_b: bool,
    family: &str,
) -> Vec<String> {
    common::run_oracle(
        common::python(common::oracle_file("peft_oracle.py"))
            .arg("make")
            .arg(dir)
            .args([
                targets,
                save,
                "4",
                "8",
                "0",
                if random_b { "1" } else { "0" },
                family,
            ]),
    )
}

fn lora_config(targets: &str, save: &str, init_from: &Path, merge: bool) -> LoraConfig {
    let targets = format!("[{targets}]");
    let save = if save == "-" {
        "[]".into()
    } else {
        format!("[{save}]")
    };
    serde_yaml::from_str(&format!(
        "{{r: 4, alpha: 8, dropout: 0.0, target_modules: {targets}, use_rslora: false, \
         modules_to_save: {save}, init_from: '{}', merge: {merge}}}",
        init_from.display()
    ))
    .unwrap()
}

fn trainer_config() -> TrainerConfig {
    compose::trainer_config(&format!(
        "{{max_steps: {STEPS}, lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5, schedule: cosine}}"
    ))
}

fn loader(t: &TrainerConfig) -> DataLoader {
    let cfg: DataConfig = serde_yaml::from_str(
        "{kind: arithmetic, digits: 2, num_train: 200, num_eval: 0, seed: 0, seq_len: 16, \
         shuffle: true, num_workers: 0}",
    )
    .unwrap();
    let d = data::build(
        &cfg,
        &DataOptions {
            model_vocab_size: 32,
            run_dir: None,
            init_from: None,
        },
    )
    .unwrap();
    let layout = BatchLayout {
        global_batch_size: t.global_batch_size,
        micro_batch_size: t.micro_batch_size,
        rank: 0,
        world_size: 1,
    };
    DataLoader::new(d.train, true, t.seed as u64, layout, Device::Cpu).unwrap()
}

/// flotilla's trainer over the fixture's base with the fixture's adapter.
fn trainer(dir: &Path, lora: &LoraConfig, t: &TrainerConfig) -> Trainer {
    let base_cfg = read_model_config(dir.join("base")).unwrap();
    let model = CausalLm::with_lora(&base_cfg, Some(lora)).unwrap();
    let (_, hf) = HfWeights::open(dir.join("base")).unwrap();
    let adapter = PeftAdapter::open(&dir.join("adapter"), &model, lora).unwrap();
    let source = Overlay {
        names: adapter.names().clone(),
        over: &adapter,
        base: &hf,
    };
    Trainer::new(model, &source, t, loader(t), Device::Cpu).unwrap()
}

/// The oracle's rows on the batches flotilla's loader gives; its trained adapter in `out`.
fn peft_rows(dir: &Path, t: &TrainerConfig, out: &Path) -> Vec<[f64; 3]> {
    peft_rows_for(dir, t, out, STEPS)
}

/// [`peft_rows`] of the first `steps` steps.
fn peft_rows_for(dir: &Path, t: &TrainerConfig, out: &Path, steps: u64) -> Vec<[f64; 3]> {
    let mut l = loader(t);
    let batches = dir.join("batches.safetensors");
    replay::write_step_batches(&mut l, steps, &batches);
    common::run_oracle(
        common::python(common::oracle_file("peft_oracle.py"))
            .arg("train")
            .arg(dir.join("base"))
            .arg(dir.join("adapter"))
            .arg(&batches)
            .arg(steps.to_string())
            .arg(out)
            .args(replay::hyperparameters(t, "cosine")),
    )
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Max |a − b| over max |b|.
fn tensor_err(a: &Tensor, b: &Tensor) -> f64 {
    let scale = b.abs().max().double_value(&[]).max(1e-12);
    (a - b).abs().max().double_value(&[]) / scale
}

#[test]
fn lora_training_matches_pytorch_and_peft() {
    if !peft_python() {
        return;
    }
    for (targets, save) in [
        ("q_proj,v_proj", "-"),
        ("all-linear", "-"),
        ("q_proj,v_proj", "lm_head"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let keys = make_fixture(dir, targets, save, false);
        let lora = lora_config(targets, save, &dir.join("adapter"), false);
        let t = trainer_config();
        let out = dir.join("peft_trained");
        let want = peft_rows(dir, &t, &out);
        let mut tr = trainer(dir, &lora, &t);
        let rows: Vec<MetricsRow> = tr.run(STEPS, None).unwrap();
        assert_eq!(rows.len(), want.len());
        let (mut dl, mut dn, mut dlr) = (0f64, 0f64, 0f64);
        for (r, w) in rows.iter().zip(&want) {
            dl = dl.max(rel(r.loss, w[0]));
            dn = dn.max(rel(r.grad_norm, w[1]));
            dlr = dlr.max(rel(r.lr, w[2]));
        }
        // The trained adapter, tensor by tensor, against PEFT's.
        let theirs: Vec<(String, Tensor)> =
            Tensor::read_safetensors(out.join(peft::ADAPTER_WEIGHTS)).unwrap();
        let ours = tr.weights().full_params().unwrap();
        let mut dw = 0f64;
        for (key, t) in &theirs {
            let name = key.strip_prefix(peft::PEFT_PREFIX).unwrap();
            dw = dw.max(tensor_err(ours.get(name).unwrap(), t));
        }
        eprintln!(
            "{targets} (modules_to_save {save}), {} adapter tensors: loss {:.4} -> {:.4}; max rel \
             diff vs peft: loss {dl:e}, grad_norm {dn:e}, lr {dlr:e}, trained adapter {dw:e}",
            keys.len(),
            rows[0].loss,
            rows.last().unwrap().loss
        );
        assert_eq!(theirs.len(), keys.len());
        assert!(
            dl < 1e-4 && dn < 1e-4 && dlr < 1e-4 && dw < 1e-4,
            "{targets} / {save}"
        );
        assert!(rows.last().unwrap().loss < 0.95 * rows[0].loss, "{rows:?}");
        // Only the adapter (and the module to save) trained: the base is untouched.
        let (_, hf) = HfWeights::open(dir.join("base")).unwrap();
        for s in tr.model().param_specs().iter().filter(|s| !s.trainable) {
            let base = hf.read_range(&s.name, 0, s.numel() as i64).unwrap();
            let now = ours.get(&s.name).unwrap().reshape([-1]);
            assert!(now.equal(&base), "{} changed", s.name);
        }
    }
}

fn logits(model: &CausalLm, params: &flotilla_train::model::Params, tokens: &Tensor) -> Tensor {
    tch::no_grad(|| model.forward(params, tokens).unwrap())
}

fn oracle_logits(args: &[&std::ffi::OsStr]) -> (Tensor, Vec<String>) {
    #[derive(serde::Deserialize)]
    struct Out {
        logits: Vec<Vec<Vec<f32>>>,
        warnings: Vec<String>,
    }
    let out: Out =
        common::run_oracle(common::python(common::oracle_file("peft_oracle.py")).args(args));
    let flat: Vec<f32> = out.logits.iter().flatten().flatten().copied().collect();
    let (b, t) = (out.logits.len() as i64, out.logits[0].len() as i64);
    (Tensor::from_slice(&flat).reshape([b, t, -1]), out.warnings)
}

/// The logits of `PeftModel.from_pretrained(dir/base, adapter)` on `tokens` (JSON), which must
/// load with no missing or unexpected key (`what` names the case in messages).
fn peft_logits(dir: &Path, adapter: &Path, tokens: &str, what: &str) -> Tensor {
    let (logits, warnings) = oracle_logits(&[
        "logits".as_ref(),
        dir.join("base").as_os_str(),
        adapter.as_os_str(),
        tokens.as_ref(),
    ]);
    let keyed: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("missing") || w.contains("unexpected") || w.contains("Missing"))
        .collect();
    assert!(keyed.is_empty(), "{what}: PEFT warned: {keyed:?}");
    logits
}

#[test]
fn final_adapter_loads_in_peft_and_merged_model_in_transformers_with_equal_logits() {
    if !peft_python() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A non-zero B from the start, so that the adapter changes the logits.
    make_fixture(dir, "q_proj,v_proj", "lm_head", true);
    let lora = lora_config("q_proj,v_proj", "lm_head", &dir.join("adapter"), true);
    let t = trainer_config();
    let mut tr = trainer(dir, &lora, &t);
    tr.run(3, None).unwrap();
    let fin = dir.join("final");
    let base = dir.join("base").display().to_string();
    let merged = flotilla_train::checkpoint::FinalOptions {
        kind: Kind::Float,
        max_shard_bytes: u64::MAX,
        base: Some(&dir.join("base")),
    };
    flotilla_train::checkpoint::save_adapter(&tr, &fin, &lora, Some(&base), None, merged).unwrap();

    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fin.join(peft::ADAPTER_CONFIG)).unwrap())
            .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], 4);
    assert_eq!(config["lora_alpha"], 8);
    assert_eq!(config["base_model_name_or_path"], base.as_str());
    assert_eq!(config["modules_to_save"], serde_json::json!(["lm_head"]));

    let tokens = vec![
        vec![1i64, 5, 9, 3, 17, 2, 30, 4],
        vec![7, 7, 1, 0, 12, 25, 6, 8],
    ];
    let x = Tensor::from_slice2(&tokens);
    let ours = logits(tr.model(), &tr.weights().full_params().unwrap(), &x);
    let json = serde_json::to_string(&tokens).unwrap();
    let theirs = peft_logits(dir, &fin, &json, "llama");
    let err = tensor_err(&ours, &theirs);
    // The adapter matters: the base alone gives other logits.
    let base_cfg = read_model_config(dir.join("base")).unwrap();
    let base_model = CausalLm::new(&base_cfg).unwrap();
    let base_params = flotilla_train::state::hf_weights::load_hf(
        dir.join("base"),
        Device::Cpu,
        Some(Kind::Float),
    )
    .unwrap()
    .1;
    let plain = logits(&base_model, &base_params, &x);
    let moved = tensor_err(&plain, &ours);
    eprintln!("PeftModel vs flotilla logits: {err:e} (base alone differs by {moved:e})");
    assert!(err < 1e-5, "{err}");
    assert!(moved > 1e-3, "{moved}");

    let (merged, warnings) = oracle_logits(&[
        "hf_logits".as_ref(),
        fin.join(MERGED_DIR).as_os_str(),
        json.as_ref(),
    ]);
    let merr = tensor_err(&ours, &merged);
    eprintln!("merged model in transformers vs flotilla logits: {merr:e}");
    assert!(merr < 1e-5, "{merr}; warnings {warnings:?}");

    // Merging after the fact (`flotilla consolidate final --base base --out ...`) gives the
    // same model as final/merged/.
    merging_after_the_fact_gives_final_merged(dir, &fin, "llama");
}

/// `flotilla consolidate FINAL --base dir/base` (the adapter's settings read from its files)
/// writes the tensors `FINAL/merged/` holds.
fn merging_after_the_fact_gives_final_merged(dir: &Path, fin: &Path, what: &str) {
    let after = dir.join("merged_after");
    peft::merge_into_base(fin, &dir.join("base"), &after).unwrap();
    let read = |d: &Path| -> Vec<(String, Tensor)> {
        let mut v = Tensor::read_safetensors(d.join("model.safetensors")).unwrap();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let (a, b) = (read(&after), read(&fin.join(MERGED_DIR)));
    assert_eq!(a.len(), b.len(), "{what}");
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb, "{what}");
        assert!(ta.equal(tb), "{what}: {na} differs between the two merges");
    }
}

/// A base of another width than the fixture's (hidden 32, not 64) in `dir/other`.
fn other_base(dir: &Path) -> CausalLm {
    let other = CausalLm::new(&compose::tiny_model_config(false)).unwrap();
    let params = other.init_params(1, Device::Cpu, Kind::Float);
    save_hf(dir.join("other"), &other, &params, Kind::Float).unwrap();
    other
}

#[test]
fn an_adapter_for_another_base_is_refused_naming_the_tensor() {
    if !peft_python() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_fixture(dir, "q_proj,v_proj", "-", false);
    let other = other_base(dir);
    let lora = lora_config("q_proj,v_proj", "-", &dir.join("adapter"), false);
    let model = CausalLm::with_lora(other.config(), Some(&lora)).unwrap();
    let err = match PeftAdapter::open(&dir.join("adapter"), &model, &lora) {
        Ok(_) => panic!("an adapter for a 64-wide base accepted on a 32-wide one"),
        Err(e) => e.to_string(),
    };
    eprintln!("{err}");
    assert!(
        err.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
        "{err}"
    );
    assert!(err.contains("[4, 64]") && err.contains("[4, 32]"), "{err}");
    // And a rank that is not the adapter's names the fix.
    let r8 = LoraConfig {
        r: 8,
        ..lora.clone()
    };
    let model = CausalLm::with_lora(other.config(), Some(&r8)).unwrap();
    let err = PeftAdapter::open(&dir.join("adapter"), &model, &r8)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("set peft.r=4"), "{err}");
}

#[test]
fn lora_dropout_is_reproducible_and_recomputed_blocks_draw_the_same_masks() {
    if !peft_python() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_fixture(dir, "q_proj,v_proj", "-", true);
    let mut lora = lora_config("q_proj,v_proj", "-", &dir.join("adapter"), false);
    let run = |lora: &LoraConfig, checkpointing: bool| -> Vec<(u64, u64)> {
        let mut t = trainer_config();
        t.activation_checkpointing = checkpointing;
        let mut tr = trainer(dir, lora, &t);
        tr.run(5, None)
            .unwrap()
            .iter()
            .map(|r| (r.loss.to_bits(), r.grad_norm.to_bits()))
            .collect()
    };
    let without = run(&lora, false);
    lora.dropout = 0.3;
    let with = run(&lora, false);
    assert_ne!(with, without, "dropout changes the run");
    assert_eq!(
        run(&lora, false),
        with,
        "the same seed draws the same masks"
    );
    // A checkpointed block is recomputed in backward: it must draw the masks of its forward.
    assert_eq!(
        run(&lora, true),
        with,
        "recompute under activation checkpointing"
    );
}

#[test]
fn run_refuses_an_adapter_made_for_another_base_before_creating_anything() {
    if !peft_python() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    make_fixture(dir, "q_proj,v_proj", "-", false);
    other_base(dir);
    let work = dir.join("work");
    std::fs::create_dir(&work).unwrap();
    let run = |base: &str| {
        Command::new(common::flotilla_bin())
            .args(["run", "--dry-run", "--config-dir"])
            .arg(common::conf_dir())
            .arg(format!("model.init_from={}", dir.join(base).display()))
            .args(["peft=lora", "peft.r=4"])
            .arg(format!("peft.init_from={}", dir.join("adapter").display()))
            .current_dir(&work)
            .env(
                "FLOTILLA_TRAIN_BINARY",
                env!("CARGO_BIN_EXE_flotilla-train"),
            )
            .output()
            .unwrap()
    };
    let out = run("other");
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
            && err.contains("set model.init_from to its base"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "nothing created"
    );
    // Its own base passes the check (a dry run prepares the directory).
    let out = run("base");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_lora_settings_are_refused_naming_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    for (overrides, needle) in [
        (
            &["peft.target_modules=[q_prj]"][..],
            "peft.target_modules[0]: expected one of 'q_proj'",
        ),
        (
            &["peft.target_modules=[q_prj]"][..],
            "did you mean 'q_proj'?",
        ),
        (&["peft.r=0"][..], "peft.r: must be at least 1, got 0"),
        (&["peft.dropout=1.5"][..], "set peft.dropout=0.0"),
        (
            &["peft.target_modules=[all-linear,q_proj]"][..],
            "write peft.target_modules=all-linear alone",
        ),
        (
            &["peft.modules_to_save=[lm_head]"][..],
            "with tied embeddings (model.tie_word_embeddings=true)",
        ),
    ] {
        let out = Command::new(common::flotilla_bin())
            .args(["run", "--dry-run", "--config-dir"])
            .arg(common::conf_dir())
            .arg("peft=lora")
            .args(overrides)
            .current_dir(tmp.path())
            .env(
                "FLOTILLA_TRAIN_BINARY",
                env!("CARGO_BIN_EXE_flotilla-train"),
            )
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{overrides:?}: {err}");
        assert!(err.contains(needle), "{overrides:?}: {err}");
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "{overrides:?}: nothing created"
        );
    }
}

/// LoRA on all linear layers of Qwen3 (q/k norms, heads of their own size) and of a
/// Phi-4-mini-shaped base (fused `qkv_proj` and `gate_up_proj`, partial rotary embeddings):
/// flotilla trains the adapter PEFT's loop trains, and PEFT loads flotilla's `final/` with the
/// logits flotilla computes.
#[test]
fn lora_on_phi4_mini_trains_as_peft_and_loads_in_peft() {
    lora_on_family_trains_as_peft_and_loads_in_peft("phi3");
}

/// A mixture's experts and router as PEFT adapts transformers 5's fused parameters
/// (`ParamWrapper`s: gate_up_proj at twice the rank, down_proj, the router), its attention as
/// for a dense model; Qwen3-MoE's dense first layer keeps its MLP unadapted, as PEFT leaves it.
/// Qwen3-MoE's attention is Qwen3's (q/k norms, heads of their own size), so this case also
/// stands for dense Qwen3, whose MLP is Llama's (adapted in `lora_training_matches_...`).
/// The adapter is merged into `final/merged/` too, which transformers loads with equal logits.
#[test]
fn lora_on_mixtral_experts_trains_as_peft_and_loads_in_peft() {
    lora_on_family_trains_as_peft_and_loads_in_peft("mixtral");
}

#[test]
fn lora_on_qwen3_moe_experts_trains_as_peft_and_loads_in_peft() {
    lora_on_family_trains_as_peft_and_loads_in_peft("qwen3_moe");
}

fn lora_on_family_trains_as_peft_and_loads_in_peft(family: &str) {
    if !peft_python() {
        return;
    }
    {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let keys = make_family_fixture(dir, "all-linear", "-", true, family);
        let modules: std::collections::BTreeSet<&str> = keys
            .iter()
            .filter_map(|k| k.split('.').rev().nth(2))
            .collect();
        let moe = family.contains("mixtral") || family.contains("moe");
        let lora = lora_config("all-linear", "-", &dir.join("adapter"), moe);
        // 10 steps, the schedule's horizon on both sides.
        let t = TrainerConfig {
            max_steps: 10,
            ..trainer_config()
        };
        let out = dir.join("peft_trained");
        let want = peft_rows_for(dir, &t, &out, 10);
        let mut tr = trainer(dir, &lora, &t);
        let rows: Vec<MetricsRow> = tr.run(10, None).unwrap();
        let (mut dl, mut dn) = (0f64, 0f64);
        // The first 10 steps: with random A and B, a lr of 3e-3 and Adam's normalisation,
        // the two libtorch builds' rounding grows from 1e-7 at step 0 to 1e-3 by step 20 on
        // the fused Phi-3 layers (the loss stays within 1e-5 throughout).
        for (r, w) in rows.iter().zip(&want).take(10) {
            dl = dl.max(rel(r.loss, w[0]));
            dn = dn.max(rel(r.grad_norm, w[1]));
        }
        eprintln!(
            "{family}: LoRA on {modules:?}: loss {:.4} -> {:.4}; max rel diff vs peft: loss \
             {dl:e}, grad_norm {dn:e}",
            rows[0].loss,
            rows.last().unwrap().loss
        );
        assert!(dl < 1e-4 && dn < 1e-4, "{family}");
        let want_modules: std::collections::BTreeSet<&str> = match family {
            "phi3" => ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"].into(),
            // The experts' two wrappers (`mlp.experts.base_layer`: gate_up_proj, inside
            // `mlp.experts`: down_proj) and the router (`mlp.gate`).
            "mixtral" | "qwen3_moe" => [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "base_layer",
                "experts",
                "gate",
            ]
            .into(),
            _ => [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ]
            .into(),
        };
        assert_eq!(modules, want_modules, "{family}: PEFT's all-linear");

        let fin = dir.join("final");
        let merged = flotilla_train::checkpoint::FinalOptions {
            kind: Kind::Float,
            max_shard_bytes: u64::MAX,
            base: Some(&dir.join("base")),
        };
        let base = dir.join("base").display().to_string();
        flotilla_train::checkpoint::save_adapter(&tr, &fin, &lora, Some(&base), None, merged)
            .unwrap();
        let tokens = vec![vec![1i64, 5, 9, 3, 17, 2, 30, 4]];
        let x = Tensor::from_slice2(&tokens);
        let ours = logits(tr.model(), &tr.weights().full_params().unwrap(), &x);
        let json = serde_json::to_string(&tokens).unwrap();
        let theirs = peft_logits(dir, &fin, &json, family);
        let err = tensor_err(&ours, &theirs);
        eprintln!("{family}: PeftModel vs flotilla logits: {err:e}");
        assert!(err < 1e-5, "{family}: {err}");
        if moe {
            let config: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(fin.join(peft::ADAPTER_CONFIG)).unwrap(),
            )
            .unwrap();
            assert_eq!(
                config["target_parameters"],
                serde_json::json!(["down_proj", "gate_up_proj", "gate.weight"]),
                "{family}"
            );
            assert_eq!(config["rank_pattern"][r".*\.gate_up_proj"], 8, "{family}");
            assert_eq!(config["alpha_pattern"][r".*\.gate_up_proj"], 16, "{family}");
            let (merged, warnings) = oracle_logits(&[
                "hf_logits".as_ref(),
                fin.join(MERGED_DIR).as_os_str(),
                json.as_ref(),
            ]);
            let merr = tensor_err(&ours, &merged);
            eprintln!("{family}: merged model in transformers vs flotilla logits: {merr:e}");
            assert!(merr < 1e-5, "{family}: {merr}; warnings {warnings:?}");
            // `flotilla consolidate final --base base` reads the adapter's settings from its
            // files (the experts' wrappers by target_parameters) and merges the same tensors.
            merging_after_the_fact_gives_final_merged(dir, &fin, family);
        }
    }
}
