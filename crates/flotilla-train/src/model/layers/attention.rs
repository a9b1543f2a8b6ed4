//! Causal scaled dot-product attention with grouped-query heads, as transformers' `sdpa`
//! attention computes it: over a whole row, within each sequence of a packed row (a mask), or
//! for new positions against a key/value cache.

use tch::{Kind, Tensor};

/// Causal attention of queries `q` `[B, num_heads, T_q, head_dim]` to keys `k` and values `v`
/// `[B, num_kv_heads, T_k, head_dim]`, where the queries are the last `T_q` of the `T_k` key
/// positions (all of them in a training forward, the new ones after a cache's); `packed_mask`
/// (`[B, 1, T, T]`, only when `T_q == T_k`) keeps each sequence of a packed row to itself.
/// Returns `[B, num_heads, T_q, head_dim]`.
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    packed_mask: Option<&Tensor>,
    num_heads: i64,
    num_kv_heads: i64,
) -> Tensor {
    let gqa = num_kv_heads != num_heads;
    let (t_q, t_k) = (q.size()[2], k.size()[2]);
    if t_q == t_k {
        match packed_mask {
            Some(mask) => {
                // With a mask the fused GPU kernels take no grouped-query heads (SDPA would
                // fall back to the math kernel, which holds [B, heads, T, T]): the KV heads
                // are repeated instead, as transformers does.
                let repeat = num_heads / num_kv_heads;
                let (k, v) = if gqa {
                    (
                        k.repeat_interleave_self_int(repeat, 1, None),
                        v.repeat_interleave_self_int(repeat, 1, None),
                    )
                } else {
                    (k.shallow_clone(), v.shallow_clone())
                };
                Tensor::scaled_dot_product_attention(q, &k, &v, Some(mask), 0.0, false, None, false)
            }
            None => {
                Tensor::scaled_dot_product_attention::<&Tensor>(q, k, v, None, 0.0, true, None, gqa)
            }
        }
    } else {
        // Query i sits at position t_k - t_q + i and sees keys 0 ..= t_k - t_q + i (one
        // query sees them all: no mask).
        let mask =
            (t_q > 1).then(|| Tensor::ones([t_q, t_k], (Kind::Bool, q.device())).tril(t_k - t_q));
        Tensor::scaled_dot_product_attention(q, k, v, mask.as_ref(), 0.0, false, None, gqa)
    }
}
