//! A mixture of experts' sparse MLP, as transformers computes `MixtralSparseMoeBlock` and
//! `Qwen3MoeSparseMoeBlock`: the router's logits, their softmax in fp32, each token's top-k
//! experts (the scores renormalised where the family does), and the experts' SwiGLU MLPs run on
//! the tokens grouped by expert, no loop over tokens. The experts are stacked as transformers 5
//! keeps them (`gate_up_proj` `[experts, 2 inter, hidden]`, `down_proj` `[experts, hidden,
//! inter]`), so that each projection of every expert is one grouped matrix product
//! (`torch._grouped_mm`, with the group ends computed on the device: no host read, one kernel
//! per projection); shapes it cannot take (a row not a multiple of 16 bytes, fp64) run one
//! product per expert instead, with the same values. The grouping is a stable sort of the
//! (token, slot) assignments and its inverse permutation, so forward and backward are
//! deterministic (every gather and scatter moves each row once; the sum over a token's k
//! experts is a plain reduction).
//!
//! LoRA adapts the router and the experts as PEFT does on transformers 5's fused experts
//! ([`MoeAdapters`]): each adapted parameter's `W + scale·B_e·A_e`, applied as the low-rank
//! product beside the base projection.
//!
//! It also records what the auxiliary load-balancing loss needs of each layer
//! ([`RouterStats`], kept in the forward's [`RouterLog`]); the loss itself, which couples every
//! layer, is the engine's.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tch::{Kind, Tensor};

use super::linear::linear;
use super::mlp::swiglu;
use super::side_by_side::{differences, timed_forward_backward};

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

/// The LoRA factors of one adapted parameter and the scale of their product.
#[derive(Clone, Copy, Debug)]
pub struct LoraPair<'a> {
    /// `[r·experts, in]`: expert `e`'s `A` is rows `e·r .. (e+1)·r` (the router: one expert).
    pub a: &'a Tensor,
    /// `[out, r·experts]`: expert `e`'s `B` is columns `e, e + experts, ...` (rank-major).
    pub b: &'a Tensor,
    pub scale: f64,
}

impl LoraPair<'_> {
    /// Expert `e`'s `(A_e [r, in], B_e [out, r])` of `experts`.
    fn of_expert(&self, e: i64, experts: i64) -> (Tensor, Tensor) {
        let r = self.a.size()[0] / experts;
        let out = self.b.size()[0];
        let a = self.a.narrow(0, e * r, r);
        let b = self.b.reshape([out, r, experts]).select(2, e);
        (a, b)
    }

    /// `scale · (x @ A_eᵀ) @ B_eᵀ`.
    fn update(&self, x: &Tensor, e: i64, experts: i64) -> Tensor {
        let (a, b) = self.of_expert(e, experts);
        linear(&linear(x, &a), &b) * self.scale
    }

    /// [`LoraPair::update`] of every expert at once over rows grouped by expert (`ends`: each
    /// group's end): `A` as `[experts, in, r]`, `B` as `[experts, r, out]`.
    fn grouped_update(&self, x: &Tensor, ends: &Tensor, experts: i64) -> Tensor {
        let (r, inp) = (self.a.size()[0] / experts, self.a.size()[1]);
        let out = self.b.size()[0];
        let a = self.a.view([experts, r, inp]).transpose(1, 2);
        let b = self
            .b
            .view([out, r, experts])
            .permute([2, 1, 0])
            .contiguous();
        grouped_mm(&grouped_mm(x, &a, ends), &b, ends) * self.scale
    }
}

/// `x`'s rows in groups (group `g` ends at row `ends[g]`, int32), group `g` times `w[g]`
/// (`[groups, in, out]`).
fn grouped_mm(x: &Tensor, w: &Tensor, ends: &Tensor) -> Tensor {
    x.internal_grouped_mm::<&Tensor>(w, Some(ends), None, None)
}

/// Whether `torch._grouped_mm` takes a layer of this dtype and these widths: fp32, bf16 or fp16,
/// every row of its operands a multiple of 16 bytes.
fn grouped_mm_takes(kind: Kind, widths: &[i64]) -> bool {
    let bytes = match kind {
        Kind::Float => 4,
        Kind::BFloat16 | Kind::Half => 2,
        _ => return false,
    };
    widths.iter().all(|w| (w * bytes) % 16 == 0)
}

/// A sparse layer's experts, stacked: `gate_up` `[experts, 2 inter, hidden]` (each expert's
/// gate rows, then its up rows) and `down` `[experts, hidden, inter]`.
#[derive(Clone, Copy, Debug)]
pub struct StackedExperts<'a> {
    pub gate_up: &'a Tensor,
    pub down: &'a Tensor,
}

/// A sparse layer's LoRA adapters, each absent where the job does not adapt it.
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeAdapters<'a> {
    /// The router (`mlp.gate.weight`).
    pub router: Option<LoraPair<'a>>,
    /// The experts' fused `gate_up_proj`: its update's first `moe_intermediate` rows add to the
    /// gate projection, the rest to the up projection.
    pub gate_up: Option<LoraPair<'a>>,
    /// The experts' `down_proj`.
    pub down: Option<LoraPair<'a>>,
}

impl SparseMlp {
    /// The layer's output for `x` (`[B, T, hidden]`), in `x`'s dtype. `router` is `[experts,
    /// hidden]`; `experts` the stacked experts; `adapters` their LoRA factors. `jitter_seed`:
    /// training (the noise is drawn from it), `None` in evaluation and generation. With `log`,
    /// the layer's routing statistics are recorded as layer `layer`.
    pub fn forward(
        &self,
        x: &Tensor,
        router: &Tensor,
        experts: StackedExperts,
        adapters: &MoeAdapters,
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
        // Out of place: an in-place add would rewrite what autograd saved.
        let plain = linear(&rows, router);
        let logits = match &adapters.router {
            Some(lora) => plain + lora.update(&rows, 0, 1),
            None => plain,
        };
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
        let routed = self.run_experts(&rows, &chosen, experts, adapters);
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
    fn run_experts(
        &self,
        rows: &Tensor,
        chosen: &Tensor,
        experts: StackedExperts,
        adapters: &MoeAdapters,
    ) -> Tensor {
        let hidden = rows.size()[1];
        let (grouped, order, counts) = self.sort_by_expert(rows, chosen);
        let inter = experts.down.size()[2];
        let sorted = if grouped_mm_takes(grouped.kind(), &[hidden, inter]) {
            self.grouped_experts(&grouped, &counts, experts, adapters)
        } else {
            self.expert_by_expert(&grouped, &counts, experts, adapters)
        };
        sorted.index_select(0, &order.argsort(0, false))
    }

    /// The (token, slot) assignments' rows sorted by expert (stable), with the order that sorted
    /// them and each expert's count: `rows` `[N, hidden]`, `chosen` `[N, k]` experts.
    fn sort_by_expert(&self, rows: &Tensor, chosen: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (n, hidden) = (rows.size()[0], rows.size()[1]);
        let k = self.top_k;
        let flat = chosen.reshape([-1]);
        let order = flat.argsort_stable(true, 0, false);
        // Row j of the expanded input is token j / k; gathering it by `order` moves each row
        // once (its gradient is a permutation back and a sum over the k copies).
        let grouped = rows
            .unsqueeze(1)
            .expand([n, k, hidden], false)
            .reshape([n * k, hidden])
            .index_select(0, &order);
        let counts = flat.bincount::<Tensor>(None, self.num_experts);
        (grouped, order, counts)
    }

    /// The experts' MLPs over `grouped` (rows sorted by expert, `counts` per expert) as two
    /// grouped products, the LoRA updates as grouped products too: nothing read to the host.
    fn grouped_experts(
        &self,
        grouped: &Tensor,
        counts: &Tensor,
        StackedExperts { gate_up, down }: StackedExperts,
        adapters: &MoeAdapters,
    ) -> Tensor {
        let ends = counts.cumsum(0, Kind::Int);
        let experts = self.num_experts;
        let inter = down.size()[2];
        let plain = grouped_mm(grouped, &gate_up.transpose(1, 2), &ends);
        let fused = match &adapters.gate_up {
            Some(lora) => plain + lora.grouped_update(grouped, &ends, experts),
            None => plain,
        };
        let gated = swiglu(&fused.narrow(1, 0, inter), &fused.narrow(1, inter, inter));
        let out = grouped_mm(&gated, &down.transpose(1, 2), &ends);
        match &adapters.down {
            Some(lora) => out + lora.grouped_update(&gated, &ends, experts),
            None => out,
        }
    }

    /// [`SparseMlp::grouped_experts`] one expert at a time (the counts read to the host), for
    /// what the grouped product does not take.
    fn expert_by_expert(
        &self,
        grouped: &Tensor,
        counts: &Tensor,
        StackedExperts { gate_up, down }: StackedExperts,
        adapters: &MoeAdapters,
    ) -> Tensor {
        let counts =
            Vec::<i64>::try_from(counts.to_device(tch::Device::Cpu)).expect("expert counts");
        let inter = down.size()[2];
        // One view per expert from one node (its backward stacks the experts' gradients once,
        // where a `select` per expert would each build a zero gradient of the whole stack).
        let (gate_ups, downs) = (gate_up.unbind(0), down.unbind(0));
        let mut outputs = Vec::with_capacity(counts.len());
        let mut start = 0;
        for (e, &count) in counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let x = grouped.narrow(0, start, count);
            let (e, n) = (e as i64, self.num_experts);
            let plain = linear(&x, &gate_ups[e as usize]);
            let fused = match &adapters.gate_up {
                Some(lora) => plain + lora.update(&x, e, n),
                None => plain,
            };
            let gated = swiglu(&fused.narrow(1, 0, inter), &fused.narrow(1, inter, inter));
            let out = linear(&gated, &downs[e as usize]);
            outputs.push(match &adapters.down {
                Some(lora) => out + lora.update(&gated, e, n),
                None => out,
            });
            start += count;
        }
        Tensor::cat(&outputs, 0)
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

/// What [`compare_expert_paths`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ExpertPathComparison {
    /// max |grouped - per expert| / max |per expert| of the experts' outputs.
    pub output: f64,
    /// ... the largest of the input's, `gate_up`'s and `down`'s gradients'.
    pub gradients: f64,
    /// Forward and backward of the experts, seconds (the best of the repeats).
    pub time_grouped: f64,
    pub time_per_expert: f64,
    /// Experts that no assignment chose.
    pub unchosen_experts: i64,
}

/// The experts of one sparse layer (`experts` of width `inter` over `hidden`, each of `tokens`
/// random tokens routed to `top_k` of them by a random router), in `kind` on `device`: the
/// grouped products against one product per expert, on the same routed rows. Returns the
/// largest differences of the outputs and of the gradients (input and experts), and each
/// path's time of a forward and backward (the best of `repeat`).
#[allow(clippy::too_many_arguments)]
pub fn compare_expert_paths(
    device: tch::Device,
    kind: Kind,
    tokens: i64,
    hidden: i64,
    inter: i64,
    experts: i64,
    top_k: i64,
    repeat: usize,
) -> ExpertPathComparison {
    tch::manual_seed(5);
    let opts = (kind, device);
    let std = (hidden as f64).powf(-0.5);
    let x = Tensor::randn([tokens, hidden], opts);
    let router = Tensor::randn([experts, hidden], opts) * std;
    let gate_up = (Tensor::randn([experts, 2 * inter, hidden], opts) * std).set_requires_grad(true);
    let down = (Tensor::randn([experts, hidden, inter], opts) * (inter as f64).powf(-0.5))
        .set_requires_grad(true);
    let mlp = SparseMlp {
        num_experts: experts,
        top_k,
        norm_topk_prob: true,
        scores_in_compute_dtype: false,
        jitter: 0.0,
    };
    // The routed rows, sorted by expert, as `run_experts` sorts them.
    let (grouped, _, counts) = tch::no_grad(|| {
        let probs = linear(&x, &router).softmax(-1, Kind::Float);
        let (_, chosen) = probs.topk(top_k, -1, true, true);
        mlp.sort_by_expert(&x, &chosen)
    });
    let grouped = grouped.set_requires_grad(true);
    let unchosen = counts.eq(0).sum(Kind::Int64).int64_value(&[]);
    let seed = Tensor::randn([tokens * top_k, hidden], opts);
    let stacked = StackedExperts {
        gate_up: &gate_up,
        down: &down,
    };
    let none = MoeAdapters::default();
    let leaves = [&grouped, &gate_up, &down];
    let grouped_path = || mlp.grouped_experts(&grouped, &counts, stacked, &none);
    let per_expert = || mlp.expert_by_expert(&grouped, &counts, stacked, &none);
    let (ours, our_grads, time_grouped) =
        timed_forward_backward(device, repeat, &leaves, &seed, &grouped_path);
    let (theirs, their_grads, time_per_expert) =
        timed_forward_backward(device, repeat, &leaves, &seed, &per_expert);
    let (output, gradients) = differences((&ours, &our_grads), (&theirs, &their_grads));
    ExpertPathComparison {
        output,
        gradients,
        time_grouped,
        time_per_expert,
        unchosen_experts: unchosen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn layer(jitter: f64, norm_topk_prob: bool) -> SparseMlp {
        SparseMlp {
            num_experts: 5,
            top_k: 2,
            norm_topk_prob,
            scores_in_compute_dtype: false,
            jitter,
        }
    }

    /// An input `[2, 6, 8]`, a router over 5 experts, and the experts stacked: `gate_up`
    /// `[5, 24, 8]` (inter 12), `down` `[5, 8, 12]`.
    fn weights() -> (Tensor, Tensor, Tensor, Tensor) {
        tch::manual_seed(7);
        let opts = (Kind::Float, Device::Cpu);
        let x = Tensor::randn([2, 6, 8], opts);
        let router = Tensor::randn([5, 8], opts);
        let gate_up = Tensor::randn([5, 24, 8], opts) * 0.3;
        let down = Tensor::randn([5, 8, 12], opts) * 0.3;
        (x, router, gate_up, down)
    }

    /// `mlp`'s output for `x` without adapters (training when `seed` is given), its routing
    /// recorded in `log`.
    fn plain(
        mlp: &SparseMlp,
        (x, router): (&Tensor, &Tensor),
        (gate_up, down): (&Tensor, &Tensor),
        seed: Option<u64>,
        log: Option<(&RouterLog, usize)>,
    ) -> Tensor {
        let experts = StackedExperts { gate_up, down };
        mlp.forward(x, router, experts, &MoeAdapters::default(), seed, log)
    }

    /// The grouped dispatch equals routing each token by itself, on both paths (fp32 takes the
    /// grouped products, fp64 one product per expert).
    #[test]
    fn grouped_dispatch_equals_a_loop_over_tokens() {
        let (x, router, gate_up, down) = weights();
        for kind in [Kind::Float, Kind::Double] {
            let (x, router) = (x.to_kind(kind), router.to_kind(kind));
            let (gate_up, down) = (gate_up.to_kind(kind), down.to_kind(kind));
            for norm in [false, true] {
                let mlp = layer(0.0, norm);
                let got = plain(&mlp, (&x, &router), (&gate_up, &down), None, None);
                let rows = x.reshape([-1, 8]);
                let mut want = Vec::new();
                for t in 0..rows.size()[0] {
                    let r = rows.get(t);
                    let probs = linear(&r, &router).softmax(-1, Kind::Float);
                    let (mut s, e) = probs.topk(2, -1, true, true);
                    if norm {
                        s = &s / s.sum(Kind::Float);
                    }
                    let mut out = r.zeros_like();
                    for j in 0..2 {
                        let e = e.int64_value(&[j]);
                        let (gate, up) = (
                            gate_up.get(e).narrow(0, 0, 12),
                            gate_up.get(e).narrow(0, 12, 12),
                        );
                        let y = linear(&swiglu(&linear(&r, &gate), &linear(&r, &up)), &down.get(e));
                        out += y * s.double_value(&[j]);
                    }
                    want.push(out);
                }
                let want = Tensor::stack(&want, 0).view([2, 6, 8]);
                let err = (&got - &want).abs().max().double_value(&[]);
                assert!(err < 1e-5, "{kind:?} norm_topk_prob {norm}: {err}");
            }
        }
    }

    /// The grouped products give the values and the gradients (input, experts, LoRA factors)
    /// of one product per expert, with an expert that no token chose.
    #[test]
    fn grouped_products_equal_expert_by_expert() {
        let (x, _, gate_up, down) = weights();
        let opts = (Kind::Float, Device::Cpu);
        let (e, inter, hidden, r) = (5i64, 12i64, 8i64, 3i64);
        let leaves = [
            x.reshape([-1, hidden]).narrow(0, 0, 11),
            gate_up,
            down,
            Tensor::randn([2 * r * e, hidden], opts) * 0.2,
            Tensor::randn([2 * inter, 2 * r * e], opts) * 0.2,
            Tensor::randn([r * e, inter], opts) * 0.2,
            Tensor::randn([hidden, r * e], opts) * 0.2,
        ]
        .map(|t| t.detach().set_requires_grad(true));
        // Rows sorted by expert; expert 2 gets none.
        let counts = Tensor::from_slice(&[3i64, 4, 0, 1, 3]);
        let mlp = layer(0.0, true);
        let weight = Tensor::randn([11, hidden], opts);
        let run = |grouped: bool| {
            let [rows, gu, dn, gu_a, gu_b, dn_a, dn_b] = &leaves;
            let adapters = MoeAdapters {
                router: None,
                gate_up: Some(LoraPair {
                    a: gu_a,
                    b: gu_b,
                    scale: 0.5,
                }),
                down: Some(LoraPair {
                    a: dn_a,
                    b: dn_b,
                    scale: 1.5,
                }),
            };
            let experts = StackedExperts {
                gate_up: gu,
                down: dn,
            };
            let out = match grouped {
                true => mlp.grouped_experts(rows, &counts, experts, &adapters),
                false => mlp.expert_by_expert(rows, &counts, experts, &adapters),
            };
            let loss = (&out * &weight).sum(Kind::Float);
            let grads = Tensor::run_backward(&[loss], &leaves, false, false);
            (out, grads)
        };
        let (ours, our_grads) = run(true);
        let (theirs, their_grads) = run(false);
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let err = (a - b).abs().max().double_value(&[]);
            let scale = b.abs().max().double_value(&[]);
            assert!(
                scale > 0.0 && err <= 1e-6 * scale,
                "{what}: {err} of {scale}"
            );
        };
        close(&ours, &theirs, "output");
        for (k, (a, b)) in our_grads.iter().zip(&their_grads).enumerate() {
            close(a, b, &format!("gradient of leaf {k}"));
        }
        let unchosen = our_grads[1].get(2).abs().max().double_value(&[]);
        assert_eq!(unchosen, 0.0, "an expert no row chose gets no gradient");
    }

    /// The adapters equal PEFT's merged parameters: `W + scale·delta` with PEFT's
    /// `einsum("o r e, e r i -> e o i", B.reshape(out, r, E), A.reshape(E, r, in))` per fused
    /// parameter (gate rows then up rows of `gate_up_proj`), and `W + scale·B@A` for the router.
    #[test]
    fn adapters_equal_pefts_merged_parameters() {
        let (x, router, gate_up, down) = weights();
        let stacked = StackedExperts {
            gate_up: &gate_up,
            down: &down,
        };
        let (e, inter, hidden, r) = (5i64, 12i64, 8i64, 3i64);
        let opts = (Kind::Float, Device::Cpu);
        let gu = (
            Tensor::randn([2 * r * e, hidden], opts) * 0.2,
            Tensor::randn([2 * inter, 2 * r * e], opts) * 0.2,
        );
        let dn = (
            Tensor::randn([r * e, inter], opts) * 0.2,
            Tensor::randn([hidden, r * e], opts) * 0.2,
        );
        let rt = (
            Tensor::randn([r, hidden], opts) * 0.2,
            Tensor::randn([e, r], opts) * 0.2,
        );
        let adapters = MoeAdapters {
            router: Some(LoraPair {
                a: &rt.0,
                b: &rt.1,
                scale: 2.0,
            }),
            gate_up: Some(LoraPair {
                a: &gu.0,
                b: &gu.1,
                scale: 0.5,
            }),
            down: Some(LoraPair {
                a: &dn.0,
                b: &dn.1,
                scale: 1.5,
            }),
        };
        let delta = |(a, b): &(Tensor, Tensor), rank: i64| {
            let a = a.reshape([e, rank, -1]);
            let b = b.reshape([b.size()[0], rank, e]);
            Tensor::einsum("ore,eri->eoi", &[b, a], None::<&[i64]>)
        };
        let merged_gate_up = &gate_up + delta(&gu, 2 * r) * 0.5;
        let merged_down = &down + delta(&dn, r) * 1.5;
        let merged_router = &router + rt.1.matmul(&rt.0) * 2.0;
        for norm in [false, true] {
            let mlp = layer(0.0, norm);
            let ours = mlp.forward(&x, &router, stacked, &adapters, None, None);
            let theirs = plain(
                &mlp,
                (&x, &merged_router),
                (&merged_gate_up, &merged_down),
                None,
                None,
            );
            let err = (&ours - &theirs).abs().max().double_value(&[]);
            let scale = theirs.abs().max().double_value(&[]);
            assert!(
                err < 1e-5 * scale,
                "norm_topk_prob {norm}: {err} of {scale}"
            );
            let unadapted = plain(&mlp, (&x, &router), (&gate_up, &down), None, None);
            let moved = (&ours - &unadapted).abs().max().double_value(&[]);
            assert!(
                moved > 0.1 * scale,
                "the adapters change the output: {moved}"
            );
        }
    }

    /// Jitter applies in training only (a seed), the same for the same seed.
    #[test]
    fn router_jitter_only_in_training() {
        let (x, router, gate_up, down) = weights();
        let run = |mlp: &SparseMlp, seed: Option<u64>| {
            plain(mlp, (&x, &router), (&gate_up, &down), seed, None)
        };
        let unjittered = run(&layer(0.0, true), None);
        let jittery = layer(0.4, true);
        assert!(run(&jittery, None).equal(&unjittered));
        let a = run(&jittery, Some(3));
        assert!(a.equal(&run(&jittery, Some(3))));
        assert!(!a.equal(&unjittered));
    }

    /// The loss over recorded layers is transformers' formula, and its gradient is the counts'.
    #[test]
    fn load_balancing_matches_its_formula() {
        let (x, router, gate_up, down) = weights();
        let log = RouterLog::default();
        let mlp = layer(0.0, true);
        let _ = plain(
            &mlp,
            (&x, &router),
            (&gate_up, &down),
            None,
            Some((&log, 0)),
        );
        let router2 = &router * 0.5;
        let _ = plain(
            &mlp,
            (&x, &router2),
            (&gate_up, &down),
            None,
            Some((&log, 3)),
        );
        let (loss, grad) = log.with_all(|s| load_balancing(s, 5)).unwrap();
        // By hand: both layers' probabilities and top-2 choices over the 12 tokens.
        let rows = x.reshape([-1, 8]);
        let (mut counts, mut probs) = (vec![0f64; 5], vec![0f64; 5]);
        for r in [&router, &router2] {
            let p = linear(&rows, r).softmax(-1, Kind::Float);
            let (_, e) = p.topk(2, -1, true, true);
            for v in Vec::<i64>::try_from(e.reshape([-1])).unwrap() {
                counts[v as usize] += 1.0;
            }
            for (k, v) in Vec::<f32>::try_from(p.sum_dim_intlist(0, false, Kind::Float))
                .unwrap()
                .into_iter()
                .enumerate()
            {
                probs[k] += v as f64;
            }
        }
        let n = 24.0;
        let want: f64 = (0..5).map(|e| counts[e] / n * probs[e] / n).sum::<f64>() * 5.0;
        assert!((loss.double_value(&[]) - want).abs() < 1e-6);
        let grad = Vec::<f32>::try_from(grad).unwrap();
        for e in 0..5 {
            assert!((grad[e] as f64 - 5.0 * counts[e] / (n * n)).abs() < 1e-7);
        }
    }
}
