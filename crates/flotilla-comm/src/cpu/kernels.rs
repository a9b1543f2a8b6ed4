//! Reduction kernels of the CPU backend, per element type: combining two buffers, and
//! reducing many sources in rank order. bf16 and f16 are combined in f32 and rounded once per
//! combination, as NCCL does; i64 sums wrap.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::comm::{Element, ReduceOp};

/// `out = srcs[0] ∘ srcs[1] ∘ … ∘ srcs[n-1]` in that order (accumulating in f32 for the half
/// types); `out` may be one of the sources.
///
/// # Safety
/// Every source is valid for reads of `len` elements and `out` for writes of `len`; `out` is
/// either disjoint from every source or equal to one of them; nothing else writes them during
/// the call.
pub(super) unsafe fn reduce_ordered<T: Kernel>(
    srcs: &[*const T],
    out: *mut T,
    len: usize,
    op: ReduceOp,
) {
    const B: usize = 512;
    let mut acc = [T::Acc::default(); B];
    let mut tmp = [T::Acc::default(); B];
    let mut i = 0;
    while i < len {
        let m = B.min(len - i);
        // SAFETY: block `i..i + m` lies within the `len` elements of every source and of `out`.
        // The shared slices of the sources are temporaries that end before the mutable slice
        // of `out` is made, so `out` may be one of the sources.
        unsafe {
            T::to_acc(std::slice::from_raw_parts(srcs[0].add(i), m), &mut acc[..m]);
            for s in &srcs[1..] {
                T::to_acc(std::slice::from_raw_parts(s.add(i), m), &mut tmp[..m]);
                T::acc_combine(&mut acc[..m], &tmp[..m], op);
            }
            if op == ReduceOp::Avg {
                T::acc_div(&mut acc[..m], srcs.len());
            }
            T::from_acc(&acc[..m], std::slice::from_raw_parts_mut(out.add(i), m));
        }
        i += m;
    }
}

/// Arithmetic the CPU backend needs per element type.
pub(super) trait Kernel: Element {
    /// Accumulator type: f32 for the half types, the type itself otherwise.
    type Acc: Copy + Default;
    fn to_acc(src: &[Self], dst: &mut [Self::Acc]);
    fn from_acc(src: &[Self::Acc], dst: &mut [Self]);
    fn acc_combine(acc: &mut [Self::Acc], other: &[Self::Acc], op: ReduceOp);
    fn acc_div(acc: &mut [Self::Acc], n: usize);

    /// `acc = acc ∘ other`, then divided by `div` if given (the last step of an average).
    fn combine(acc: &mut [Self], other: &[Self], op: ReduceOp, div: Option<usize>) {
        const B: usize = 1024;
        let mut a = [Self::Acc::default(); B];
        let mut b = [Self::Acc::default(); B];
        for (ac, oc) in acc.chunks_mut(B).zip(other.chunks(B)) {
            let m = ac.len();
            Self::to_acc(ac, &mut a[..m]);
            Self::to_acc(oc, &mut b[..m]);
            Self::acc_combine(&mut a[..m], &b[..m], op);
            if let Some(n) = div {
                Self::acc_div(&mut a[..m], n);
            }
            Self::from_acc(&a[..m], ac);
        }
    }
}

fn combine_f32(acc: &mut [f32], other: &[f32], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b),
        // NaN propagates, as in torch.
        ReduceOp::Max => acc.iter_mut().zip(other).for_each(|(a, &b)| {
            if b > *a || b.is_nan() {
                *a = b
            }
        }),
        ReduceOp::Min => acc.iter_mut().zip(other).for_each(|(a, &b)| {
            if b < *a || b.is_nan() {
                *a = b
            }
        }),
    }
}

impl Kernel for f32 {
    type Acc = f32;
    fn to_acc(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn from_acc(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn acc_combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        combine_f32(acc, other, op)
    }
    fn acc_div(acc: &mut [f32], n: usize) {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d)
    }
    fn combine(acc: &mut [f32], other: &[f32], op: ReduceOp, div: Option<usize>) {
        match div {
            Some(n) if matches!(op, ReduceOp::Sum | ReduceOp::Avg) => {
                let d = n as f32;
                acc.iter_mut()
                    .zip(other)
                    .for_each(|(a, b)| *a = (*a + *b) / d)
            }
            _ => {
                combine_f32(acc, other, op);
                if let Some(n) = div {
                    Self::acc_div(acc, n)
                }
            }
        }
    }
}

impl Kernel for i64 {
    type Acc = i64;
    fn to_acc(src: &[i64], dst: &mut [i64]) {
        dst.copy_from_slice(src)
    }
    fn from_acc(src: &[i64], dst: &mut [i64]) {
        dst.copy_from_slice(src)
    }
    fn acc_combine(acc: &mut [i64], other: &[i64], op: ReduceOp) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = a.wrapping_add(*b)),
            ReduceOp::Max => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = (*a).max(*b)),
            ReduceOp::Min => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = (*a).min(*b)),
        }
    }
    fn acc_div(acc: &mut [i64], n: usize) {
        let d = n as i64;
        acc.iter_mut().for_each(|a| *a /= d)
    }
    fn combine(acc: &mut [i64], other: &[i64], op: ReduceOp, div: Option<usize>) {
        Self::acc_combine(acc, other, op);
        if let Some(n) = div {
            Self::acc_div(acc, n)
        }
    }
}

/// f32 → bf16, round to nearest even, NaN kept quiet (same bits as `half::bf16::from_f32`).
#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

impl Kernel for bf16 {
    type Acc = f32;
    fn to_acc(src: &[bf16], dst: &mut [f32]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = f32::from_bits((s.to_bits() as u32) << 16))
    }
    fn from_acc(src: &[f32], dst: &mut [bf16]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16::from_bits(f32_to_bf16_bits(s)))
    }
    fn acc_combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        combine_f32(acc, other, op)
    }
    fn acc_div(acc: &mut [f32], n: usize) {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d)
    }
}

impl Kernel for f16 {
    type Acc = f32;
    fn to_acc(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn from_acc(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src)
    }
    fn acc_combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        combine_f32(acc, other, op)
    }
    fn acc_div(acc: &mut [f32], n: usize) {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let samples = [
            0.0f32,
            -0.0,
            1.0,
            1.003_906_3,
            1.0039063,
            1.234_567_8e-3,
            -2.5e-39,
            65504.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for &x in &samples {
            assert_eq!(f32_to_bf16_bits(x), bf16::from_f32(x).to_bits(), "{x}");
        }
        let mut s = 0x1234_5678u32;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            if x.is_nan() {
                assert!(bf16::from_bits(f32_to_bf16_bits(x)).is_nan());
            } else {
                assert_eq!(f32_to_bf16_bits(x), bf16::from_f32(x).to_bits(), "{x}");
            }
        }
    }

    #[test]
    fn kernels_combine_in_f32() {
        let mut a: Vec<bf16> = [1.0f32, 2.0, -3.0, 0.5]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        let b: Vec<bf16> = [1.0f32, 5.0, 4.0, 0.25]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        bf16::combine(&mut a, &b, ReduceOp::Avg, Some(2));
        let got: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, vec![1.0, 3.5, 0.5, 0.375]);
        let mut h: Vec<f16> = [1.0f32, -7.0].iter().map(|&x| f16::from_f32(x)).collect();
        f16::combine(
            &mut h,
            &[f16::from_f32(2.0), f16::from_f32(-9.0)],
            ReduceOp::Min,
            None,
        );
        assert_eq!(h[0].to_f32(), 1.0);
        assert_eq!(h[1].to_f32(), -9.0);
        let mut x = vec![1.0f32, f32::NAN];
        f32::combine(&mut x, &[f32::NAN, 0.0], ReduceOp::Max, None);
        assert!(x[0].is_nan() && x[1].is_nan());
        let mut i = vec![7i64, -7];
        i64::combine(&mut i, &[2, 0], ReduceOp::Avg, Some(2));
        assert_eq!(i, vec![4, -3]);
    }

    #[test]
    fn reduce_ordered_accumulates_halves_in_f32() {
        // bf16 has 8 significant bits: 256 + 1 rounds back to 256, so pairwise bf16 sums give
        // 256 + 1 + 1 = 256; accumulated in f32 the result is 258 (exact in bf16).
        let a = [bf16::from_f32(256.0)];
        let b = [bf16::from_f32(1.0)];
        let c = [bf16::from_f32(1.0)];
        let mut out = [bf16::ZERO];
        let srcs = [a.as_ptr(), b.as_ptr(), c.as_ptr()];
        // SAFETY: every source and `out` hold one element, and `out` is none of the sources.
        unsafe { reduce_ordered(&srcs, out.as_mut_ptr(), 1, ReduceOp::Sum) };
        assert_eq!(out[0].to_f32(), 258.0);
        let mut pairwise = a;
        bf16::combine(&mut pairwise, &b, ReduceOp::Sum, None);
        bf16::combine(&mut pairwise, &c, ReduceOp::Sum, None);
        assert_eq!(pairwise[0].to_f32(), 256.0);
    }
}
