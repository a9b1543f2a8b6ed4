//! A mixture of experts' sparse MLP, as transformers computes `MixtralSparseMoeBlock` and
//! `Qwen3MoeSparseMoeBlock`: the router's logits, their softmax in fp32, each token's top-k
//! experts (the scores renormalised where the family does), and the experts' SwiGLU MLPs run on
//! the tokens grouped by expert: one matrix product per expert and projection, no loop over
//! tokens. The grouping is a stable sort of the (token, slot) assignments and its inverse
//! permutation, so forward and backward are deterministic (every gather and scatter moves each
//! row once; the sum over a token's k experts is a plain reduction).
//!
//! It also records what the auxiliary load-balancing loss needs of each layer
//! ([`RouterStats`], kept in the forward's [`RouterLog`]); the loss itself, which couples every
//! layer, is the engine's.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tch::{Kind, Tensor};

use super::linear::linear;
use super::mlp::swiglu;

/// How a family routes tokens to its experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SparseMlp {
    pub num_experts: i64,
    /// Experts per token.
    pub top_k: i64,
    /// The top-k scores renormalised to sum to one (Mixtral always; Qwen3-MoE's
    /// `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// The scores rounded to the activations' dtype before they weight the experts' outputs
    /// (Qwen3-MoE); Mixtral weighs in fp32 and rounds the product.
    pub scores_in_compute_dtype: bool,
    /// Mixtral's `router_jitter_noise`: in training, the input is multiplied by noise uniform in
    /// `[1 - jitter, 1 + jitter]` before the router and the experts see it.
    pub jitter: f64,
}

/// One sparse layer's routing in one forward, for the load-balancing loss (transformers'
/// `load_balancing_loss_func`): per expert, how many of the layer's (token, slot) assignments
/// chose it and the sum over tokens of its softmax probability.
#[derive(Debug)]
pub struct RouterStats {
    /// `[experts]` fp32, no gradient.
    pub counts: Tensor,
    /// `[experts]` fp32, attached to the router's graph (the loss's gradient flows through it).
    pub prob_sums: Tensor,
    /// Tokens routed.
    pub rows: i64,
}

/// Every sparse layer's [`RouterStats`] of one forward, by layer; a recomputed layer (activation
/// checkpointing) replaces its entry.
#[derive(Debug, Default)]
pub struct RouterLog {
    layers: Mutex<BTreeMap<usize, RouterStats>>,
}

impl RouterLog {
    pub fn record(&self, layer: usize, stats: RouterStats) {
        self.layers
            .lock()
            .expect("router log lock")
            .insert(layer, stats);
    }

    /// Layer `layer`'s statistics, taken out of the log.
    pub fn take(&self, layer: usize) -> Option<RouterStats> {
        self.layers.lock().expect("router log lock").remove(&layer)
    }

    /// Calls `f` with every layer's statistics.
    pub fn with_all<R>(&self, f: impl FnOnce(&BTreeMap<usize, RouterStats>) -> R) -> R {
        f(&self.layers.lock().expect("router log lock"))
    }
}

impl SparseMlp {
    /// The layer's output for `x` (`[B, T, hidden]`), in `x`'s dtype. `router` is `[experts,
    /// hidden]`; `experts` holds each expert's gate, up and down projections in turn.
    /// `jitter_seed`: training (the noise is drawn from it), `None` in evaluation and
    /// generation. With `log`, the layer's routing statistics are recorded as layer `layer`.
    pub fn forward(
        &self,
        x: &Tensor,
        router: &Tensor,
        experts: &[Tensor],
        jitter_seed: Option<u64>,
        log: Option<(&RouterLog, usize)>,
    ) -> Tensor {
        let size = x.size();
        let hidden = *size.last().expect("[B, T, hidden]");
        let flat = x.reshape([-1, hidden]);
        let rows = match jitter_seed.filter(|_| self.jitter > 0.0) {
            Some(seed) => {
                tch::manual_seed(seed as i64);
                let noise = flat
                    .empty_like()
                    .uniform_(1.0 - self.jitter, 1.0 + self.jitter);
                flat * noise
            }
            None => flat,
        };
        let logits = linear(&rows, router);
        let probs = logits.softmax(-1, Kind::Float);
        let (mut scores, chosen) = probs.topk(self.top_k, -1, true, true);
        if let Some((log, layer)) = log {
            log.record(layer, self.stats(&logits, &probs, &chosen));
        }
        if self.norm_topk_prob {
            scores = &scores / scores.sum_dim_intlist(-1, true, Kind::Float);
        }
        if self.scores_in_compute_dtype {
            scores = scores.to_kind(x.kind());
        }
        let routed = self.run_experts(&rows, &chosen, experts);
        let n = rows.size()[0];
        // Each (token, slot) output weighted by its score, rounded to the activations' dtype,
        // then summed over the token's experts.
        let weighted = (routed.view([n, self.top_k, hidden]) * scores.unsqueeze(-1))
            .to_kind(x.kind())
            .sum_dim_intlist(1, false, x.kind());
        weighted.view(size.as_slice())
    }

    /// The experts' outputs for every (token, slot) assignment, `[N * k, hidden]` in (token,
    /// slot) order: the assignments sorted by expert (stable), each expert's rows through its
    /// MLP at once, and the result put back in order.
    fn run_experts(&self, rows: &Tensor, chosen: &Tensor, experts: &[Tensor]) -> Tensor {
        let (n, hidden) = (rows.size()[0], rows.size()[1]);
        let k = self.top_k;
        let flat = chosen.reshape([-1]);
        let order = flat.argsort_stable(true, 0, false);
        // Row j of the expanded input is token j / k; gathering it by `order` moves each row
        // once (its gradient is a permutation back and a sum over the k copies).
        let expanded = rows
            .unsqueeze(1)
            .expand([n, k, hidden], false)
            .reshape([n * k, hidden]);
        let grouped = expanded.index_select(0, &order);
        let counts = Vec::<i64>::try_from(
            flat.bincount::<Tensor>(None, self.num_experts)
                .to_device(tch::Device::Cpu),
        )
        .expect("expert counts");
        let mut outputs = Vec::with_capacity(counts.len());
        let mut start = 0;
        for (e, &count) in counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let x = grouped.narrow(0, start, count);
            let w = &experts[3 * e..3 * e + 3];
            let gated = swiglu(&linear(&x, &w[0]), &linear(&x, &w[1]));
            outputs.push(linear(&gated, &w[2]));
            start += count;
        }
        let sorted = Tensor::cat(&outputs, 0);
        sorted.index_select(0, &order.argsort(0, false))
    }

    /// What the load-balancing loss reads of this layer, as `load_balancing_loss_func` computes
    /// it: the softmax of the logits in their own dtype and its top-k, counted per expert.
    fn stats(&self, logits: &Tensor, probs: &Tensor, chosen: &Tensor) -> RouterStats {
        let (probs, chosen) = if logits.kind() == Kind::Float {
            (probs.shallow_clone(), chosen.shallow_clone())
        } else {
            let own = logits.softmax(-1, logits.kind());
            let (_, chosen) = own.topk(self.top_k, -1, true, true);
            (own.to_kind(Kind::Float), chosen)
        };
        let counts = tch::no_grad(|| {
            chosen
                .reshape([-1])
                .bincount::<Tensor>(None, self.num_experts)
                .to_kind(Kind::Float)
        });
        RouterStats {
            counts,
            prob_sums: probs.sum_dim_intlist(0, false, Kind::Float),
            rows: probs.size()[0],
        }
    }
}

/// transformers' `load_balancing_loss_func` over the layers of `stats`: with `C` the experts'
/// assignment counts and `P` their probability sums, both summed over the layers and divided by
/// the tokens routed in all layers, `experts * sum(C * P)`. Returns the loss (fp32 scalar, no
/// gradient) and the gradient of the loss with respect to every layer's `prob_sums` (the same
/// `[experts]` vector for each layer: the loss is linear in them, the counts being constants).
pub fn load_balancing(
    stats: &BTreeMap<usize, RouterStats>,
    num_experts: i64,
) -> Option<(Tensor, Tensor)> {
    let first = stats.values().next()?;
    let _guard = tch::no_grad_guard();
    let mut counts = first.counts.zeros_like();
    let mut probs = first.counts.zeros_like();
    let mut rows = 0i64;
    for s in stats.values() {
        counts += &s.counts;
        probs += s.prob_sums.detach();
        rows += s.rows;
    }
    let total = rows as f64;
    let loss = (&counts * &probs).sum(Kind::Float) * (num_experts as f64 / (total * total));
    let grad = counts * (num_experts as f64 / (total * total));
    Some((loss, grad))
}
