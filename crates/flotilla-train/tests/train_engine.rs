//! The unit engine against one whole-graph backward: with and without activation
//! checkpointing, tied and untied embeddings, and gradient accumulation over two micro-batches
//! against one batch of twice the size.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/compose.rs"]
mod compose;

use flotilla_config::schema::ModelConfig;
use flotilla_train::data::{Batch, IGNORE_INDEX};
use flotilla_train::model::{CausalLm, Params};
use flotilla_train::objective::next_token_loss_sum;
use flotilla_train::{Engine, EngineOptions, LossChunks, SingleProcess, Strategy, TrainError};
use tch::{Device, Kind, Tensor};

fn tiny(tied: bool) -> ModelConfig {
    compose::tiny_model_config(tied)
}

fn batch(rows: i64, t: i64, seed: i64) -> Batch {
    tch::manual_seed(seed);
    let input_ids = Tensor::randint(40, [rows, t], (Kind::Int64, Device::Cpu));
    let labels = Tensor::randint(40, [rows, t], (Kind::Int64, Device::Cpu));
    let mask = Tensor::rand([rows, t], (Kind::Float, Device::Cpu)).lt(0.3);
    let labels = labels.masked_fill(&mask, IGNORE_INDEX);
    let n = labels.ne(IGNORE_INDEX).sum(Kind::Int64).int64_value(&[]) as u64;
    Batch {
        input_ids,
        labels,
        positions: None,
        layout: None,
        num_loss_tokens: n,
        pairs: false,
        reference_logps: None,
    }
}

/// `b` with rows packing sequences: row 0 of 5 and `T - 5` tokens, row 1 of 3, 4 and the rest,
/// the others one sequence each.
fn packed(mut b: Batch) -> Batch {
    let (rows, t) = (b.input_ids.size()[0], b.input_ids.size()[1]);
    let mut positions = vec![];
    for r in 0..rows {
        let starts: &[i64] = match r {
            0 => &[0, 5],
            1 => &[0, 3, 7],
            _ => &[0],
        };
        for i in 0..t {
            let begin = starts.iter().rev().find(|&&s| s <= i).unwrap();
            positions.push(i - begin);
        }
    }
    b.positions = Some(Tensor::from_slice(&positions).reshape([rows, t]));
    b
}

/// Whole-graph reference: loss_sum / tokens, one backward.
fn reference(model: &CausalLm, params: &Params, b: &Batch, tokens: u64) -> (f64, Params) {
    let leaves = params.requiring_grad();
    let logits = model.forward_input(&leaves, &b.model_input()).unwrap();
    let loss = next_token_loss_sum(&logits, b) / tokens as f64;
    let names: Vec<&str> = leaves.names().collect();
    let wrt: Vec<&Tensor> = names.iter().map(|n| leaves.get(n).unwrap()).collect();
    let grads = Tensor::run_backward(&[&loss], &wrt, false, false);
    let mut out = Params::new();
    for (n, g) in names.iter().zip(grads) {
        out.insert(*n, g);
    }
    (loss.double_value(&[]), out)
}

fn max_diff(a: &Params, b: &Params) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .map(|(n, t)| {
            let u = b.get(n).unwrap_or_else(|| panic!("{n} missing"));
            (t - u).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

/// Records the order of `gradients_ready` and checks each call sees only owned parameters.
struct Recorder<'a> {
    inner: SingleProcess<'a>,
    ready: Vec<(usize, Vec<String>)>,
}

impl Strategy for Recorder<'_> {
    fn params_for(&mut self, model: &CausalLm, unit: usize) -> Result<Vec<Tensor>, TrainError> {
        self.inner.params_for(model, unit)
    }
    fn gradients_ready(&mut self, unit: usize, grads: &Params) -> Result<(), TrainError> {
        self.ready
            .push((unit, grads.names().map(str::to_string).collect()));
        Ok(())
    }
}

#[test]
fn engine_matches_whole_graph_backward() {
    for tied in [true, false] {
        let model = CausalLm::new(&tiny(tied)).unwrap();
        let params = model.init_params(5, Device::Cpu, Kind::Float);
        let whole_rows = reference(&model, &params, &batch(4, 12, 1), 1).0;
        // The head and loss fused in chunks of 5 of the 48 tokens (the last one short), or in
        // one chunk (`Auto`: the vocabulary is smaller than the hidden size), or the whole
        // logits then the loss.
        for (b, ckpt, loss_chunks) in [
            (batch(4, 12, 1), false, LossChunks::Auto),
            (batch(4, 12, 1), false, LossChunks::Rows(5)),
            (batch(4, 12, 1), false, LossChunks::Whole),
            (batch(4, 12, 1), true, LossChunks::Rows(5)),
            (batch(4, 12, 1), true, LossChunks::Whole),
            (packed(batch(4, 12, 1)), false, LossChunks::Rows(7)),
            (packed(batch(4, 12, 1)), true, LossChunks::Auto),
        ] {
            let tokens = b.num_loss_tokens;
            let (ref_loss, ref_grads) = reference(&model, &params, &b, tokens);
            if b.positions.is_some() {
                // The packed rows attend differently: the loss must change (by ~5e-5 here, a
                // random tiny model being nearly indifferent to context).
                let sum = reference(&model, &params, &b, 1).0;
                assert!((sum - whole_rows).abs() > 1e-5 * whole_rows.abs());
            }
            let engine = Engine::new(
                &model,
                EngineOptions {
                    activation_checkpointing: ckpt,
                    loss_chunks,
                    ..EngineOptions::default()
                },
            );
            let mut strat = Recorder {
                inner: SingleProcess { params: &params },
                ready: Vec::new(),
            };
            let (loss, grads) = engine
                .forward_backward(&mut strat, std::slice::from_ref(&b), tokens)
                .unwrap();
            let loss = loss.double_value(&[]);
            let d = max_diff(&grads, &ref_grads);
            let packed = b.positions.is_some();
            eprintln!(
                "tied={tied} ckpt={ckpt} packed={packed} {loss_chunks:?}: loss {loss} vs \
                 {ref_loss}, max grad diff {d:e}"
            );
            assert!((loss - ref_loss).abs() <= 1e-6 * ref_loss.abs());
            assert!(d <= 1e-7, "max grad diff {d:e}");
            // gradients_ready: every unit once, in reverse order, with its owned params.
            let n = model.units().len();
            let units: Vec<usize> = strat.ready.iter().map(|(u, _)| *u).collect();
            assert_eq!(units, (0..n).rev().collect::<Vec<_>>());
            for (u, names) in &strat.ready {
                let owned: Vec<String> = model.owned_params(*u).map(|s| s.name.clone()).collect();
                assert_eq!(names, &owned);
            }
        }
    }
}

#[test]
fn accumulation_over_two_micro_batches_equals_one_batch() {
    for tied in [true, false] {
        let model = CausalLm::new(&tiny(tied)).unwrap();
        let params = model.init_params(9, Device::Cpu, Kind::Float);
        let whole = batch(4, 10, 2);
        let tokens = whole.num_loss_tokens;
        let half = |r: std::ops::Range<i64>| {
            let labels = whole.labels.narrow(0, r.start, r.end - r.start);
            Batch {
                input_ids: whole.input_ids.narrow(0, r.start, r.end - r.start),
                positions: None,
                layout: None,
                num_loss_tokens: labels.ne(IGNORE_INDEX).sum(Kind::Int64).int64_value(&[]) as u64,
                labels,
                pairs: false,
                reference_logps: None,
            }
        };
        let micro = [half(0..2), half(2..4)];
        for ckpt in [false, true] {
            let engine = Engine::new(
                &model,
                EngineOptions {
                    activation_checkpointing: ckpt,
                    ..EngineOptions::default()
                },
            );
            let (l1, g1) = engine
                .forward_backward(
                    &mut SingleProcess { params: &params },
                    std::slice::from_ref(&whole),
                    tokens,
                )
                .unwrap();
            let (l2, g2) = engine
                .forward_backward(&mut SingleProcess { params: &params }, &micro, tokens)
                .unwrap();
            let (l1, l2) = (l1.double_value(&[]), l2.double_value(&[]));
            let d = max_diff(&g1, &g2);
            eprintln!("accumulation tied={tied} ckpt={ckpt}: loss {l1} vs {l2}, max diff {d:e}");
            assert!((l1 - l2).abs() <= 1e-6 * l1.abs());
            assert!(d <= 1e-7, "{d:e}");
        }
    }
}
