//! Causal attention with grouped-query heads, as transformers computes it: scaled dot-product
//! attention (`sdpa`) over a whole row, within each sequence of a packed row (a mask), within a
//! sliding window, or for new positions against a key/value cache; and the eager attention of
//! Gemma 2, whose scores are soft-capped before the softmax. A forward's masks are built once
//! and shared by its layers ([`MaskCache`]).

use std::collections::HashMap;
use std::sync::Mutex;

use tch::{Kind, Tensor};

use super::mask::PackedRows;
use super::softcap::soft_cap;
use super::varlen::{flash_varlen, flash_varlen_applies};

/// The boolean masks of one forward's layers, built once and shared: every layer with the same
/// window over the same positions (and the same packed rows) reads the same mask, where each
/// used to build its own.
#[derive(Debug, Default)]
pub struct MaskCache {
    masks: Mutex<HashMap<MaskKey, Tensor>>,
}

/// A mask's queries, keys and window.
type MaskKey = (i64, i64, Option<i64>);

impl MaskCache {
    /// The mask of `t_q` queries over `t_k` keys within `window`, and'ed with `packed`'s, from
    /// the cache or built now.
    fn get(
        &self,
        q: &Tensor,
        t_q: i64,
        t_k: i64,
        window: Option<i64>,
        packed: Option<&PackedRows>,
    ) -> Tensor {
        let mut masks = self.masks.lock().expect("mask cache lock");
        masks
            .entry((t_q, t_k, window))
            .or_insert_with(|| {
                let mask = visible_keys(q, t_q, t_k, window);
                match packed {
                    Some(p) => mask.logical_and(&p.mask()),
                    None => mask,
                }
            })
            .shallow_clone()
    }
}

/// What a layer's attention does besides causal masking.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// The scores' scale (`None`: `head_dim ** -0.5`).
    pub scale: Option<f64>,
    /// Scores soft-capped at this value before the softmax (eager attention, as transformers
    /// runs Gemma 2).
    pub softcap: Option<f64>,
    /// Each query sees the keys of the last `window` positions, itself included
    /// (transformers' `kv_idx > q_idx - sliding_window`).
    pub window: Option<i64>,
}

/// Causal attention of queries `q` `[B, num_heads, T_q, head_dim]` to keys `k` and values `v`
/// `[B, num_kv_heads, T_k, head_dim]`, where the queries are the last `T_q` of the `T_k` key
/// positions (all of them in a training forward, the new ones after a cache's); `packed` (only
/// when `T_q == T_k`) keeps each sequence of a packed row to itself: on CUDA in half
/// precision by flash attention over the sequences' bounds (no mask), elsewhere by their
/// `[B, 1, T, T]` mask. Returns `[B, num_heads, T_q, head_dim]`. The masks a window or
/// soft-capping needs come from `masks`, the forward's cache (`packed` must be the same for
/// every call with one cache).
#[allow(clippy::too_many_arguments)]
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packed: Option<&PackedRows>,
    masks: &MaskCache,
    num_heads: i64,
    num_kv_heads: i64,
    options: &AttentionOptions,
) -> Tensor {
    let gqa = num_kv_heads != num_heads;
    let (t_q, t_k) = (q.size()[2], k.size()[2]);
    // The window hides keys only when some query has more than `window` positions behind it.
    let window = options.window.filter(|w| t_k > *w);
    let repeated = || {
        // With a mask the fused GPU kernels take no grouped-query heads (SDPA would fall back
        // to the math kernel, which holds [B, heads, T, T]): the KV heads are repeated instead,
        // as transformers does.
        let repeat = num_heads / num_kv_heads;
        if gqa {
            (
                k.repeat_interleave_self_int(repeat, 1, None),
                v.repeat_interleave_self_int(repeat, 1, None),
            )
        } else {
            (k.shallow_clone(), v.shallow_clone())
        }
    };
    if let Some(rows) =
        packed.filter(|_| t_q == t_k && options.softcap.is_none() && flash_varlen_applies(q))
    {
        let scale = options.scale.unwrap_or(1.0 / (q.size()[3] as f64).sqrt());
        return flash_varlen(q, k, v, &rows.bounds(), scale, window);
    }
    if options.softcap.is_none() && window.is_none() {
        let scale = options.scale;
        if t_q == t_k {
            return match packed {
                Some(rows) => {
                    let (k, v) = repeated();
                    Tensor::scaled_dot_product_attention(
                        q,
                        &k,
                        &v,
                        Some(&rows.mask()),
                        0.0,
                        false,
                        scale,
                        false,
                    )
                }
                None => Tensor::scaled_dot_product_attention::<&Tensor>(
                    q, k, v, None, 0.0, true, scale, gqa,
                ),
            };
        }
        // Query i sits at position t_k - t_q + i and sees keys 0 ..= t_k - t_q + i (one query
        // sees them all: no mask).
        let mask = (t_q > 1).then(|| visible_keys(q, t_q, t_k, None));
        return Tensor::scaled_dot_product_attention(
            q,
            k,
            v,
            mask.as_ref(),
            0.0,
            false,
            scale,
            gqa,
        );
    }
    let mask = masks.get(q, t_q, t_k, window, packed);
    let (k, v) = repeated();
    match options.softcap {
        None => Tensor::scaled_dot_product_attention(
            q,
            &k,
            &v,
            Some(&mask),
            0.0,
            false,
            options.scale,
            false,
        ),
        Some(cap) => {
            // transformers' eager attention: scores in the activation dtype, capped, masked,
            // a softmax in fp32 cast back.
            let scale = options.scale.unwrap_or(1.0 / (q.size()[3] as f64).sqrt());
            let scores = soft_cap(&(q.matmul(&k.transpose(2, 3)) * scale), cap);
            let scores = scores.masked_fill(&mask.logical_not(), f64::NEG_INFINITY);
            let probs = scores.softmax(-1, Kind::Float).to_kind(q.kind());
            probs.matmul(&v)
        }
    }
}

/// `[T_q, T_k]`, true where query `i` (at position `T_k - T_q + i`) may see key `j`: `j` at or
/// before it and, with a window, fewer than `window` positions behind it.
fn visible_keys(q: &Tensor, t_q: i64, t_k: i64, window: Option<i64>) -> Tensor {
    let device = q.device();
    let rows = (Tensor::arange(t_q, (Kind::Int64, device)) + (t_k - t_q)).unsqueeze(1);
    let cols = Tensor::arange(t_k, (Kind::Int64, device)).unsqueeze(0);
    let causal = cols.le_tensor(&rows);
    match window {
        Some(w) => causal.logical_and(&cols.gt_tensor(&(rows - w))),
        None => causal,
    }
}
