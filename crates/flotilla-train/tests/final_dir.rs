//! `final/` as `save_pretrained` writes it, against the real transformers
//! (tests/oracle/final_dir_oracle.py): a full fine-tune of a bf16 base saved in several shards
//! with an index writes a `final/` that transformers loads with no missing or unexpected
//! weight, in bfloat16 (the base's dtype), with the trained values, the base's
//! generation_config.json (its eos ids, where `model.generate()` stops) and the base's
//! tokenizer files byte for byte; a small `max_shard_size` splits it into shards with an index
//! that transformers reads, and a large one writes a single `model.safetensors` (removing the
//! shards and index an earlier write left).
//!
//! `final/` appears only when whole: a failed write leaves neither it nor its staging
//! directory.
//!
//! A LoRA job's `final/merged/` under FSDP on 2 ranks (threads over one `MemoryStore`) is
//! streamed unit by unit: rank 0 never gathers more than one flat group at a time, and the
//! files hold exactly the adapters folded into the base as `MergedWeights` folds them (the
//! merge that tests/lora.rs checks against PEFT).

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;
#[path = "support/threads.rs"]
mod threads;

use std::path::Path;
use std::sync::Arc;

use flotilla_comm::comm::Communicator;
use flotilla_config::schema::DataConfig;
use flotilla_config::schema::JobConfig;
use flotilla_train::checkpoint::{save_adapter, save_final, FinalOptions};
use flotilla_train::data::{self, BatchLayout, DataLoader, DataOptions, Tokenizer};
use flotilla_train::model::hf_config::{read_hf_config, weight_kind};
use flotilla_train::model::CausalLm;
use flotilla_train::state::hf_weights::HfWeights;
use flotilla_train::state::merge::MergedWeights;
use flotilla_train::state::peft::MERGED_DIR;
use flotilla_train::{DistContext, Trainer};
use serde_json::Value;
use tch::{Device, Kind};

/// `final_dir_oracle.py ARGS`'s answer.
fn oracle(args: &[&str]) -> Value {
    common::run_oracle(common::python(common::oracle_file("final_dir_oracle.py")).args(args))
}

/// A trainer fine-tuning `base` for 3 steps on arithmetic data (ids below the base's 64).
fn fine_tuned(base: &Path) -> Trainer {
    let (model, weights) = HfWeights::open(base).unwrap();
    let t = compose::trainer_config("{max_steps: 3, warmup_steps: 1}");
    let cfg: DataConfig = serde_yaml::from_str(
        "{kind: arithmetic, digits: 2, num_train: 64, num_eval: 0, seed: 0, seq_len: 16, \
         shuffle: true, num_workers: 0}",
    )
    .unwrap();
    let d = data::build(
        &cfg,
        &DataOptions {
            model_vocab_size: 64,
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
    let loader = DataLoader::new(d.train, true, 7, layout, Device::Cpu).unwrap();
    let mut trainer = Trainer::new(model, &weights, &t, loader, Device::Cpu).unwrap();
    trainer.run(3, None).unwrap();
    trainer
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn final_dir_is_what_save_pretrained_writes() {
    let Some(_) = common::oracle_python() else {
        return common::skip_or_fail(
            "final_dir_is_what_save_pretrained_writes: no transformers; run scripts/setup.sh",
        );
    };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let made = oracle(&["base", base.to_str().unwrap()]);
    assert!(made["shards"].as_u64().unwrap() > 1, "the base is sharded");
    let trainer = fine_tuned(&base);
    let tokenizer = Tokenizer::from_file(base.join("tokenizer.json"), "data.tokenizer").unwrap();
    // `save_dtype: auto` with a base: the base's dtype.
    let kind = weight_kind(&read_hf_config(&base).unwrap()).unwrap();
    assert_eq!(kind, Kind::BFloat16);

    let fin = tmp.path().join("final");
    let opts = FinalOptions {
        kind,
        max_shard_bytes: 20_000,
        base: Some(&base),
    };
    save_final(&trainer, &fin, Some(&tokenizer), opts).unwrap();
    let written = files(&fin);
    let shards: Vec<&String> = written.iter().filter(|f| f.starts_with("model-")).collect();
    assert!(shards.len() > 1, "{written:?}");
    assert!(written.contains(&"model.safetensors.index.json".to_string()));
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
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fin.join("config.json")).unwrap()).unwrap();
    let base_config: Value =
        serde_json::from_str(&std::fs::read_to_string(base.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config, base_config,
        "config.json is the base's, dtype included"
    );

    let loaded = oracle(&["load", fin.to_str().unwrap()]);
    assert_eq!(loaded["dtypes"], serde_json::json!(["torch.bfloat16"]));
    assert_eq!(loaded["generation_eos"], serde_json::json!([2, 7]));
    assert_eq!(loaded["config_eos"], 2);
    assert_eq!(loaded["tokenizer_eos"], 2);
    // The trained values, rounded to bfloat16 as written.
    let params = trainer.full_params().unwrap();
    let mut compared = 0;
    for (name, t) in params.iter() {
        let ours = t
            .to_kind(Kind::BFloat16)
            .to_kind(Kind::Double)
            .sum(Kind::Double)
            .double_value(&[]);
        let theirs = loaded["sums"][name].as_f64().unwrap();
        assert!(
            (ours - theirs).abs() <= 1e-9 * ours.abs().max(1.0),
            "{name}: {ours} vs {theirs}"
        );
        compared += 1;
    }
    assert_eq!(compared, loaded["sums"].as_object().unwrap().len());
    let base_sums = oracle(&["load", base.to_str().unwrap()]);
    assert_ne!(
        base_sums["sums"], loaded["sums"],
        "training changed the weights"
    );

    // A large max_shard_size writes one file, and the earlier shards and index are gone.
    let opts = FinalOptions {
        max_shard_bytes: 50_000_000_000,
        ..opts
    };
    save_final(&trainer, &fin, Some(&tokenizer), opts).unwrap();
    let written = files(&fin);
    assert!(
        written.contains(&"model.safetensors".to_string()),
        "{written:?}"
    );
    assert!(
        !written
            .iter()
            .any(|f| f.starts_with("model-") || f.ends_with(".index.json")),
        "{written:?}"
    );
    let again = oracle(&["load", fin.to_str().unwrap()]);
    assert_eq!(again["sums"], loaded["sums"]);
}

/// `job`'s data, built in process.
fn job_data(job: &JobConfig) -> data::Data {
    data::build(
        &job.data,
        &DataOptions {
            model_vocab_size: job.model.vocab_size,
            run_dir: None,
            init_from: None,
        },
    )
    .unwrap()
}

/// `final/` appears whole or not at all (`status` and `report` take it as the sign that
/// training finished): a staging directory a killed writer left is cleared, a write that fails
/// after the weights (the base's config.json is not JSON) leaves neither `final/` nor its
/// staging directory, and a write that succeeds leaves `final/` alone.
#[test]
fn final_dir_appears_only_when_whole() {
    let job = compose::composer()
        .compose(&common::ov(&[
            "model=tiny",
            "trainer.device=cpu",
            "trainer.precision=32-true",
            "trainer.micro_batch_size=2",
            "trainer.global_batch_size=2",
            "data.seq_len=16",
            "data.num_train=8",
            "compute.tasks_per_node=1",
        ]))
        .unwrap()
        .typed
        .unwrap();
    let model = CausalLm::new(&job.model).unwrap();
    let params = model.init_params(3, Device::Cpu, Kind::Float);
    let d = job_data(&job);
    let layout = BatchLayout {
        global_batch_size: 2,
        micro_batch_size: 2,
        rank: 0,
        world_size: 1,
    };
    let loader = DataLoader::new(d.train, true, 7, layout, Device::Cpu).unwrap();
    let mut trainer = Trainer::new(model, &params, &job.trainer, loader, Device::Cpu).unwrap();
    trainer.run(1, None).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let runs = tmp.path().join("run");
    std::fs::create_dir_all(runs.join(".tmp-final")).unwrap();
    std::fs::write(runs.join(".tmp-final/model.safetensors"), "cut short").unwrap();
    let broken_base = tmp.path().join("base");
    std::fs::create_dir(&broken_base).unwrap();
    std::fs::write(broken_base.join("config.json"), "{not json").unwrap();
    let fin = runs.join("final");
    let opts = FinalOptions {
        kind: Kind::Float,
        max_shard_bytes: u64::MAX,
        base: Some(&broken_base),
    };
    let err = save_final(&trainer, &fin, None, opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    assert!(files(&runs).is_empty(), "{:?}", files(&runs));

    let opts = FinalOptions { base: None, ..opts };
    save_final(&trainer, &fin, None, opts).unwrap();
    assert_eq!(files(&runs), ["final"]);
    let written = files(&fin);
    assert!(
        written.contains(&"model.safetensors".to_string())
            && written.contains(&"config.json".to_string()),
        "{written:?}"
    );
}

/// A LoRA job of the tiny model under FSDP FULL_SHARD on 2 CPU ranks, merged at the end.
fn lora_fsdp_job() -> JobConfig {
    let overrides = [
        "model=tiny",
        "trainer/dist=fsdp",
        "trainer.dist.backend=cpu",
        "trainer.precision=32-true",
        "trainer.device=cpu",
        "trainer.lr=0.01",
        "trainer.micro_batch_size=2",
        "trainer.global_batch_size=4",
        "data.seq_len=16",
        "data.num_train=64",
        "compute.tasks_per_node=2",
        "compute.gpus_per_node=0",
        "peft=lora",
        "peft.target_modules=all-linear",
        "peft.merge=true",
    ];
    compose::composer()
        .compose(&common::ov(&overrides))
        .unwrap()
        .typed
        .unwrap()
}

/// On one rank of 2: 3 steps, then `final/` with `final/merged/` in `dir` (collective).
/// Returns rank 0's largest gathered group for the merge, the model's bytes, and (rank 0) the
/// reference merge of the gathered parameters.
fn merge_on_rank(
    job: &JobConfig,
    dir: &Path,
    comm: Arc<dyn Communicator>,
) -> (usize, usize, Vec<(String, tch::Tensor)>) {
    tch::set_num_threads(1);
    let rank = comm.rank();
    let lora = job.peft.lora().unwrap();
    let model = CausalLm::with_lora(&job.model, Some(lora)).unwrap();
    let params = model.init_params(3, Device::Cpu, Kind::Float);
    let d = job_data(job);
    let layout = BatchLayout {
        global_batch_size: job.trainer.global_batch_size,
        micro_batch_size: job.trainer.micro_batch_size,
        rank,
        world_size: 2,
    };
    let loader = DataLoader::new(d.train, true, 7, layout, Device::Cpu).unwrap();
    let dist = DistContext {
        comm,
        local_world_size: 2,
    };
    let mut trainer = Trainer::distributed(
        model,
        &params,
        &job.trainer,
        loader,
        Device::Cpu,
        Some(dist),
    )
    .unwrap();
    let model_bytes: usize = params.iter().map(|(_, t)| t.numel() * 4).sum();
    drop(params);
    trainer.run(3, None).unwrap();
    let opts = FinalOptions {
        kind: Kind::Float,
        max_shard_bytes: u64::MAX,
        base: None,
    };
    save_adapter(&trainer, dir, lora, None, None, opts).unwrap();
    let peak = trainer.weights().transient_peaks().checkpoint_gathered;
    let full = trainer.full_params().unwrap();
    let mut reference = vec![];
    if rank == 0 {
        let base = CausalLm::new(&job.model).unwrap();
        let merged = MergedWeights::new(&full, trainer.model(), lora);
        let mut changed = 0;
        for spec in base.param_specs() {
            let m = merged.merged(&spec.name).unwrap();
            changed +=
                usize::from(!m.allclose(full.require(&spec.name).unwrap(), 1e-6, 1e-6, false));
            reference.push((spec.name.clone(), m));
        }
        // Training moved the adapters: merging changes every adapted weight (all-linear: 7 a
        // block).
        let blocks = job.model.num_hidden_layers;
        assert_eq!(
            changed,
            7 * blocks,
            "merged weights that differ from the base"
        );
    }
    (peak, model_bytes, reference)
}

#[test]
fn merged_final_under_fsdp_streams_a_group_at_a_time_and_equals_the_merge() {
    let job = lora_fsdp_job();
    let tmp = tempfile::tempdir().unwrap();
    let fin = tmp.path().join("final");
    let results = {
        let fin = fin.clone();
        threads::on_threads(2, move |comm| merge_on_rank(&job, &fin, comm))
    };
    let (peak, model_bytes, mut reference) = results.into_iter().next().unwrap();
    // Rank 0 gathered one flat group at a time: a block's, never the model.
    assert!(peak > 0, "the merge gathered to rank 0");
    assert!(
        peak * 2 < model_bytes,
        "rank 0 gathered {peak} bytes at once of a {model_bytes}-byte model"
    );
    let mut written =
        tch::Tensor::read_safetensors(fin.join(MERGED_DIR).join("model.safetensors")).unwrap();
    written.sort_by(|a, b| a.0.cmp(&b.0));
    reference.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        written.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        reference.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "the base's parameters, no factor"
    );
    let mut adapted = 0;
    for ((name, ours), (_, theirs)) in written.iter().zip(&reference) {
        assert!(ours.equal(theirs), "{name} differs from the merge");
        if name.contains("_proj") {
            adapted += 1;
        }
    }
    assert!(adapted > 0);
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(fin.join(MERGED_DIR).join("config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config["architectures"],
        serde_json::json!(["LlamaForCausalLM"])
    );
}
