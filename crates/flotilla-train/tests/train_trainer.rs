//! The single-process trainer against a PyTorch/transformers fp32 loop
//! (tests/oracle/train_oracle.py) from the same initial weights and the same batches: loss,
//! gradient norm and learning rate of 20 steps, and the `metrics.csv` it writes; the same for a
//! tiny model of every family (Mistral, Qwen3, Gemma 2 and 3, Phi-3, SmolLM3) with its norm
//! weights and biases made non-trivial, windows shorter than the sequences, and Gemma's padding
//! token, whose embedding row transformers never trains. FSDP FULL_SHARD over 2 ranks (threads
//! over one `MemoryStore`) trains Gemma 2 and Qwen3 as one process does. A process group of
//! one (`trainer.dist.process_group: always`) runs every collective of DDP and FSDP (FULL_SHARD,
//! HYBRID_SHARD) through the communicator, counted, and trains exactly as no group does.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;
#[path = "support/replay.rs"]
mod replay;
#[path = "support/threads.rs"]
mod threads;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use flotilla_comm::comm::{
    Backend, CommError, Communicator, Device as CommDevice, OpKind, RawOp, Work,
};
use flotilla_comm::cpu::{CpuComm, CpuOptions};
use flotilla_comm::store::MemoryStore;
use flotilla_config::schema::{
    DataConfig, LayerType, LoraConfig, ModelConfig, ModelType, MoeConfig, TrainerConfig,
};
use flotilla_train::data::{self, BatchLayout, DataLoader, DataOptions, Dataset};
use flotilla_train::model::CausalLm;
use flotilla_train::state::hf_weights::save_hf;
use flotilla_train::{DistContext, MetricsRow, MetricsWriter, Trainer};
use tch::{Device, Kind, Tensor};

const STEPS: u64 = 20;

fn model_config() -> ModelConfig {
    ModelConfig {
        vocab_size: 32,
        ..compose::tiny_model_config(true)
    }
}

fn trainer_config(schedule: &str) -> TrainerConfig {
    compose::trainer_config(&format!(
        "{{max_steps: {STEPS}, min_lr: 3.0e-4, warmup_steps: 5, schedule: {schedule}}}"
    ))
}

fn dataset() -> Arc<dyn Dataset> {
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
    d.train
}

fn loader(t: &TrainerConfig) -> DataLoader {
    rank_loader(t, 0, 1)
}

/// Rank `rank`'s share of every global batch.
fn rank_loader(t: &TrainerConfig, rank: usize, world_size: usize) -> DataLoader {
    let layout = BatchLayout {
        global_batch_size: t.global_batch_size,
        micro_batch_size: t.micro_batch_size,
        rank,
        world_size,
    };
    DataLoader::new(dataset(), true, t.seed as u64, layout, Device::Cpu).unwrap()
}

/// Each step's `[loss, grad_norm, lr]` from transformers + AdamW, then the load-balancing loss
/// for a mixture of experts that adds it.
fn run_oracle(dir: &Path, t: &TrainerConfig, schedule: &str) -> Vec<Vec<f64>> {
    // The batches the trainer will see, from an identical loader.
    let mut l = loader(t);
    let batches = dir.join("batches.safetensors");
    replay::write_step_batches(&mut l, STEPS, &batches);
    common::run_oracle(
        common::python(common::oracle_file("train_oracle.py"))
            .arg(dir.join("init"))
            .arg(&batches)
            .arg(STEPS.to_string())
            .args(replay::hyperparameters(t, schedule)),
    )
}

#[test]
fn trainer_matches_torch_loop() {
    for schedule in ["cosine", "linear"] {
        let tmp = tempfile::tempdir().unwrap();
        let t = trainer_config(schedule);
        let model = CausalLm::new(&model_config()).unwrap();
        let params = model.init_params(3, Device::Cpu, Kind::Float);
        save_hf(tmp.path().join("init"), &model, &params, Kind::Float).unwrap();
        let want = run_oracle(tmp.path(), &t, schedule);

        let mut trainer = Trainer::new(model, &params, &t, loader(&t), Device::Cpu).unwrap();
        let csv = tmp.path().join("metrics.csv");
        let mut writer = MetricsWriter::create(&csv).unwrap();
        let rows = trainer.run(STEPS, Some(&mut writer)).unwrap();
        drop(writer);

        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
        let (mut dl, mut dn, mut dlr) = (0f64, 0f64, 0f64);
        for (r, w) in rows.iter().zip(&want) {
            dl = dl.max(rel(r.loss, w[0]));
            dn = dn.max(rel(r.grad_norm, w[1]));
            dlr = dlr.max(rel(r.lr, w[2]));
        }
        eprintln!(
            "{schedule}: loss {:.4} -> {:.4}; max rel diff vs torch: loss {dl:e}, grad_norm {dn:e}, lr {dlr:e}",
            rows[0].loss,
            rows.last().unwrap().loss
        );
        assert_eq!(rows.len(), want.len());
        assert!(dl < 1e-4 && dn < 1e-4 && dlr < 1e-4);
        // Clipping was active at least once, and the loss went down.
        assert!(rows.iter().any(|r| r.grad_norm > 1.0));
        assert!(rows.last().unwrap().loss < rows[0].loss);

        let text = std::fs::read_to_string(&csv).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "step,loss,grad_norm,lr,tokens_per_s,elapsed_s"
        );
        assert_eq!(lines.count(), STEPS as usize);
    }
}

#[test]
fn activation_checkpointing_gives_the_same_run() {
    let model_cfg = model_config();
    let run = |ckpt: bool| {
        let mut t = trainer_config("cosine");
        t.activation_checkpointing = ckpt;
        let model = CausalLm::new(&model_cfg).unwrap();
        let params = model.init_params(4, Device::Cpu, Kind::Float);
        let mut trainer = Trainer::new(model, &params, &t, loader(&t), Device::Cpu).unwrap();
        let rows = trainer.run(5, None).unwrap();
        let p = trainer
            .full_params()
            .unwrap()
            .iter()
            .map(|(_, t)| t.copy())
            .collect::<Vec<_>>();
        (rows, p)
    };
    let (a, pa) = run(false);
    let (b, pb) = run(true);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (x.step, x.loss, x.grad_norm, x.lr),
            (y.step, y.loss, y.grad_norm, y.lr)
        );
    }
    for (x, y) in pa.iter().zip(&pb) {
        assert!(x.equal(y));
    }
}

#[test]
fn reduced_precisions_train_close_to_fp32() {
    use flotilla_config::schema::Precision;
    let run = |precision: Precision| {
        let mut t = trainer_config("cosine");
        t.precision = precision;
        let model = CausalLm::new(&model_config()).unwrap();
        let params = model.init_params(4, Device::Cpu, Kind::Float);
        let mut trainer = Trainer::new(model, &params, &t, loader(&t), Device::Cpu).unwrap();
        let rows = trainer.run(4, None).unwrap();
        let kind = trainer
            .full_params()
            .unwrap()
            .iter()
            .next()
            .unwrap()
            .1
            .kind();
        (rows, kind, trainer.loss_scaler())
    };
    let (fp32, kind, scaler) = run(Precision::Full32);
    assert_eq!((kind, scaler), (Kind::Float, None));
    for p in [
        Precision::Bf16Mixed,
        Precision::Bf16True,
        Precision::Fp16Mixed,
    ] {
        let (rows, kind, scaler) = run(p);
        // Same initial weights: the first loss differs only by the compute dtype's rounding.
        let rel = (rows[0].loss - fp32[0].loss).abs() / fp32[0].loss;
        assert!(
            rel < 2e-2,
            "{p:?}: loss {} vs fp32 {}",
            rows[0].loss,
            fp32[0].loss
        );
        assert!(rel > 0.0, "{p:?} computed in fp32");
        assert!(rows.iter().all(|r| r.loss.is_finite()), "{p:?}: {rows:?}");
        let master = if p == Precision::Bf16True {
            Kind::BFloat16
        } else {
            Kind::Float
        };
        assert_eq!(kind, master, "{p:?}");
        match p {
            // Either every step was clean (scale unchanged) or overflowing steps halved it.
            Precision::Fp16Mixed => {
                let s = scaler.unwrap();
                assert!(s.scale <= 65536.0 && s.scale >= 65536.0 / 16.0, "{s:?}");
            }
            _ => assert!(scaler.is_none()),
        }
    }
}

/// A tiny model of `family` (vocabulary 32, sequences of 16): windows of 6 where the family has
/// them, heads of their own size, Gemma's padding token 0.
fn family_config(family: ModelType) -> ModelConfig {
    let base = ModelConfig {
        model_type: Some(family),
        ..model_config()
    };
    use LayerType::{Full, Sliding};
    match family {
        ModelType::Mistral => ModelConfig {
            sliding_window: Some(6),
            ..base
        },
        ModelType::Qwen3 => ModelConfig {
            head_dim: Some(12),
            tie_word_embeddings: false,
            ..base
        },
        ModelType::Gemma2 => ModelConfig {
            head_dim: Some(16),
            sliding_window: Some(6),
            layer_types: Some(vec![Sliding, Full]),
            query_pre_attn_scalar: Some(12.0),
            attn_logit_softcapping: Some(2.0),
            final_logit_softcapping: Some(3.0),
            pad_token_id: Some(0),
            ..base
        },
        ModelType::Gemma3 => ModelConfig {
            head_dim: Some(8),
            sliding_window: Some(6),
            layer_types: Some(vec![Sliding, Full]),
            query_pre_attn_scalar: Some(8.0),
            rope_local_base_freq: Some(100.0),
            pad_token_id: Some(0),
            ..base
        },
        ModelType::Phi3 => ModelConfig {
            sliding_window: Some(7),
            tie_word_embeddings: false,
            ..base
        },
        ModelType::SmolLm3 => ModelConfig {
            no_rope_layers: Some(vec![1, 0]),
            ..base
        },
        // 4 experts, 2 a token, a window of 6; the load-balancing loss on, weighted enough to
        // show in the gradients.
        ModelType::Mixtral => ModelConfig {
            sliding_window: Some(6),
            tie_word_embeddings: false,
            moe: Some(MoeConfig {
                num_experts: 4,
                num_experts_per_tok: 2,
                moe_intermediate_size: None,
                norm_topk_prob: None,
                output_router_logits: Some(true),
                router_aux_loss_coef: Some(0.05),
                router_jitter_noise: None,
                decoder_sparse_step: None,
                mlp_only_layers: None,
            }),
            ..base
        },
        // 5 experts of width 24, 3 a token, not renormalised; layer 1 dense; no auxiliary loss.
        ModelType::Qwen3Moe => ModelConfig {
            head_dim: Some(12),
            tie_word_embeddings: false,
            moe: Some(MoeConfig {
                num_experts: 5,
                num_experts_per_tok: 3,
                moe_intermediate_size: Some(24),
                norm_topk_prob: Some(false),
                output_router_logits: None,
                router_aux_loss_coef: None,
                router_jitter_noise: None,
                decoder_sparse_step: None,
                mlp_only_layers: Some(vec![1]),
            }),
            ..base
        },
        _ => base,
    }
}

/// One test per family, so that the test harness runs them side by side.
macro_rules! family_training_tests {
    ($($test:ident: $family:expr,)+) => {$(
        #[test]
        fn $test() {
            trains_as_transformers_and_adamw_do($family);
        }
    )+};
}

family_training_tests! {
    mistral_trains_as_transformers_and_adamw_do: ModelType::Mistral,
    qwen3_trains_as_transformers_and_adamw_do: ModelType::Qwen3,
    gemma2_trains_as_transformers_and_adamw_do: ModelType::Gemma2,
    gemma3_trains_as_transformers_and_adamw_do: ModelType::Gemma3,
    phi3_trains_as_transformers_and_adamw_do: ModelType::Phi3,
    smollm3_trains_as_transformers_and_adamw_do: ModelType::SmolLm3,
    mixtral_trains_as_transformers_and_adamw_do: ModelType::Mixtral,
    qwen3_moe_trains_as_transformers_and_adamw_do: ModelType::Qwen3Moe,
}

/// 20 steps of `family` against transformers + AdamW from the same weights and batches.
fn trains_as_transformers_and_adamw_do(family: ModelType) {
    {
        let tmp = tempfile::tempdir().unwrap();
        let t = trainer_config("cosine");
        let model = CausalLm::new(&family_config(family)).unwrap();
        // Norm weights and biases away from their starting values, so a wrong convention
        // shows.
        let mut params = model.init_params(3, Device::Cpu, Kind::Float);
        tch::manual_seed(11);
        for name in params.names().map(String::from).collect::<Vec<_>>() {
            if name.contains("norm") || name.ends_with(".bias") {
                let t = params.get(&name).unwrap();
                let moved = t + Tensor::randn_like(t) * 0.3;
                params.insert(name.clone(), moved);
            }
            // Routers that prefer experts clearly (near-ties would make the comparison
            // depend on the last bit of a logit).
            if name.ends_with(".gate.weight") {
                let t = params.get(&name).unwrap();
                params.insert(name, Tensor::randn_like(t) * 0.5);
            }
        }
        save_hf(tmp.path().join("init"), &model, &params, Kind::Float).unwrap();
        let want = run_oracle(tmp.path(), &t, "cosine");

        let mut trainer = Trainer::new(model, &params, &t, loader(&t), Device::Cpu).unwrap();
        let rows = trainer.run(STEPS, None).unwrap();
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
        let (mut dl, mut dn, mut da) = (0f64, 0f64, 0f64);
        let aux_on = family_config(family)
            .moe
            .and_then(|m| m.aux_loss_coef())
            .is_some();
        for (r, w) in rows.iter().zip(&want) {
            dl = dl.max(rel(r.loss, w[0]));
            dn = dn.max(rel(r.grad_norm, w[1]));
            let ours = r.extra.iter().find(|(n, _)| n == "aux_loss").map(|e| e.1);
            assert_eq!(ours.is_some(), aux_on, "{family}: {r:?}");
            assert_eq!(w.len(), if aux_on { 4 } else { 3 }, "{family}: {w:?}");
            if let Some(a) = ours {
                da = da.max(rel(a, w[3]));
            }
        }
        assert!(da < 1e-4, "{family}: aux_loss {da:e}");
        eprintln!(
            "{family}: loss {:.4} -> {:.4}; max rel diff vs transformers + AdamW: loss {dl:e}, \
             grad_norm {dn:e}, aux_loss {da:e}",
            rows[0].loss,
            rows.last().unwrap().loss
        );
        assert_eq!(rows.len(), want.len(), "{family}");
        assert!(
            dl < 1e-4 && dn < 1e-4,
            "{family}: loss {dl:e}, grad_norm {dn:e}"
        );
        assert!(rows.last().unwrap().loss < rows[0].loss, "{family}");
    }
}

#[test]
fn fsdp_two_ranks_train_gemma2_qwen3_and_mixtral_as_one_process() {
    // Mixtral with its load-balancing loss, and with activation checkpointing (its routing
    // recomputed in backward); then with LoRA on everything PEFT adapts in it (attention,
    // the fused experts, the router, whose adapter the load-balancing loss trains too), the
    // adapters sharded in their block's trained group and the base in its frozen one.
    let lora: LoraConfig = serde_yaml::from_str(
        "{r: 2, alpha: 4, dropout: 0.0, target_modules: [all-linear], use_rslora: false, \
         modules_to_save: [], init_from: null, merge: false}",
    )
    .unwrap();
    for (family, lora) in [
        (ModelType::Gemma2, None),
        (ModelType::Qwen3, None),
        (ModelType::Mixtral, None),
        (ModelType::Mixtral, Some(lora)),
    ] {
        let checkpointing = family == ModelType::Mixtral;
        let config = family_config(family);
        let model = CausalLm::with_lora(&config, lora.as_ref()).unwrap();
        let params = model.init_params(5, Device::Cpu, Kind::Float);
        let single = trainer_config("cosine");
        let mut one = Trainer::new(model, &params, &single, loader(&single), Device::Cpu).unwrap();
        let want = one.run(10, None).unwrap();

        let sharded = compose::trainer_config(&format!(
            "{{max_steps: {STEPS}, min_lr: 3.0e-4, warmup_steps: 5, schedule: cosine, \
             micro_batch_size: 4, dist: {{mode: fsdp, backend: cpu, timeout_s: 120, \
             sharding_strategy: FULL_SHARD, auto_wrap_policy: block, min_num_params: 0, \
             activation_checkpointing: {checkpointing}, limit_all_gathers: true, \
             forward_prefetch: false, backward_prefetch: BACKWARD_PRE, \
             sync_module_states: false, cpu_offload: false, param_dtype: null, \
             reduce_dtype: null, state_dict_type: full}}}}"
        ));
        let t = sharded.clone();
        let lora_of_ranks = lora.clone();
        let ranks: Vec<Vec<MetricsRow>> = threads::on_threads(2, move |comm| {
            tch::set_num_threads(1);
            let rank = comm.rank();
            let model = CausalLm::with_lora(&config, lora_of_ranks.as_ref()).unwrap();
            let params = model.init_params(5, Device::Cpu, Kind::Float);
            let dist = DistContext {
                comm,
                local_world_size: 2,
            };
            let loader = rank_loader(&t, rank, 2);
            let mut tr =
                Trainer::distributed(model, &params, &t, loader, Device::Cpu, Some(dist)).unwrap();
            tr.run(10, None).unwrap()
        });
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
        let (mut dl, mut dn) = (0f64, 0f64);
        for (r, w) in ranks[0].iter().zip(&want) {
            dl = dl.max(rel(r.loss, w.loss));
            dn = dn.max(rel(r.grad_norm, w.grad_norm));
            assert_eq!(r.extra.len(), w.extra.len(), "{family}");
            assert_eq!(w.extra.is_empty(), family != ModelType::Mixtral, "{family}");
            assert!(w.grad_norm > 0.0, "{family}");
            for ((name, a), (_, b)) in r.extra.iter().zip(&w.extra) {
                assert!(rel(*a, *b) < 1e-5, "{family}: {name} {a} vs {b}");
            }
        }
        let family = format!("{family}{}", if lora.is_some() { " LoRA" } else { "" });
        eprintln!("{family}: FSDP x2 vs one process: loss {dl:e}, grad_norm {dn:e}");
        assert_eq!(ranks[0].len(), 10);
        assert!(
            dl < 1e-5 && dn < 1e-5,
            "{family}: loss {dl:e}, grad_norm {dn:e}"
        );
    }
}

/// A mixture with its load-balancing loss on reports it in evaluation too (`eval_aux_loss`,
/// unscaled, the mean over the evaluation's micro-batches; eval_loss stays the cross-entropy,
/// as training's `loss` does): on the micro-batches of training's first step, before any
/// update, it equals that step's `aux_loss` (which equals transformers' within 1.3e-7 in
/// `every_family_trains_as_transformers_and_adamw`). A dense model reports none.
#[test]
fn evaluation_reports_a_mixtures_load_balancing_loss_as_training_does() {
    for family in [ModelType::Mixtral, ModelType::Qwen3] {
        let config = family_config(family);
        let t = trainer_config("cosine");
        let unshuffled = || {
            let layout = BatchLayout {
                global_batch_size: t.global_batch_size,
                micro_batch_size: t.micro_batch_size,
                rank: 0,
                world_size: 1,
            };
            DataLoader::new(dataset(), false, 0, layout, Device::Cpu).unwrap()
        };
        let model = CausalLm::new(&config).unwrap();
        let params = model.init_params(5, Device::Cpu, Kind::Float);
        let mut tr = Trainer::new(model, &params, &t, unshuffled(), Device::Cpu).unwrap();
        let eval = flotilla_train::EvalSet {
            dataset: dataset(),
            num_batches: t.global_batch_size / t.micro_batch_size,
            micro_batch_size: t.micro_batch_size,
            task: None,
        };
        assert!(eval.num_batches > 1, "several micro-batches averaged");
        let metrics = tr.evaluate(&eval).unwrap();
        let first = tr.run(1, None).unwrap();
        let trained_aux = first[0].extra.iter().find(|(n, _)| n == "aux_loss");
        let eval_aux = metrics.extra.iter().find(|(n, _)| n == "aux_loss");
        match (family, trained_aux, eval_aux) {
            (ModelType::Mixtral, Some((_, a)), Some((_, e))) => {
                let rel = (a - e).abs() / a.abs();
                eprintln!("Mixtral: eval aux_loss {e} vs the first step's {a}: {rel:e}");
                assert!(rel < 1e-6, "{e} vs {a}");
                // eval_loss is the cross-entropy alone: the step's loss on the same batches.
                let dl = (metrics.loss - first[0].loss).abs() / first[0].loss;
                assert!(
                    dl < 1e-6,
                    "eval_loss {} vs loss {}",
                    metrics.loss,
                    first[0].loss
                );
            }
            (ModelType::Qwen3, None, None) => {}
            other => panic!("{other:?}"),
        }
    }
}

/// A communicator that counts the collectives of each kind it runs for another.
struct Counting {
    inner: Box<dyn Communicator>,
    counts: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
}

impl Communicator for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> Backend {
        self.inner.backend()
    }
    fn device(&self) -> CommDevice {
        self.inner.device()
    }
    unsafe fn submit(&self, op: RawOp) -> Result<Work<'static>, CommError> {
        let kind = match op.kind {
            OpKind::AllReduce(_) => "all_reduce",
            OpKind::ReduceScatter(_) => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast { .. } => "broadcast",
            _ => "other",
        };
        *self.counts.lock().unwrap().entry(kind.into()).or_default() += 1;
        // SAFETY: the caller's promise about `op`'s buffers is passed on unchanged.
        unsafe { self.inner.submit(op) }
    }
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError> {
        *self
            .counts
            .lock()
            .unwrap()
            .entry("split".into())
            .or_default() += 1;
        Ok(Box::new(Counting {
            inner: self.inner.split(color, key)?,
            counts: self.counts.clone(),
        }))
    }
}

#[test]
fn a_process_group_of_one_runs_every_collective_and_changes_nothing() {
    let base = trainer_config("cosine");
    let model = || CausalLm::new(&model_config()).unwrap();
    // Fresh weights for each trainer (a replicated one trains the tensors it is given).
    let params = || model().init_params(5, Device::Cpu, Kind::Float);
    let mut alone = Trainer::new(model(), &params(), &base, loader(&base), Device::Cpu).unwrap();
    let want = alone.run(6, None).unwrap();
    let fsdp = |strategy: &str| {
        format!(
            "{{mode: fsdp, backend: cpu, timeout_s: 120, process_group: always, \
             sharding_strategy: {strategy}, auto_wrap_policy: block, min_num_params: 0, \
             activation_checkpointing: false, limit_all_gathers: true, \
             forward_prefetch: false, backward_prefetch: BACKWARD_PRE, \
             sync_module_states: true, cpu_offload: false, param_dtype: null, \
             reduce_dtype: null, state_dict_type: full}}"
        )
    };
    for (name, dist, kinds) in [
        (
            "ddp",
            "{mode: ddp, backend: cpu, timeout_s: 120, bucket_cap_mb: 25, process_group: always}"
                .to_string(),
            vec!["all_reduce", "broadcast"],
        ),
        (
            "fsdp FULL_SHARD",
            fsdp("FULL_SHARD"),
            vec!["all_gather", "all_reduce", "broadcast", "reduce_scatter"],
        ),
        (
            "fsdp HYBRID_SHARD",
            fsdp("HYBRID_SHARD"),
            vec![
                "all_gather",
                "all_reduce",
                "broadcast",
                "reduce_scatter",
                "split",
            ],
        ),
    ] {
        let t = compose::trainer_config(&format!(
            "{{max_steps: {STEPS}, min_lr: 3.0e-4, warmup_steps: 5, schedule: cosine, \
             dist: {dist}}}"
        ));
        let store = MemoryStore::group_with_timeout(1, Duration::from_secs(60))
            .pop()
            .unwrap();
        let counts = Arc::new(std::sync::Mutex::new(Default::default()));
        let comm: Arc<dyn Communicator> = Arc::new(Counting {
            inner: Box::new(CpuComm::new(store, CpuOptions::default()).unwrap()),
            counts: counts.clone(),
        });
        let dist = DistContext {
            comm,
            local_world_size: 1,
        };
        let mut tr =
            Trainer::distributed(model(), &params(), &t, loader(&t), Device::Cpu, Some(dist))
                .unwrap();
        let rows = tr.run(6, None).unwrap();
        let counts = counts.lock().unwrap().clone();
        // DDP bit for bit; FSDP's norm sums per-parameter pieces in another order.
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
        for (r, w) in rows.iter().zip(&want) {
            assert!(
                rel(r.loss, w.loss) < 1e-6 && rel(r.grad_norm, w.grad_norm) < 1e-6,
                "{name}: {:?} vs {:?}",
                (r.loss, r.grad_norm),
                (w.loss, w.grad_norm)
            );
            if name == "ddp" {
                assert_eq!((r.loss, r.grad_norm), (w.loss, w.grad_norm));
            }
        }
        eprintln!("{name}: a group of one ran {counts:?}");
        let ran: Vec<&str> = counts.keys().map(String::as_str).collect();
        assert_eq!(ran, kinds, "{name}");
        // The loss and stop flag every step, at least.
        assert!(counts["all_reduce"] >= 6, "{name}: {counts:?}");
    }
}
