//! Unit tests of the memory model: every term on small configs worked out by hand, the GPU
//! resolution, the refusal and the advice.

use super::*;
use flotilla_config::schema::{validate, ModelConfig};

/// A job but its data: the tiny preset (vocabulary 32, hidden 128, MLP 352, 4 layers, 4 heads,
/// 2 KV heads, tied), micro batch 4 of 32 tokens, fp32, one process on one H100.
const BASE: &str = "
seed: 1
model: {name: tiny, vocab_size: 32, hidden_size: 128, intermediate_size: 352,
  num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2,
  max_position_embeddings: 256, rms_norm_eps: 1.0e-5, rope_theta: 10000.0, rope_scaling: null,
  tie_word_embeddings: true, initializer_range: 0.02, init_from: null}
trainer: {dist: {mode: none}, max_steps: 10, global_batch_size: 4, micro_batch_size: 4,
  lr: 1.0e-3, min_lr: 0.0, warmup_steps: 0, schedule: constant, weight_decay: 0.1,
  betas: [0.9, 0.95], eps: 1.0e-8, grad_clip: 1.0, precision: 32-true, device: cuda,
  eval_every: 0, eval_batches: 1, checkpoint_every: 0, keep_last_checkpoints: 0,
  resume: never, log_every: 1, activation_checkpointing: false, seed: 7}
compute: {launcher: local, nodes: 1, tasks_per_node: 1, gpus_per_node: 1, cpus_per_task: 1,
  mem_gb: null, timeout_min: 10, partition: null, account: null, qos: null, constraint: null,
  array_parallelism: 1, signal_delay_s: 90, max_num_timeout: 1, setup: [],
  additional_parameters: {}, template: null, max_parallel: 1, gpu_type: h100,
  gpu_mem_gb: null, check_memory: true}
";

/// The data of [`job`]'s jobs.
const ARITHMETIC_DATA: &str =
    "data: {kind: arithmetic, digits: 2, num_train: 100, num_eval: 0, seed: 0, seq_len: 32,
  shuffle: false, num_workers: 0}";

/// [`BASE`] on arithmetic data, with `extra` (YAML lines `section: {key: value}` replacing
/// whole sections) laid over it.
pub(crate) fn job(extra: &str) -> JobConfig {
    job_from(&format!("{BASE}{ARITHMETIC_DATA}"), extra)
}

fn job_from(base: &str, extra: &str) -> JobConfig {
    let mut root = flotilla_config::yaml::load_str(base, "base").unwrap();
    if !extra.trim().is_empty() {
        let over = flotilla_config::yaml::load_str(extra, "extra").unwrap();
        flotilla_config::compose::merge_into(&mut root, over).unwrap();
    }
    validate(&root).unwrap_or_else(|e| panic!("{e}"))
}

const DDP: &str = "{mode: ddp, backend: auto, timeout_s: 60, bucket_cap_mb: 25}";

/// `trainer.dist` for FSDP with `strategy`, `state_dict_type` and `cpu_offload`.
fn fsdp(strategy: &str, state_dict: &str, offload: bool) -> String {
    format!(
        "{{mode: fsdp, backend: auto, timeout_s: 60, sharding_strategy: {strategy},
  auto_wrap_policy: block, min_num_params: 100000000, activation_checkpointing: false,
  limit_all_gathers: true, forward_prefetch: false, backward_prefetch: BACKWARD_PRE,
  sync_module_states: false, cpu_offload: {offload}, param_dtype: null, reduce_dtype: null,
  state_dict_type: {state_dict}}}"
    )
}

/// The tiny job on `ranks` GPUs of one node, one micro batch of 4 per rank, with `dist`.
fn on_ranks(ranks: usize, dist: &str, trainer_extra: &str) -> JobConfig {
    job(&format!(
        "trainer: {{dist: {dist}, global_batch_size: {}{trainer_extra}}}
compute: {{tasks_per_node: {ranks}, gpus_per_node: {ranks}}}",
        4 * ranks
    ))
}

fn moment(job: &JobConfig, phase: Phase) -> Moment {
    Step::new(job)
        .moments()
        .into_iter()
        .find(|m| m.phase == phase)
        .unwrap_or_else(|| panic!("no {phase:?} moment"))
}

fn largest(job: &JobConfig, t: TermKind) -> u64 {
    Step::new(job)
        .moments()
        .iter()
        .map(|m| m.get(t))
        .max()
        .unwrap()
}

// The tiny model by hand: embedding 32·128 = 4096; a block 2·128 (norms) + 2·128·128 (q, o)
// + 2·64·128 (k, v) + 3·352·128 = 184_576; the head's norm 128 (tied).
const EMBED: u64 = 4096;
const BLOCK: u64 = 184_576;
const P: u64 = EMBED + 4 * BLOCK + 128;

#[test]
fn units_count_the_parameters_of_the_architecture() {
    let j = job("");
    let u = Units::of(&j);
    assert_eq!(u.owned, vec![EMBED, BLOCK, BLOCK, BLOCK, BLOCK, 128]);
    assert_eq!(u.reads[5], 128 + EMBED, "the tied head reads the embedding");
    assert_eq!(u.total(), P);
    assert_eq!(u.total(), j.model.num_parameters());
    let untied = job("model: {tie_word_embeddings: false}");
    assert_eq!(Units::of(&untied).total(), untied.model.num_parameters());
    for preset in ["small", "llama-1b", "llama-8b"] {
        let yaml = std::fs::read_to_string(format!(
            "{}/../../conf/model/{preset}.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let model: ModelConfig = serde_json::from_value(flotilla_config::node::to_json(
            &flotilla_config::yaml::load_str(&yaml, "m").unwrap(),
        ))
        .unwrap();
        let mut j = job("");
        j.model = model;
        assert_eq!(Units::of(&j).total(), j.model.num_parameters(), "{preset}");
    }
}

#[test]
fn one_process_fp32_holds_params_grads_and_two_moments() {
    let j = job("");
    let end = moment(&j, Phase::EndOfBackward);
    assert_eq!(end.get(TermKind::Params), 4 * P);
    assert_eq!(end.get(TermKind::Grads), 4 * P);
    assert_eq!(end.get(TermKind::Optimizer), 8 * P);
    assert_eq!(
        largest(&j, TermKind::ComputeCopies),
        0,
        "fp32 computes on the masters"
    );
    // AdamW: three temporaries of the largest tensor (a block's 352×128 MLP weight).
    let opt = moment(&j, Phase::OptimizerStep);
    assert_eq!(opt.get(TermKind::OptimizerWorkspace), 3 * 352 * 128 * 4);
    // The context and a 5% margin over the tensors, on a GPU.
    assert_eq!(end.get(TermKind::CudaContext), CUDA_CONTEXT_BYTES);
    let tensors = end.total() - CUDA_CONTEXT_BYTES - end.get(TermKind::AllocatorMargin);
    assert_eq!(
        end.get(TermKind::AllocatorMargin),
        (tensors as f64 * 0.05).ceil() as u64
    );
}

#[test]
fn mixed_precision_adds_compute_copies_and_bf16_true_halves_the_states() {
    let j = job("trainer: {precision: bf16-mixed}");
    let loss = moment(&j, Phase::LossBackward);
    // Every unit's bf16 copy is kept by its graph; the tied head casts the embedding again.
    assert_eq!(loss.get(TermKind::ComputeCopies), 2 * (P + EMBED));
    assert_eq!(loss.get(TermKind::Params), 4 * P);
    // With checkpointing, only the head's copy survives the forward.
    let ac = job("trainer: {precision: bf16-mixed, activation_checkpointing: true}");
    assert_eq!(
        moment(&ac, Phase::LossBackward).get(TermKind::ComputeCopies),
        2 * (128 + EMBED)
    );
    // bf16-true: bf16 masters and moments, but the engine's gradients stay fp32.
    let t = job("trainer: {precision: bf16-true}");
    let end = moment(&t, Phase::EndOfBackward);
    assert_eq!(end.get(TermKind::Params), 2 * P);
    assert_eq!(end.get(TermKind::Optimizer), 4 * P);
    assert_eq!(end.get(TermKind::Grads), 4 * P);
    assert_eq!(largest(&t, TermKind::ComputeCopies), 0);
}

#[test]
fn activations_per_block_and_loss_by_hand() {
    // fp32, 4 x 32 tokens: per token a block saves its input 512, norm 2·512+4, q 512, k and v
    // 256 each, the attention output 512, log-sum-exp 4·4, the fp32 residual 512, norm 1028,
    // the MLP 4·352·4 = 5632: 10264 bytes (PyTorch's saved tensors, crates/flotilla-train/tests/memory.rs).
    let j = job("");
    let a = Step::new(&j).act;
    let n = 4 * 32;
    assert_eq!(a.block(), n * 10264);
    assert_eq!(a.block_input, n * 512);
    assert_eq!(a.rotary, 2 * 32 * 32 * 4);
    // The loss fused with the head, in one chunk (a vocabulary of 32 below the hidden 128):
    // the logits, the fp32 log-probabilities and targets, and in backward their gradients
    // with the head's input gradient and its fp32 weight gradient.
    assert_eq!(a.logits, n * 32 * 4);
    assert_eq!(a.loss, n * 32 * 4 + n * 8);
    assert_eq!(a.loss_backward, 2 * n * 32 * 4 + n * 128 * 4 + 32 * 128 * 4);
    // DPO takes the whole logits of its chosen and rejected rows, shifted by one position.
    let mut dpo = j.clone();
    dpo.objective =
        flotilla_config::schema::ObjectiveConfig::Dpo(flotilla_config::schema::DpoConfig {
            beta: 0.1,
            loss_type: flotilla_config::schema::DpoLossType::Sigmoid,
            label_smoothing: 0.0,
            reference: flotilla_config::schema::ReferenceModel::Precomputed,
        });
    let d = Step::new(&dpo).act;
    assert_eq!(d.loss, 8 * 31 * 32 * 4 + 8 * 31 * 8);
    assert_eq!(d.loss_backward, 2 * 8 * 31 * 32 * 4);
    // bf16: fp32 copies in the norms, half-size tensors, lse in fp32, rotary casts per block.
    let b = Step::new(&job("trainer: {precision: bf16-mixed}")).act;
    assert_eq!(b.block(), n * 5912 + 2 * 32 * 32 * 2);
    // Held at the loss: the token ids, four blocks, the head, the rotary tables.
    let loss = moment(&j, Phase::LossBackward);
    assert_eq!(
        loss.get(TermKind::Activations),
        a.tokens + 4 * a.block() + a.head + a.rotary
    );
    // Checkpointing keeps block inputs only, and recomputes one block in backward.
    let ac = job("trainer: {activation_checkpointing: true}");
    let c = Step::new(&ac).act;
    assert_eq!(
        moment(&ac, Phase::LossBackward).get(TermKind::Activations),
        c.tokens + 4 * c.block_input + c.head + c.rotary
    );
    assert_eq!(largest(&ac, TermKind::Recompute), c.block_saved);
}

#[test]
fn packed_rows_hold_their_tables_their_mask_and_a_bias_per_block() {
    let chat_on = |packing: bool, attention: &str, precision: &str, device: &str| {
        let data = format!(
            "data: {{kind: chat, path: chats.jsonl, eval_path: null, tokenizer: tok,
  chat_template: null, format: messages, messages_key: messages, system: null,
  train_on: assistant, overflow: truncate, packing: {packing}, packed_attention: {attention},
  skip_bad_records: false, seq_len: 32, shuffle: false, num_workers: 0}}"
        );
        Step::new(&job_from(
            &format!("{BASE}{data}"),
            &format!("trainer: {{precision: {precision}, device: {device}}}"),
        ))
        .act
    };
    let chat = |packing: bool, attention: &str, precision: &str| {
        chat_on(packing, attention, precision, "cpu")
    };
    let (m, t, n) = (4, 32, 4 * 32);
    let plain = chat(false, "conversation", "32-true");
    // Packing with attention over the window needs nothing more.
    let window = chat(true, "window", "32-true");
    assert_eq!(
        (window.block(), window.shared()),
        (plain.block(), plain.shared())
    );
    // Isolated sequences: a rotary table per row, the position ids and the boolean mask; each
    // block keeps SDPA's fp32 bias made of the mask, and its keys and values repeated from 2
    // KV heads to the 4 query heads (2 x 64 more elements a token).
    let packed = chat(true, "conversation", "32-true");
    assert_eq!(packed.rotary, m * plain.rotary);
    assert_eq!(packed.packing, n * 8 + m * t * t);
    let repeated_kv = n * 2 * 64;
    assert_eq!(
        packed.block_saved,
        plain.block_saved + (m * t * t + repeated_kv) * 4
    );
    // bf16: the bias, the keys and values, and each block's casts of the per-row tables in
    // bf16.
    let plain = chat(false, "conversation", "bf16-mixed");
    let packed = chat(true, "conversation", "bf16-mixed");
    let table_casts = 2 * t * 32 * 2;
    assert_eq!(
        packed.block_saved,
        plain.block_saved + (m - 1) * table_casts + (m * t * t + repeated_kv) * 2
    );
    // The peak holds them: the loss moment keeps every block's bias and the shared terms.
    assert!(packed.shared() > plain.shared());
    // On a GPU in bf16, flash attention by the sequences' bounds: no mask, no bias, the KV
    // heads as they are; the bounds (int32) beside the position ids.
    let plain = chat_on(false, "conversation", "bf16-mixed", "cuda");
    let packed = chat_on(true, "conversation", "bf16-mixed", "cuda");
    assert_eq!(packed.packing, n * 8 + (n + 1) * 4);
    assert_eq!(
        packed.block_saved,
        plain.block_saved + (m - 1) * table_casts
    );
}

#[test]
fn ddp_gradients_are_their_buckets_allocated_as_the_backward_reaches_them() {
    let j = on_ranks(2, DDP, "");
    let end = moment(&j, Phase::EndOfBackward);
    assert_eq!(end.get(TermKind::Grads), 4 * P, "no second copy in buckets");
    // 25 MB holds this model in one bucket, allocated whole at the head's backward; with a
    // bucket per unit a block's backward holds only the gradients from it to the head (and
    // the tied embedding's).
    assert_eq!(moment(&j, Phase::Backward).get(TermKind::Grads), 4 * P);
    let per_unit = on_ranks(
        2,
        "{mode: ddp, backend: auto, timeout_s: 60, bucket_cap_mb: 0.000001}",
        "",
    );
    let block = moment(&per_unit, Phase::Backward).get(TermKind::Grads);
    assert!(0 < block && block < 4 * P, "{block} of {}", 4 * P);
    assert_eq!(
        moment(&per_unit, Phase::EndOfBackward).get(TermKind::Grads),
        4 * P
    );
    // Gradient accumulation: the gradients exist already when the last backward starts.
    let acc = on_ranks(2, DDP, ", micro_batch_size: 2");
    assert_eq!(Step::new(&acc).accum, 2);
    assert_eq!(
        moment(&acc, Phase::LossBackward).get(TermKind::Grads),
        4 * P
    );
    assert_eq!(moment(&j, Phase::LossBackward).get(TermKind::Grads), 0);
}

#[test]
fn fsdp_shards_pad_and_gather_as_the_trainer_does() {
    let j = on_ranks(3, &fsdp("FULL_SHARD", "full", false), "");
    // Groups per unit, each padded to a multiple of 3: 4096 → 4098, 184576 → 184578, 128 → 129.
    let shards = 1366 + 4 * 61_526 + 43;
    let opt = moment(&j, Phase::OptimizerStep);
    assert_eq!(opt.get(TermKind::Params), 4 * shards);
    assert_eq!(opt.get(TermKind::Optimizer), 8 * shards);
    // The reduced gradients are shards of their own; at the end of the backward pass the
    // embedding's group is being reduced with the first block's still in flight.
    let padded = 4098 + 4 * 184_578 + 129;
    assert_eq!(opt.get(TermKind::Grads), 4 * shards);
    assert_eq!(
        moment(&j, Phase::EndOfBackward).get(TermKind::UnshardedGrads),
        4 * (4098 + 184_578)
    );
    // The worst block (the last): its group and the head's in flight, one unit's fp32
    // gradients (with the tied embedding's, held from the head's backward).
    let block = moment(&j, Phase::Backward);
    assert_eq!(block.get(TermKind::UnshardedGrads), 4 * (184_578 + 129));
    assert_eq!(Step::new(&j).peak_unsharded_grads(), Some(4 * 2 * 184_578));
    assert_eq!(block.get(TermKind::GradAccumulators), 4 * (184_576 + 4096));
    // bf16-mixed: the bf16 gradient is cast into an fp32 shard of its own.
    let mixed = on_ranks(
        3,
        &fsdp("FULL_SHARD", "full", false),
        ", precision: bf16-mixed",
    );
    assert_eq!(
        moment(&mixed, Phase::OptimizerStep).get(TermKind::Grads),
        4 * shards
    );
    // Gathered, FULL_SHARD with backward prefetch: a block with the one before it prefetched
    // (more than the head with the tied embedding it reads and the last block prefetched).
    assert_eq!(largest(&j, TermKind::Gathered), 4 * 2 * 184_578);
    assert_eq!(
        moment(&j, Phase::LossBackward).get(TermKind::Gathered),
        4 * (129 + 4098 + 184_578)
    );
    // SHARD_GRAD_OP keeps every group until the step ends.
    let sgo = on_ranks(3, &fsdp("SHARD_GRAD_OP", "full", false), "");
    assert_eq!(
        moment(&sgo, Phase::OptimizerStep).get(TermKind::Gathered),
        4 * padded
    );
    // A full checkpoint gathers one group at a time on rank 0.
    assert_eq!(
        moment(&j, Phase::Checkpoint).get(TermKind::CheckpointGather),
        4 * 184_578
    );
    // Sharded checkpoints write each rank's shards; the final model still gathers a group at
    // a time.
    let sharded = on_ranks(3, &fsdp("FULL_SHARD", "sharded", false), "");
    assert_eq!(
        moment(&sharded, Phase::Checkpoint).get(TermKind::CheckpointGather),
        4 * 184_578
    );
}

#[test]
fn fsdp_cpu_offload_moves_the_states_to_the_host() {
    let j = on_ranks(2, &fsdp("FULL_SHARD", "full", true), "");
    let opt = moment(&j, Phase::OptimizerStep);
    assert_eq!(opt.get(TermKind::Params), 0);
    assert_eq!(opt.get(TermKind::Optimizer), 0);
    assert_eq!(opt.get(TermKind::Grads), 0);
    let est = estimate(&j);
    let offloaded = est
        .host_terms
        .iter()
        .find(|t| t.term == TermKind::Offloaded)
        .unwrap();
    let shards = 2048 + 4 * 92_288 + 64;
    assert_eq!(offloaded.bytes, 2 * (4 * 4 * shards + 3 * 92_288 * 4));
}

#[test]
fn the_gpu_comes_from_gpu_mem_gb_then_gpu_type_then_a_constraint() {
    let mut c = job("").compute;
    assert_eq!(job_gpu(&c).unwrap().bytes, 81_559 << 20);
    c.gpu_mem_gb = Some(40.0);
    assert_eq!(job_gpu(&c).unwrap().bytes, 40 << 30);
    c.gpu_mem_gb = None;
    c.gpu_type = None;
    assert_eq!(job_gpu(&c), None);
    c.constraint = Some("A100-80GB".into());
    let g = job_gpu(&c).unwrap();
    assert_eq!(g.bytes, 80 << 30);
    assert_eq!(g.source, "compute.constraint=A100-80GB");
    c.constraint = Some("bigmem".into());
    assert_eq!(job_gpu(&c), None);
}

/// llama-8b, 8 ranks of one node, bf16-mixed, 1 x 4096 tokens, no accumulation.
fn llama8b(dist: &str) -> JobConfig {
    let yaml = std::fs::read_to_string(format!(
        "{}/../../conf/model/llama-8b.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut j = job(&format!(
        "trainer: {{dist: {dist}, global_batch_size: 8, micro_batch_size: 1, precision: bf16-mixed}}
compute: {{tasks_per_node: 8, gpus_per_node: 8}}"
    ));
    j.model = serde_json::from_value(flotilla_config::node::to_json(
        &flotilla_config::yaml::load_str(&yaml, "m").unwrap(),
    ))
    .unwrap();
    if let flotilla_config::schema::DataConfig::Arithmetic(d) = &mut j.data {
        d.seq_len = 4096;
    }
    j
}

#[test]
fn llama_8b_under_ddp_is_refused_with_ranked_advice() {
    let j = llama8b(DDP);
    let err = check(&j, "the job").unwrap_err().to_string();
    assert!(
        err.starts_with("the job does not fit in GPU memory"),
        "{err}"
    );
    assert!(
        err.contains("the largest term is AdamW moments (fp32)"),
        "{err}"
    );
    assert!(err.contains("1. trainer/dist=fsdp"), "{err}");
    assert!(err.contains("compute.check_memory=false"), "{err}");
    let advice = advise(&j, 81_559 << 20);
    assert!(advice[0].fits, "{advice:?}");
    // Those that fit come first; the rest by their estimate.
    let first_miss = advice.iter().position(|a| !a.fits).unwrap_or(advice.len());
    assert!(advice[first_miss..].iter().all(|a| !a.fits));
    assert!(advice[first_miss..]
        .windows(2)
        .all(|w| w[0].peak_bytes <= w[1].peak_bytes));
    // Skipped on request, and never for a CPU job.
    let mut off = j.clone();
    off.compute.check_memory = false;
    assert!(check(&off, "the job").is_ok());
    let mut cpu = j.clone();
    cpu.trainer.device = flotilla_config::schema::Device::Cpu;
    assert!(check(&cpu, "the job").is_ok());
    // Unknown GPU: nothing to check against.
    let mut unknown = j;
    unknown.compute.gpu_type = None;
    assert!(check(&unknown, "the job").is_ok());
}

#[test]
fn llama_8b_full_shard_with_sharded_checkpoints_fits_an_h100() {
    let j = llama8b(&fsdp("FULL_SHARD", "sharded", false));
    let est = estimate(&j);
    assert_eq!(est.fits, Some(true), "{}", render::table(&est, &[]));
    assert!(check(&j, "the job").is_ok());
    // So does its full-checkpoint twin: rank 0 gathers one group at a time.
    let full = llama8b(&fsdp("FULL_SHARD", "full", false));
    let est = estimate(&full);
    assert_eq!(est.fits, Some(true), "{}", render::table(&est, &[]));
    assert!(est.peak_phase != Phase::Checkpoint);
    // With activation checkpointing and evaluation: at most 30 GiB per GPU, and a resume
    // within 160 GiB of host RAM per node.
    let mut ac = full.clone();
    if let flotilla_config::schema::DistConfig::Fsdp(f) = &mut ac.trainer.dist {
        f.activation_checkpointing = true;
    }
    ac.trainer.eval_every = 100;
    ac.trainer.resume = flotilla_config::schema::Resume::Auto;
    let est = estimate(&ac);
    let table = render::table(&est, &[]);
    assert!(est.peak_bytes <= 30 << 30, "{table}");
    let (host_terms, host_peak) = Step::new(&ac).host(est.peak_bytes);
    assert!(host_peak <= 160 << 30, "{table}");
    let resume = host_terms
        .iter()
        .find(|(k, _)| *k == TermKind::ResumeRead)
        .unwrap()
        .1;
    assert!(resume > 0 && resume < 8 << 30, "{resume}");
}

#[test]
fn json_names_every_term_and_the_advice() {
    let j = llama8b(DDP);
    let est = estimate(&j);
    let v = render::json(&est, &advise(&j, est.gpu.as_ref().unwrap().bytes));
    assert_eq!(v["fits"], false);
    // The loss fused with the head holds one chunk of the 128k vocabulary's logits at a time
    // (4096 tokens: 8 chunks of 512, 250.5 MiB of fp32 log-probabilities), not the whole
    // micro-batch's 2 GiB: the peak is its backward (the head's fp32 gradient beside the
    // replica and its AdamW state) or a block's.
    let phase = v["peak_phase"].as_str().unwrap();
    assert!(["loss_backward", "backward"].contains(&phase), "{phase}");
    let term = |name: &str| {
        v["terms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["term"] == name)
            .unwrap_or_else(|| panic!("{name} in {v}"))
            .clone()
    };
    let log_probs = term("loss")["bytes"].as_u64().unwrap();
    let chunk = 512 * 128_256 * 4;
    assert!(
        (chunk..chunk + 512 * 16).contains(&log_probs),
        "{}",
        term("loss")
    );
    let keys: Vec<&str> = v["terms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["term"].as_str().unwrap())
        .collect();
    for k in [
        "params",
        "compute_copies",
        "grads",
        "optimizer",
        "activations",
        "logits",
        "loss",
    ] {
        assert!(keys.contains(&k), "{k} in {keys:?}");
    }
    assert!(v["advice"][0]["overrides"].is_array());
    assert!(v["gpu"]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn start_up_holds_only_what_each_rank_keeps() {
    // Replicated: the masters in their dtype, nothing beside them.
    let j = job("");
    assert_eq!(moment(&j, Phase::Startup).get(TermKind::StartupParams), 0);
    let t = job("trainer: {precision: bf16-true}");
    let s = moment(&t, Phase::Startup);
    assert_eq!(s.get(TermKind::StartupParams), 0);
    assert_eq!(s.get(TermKind::Params), 2 * P);
    // FSDP: the shards and moments, read by ranges; sync_module_states broadcasts one group.
    let f = on_ranks(3, &fsdp("FULL_SHARD", "full", false), "");
    let s = moment(&f, Phase::Startup);
    assert_eq!(s.get(TermKind::StartupParams), 0);
    assert_eq!(s.get(TermKind::Params), 4 * (1366 + 4 * 61_526 + 43));
    let mut synced = f.clone();
    if let flotilla_config::schema::DistConfig::Fsdp(fs) = &mut synced.trainer.dist {
        fs.sync_module_states = true;
    }
    assert_eq!(
        moment(&synced, Phase::Startup).get(TermKind::StartupParams),
        4 * 184_578
    );
}

#[test]
fn llama8b_lora_fits_one_80gb_gpu_where_a_full_fine_tune_does_not() {
    let one_gpu = |lora: bool| {
        let mut j = llama8b(DDP);
        j.trainer.dist = flotilla_config::schema::DistConfig::None;
        j.trainer.global_batch_size = 1;
        j.compute.tasks_per_node = 1;
        j.compute.gpus_per_node = 1;
        j.compute.gpu_type = Some("h100".into());
        j.trainer.activation_checkpointing = true;
        if lora {
            j.peft = serde_json::from_value(serde_json::json!({
                "method": "lora", "r": 16, "alpha": 32.0, "dropout": 0.0,
                "target_modules": ["all-linear"], "use_rslora": false, "modules_to_save": [],
                "init_from": null, "merge": false
            }))
            .unwrap();
        }
        j
    };
    let (full, lora) = (one_gpu(false), one_gpu(true));
    let gpu = 80u64 << 30;
    let full_est = estimate(&full);
    let lora_est = estimate(&lora);
    assert!(
        full_est.peak_bytes > gpu,
        "{}",
        render::table(&full_est, &[])
    );
    assert!(
        lora_est.peak_bytes < 40 << 30,
        "{}",
        render::table(&lora_est, &[])
    );
    // The frozen base in bf16; the adapters (r 16 on every linear layer: 42M) in fp32, with
    // fp32 gradients and two fp32 moments; no base gradient or moment.
    let units = Units::of(&lora);
    let adapters = units.trained_total();
    assert_eq!(
        adapters,
        32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336))
    );
    let opt = moment(&lora, Phase::OptimizerStep);
    assert_eq!(
        opt.get(TermKind::Params),
        adapters * 4 + (units.total() - adapters) * 2
    );
    assert_eq!(opt.get(TermKind::Grads), adapters * 4);
    assert_eq!(opt.get(TermKind::Optimizer), adapters * 8);
    eprintln!("{}", render::table(&lora_est, &[]));
}

#[test]
fn each_nccl_communicator_of_several_ranks_holds_its_buffers() {
    let nccl = |j: &JobConfig| moment(j, Phase::EndOfBackward).get(TermKind::NcclBuffers);
    assert_eq!(nccl(&job("")), 0, "one process has no communicator");
    assert_eq!(nccl(&on_ranks(8, DDP, "")), NCCL_COMMUNICATOR_BYTES);
    let full = fsdp("FULL_SHARD", "full", false);
    assert_eq!(nccl(&on_ranks(8, &full, "")), NCCL_COMMUNICATOR_BYTES);
    // HYBRID_SHARD over 2 nodes of 4: the world, a node's ranks, and the ranks across nodes.
    let hybrid = job(&format!(
        "trainer: {{dist: {}, global_batch_size: 32}}
compute: {{nodes: 2, tasks_per_node: 4, gpus_per_node: 4}}",
        fsdp("HYBRID_SHARD", "full", false)
    ));
    assert_eq!(nccl(&hybrid), 3 * NCCL_COMMUNICATOR_BYTES);
    // On one node HYBRID's cross-node groups are single ranks: no buffers of their own.
    let one_node = on_ranks(4, &fsdp("HYBRID_SHARD", "full", false), "");
    assert_eq!(nccl(&one_node), 2 * NCCL_COMMUNICATOR_BYTES);
}
