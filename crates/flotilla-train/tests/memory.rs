//! "Will it fit?" (issue 14): flotilla's memory estimate (`flotilla_launch::memory`) checked
//! against what really holds memory, and the fit check through the CLI.
//!
//! - Model states: the CPU trainer of the tiny preset (2 ranks as threads over a
//!   `MemoryStore` for DDP and FSDP), stepped under none / DDP / FSDP FULL_SHARD /
//!   SHARD_GRAD_OP and 32-true / bf16-mixed / bf16-true, Llama, Qwen2 and Gemma 2 (four norms
//!   a block, heads of their own size): the bytes of the distinct storages
//!   behind its parameters, gradients and AdamW moments equal the estimate's terms exactly, so
//!   do its FSDP all-gather peak, and the bf16 compute copies the
//!   engine's units really receive (a probing strategy) equal the compute-copies term.
//! - Activations: PyTorch's saved tensors (tests/oracle/memory_oracle.py: transformers'
//!   decoder layer of each family — Llama (also packed), Qwen3's q/k norms, Phi-3's fused
//!   projections and partial rotary, Mistral's sliding window under SDPA, Gemma 2's four norms,
//!   GeGLU and eager soft-capped attention —, and the final norm, LM head (soft-capped logits
//!   for Gemma 2) with flotilla's fp32 cross-entropy over one chunk of tokens as the fused
//!   loss runs it (the `small` model's 4096 words over 512 hidden: 8 chunks), distinct storages
//!   counted with `saved_tensors_hooks`) against the estimate's per-block and loss terms,
//!   within 10%, with and without activation checkpointing, fp32 and bf16.
//! - The CLI: `flotilla plan --memory` (table and JSON) and `flotilla run` for llama-8b on 8
//!   H100s: DDP refused with exit status 2, the largest term and ranked advice, nothing
//!   created; FSDP FULL_SHARD with sharded checkpoints accepted (`--dry-run`);
//!   `compute.check_memory=false` skips the refusal.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;
#[path = "support/threads.rs"]
mod threads;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use common::ov;
use compose::composer;
use flotilla_comm::comm::Communicator;
use flotilla_config::schema::hf_config::HfLlamaConfig;
use flotilla_config::schema::{DistConfig, JobConfig, ObjectiveConfig};
use flotilla_launch::memory::{self, Phase, Step, TermKind};
use flotilla_train::data::{self, BatchLayout, DataLoader, DataOptions};
use flotilla_train::model::{CausalLm, Params};
use flotilla_train::parallel::replicated::Replicated;
use flotilla_train::parallel::storage_shim::{distinct_storage_bytes, held_bytes, storage_address};
use flotilla_train::parallel::weights::StatePart;
use flotilla_train::{parallelize, AdamWConfig, DistContext, Engine, EngineOptions, Strategy};
use tch::{Device, Kind, Tensor};
use threads::on_threads;

/// The job `overrides` compose to from the repository's conf/, typed.
fn job(overrides: &[&str]) -> JobConfig {
    composer()
        .compose(&ov(overrides))
        .unwrap_or_else(|e| panic!("{overrides:?}: {e}"))
        .typed
        .expect("a validated flotilla job")
}

/// A CPU job of the tiny model on `ranks` ranks: 2 sequences of 16 tokens per rank and step.
fn tiny(ranks: usize, dist: &str, precision: &str, extra: &[&str]) -> JobConfig {
    let mut o = vec![
        "model=tiny".to_string(),
        format!("trainer/dist={dist}"),
        format!("trainer.precision={precision}"),
        "trainer.device=cpu".into(),
        "trainer.micro_batch_size=2".into(),
        format!("trainer.global_batch_size={}", 2 * ranks),
        "data.seq_len=16".into(),
        "data.num_train=64".into(),
        "data.shuffle=false".into(),
        format!("compute.tasks_per_node={ranks}"),
        "compute.gpus_per_node=0".into(),
    ];
    if dist != "none" {
        o.push("trainer.dist.backend=cpu".into());
    }
    o.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = o.iter().map(String::as_str).collect();
    job(&refs)
}

/// The estimate's largest size of `term` over the step.
fn term(job: &JobConfig, t: TermKind) -> u64 {
    Step::new(job)
        .moments()
        .iter()
        .map(|m| m.get(t))
        .max()
        .unwrap_or(0)
}

/// A tiny Qwen3 (per-head q and k norms, heads of their own size).
const QWEN3: &[&str] = &["+model.model_type=qwen3", "+model.head_dim=48"];

/// A tiny Phi-3 (fused `qkv_proj` and `gate_up_proj`, half the head's dimensions rotated).
const PHI3: &[&str] = &["+model.model_type=phi3", "+model.partial_rotary_factor=0.5"];

/// A tiny Mistral whose window is shorter than the test's sequences.
const MISTRAL_WINDOW: &[&str] = &["+model.model_type=mistral", "+model.sliding_window=16"];

/// A tiny Gemma 2 (the model group's keys it adds to tiny).
const GEMMA2: &[&str] = &[
    "+model.model_type=gemma2",
    "+model.head_dim=48",
    "+model.sliding_window=8",
    "+model.layer_types=[sliding_attention,full_attention,sliding_attention,full_attention]",
    "+model.query_pre_attn_scalar=48",
    "+model.attn_logit_softcapping=50.0",
    "+model.final_logit_softcapping=30.0",
];

/// Qwen3-MoE: 4 experts of width 48, 2 a token, its second block dense (mlp_only_layers).
const MIXTRAL: &[&str] = &[
    "+model.model_type=mixtral",
    "+model.moe={num_experts:4,num_experts_per_tok:2}",
];

const QWEN3_MOE_SPARSE: &[&str] = &[
    "+model.model_type=qwen3_moe",
    "+model.moe={num_experts:8,num_experts_per_tok:3,moe_intermediate_size:40,norm_topk_prob:true}",
];

const QWEN3_MOE: &[&str] = &[
    "+model.model_type=qwen3_moe",
    "+model.moe={num_experts:4,num_experts_per_tok:2,moe_intermediate_size:48,mlp_only_layers:[1]}",
];

/// What one rank really held, in bytes of distinct storages.
#[derive(Debug, Default, Clone, PartialEq)]
struct Held {
    params: usize,
    grads: usize,
    optimizer: usize,
    peak_gathered: Option<usize>,
    /// Parameters and AdamW state right after the weights are built.
    startup: usize,
    /// FSDP: unsharded gradients, an evaluation's gathered groups and a full checkpoint's
    /// group gathered to rank 0 (0 on the other ranks), at their peaks.
    transient: Option<(usize, usize, usize)>,
}

/// Runs two optimizer steps of `job` on rank `rank` of `comm` (or one process), measuring the
/// gradients after the second backward and the parameters and moments after its AdamW step.
fn run_rank(job: &JobConfig, comm: Option<Arc<dyn Communicator>>) -> Held {
    tch::set_num_threads(1);
    let (rank, world) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
    let llama = CausalLm::with_lora(&job.model, job.peft.lora()).unwrap();
    let params = llama.init_params(7, Device::Cpu, Kind::Float);
    let dist = comm.map(|comm| DistContext {
        comm,
        local_world_size: world,
    });
    let parallelize::Parallelized {
        mut weights,
        engine: options,
    } = parallelize::parallelize(&llama, &params, &job.trainer, Device::Cpu, dist.as_ref())
        .unwrap();
    drop(params);
    let mut loader = loader(job, rank, world);
    let mut held = Held::default();
    let h = weights.held_tensors();
    let mut states = h.params;
    states.extend(h.optimizer);
    held.startup = distinct_storage_bytes(&states);
    for _ in 0..2 {
        let batches = loader.next_step().unwrap();
        let engine = Engine::new(&llama, options);
        let _loss = weights.forward_backward(&engine, &batches).unwrap();
        held.grads = distinct_storage_bytes(&weights.held_tensors().grads);
        let _norm = weights.clip_grad_norm(1.0).unwrap();
        weights.optimizer_step(1e-3, None).unwrap();
        let h = weights.held_tensors();
        held.params = distinct_storage_bytes(&h.params);
        held.optimizer = distinct_storage_bytes(&h.optimizer);
        weights.end_step().unwrap();
    }
    held.peak_gathered = weights.peak_gathered_bytes();
    if matches!(job.trainer.dist, DistConfig::Fsdp(_)) {
        // An evaluation forward and a full checkpoint's parameters, as the trainer runs them.
        let batch = loader.next_step().unwrap();
        weights
            .forward_eval(
                &llama,
                &[batch.micro_batches[0].model_input()],
                &mut |_, _| Ok(()),
            )
            .unwrap();
        let mut seen = 0;
        let mut count = |_: &str, _: &Tensor| {
            seen += 1;
            Ok(())
        };
        weights
            .visit_full(StatePart::Params, (rank == 0).then_some(&mut count as _))
            .unwrap();
        if rank == 0 {
            let trained = llama.param_specs().iter().filter(|s| s.trainable).count();
            assert_eq!(seen, trained, "every trained parameter visited");
        }
        let p = weights.transient_peaks();
        held.transient = Some((p.unsharded_grads, p.eval_gathered, p.checkpoint_gathered));
    }
    held
}

fn loader(job: &JobConfig, rank: usize, world: usize) -> DataLoader {
    let dataset = data::build(
        &job.data,
        &DataOptions {
            model_vocab_size: job.model.vocab_size,
            run_dir: None,
            init_from: None,
        },
    )
    .unwrap()
    .train;
    let layout = BatchLayout {
        global_batch_size: job.trainer.global_batch_size,
        micro_batch_size: job.trainer.micro_batch_size,
        rank,
        world_size: world,
    };
    DataLoader::new(dataset, false, 7, layout, Device::Cpu).unwrap()
}

/// [`run_rank`] on every rank of `job` (threads over one `MemoryStore` when more than one).
fn run_world(job: &JobConfig) -> Vec<Held> {
    let world = job.compute.world_size();
    if world == 1 {
        return vec![run_rank(job, None)];
    }
    let job = job.clone();
    on_threads(world, move |comm| run_rank(&job, Some(comm)))
}

/// One DDP step's reduced gradients on each of 2 ranks with `bucket_cap_mb`, and the number
/// and bytes of the distinct storages behind them.
fn ddp_step_grads(bucket_cap_mb: &str) -> Vec<(Vec<Tensor>, usize, usize)> {
    let cap = format!("trainer.dist.bucket_cap_mb={bucket_cap_mb}");
    let job = tiny(2, "ddp", "32-true", &[&cap]);
    on_threads(2, move |comm| {
        tch::set_num_threads(1);
        let rank = comm.rank();
        let llama = CausalLm::new(&job.model).unwrap();
        let params = llama.init_params(7, Device::Cpu, Kind::Float);
        let dist = DistContext {
            comm,
            local_world_size: 2,
        };
        let mut p =
            parallelize::parallelize(&llama, &params, &job.trainer, Device::Cpu, Some(&dist))
                .unwrap();
        let batches = loader(&job, rank, 2).next_step().unwrap();
        let _loss = p
            .weights
            .forward_backward(&Engine::new(&llama, p.engine), &batches)
            .unwrap();
        let grads = p.weights.held_tensors().grads;
        let storages: std::collections::HashSet<usize> =
            grads.iter().filter_map(storage_address).collect();
        let bytes = distinct_storage_bytes(&grads);
        let copies = grads.iter().map(Tensor::copy).collect();
        (copies, storages.len(), bytes)
    })
}

#[test]
fn ddp_gradients_are_views_of_their_buckets() {
    let job = tiny(2, "ddp", "32-true", &[]);
    let grad_bytes = term(&job, TermKind::Grads) as usize;
    let units = CausalLm::new(&job.model).unwrap().units().len();
    // 25 MB holds the tiny model in one bucket; 100 bytes close a bucket at every unit.
    let one = ddp_step_grads("25");
    let many = ddp_step_grads("0.0001");
    for (rank, ((g1, s1, b1), (gm, sm, bm))) in one.iter().zip(&many).enumerate() {
        assert_eq!(
            (*s1, *b1),
            (1, grad_bytes),
            "rank {rank}: one bucket, no copy"
        );
        assert_eq!(*sm, units, "rank {rank}: one bucket per unit");
        assert_eq!(
            *bm, grad_bytes,
            "rank {rank}: the buckets are the gradients"
        );
        assert_eq!(g1.len(), gm.len());
        for (i, (t1, tm)) in g1.iter().zip(gm).enumerate() {
            assert!(
                t1.equal(tm),
                "rank {rank}: gradient {i} differs with per-unit buckets"
            );
            assert!(
                t1.equal(&one[0].0[i]),
                "rank {rank}: gradient {i} differs from rank 0"
            );
        }
    }
}

#[test]
fn model_state_terms_equal_the_bytes_the_trainer_holds() {
    let mut lines = vec![];
    let gemma2_fsdp = [
        GEMMA2,
        &[
            "trainer.dist.sharding_strategy=FULL_SHARD",
            "trainer.eval_every=1",
        ],
    ]
    .concat();
    let moe_fsdp = [
        QWEN3_MOE,
        &[
            "trainer.dist.sharding_strategy=FULL_SHARD",
            "trainer.eval_every=1",
        ],
    ]
    .concat();
    let moe_lora = [QWEN3_MOE, &["peft=lora", "peft.target_modules=all-linear"]].concat();
    for (dist, ranks, extra) in [
        ("none", 1, &[][..]),
        ("ddp", 2, &[][..]),
        // LoRA: a frozen base in the compute dtype, trained adapters (and a module to save).
        (
            "none",
            1,
            &["peft=lora", "peft.target_modules=all-linear"][..],
        ),
        ("ddp", 2, &["peft=lora", "peft.r=4"][..]),
        (
            "fsdp",
            2,
            &[
                "peft=lora",
                "peft.target_modules=all-linear",
                "trainer.dist.sharding_strategy=FULL_SHARD",
                "trainer.eval_every=1",
            ][..],
        ),
        (
            "fsdp",
            2,
            &[
                "peft=lora",
                "trainer.dist.sharding_strategy=SHARD_GRAD_OP",
                "trainer.eval_every=1",
            ][..],
        ),
        (
            "fsdp",
            2,
            &[
                "trainer.dist.sharding_strategy=FULL_SHARD",
                "trainer.eval_every=1",
            ][..],
        ),
        (
            "fsdp",
            2,
            &[
                "trainer.dist.sharding_strategy=SHARD_GRAD_OP",
                "trainer.eval_every=1",
            ][..],
        ),
        // Qwen2: q/k/v biases in every block, trained, sharded and bucketed like its weights;
        // frozen with the base under LoRA.
        ("none", 1, &["+model.model_type=qwen2"][..]),
        ("ddp", 2, &["+model.model_type=qwen2"][..]),
        (
            "fsdp",
            2,
            &[
                "+model.model_type=qwen2",
                "trainer.dist.sharding_strategy=FULL_SHARD",
                "trainer.eval_every=1",
            ][..],
        ),
        (
            "fsdp",
            2,
            &[
                "+model.model_type=qwen2",
                "peft=lora",
                "trainer.dist.sharding_strategy=FULL_SHARD",
                "trainer.eval_every=1",
            ][..],
        ),
        // Gemma 2: four norms a block, heads of their own size, alternating windows.
        ("ddp", 2, GEMMA2),
        ("fsdp", 2, &gemma2_fsdp[..]),
        // A mixture of experts: every expert of a block in its unit's groups.
        ("fsdp", 2, &moe_fsdp[..]),
        ("ddp", 2, &moe_lora[..]),
        ("fsdp", 2, &moe_lora[..]),
    ] {
        for precision in ["32-true", "bf16-mixed", "bf16-true"] {
            let job = tiny(ranks, dist, precision, extra);
            let lora = if extra.contains(&"peft=lora") {
                " LoRA"
            } else {
                ""
            };
            let qwen2 = extra.contains(&"+model.model_type=qwen2");
            if qwen2 {
                // The planner must see the biases: tiny has 4 blocks of q [128] + k, v [64].
                let mut llama = job.clone();
                llama.model.model_type = None;
                assert_eq!(
                    memory::Units::of(&job).total(),
                    memory::Units::of(&llama).total() + 4 * (128 + 2 * 64),
                    "Qwen2's q/k/v biases"
                );
            }
            let gemma2 = extra.contains(&"+model.model_type=gemma2");
            if gemma2 {
                // Four norms a block (2 more of [128]) and 4 heads of 48, not 32: the
                // planner's parameters are the model's.
                let model = flotilla_train::model::CausalLm::new(&job.model).unwrap();
                let numel: usize = model.param_specs().iter().map(|s| s.numel()).sum();
                assert_eq!(memory::Units::of(&job).total(), numel as u64, "Gemma 2");
            }
            let moe = extra.contains(&"+model.model_type=qwen3_moe");
            if moe {
                // Every expert's parameters, the routers, and (LoRA, all-linear) adapters on the
                // attention, the fused experts and the router of the sparse blocks, on the
                // attention only of the dense one: the planner's parameters are the model's.
                let lora = job.peft.lora();
                let model = CausalLm::with_lora(&job.model, lora).unwrap();
                let numel: usize = model.param_specs().iter().map(|s| s.numel()).sum();
                assert_eq!(memory::Units::of(&job).total(), numel as u64, "Qwen3-MoE");
            }
            let arch = match (qwen2, gemma2, moe) {
                (true, _, _) => "Qwen2 ",
                (_, true, _) => "Gemma 2 ",
                (_, _, true) => "Qwen3-MoE ",
                _ => "",
            };
            let name = format!("{arch}{}{lora} {precision}", memory::strategy_name(&job));
            let step = Step::new(&job);
            let startup = step
                .moments()
                .into_iter()
                .find(|m| m.phase == Phase::Startup)
                .unwrap();
            let fsdp = dist == "fsdp";
            let want = Held {
                params: term(&job, TermKind::Params) as usize,
                grads: term(&job, TermKind::Grads) as usize,
                optimizer: term(&job, TermKind::Optimizer) as usize,
                peak_gathered: step.peak_gathered().map(|b| b as usize),
                startup: (startup.get(TermKind::Params)
                    + startup.get(TermKind::Optimizer)
                    + startup.get(TermKind::StartupParams)) as usize,
                transient: fsdp.then(|| {
                    (
                        step.peak_unsharded_grads().unwrap() as usize,
                        term(&job, TermKind::EvalGather) as usize,
                        term(&job, TermKind::CheckpointGather) as usize,
                    )
                }),
            };
            for (rank, mut got) in run_world(&job).into_iter().enumerate() {
                if rank > 0 {
                    // Only rank 0 gathers a checkpoint's group; the planner prices rank 0.
                    if let Some((_, _, ckpt)) = &mut got.transient {
                        assert_eq!(*ckpt, 0, "{name}, rank {rank} gathers nothing");
                        *ckpt = want.transient.unwrap().2;
                    }
                }
                assert_eq!(got, want, "{name}, rank {rank}: held vs estimated");
            }
            lines.push(format!(
                "{name:<28} params {:>8} B  grads {:>8} B  AdamW {:>8} B{}",
                want.params,
                want.grads,
                want.optimizer,
                want.peak_gathered
                    .map(|b| format!("  gathered peak {b:>8} B"))
                    .unwrap_or_default(),
            ));
            if let Some((u, e, c)) = want.transient {
                lines.push(format!(
                    "{:<28} start-up {:>8} B  unsharded grads {u:>8} B  eval gather {e:>8} B  \
                     checkpoint gather {c:>8} B",
                    "", want.startup
                ));
            }
        }
    }
    eprintln!("estimate = live storages, per rank (tiny, 2 x 16 tokens per rank):");
    for l in lines {
        eprintln!("  {l}");
    }
}

/// A strategy that hands out what the replicated strategy gives, remembering the storages
/// that are not the master weights (the compute copies).
struct Probe<'a> {
    inner: flotilla_train::parallel::replicated::ReplicatedStrategy<'a>,
    masters: std::collections::HashSet<usize>,
    copies: HashMap<usize, usize>,
}

impl Strategy for Probe<'_> {
    fn params_for(
        &mut self,
        model: &CausalLm,
        unit: usize,
    ) -> Result<Vec<Tensor>, flotilla_train::TrainError> {
        let params = self.inner.params_for(model, unit)?;
        for p in &params {
            let a = storage_address(p).unwrap();
            if !self.masters.contains(&a) {
                self.copies.insert(a, held_bytes(p));
            }
        }
        Ok(params)
    }

    fn gradients_ready(
        &mut self,
        unit: usize,
        grads: &Params,
    ) -> Result<(), flotilla_train::TrainError> {
        self.inner.gradients_ready(unit, grads)
    }

    fn finish_backward(&mut self, last: bool) -> Result<(), flotilla_train::TrainError> {
        self.inner.finish_backward(last)
    }
}

#[test]
fn compute_copies_are_the_bf16_tensors_the_units_receive() {
    let job = tiny(1, "none", "bf16-mixed", &[]);
    let llama = CausalLm::new(&job.model).unwrap();
    let params = llama.init_params(7, Device::Cpu, Kind::Float);
    let adam = AdamWConfig {
        betas: job.trainer.betas,
        eps: job.trainer.eps,
        weight_decay: job.trainer.weight_decay,
    };
    let mut w = Replicated::new(&llama, params, adam, Some(Kind::BFloat16));
    let masters = w
        .params
        .iter()
        .map(|(_, t)| storage_address(t).unwrap())
        .collect();
    let batches = loader(&job, 0, 1).next_step().unwrap();
    let engine = Engine::new(&llama, EngineOptions::default());
    let mut probe = Probe {
        inner: w.strategy(),
        masters,
        copies: HashMap::new(),
    };
    // Without checkpointing every unit's copy lives until its backward: all are alive at once,
    // so distinct storages are distinct allocations.
    let _loss = engine
        .forward_backward(
            &mut probe,
            &batches.micro_batches,
            batches.global_loss_tokens,
        )
        .unwrap();
    let copies: usize = probe.copies.values().sum();
    let at_loss = Step::new(&job)
        .moments()
        .into_iter()
        .find(|m| m.phase == Phase::LossBackward)
        .unwrap()
        .get(TermKind::ComputeCopies);
    eprintln!("bf16 compute copies: {copies} B held, {at_loss} B estimated");
    assert_eq!(copies as u64, at_loss);
}

/// DPO's frozen reference: the bytes of the copy the weights keep equal the estimate's term,
/// replicated and sharded, in fp32 and bf16 compute; a new LoRA adapter keeps none.
#[test]
fn the_dpo_reference_term_equals_the_copy_the_weights_keep() {
    let dpo = [
        "objective=dpo",
        "data=preference",
        "data.path=pairs.jsonl",
        "data.tokenizer=tok",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = dpo.to_vec();
        v.extend(extra);
        v
    };
    for (ranks, dist, precision, extra) in [
        (1, "none", "32-true", with(&[])),
        (1, "none", "bf16-mixed", with(&[])),
        (2, "fsdp", "32-true", with(&[])),
        (2, "fsdp", "bf16-mixed", with(&[])),
        (1, "none", "32-true", with(&["peft=lora"])),
    ] {
        let dpo_job = || {
            let mut o = vec![
                "model=tiny".to_string(),
                format!("trainer/dist={dist}"),
                format!("trainer.precision={precision}"),
                "trainer.device=cpu".into(),
                "data.seq_len=16".into(),
                format!("compute.tasks_per_node={ranks}"),
                "compute.gpus_per_node=0".into(),
            ];
            if dist != "none" {
                o.push("trainer.dist.backend=cpu".into());
            }
            o.extend(extra.iter().map(|s| s.to_string()));
            job(&o.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let job = dpo_job();
        let kept = move |comm: Option<Arc<dyn Communicator>>| -> usize {
            let llama = CausalLm::with_lora(&job.model, job.peft.lora()).unwrap();
            let params = llama.init_params(7, Device::Cpu, Kind::Float);
            let dist = comm.map(|comm| DistContext {
                comm,
                local_world_size: ranks,
            });
            let mut weights =
                parallelize::parallelize(&llama, &params, &job.trainer, Device::Cpu, dist.as_ref())
                    .unwrap()
                    .weights;
            weights.keep_reference(false).unwrap();
            distinct_storage_bytes(&weights.held_tensors().reference)
        };
        let job = dpo_job();
        let held = if ranks == 1 {
            vec![kept(None)]
        } else {
            on_threads(ranks, move |c| kept(Some(c)))
        };
        let want = term(&job, TermKind::Reference);
        for (rank, bytes) in held.iter().enumerate() {
            assert_eq!(
                *bytes as u64, want,
                "{dist} {precision} {extra:?} rank {rank}: kept {bytes} B, estimate {want} B"
            );
        }
        if job.peft.lora().is_some() {
            assert_eq!(want, 0, "a new adapter's reference is the base");
        } else {
            assert!(want > 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Activations against PyTorch

#[derive(serde::Deserialize, Debug)]
struct Saved {
    torch: String,
    block: u64,
    checkpointed: u64,
    head: u64,
    logits: u64,
}

/// What PyTorch saves for each `(job, dtype)`, in one run of the oracle; `None` without
/// transformers in the venv.
fn oracle(cases: &[(JobConfig, &str)]) -> Option<Vec<Saved>> {
    common::oracle_python()?;
    let cases: Vec<serde_json::Value> = cases
        .iter()
        .map(|(job, dtype)| {
            let config = serde_json::to_value(HfLlamaConfig::from(&job.model)).unwrap();
            // Next-token jobs fuse the loss with the head, a chunk of tokens at a time.
            let tokens = job.trainer.micro_batch_size * job.data.seq_len();
            let chunk = matches!(job.objective, ObjectiveConfig::Sft)
                .then(|| job.model.loss_chunk_rows(tokens));
            serde_json::json!([
                job.trainer.micro_batch_size,
                job.data.seq_len(),
                dtype,
                config,
                job.data.isolates_packed_sequences(),
                chunk
            ])
        })
        .collect();
    let script = common::oracle_file("memory_oracle.py");
    Some(common::run_oracle(
        common::python(script).arg(serde_json::Value::from(cases).to_string()),
    ))
}

#[test]
fn activation_terms_match_the_tensors_pytorch_saves_for_backward() {
    let mut cases = vec![];
    for (model, micro, seq) in [("tiny", 4, 64), ("small", 2, 128)] {
        for (precision, dtype) in [("32-true", "float32"), ("bf16-mixed", "bfloat16")] {
            let o = [
                format!("model={model}"),
                format!("trainer.precision={precision}"),
                format!("trainer.micro_batch_size={micro}"),
                format!("trainer.global_batch_size={micro}"),
                format!("data.seq_len={seq}"),
                "compute.tasks_per_node=1".into(),
                "trainer/dist=none".into(),
            ];
            let refs: Vec<&str> = o.iter().map(String::as_str).collect();
            cases.push((job(&refs), dtype));
            if model == "tiny" {
                // The other families' blocks: q/k norms, fused projections, a sliding window,
                // Gemma's four norms, GeGLU, eager soft-capped attention and soft-capped logits.
                // A mixture's sparse block: the router's softmax and top-k, the grouped rows,
                // each expert's SwiGLU, the scatter back (every layer sparse: with dense layers
                // the planner prices every block as the larger kind).
                for family in [
                    QWEN3,
                    PHI3,
                    MISTRAL_WINDOW,
                    GEMMA2,
                    QWEN3_MOE_SPARSE,
                    MIXTRAL,
                ] {
                    let mut other = refs.clone();
                    other.extend(family);
                    cases.push((job(&other), dtype));
                }
                // Packed conversations: per-row rotary tables and SDPA's bias of their mask.
                let mut packed = refs.clone();
                packed.extend([
                    "data=chat",
                    "data.path=chats.jsonl",
                    "data.tokenizer=tok",
                    "data.packing=true",
                ]);
                cases.push((job(&packed), dtype));
            }
        }
    }
    let Some(saved) = oracle(&cases) else {
        return common::skip_or_fail(&format!(
            "activation_terms_match_the_tensors_pytorch_saves_for_backward: `import \
             transformers, safetensors` fails in {}; run scripts/setup.sh",
            common::venv_python().display()
        ));
    };
    let mut lines = vec![];
    for ((job, dtype), saved) in cases.iter().zip(saved) {
        let a = Step::new(job).act;
        // One block as flotilla holds it: its input and saved tensors, with the rotary tables
        // it reads (shared by every block in fp32, cast per block below it).
        let shared_rotary = if *dtype == "float32" { a.rotary } else { 0 };
        let block = a.block() + shared_rotary;
        let head = a.head + a.loss + a.logits;
        let (model, micro, seq) = (
            format!(
                "{} {}",
                job.model.name,
                job.model.architecture().display_name()
            ),
            job.trainer.micro_batch_size,
            job.data.seq_len(),
        );
        let packed = if job.data.isolates_packed_sequences() {
            " packed"
        } else {
            ""
        };
        for (what, ours, theirs) in [
            ("block", block, saved.block),
            ("checkpointed block", a.block_input, saved.checkpointed),
            ("head, logits and loss", head, saved.head + saved.logits),
        ] {
            let ratio = ours as f64 / theirs as f64;
            lines.push(format!(
                "{model:<15}{packed:<7} {dtype:<8} {micro} x {seq:<4} {what:<22} flotilla {ours:>10} B  PyTorch {theirs:>10} B  ratio {ratio:.4}"
            ));
            assert!(
                (ratio - 1.0).abs() <= 0.10,
                "{model}{packed} {dtype} {what}: estimate {ours} B, PyTorch saves {theirs} B (torch {})",
                saved.torch
            );
        }
    }
    eprintln!("activations of one micro-batch, estimate vs PyTorch's saved tensors:");
    for l in lines {
        eprintln!("  {l}");
    }
}

// ---------------------------------------------------------------------------------------------
// The CLI

/// llama-8b on one node of 8 H100s, bf16-mixed, 1 x 4096 tokens per GPU, 8 sequences a step.
const LLAMA_8B: [&str; 13] = [
    "model=llama-8b",
    "data=tokens",
    "data.path=/data/train.bin",
    "data.token_dtype=uint32",
    "data.seq_len=4096",
    "trainer.precision=bf16-mixed",
    "trainer.device=cuda",
    "trainer.micro_batch_size=1",
    "trainer.global_batch_size=8",
    "compute.tasks_per_node=8",
    "compute.gpus_per_node=8",
    "compute.gpu_type=h100",
    "trainer.max_steps=10",
];

/// The `flotilla` CLI (built by `cargo build -p flotilla`, beside this crate's binary).
fn flotilla(dir: &Path, args: &[&str]) -> Output {
    Command::new(common::flotilla_bin())
        .args(args)
        .arg("--config-dir")
        .arg(common::conf_dir())
        .current_dir(dir)
        // Found before anything is created; a dry run never starts it.
        .env(
            "FLOTILLA_TRAIN_BINARY",
            env!("CARGO_BIN_EXE_flotilla-train"),
        )
        .output()
        .expect("run flotilla")
}

fn with(extra: &[&str]) -> Vec<String> {
    LLAMA_8B
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

fn args<'a>(head: &[&'a str], rest: &'a [String]) -> Vec<&'a str> {
    head.iter()
        .copied()
        .chain(rest.iter().map(String::as_str))
        .collect()
}

#[test]
fn plan_memory_prints_the_terms_and_json_for_scripts() {
    let tmp = tempfile::tempdir().unwrap();
    let ddp = with(&["trainer/dist=ddp"]);
    let out = flotilla(tmp.path(), &args(&["plan", "--memory"], &ddp));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "8 ranks (1 node x 8), DDP, bf16-mixed, micro batch 1 x 4096 tokens",
        "AdamW moments (fp32)",
        "logits (bf16, vocab 128256, chunks of 512 tokens)",
        "peak per GPU:",
        "DOES NOT FIT one NVIDIA H100",
        "host RAM per node:",
        "advice (ranked):",
        "1. trainer/dist=fsdp",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    eprintln!("{text}");
    let fsdp = with(&["trainer/dist=fsdp", "trainer.dist.state_dict_type=sharded"]);
    let out = flotilla(
        tmp.path(),
        &args(&["plan", "--memory", "--format", "json"], &fsdp),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let m = &doc["jobs"][0]["memory"];
    assert_eq!(m["fits"], true, "{m}");
    assert_eq!(m["strategy"], "FSDP FULL_SHARD");
    assert_eq!(m["gpu"]["source"], "compute.gpu_type=h100");
    assert!(m["peak_bytes"].as_u64().unwrap() < 81_559 << 20);
    assert!(m["terms"].as_array().unwrap().len() > 8);
    assert!(doc["jobs"][0]["config"]["model"].is_object());
    // Without --memory, plan prints what it always did.
    let out = flotilla(tmp.path(), &args(&["plan", "--format", "json"], &fsdp));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["jobs"][0].get("memory").is_none());
}

#[test]
fn run_refuses_a_job_that_does_not_fit_before_creating_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let dir_override = format!("flotilla.run.dir={}", run_dir.display());
    let ddp = with(&["trainer/dist=ddp", &dir_override]);
    let out = flotilla(tmp.path(), &args(&["run", "--dry-run"], &ddp));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for needle in [
        "the job does not fit in GPU memory",
        "over the 79.6 GiB of one NVIDIA H100",
        "the largest term is AdamW moments (fp32)",
        "Ranked advice",
        "1. trainer/dist=fsdp",
        "compute.check_memory=false",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    eprintln!("{err}");
    assert!(!run_dir.exists());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

    // Skipped on request.
    let unchecked = with(&[
        "trainer/dist=ddp",
        "compute.check_memory=false",
        &dir_override,
    ]);
    let out = flotilla(tmp.path(), &args(&["run", "--dry-run"], &unchecked));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(run_dir.join("config.yaml").is_file());

    // FSDP FULL_SHARD with sharded checkpoints fits.
    let fits_dir = tmp.path().join("fits");
    let fsdp = with(&[
        "trainer/dist=fsdp",
        "trainer.dist.state_dict_type=sharded",
        &format!("flotilla.run.dir={}", fits_dir.display()),
    ]);
    let out = flotilla(tmp.path(), &args(&["run", "--dry-run"], &fsdp));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fits_dir.join("config.yaml").is_file());
}
