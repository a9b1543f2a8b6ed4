//! Packed rows by their sequences' bounds: which sequences a packed batch holds
//! ([`SequenceBounds`], from position ids by transformers' rule, the one the packed mask
//! follows) and causal attention over them with flash attention's variable lengths on CUDA
//! ([`flash_varlen`], the C++ shim `csrc/attention.cpp`): no `[B, 1, T, T]` mask, no bias, no
//! repeated key/value heads. CPUs and the cases the kernel does not take keep the mask path.

use tch::{Device, Kind, Tensor};

use super::side_by_side::{differences, timed_forward_backward};

/// The sequences of a packed batch, laid end to end over its flattened rows: sequence `i` is
/// rows `starts[i] .. starts[i + 1]` of the `B·T` tokens.
#[derive(Debug)]
pub struct SequenceBounds {
    /// `[n + 1]` int32 cumulative bounds (`cu_seqlens`), on the positions' device.
    pub cumulative: Tensor,
    /// The longest sequence's length.
    pub max_len: i64,
}

impl SequenceBounds {
    /// The bounds of the sequences of position ids `[B, T]`: every row starts one, and so does
    /// a position that does not follow its predecessor by one (transformers'
    /// `find_packed_sequence_indices`, as `packed_attention_mask`). One read of the positions
    /// to the host.
    pub fn of(positions: &Tensor) -> Self {
        let (b, t) = (positions.size()[0], positions.size()[1]);
        let host = Vec::<i64>::try_from(positions.to_device(Device::Cpu).reshape([-1]))
            .expect("int64 position ids");
        let (starts, max_len) = host_bounds(&host, b as usize, t as usize);
        SequenceBounds {
            cumulative: Tensor::from_slice(&starts).to_device(positions.device()),
            max_len,
        }
    }

    /// The same bounds, sharing their tensor.
    pub fn shallow_clone(&self) -> Self {
        SequenceBounds {
            cumulative: self.cumulative.shallow_clone(),
            max_len: self.max_len,
        }
    }
}

/// What the host knew of packed rows' position ids when it built them: their largest and the
/// sequences' bounds (already on the positions' device). A forward takes these instead of
/// reading the positions back from the device.
#[derive(Debug)]
pub struct PackedLayout {
    pub max_position: i64,
    pub bounds: SequenceBounds,
}

impl PackedLayout {
    /// The same layout, sharing its tensor.
    pub fn shallow_clone(&self) -> Self {
        PackedLayout {
            max_position: self.max_position,
            bounds: self.bounds.shallow_clone(),
        }
    }
}

/// The bounds of the sequences of `rows` rows of `t` host position ids each, as
/// [`SequenceBounds::of`] finds them: the start of every sequence then the end, and the longest
/// sequence's length.
pub fn host_bounds(positions: &[i64], rows: usize, t: usize) -> (Vec<i32>, i64) {
    let mut starts = vec![];
    for r in 0..rows {
        for j in 0..t {
            let i = r * t + j;
            if j == 0 || positions[i] - positions[i - 1] != 1 {
                starts.push(i as i32);
            }
        }
    }
    starts.push((rows * t) as i32);
    let max_len = starts
        .windows(2)
        .map(|w| (w[1] - w[0]) as i64)
        .max()
        .unwrap_or(0);
    (starts, max_len)
}

/// Whether flash attention's variable-length kernel takes these queries: CUDA, half or bf16,
/// a head size that is a multiple of 8 up to 256.
pub fn flash_varlen_applies(q: &Tensor) -> bool {
    let head_dim = *q.size().last().expect("[.., head_dim]");
    q.device().is_cuda()
        && matches!(q.kind(), Kind::BFloat16 | Kind::Half)
        && head_dim % 8 == 0
        && head_dim <= 256
}

extern "C" {
    fn flotilla_flash_varlen(
        q: *const std::ffi::c_void,
        k: *const std::ffi::c_void,
        v: *const std::ffi::c_void,
        cu_seqlens: *const std::ffi::c_void,
        max_len: i64,
        scale: f64,
        window_left: i64,
        out: *mut *mut std::ffi::c_void,
    ) -> std::ffi::c_int;
    fn flotilla_flash_varlen_error() -> *const std::ffi::c_char;
}

/// Causal attention of `q` `[B, heads, T, head_dim]` to `k` and `v` `[B, kv_heads, T,
/// head_dim]` (grouped-query heads as they are), each sequence of `bounds` to itself; with a
/// window, a query sees itself and the `window - 1` keys before it (transformers'
/// `kv_idx > q_idx - sliding_window`). Returns `[B, heads, T, head_dim]`. Only where
/// [`flash_varlen_applies`].
pub fn flash_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bounds: &SequenceBounds,
    scale: f64,
    window: Option<i64>,
) -> Tensor {
    let (b, heads, t, d) = q.size4().expect("[B, heads, T, head_dim]");
    let tokens_major = |x: &Tensor| x.transpose(1, 2).reshape([b * t, x.size()[1], d]);
    let (q3, k3, v3) = (tokens_major(q), tokens_major(k), tokens_major(v));
    let mut out = std::ptr::null_mut::<std::ffi::c_void>();
    // SAFETY: every pointer is a live tch tensor handle (an at::Tensor*); the shim puts a new
    // at::Tensor* in `out`, which the returned tch tensor takes ownership of.
    let code = unsafe {
        flotilla_flash_varlen(
            q3.as_ptr() as *const std::ffi::c_void,
            k3.as_ptr() as *const std::ffi::c_void,
            v3.as_ptr() as *const std::ffi::c_void,
            bounds.cumulative.as_ptr() as *const std::ffi::c_void,
            bounds.max_len,
            scale,
            window.map_or(-1, |w| w - 1),
            &mut out,
        )
    };
    if code != 0 {
        // SAFETY: the shim returns a NUL-terminated thread-local message.
        let msg = unsafe { std::ffi::CStr::from_ptr(flotilla_flash_varlen_error()) };
        panic!(
            "flash attention over packed sequences failed: {}",
            msg.to_string_lossy()
        );
    }
    // SAFETY: a fresh at::Tensor* owned by nobody else.
    let out = unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) };
    out.reshape([b, t, heads, d]).transpose(1, 2)
}

/// The flash path against the masked one on the same inputs: packed rows of `rows` x `t`
/// tokens in `sequences` sequences of random lengths a row, `heads` query heads over
/// `kv_heads` key/value heads of `head_dim`, bf16 on `device`. Returns the largest
/// differences of the outputs and of the input gradients (each over the masked path's largest
/// magnitude) and each path's time of a forward and backward in seconds (the best of
/// `repeat`).
#[allow(clippy::too_many_arguments)]
pub fn compare_with_masked(
    device: Device,
    rows: i64,
    t: i64,
    sequences: i64,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    window: Option<i64>,
    repeat: usize,
) -> VarlenComparison {
    tch::manual_seed(3);
    // Each row cut at `sequences - 1` random points into sequences of their own positions.
    let mut positions = vec![];
    for _ in 0..rows {
        let cuts =
            Tensor::randperm(t - 1, (Kind::Int64, Device::Cpu)).narrow(0, 0, sequences - 1) + 1;
        let mut cuts = Vec::<i64>::try_from(cuts).expect("cut points");
        cuts.sort_unstable();
        let mut start = 0;
        for j in 0..t {
            if cuts.contains(&j) {
                start = j;
            }
            positions.push(j - start);
        }
    }
    let positions = Tensor::from_slice(&positions)
        .view([rows, t])
        .to_device(device);
    let bounds = SequenceBounds::of(&positions);
    let mut visible = super::mask::packed_attention_mask(&positions);
    if let Some(w) = window {
        let i = Tensor::arange(t, (Kind::Int64, device));
        visible = visible.logical_and(&i.unsqueeze(0).gt_tensor(&(i.unsqueeze(1) - w)));
    }
    let opts = (Kind::BFloat16, device);
    let q = Tensor::randn([rows, heads, t, head_dim], opts).set_requires_grad(true);
    let k = Tensor::randn([rows, kv_heads, t, head_dim], opts).set_requires_grad(true);
    let v = Tensor::randn([rows, kv_heads, t, head_dim], opts).set_requires_grad(true);
    let scale = 1.0 / (head_dim as f64).sqrt();
    let seed = Tensor::randn([rows, heads, t, head_dim], opts);
    let flash = || flash_varlen(&q, &k, &v, &bounds, scale, window);
    let masked = || {
        let repeat = heads / kv_heads;
        let (kr, vr) = (
            k.repeat_interleave_self_int(repeat, 1, None),
            v.repeat_interleave_self_int(repeat, 1, None),
        );
        Tensor::scaled_dot_product_attention(
            &q,
            &kr,
            &vr,
            Some(&visible),
            0.0,
            false,
            Some(scale),
            false,
        )
    };
    let leaves = [&q, &k, &v];
    let (out_f, grads_f, time_flash) =
        timed_forward_backward(device, repeat, &leaves, &seed, &flash);
    let (out_m, grads_m, time_masked) =
        timed_forward_backward(device, repeat, &leaves, &seed, &masked);
    let (output, gradients) = differences((&out_f, &grads_f), (&out_m, &grads_m));
    VarlenComparison {
        output,
        gradients,
        time_flash,
        time_masked,
        sequences: bounds.cumulative.size()[0] - 1,
        max_len: bounds.max_len,
    }
}

/// What [`compare_with_masked`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VarlenComparison {
    /// max |flash - masked| / max |masked| of the outputs.
    pub output: f64,
    /// ... the largest of the three input gradients'.
    pub gradients: f64,
    pub time_flash: f64,
    pub time_masked: f64,
    pub sequences: i64,
    pub max_len: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::packed_attention_mask;

    /// The bounds are the packed mask's sequences: two tokens attend to each other (the later
    /// to the earlier) exactly when they lie in one sequence of the bounds.
    #[test]
    fn bounds_are_the_packed_masks_sequences() {
        let positions = Tensor::from_slice2(&[
            [0i64, 1, 2, 0, 1, 0, 1, 2, 3, 0],
            [0, 1, 2, 3, 4, 5, 0, 1, 0, 0],
            [5, 6, 7, 0, 1, 2, 3, 9, 10, 11],
        ]);
        let b = SequenceBounds::of(&positions);
        let starts = Vec::<i32>::try_from(&b.cumulative).unwrap();
        assert_eq!(starts, [0, 3, 5, 9, 10, 16, 18, 19, 20, 23, 27, 30]);
        assert_eq!(b.max_len, 6);
        let mask = packed_attention_mask(&positions);
        let sequence_of = |i: i32| starts.iter().rposition(|s| *s <= i).unwrap();
        for r in 0..3i64 {
            for i in 0..10i64 {
                for j in 0..=i {
                    let (fi, fj) = ((r * 10 + i) as i32, (r * 10 + j) as i32);
                    let same = sequence_of(fi) == sequence_of(fj);
                    let visible = mask.int64_value(&[r, 0, i, j]) != 0;
                    assert_eq!(same, visible, "row {r}: query {i}, key {j}");
                }
            }
        }
    }

    /// On CUDA (opt-in: skipped without a GPU; the GPU proof runs the same comparison through
    /// `flotilla-train bench attention`), the variable-length kernel gives the masked path's
    /// output and input gradients, with grouped-query heads, with and without a window.
    #[test]
    fn flash_varlen_equals_the_masked_attention_on_cuda() {
        if crate::cuda::device_count() == 0 {
            eprintln!("flash_varlen_equals_the_masked_attention_on_cuda: no GPU, skipped");
            return;
        }
        for window in [None, Some(24)] {
            let c = compare_with_masked(Device::Cuda(0), 2, 128, 5, 8, 2, 64, window, 1);
            assert!(
                c.output < 2e-2 && c.gradients < 3e-2,
                "window {window:?}: {c:?}"
            );
        }
    }
}
