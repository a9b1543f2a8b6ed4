//! Checkpoints: an interrupted and resumed run equals an uninterrupted one bit for bit,
//! rotation keeps the last K checkpoints, a leftover temporary directory is ignored, a damaged
//! newest checkpoint is skipped for the newest intact one, and evaluation fills the eval
//! columns of `metrics.csv`.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;

use std::path::Path;
use std::sync::Arc;

use flotilla_config::schema::{DataConfig, ModelConfig, Resume, TrainerConfig};
use flotilla_train::data::{self, BatchLayout, Data, DataLoader, DataOptions};
use flotilla_train::model::CausalLm;
use flotilla_train::{checkpoint, fit, resume, EvalSet, FitOptions, MetricsWriter, Trainer};
use tch::{Device, Kind};

fn model_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 16,
        ..compose::tiny_model_config(true)
    }
}

fn trainer_config(checkpoint_every: u64, keep: usize) -> TrainerConfig {
    compose::trainer_config(&format!(
        "{{max_steps: 12, min_lr: 3.0e-4, warmup_steps: 3, schedule: cosine, eval_every: 4, \
         eval_batches: 2, checkpoint_every: {checkpoint_every}, \
         keep_last_checkpoints: {keep}, resume: auto}}"
    ))
}

fn data() -> Data {
    let cfg: DataConfig = serde_yaml::from_str(
        "{kind: arithmetic, digits: 2, num_train: 200, num_eval: 20, seed: 0, seq_len: 16, \
         shuffle: true, num_workers: 0}",
    )
    .unwrap();
    data::build(
        &cfg,
        &DataOptions {
            model_vocab_size: 16,
            run_dir: None,
            init_from: None,
        },
    )
    .unwrap()
}

fn trainer(t: &TrainerConfig, d: &Data) -> Trainer {
    let layout = BatchLayout {
        global_batch_size: t.global_batch_size,
        micro_batch_size: t.micro_batch_size,
        rank: 0,
        world_size: 1,
    };
    let loader = DataLoader::new(d.train.clone(), true, 7, layout, Device::Cpu).unwrap();
    let model = CausalLm::new(&model_config()).unwrap();
    let params = model.init_params(3, Device::Cpu, Kind::Float);
    Trainer::new(model, &params, t, loader, Device::Cpu).unwrap()
}

/// Runs (resuming per `t.resume`) up to `until`; returns the trainer.
fn run(dir: &Path, t: &TrainerConfig, d: &Data, until: u64) -> Trainer {
    let mut tr = trainer(t, d);
    resume(&mut tr, dir, &t.resume).unwrap();
    let mut w = MetricsWriter::open(&dir.join("metrics.csv"), tr.step_index()).unwrap();
    let eval = EvalSet {
        dataset: Arc::clone(d.eval.as_ref().unwrap()),
        num_batches: t.eval_batches,
        micro_batch_size: t.micro_batch_size,
        task: d.arithmetic.as_ref().map(|a| (a, 8)),
    };
    fit(
        &mut tr,
        Some(&mut w),
        FitOptions {
            run_dir: dir,
            until,
            eval_every: t.eval_every,
            eval: Some(eval),
            checkpoint_every: t.checkpoint_every,
            keep_last_checkpoints: t.keep_last_checkpoints,
            on_row: None,
        },
    )
    .unwrap();
    tr
}

fn rows(dir: &Path) -> Vec<Vec<String>> {
    let mut r = csv::Reader::from_path(dir.join("metrics.csv")).unwrap();
    r.records()
        .map(|x| x.unwrap().iter().map(str::to_string).collect())
        .collect()
}

fn params(tr: &Trainer) -> Vec<Vec<f32>> {
    tr.full_params()
        .unwrap()
        .iter()
        .map(|(_, t)| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap())
        .collect()
}

#[test]
fn resumed_run_equals_uninterrupted_run() {
    let d = data();
    let t = trainer_config(6, 0);
    let a = tempfile::tempdir().unwrap();
    let full = run(a.path(), &t, &d, 12);
    let b = tempfile::tempdir().unwrap();
    drop(run(b.path(), &t, &d, 6));
    assert!(b
        .path()
        .join("checkpoints/step_6/trainer_state.json")
        .is_file());
    let resumed = run(b.path(), &t, &d, 12);
    assert_eq!(resumed.step_index(), 12);

    let (ra, rb) = (rows(a.path()), rows(b.path()));
    assert_eq!(ra.len(), 12);
    assert_eq!(rb.len(), 12);
    for (x, y) in ra.iter().zip(&rb) {
        // step, loss, grad_norm, lr (written with full precision) and the eval columns.
        for c in [0, 1, 2, 3, 6, 7, 8] {
            assert_eq!(x[c], y[c], "column {c}: {x:?} vs {y:?}");
        }
    }
    // Eval at steps 4, 8, 12 (rows 3, 7, 11) only.
    for (i, r) in ra.iter().enumerate() {
        assert_eq!(!r[6].is_empty(), (i + 1) % 4 == 0, "row {i}: {r:?}");
    }
    let acc: f64 = ra[11][8].parse().unwrap();
    assert!((0.0..=1.0).contains(&acc));
    let ppl: f64 = ra[11][7].parse().unwrap();
    let loss: f64 = ra[11][6].parse().unwrap();
    assert!((ppl - loss.exp()).abs() < 1e-9 * ppl);
    assert_eq!(params(&full), params(&resumed));
}

#[test]
fn rotation_keeps_the_last_k_and_resume_ignores_temp_dirs() {
    let d = data();
    let mut t = trainer_config(2, 2);
    t.eval_every = 0;
    let dir = tempfile::tempdir().unwrap();
    drop(run(dir.path(), &t, &d, 8));
    let steps: Vec<u64> = checkpoint::list(dir.path())
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(steps, vec![6, 8]);

    // A half-written checkpoint (a crash during save) and a directory without a state file
    // are not picked.
    let ck = checkpoint::checkpoints_dir(dir.path());
    std::fs::create_dir_all(ck.join(".tmp-step_10-1")).unwrap();
    std::fs::create_dir_all(ck.join("step_12")).unwrap();
    std::fs::write(ck.join("step_12/model.safetensors"), b"junk").unwrap();
    assert_eq!(
        checkpoint::latest(dir.path()).unwrap().unwrap(),
        ck.join("step_8")
    );
    let tr = run(dir.path(), &t, &d, 8);
    assert_eq!(tr.step_index(), 8);
    assert_eq!(rows(dir.path()).len(), 8);

    // `never` starts afresh.
    t.resume = Resume::Never;
    let mut tr = trainer(&t, &d);
    assert!(resume(&mut tr, dir.path(), &t.resume).unwrap().is_none());
    assert_eq!(tr.step_index(), 0);
}

/// Truncating a file of the newest checkpoint (a node crash on a network file system) makes
/// `resume: auto` take the one before it, and the run ends as the uninterrupted one does; with
/// every checkpoint damaged, resuming fails naming each one and why.
#[test]
fn a_damaged_newest_checkpoint_is_skipped_for_the_newest_intact_one() {
    let d = data();
    let t = trainer_config(3, 0);
    let a = tempfile::tempdir().unwrap();
    let full = run(a.path(), &t, &d, 12);
    let b = tempfile::tempdir().unwrap();
    drop(run(b.path(), &t, &d, 9));
    let ck = checkpoint::checkpoints_dir(b.path());
    for step in [3, 6, 9] {
        let manifest = ck.join(format!("step_{step}/manifest.json"));
        assert!(manifest.is_file(), "{} was not written", manifest.display());
    }
    // The newest checkpoint's optimizer state loses its last bytes.
    let damaged = ck.join("step_9/optimizer.safetensors");
    let len = std::fs::metadata(&damaged).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&damaged)
        .unwrap();
    file.set_len(len - 100).unwrap();
    drop(file);
    let err = checkpoint::manifest::verify(&ck.join("step_9")).unwrap_err();
    assert_eq!(err.file, "optimizer.safetensors");
    assert_eq!(
        err.reason,
        format!("{} bytes where {len} were written", len - 100)
    );

    let mut tr = trainer(&t, &d);
    let (dir, state) = resume(&mut tr, b.path(), &t.resume).unwrap().unwrap();
    assert_eq!((dir, state.step), (ck.join("step_6"), 6));
    let resumed = run(b.path(), &t, &d, 12);
    assert_eq!(resumed.step_index(), 12);
    let (ra, rb) = (rows(a.path()), rows(b.path()));
    assert_eq!(rb.len(), 12);
    assert_eq!(ra[11][1], rb[11][1], "final loss");
    assert_eq!(params(&full), params(&resumed));

    // Every checkpoint damaged: a missing file, a header cut short.
    let c = tempfile::tempdir().unwrap();
    drop(run(c.path(), &t, &d, 6));
    let ck = checkpoint::checkpoints_dir(c.path());
    std::fs::remove_file(ck.join("step_6/model.safetensors")).unwrap();
    std::fs::write(ck.join("step_3/model.safetensors"), [1u8, 0, 0]).unwrap();
    let mut tr = trainer(&t, &d);
    let err = resume(&mut tr, c.path(), &t.resume)
        .unwrap_err()
        .to_string();
    for want in [
        "no checkpoint of this run is whole",
        "step_6: model.safetensors: missing",
        "step_3: model.safetensors: 3 bytes where",
    ] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
}
