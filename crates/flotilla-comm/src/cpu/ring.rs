//! The pipelined algorithms of the CPU backend, for large buffers: ring reduce-scatter and
//! ring all-gather (together, all_reduce) and a chain for broadcast, each in chunks so a rank
//! forwards chunk i while chunk i+1 is still arriving. The contract of these `unsafe fn`s is
//! the engine's (see `engine.rs`).
//!
//! A chunk handed to `send` is read by a writer thread until that send is done, so every
//! algorithm writes each piece of memory only before it queues it, or after `wait_sent`
//! returned for it: the comments at each `unsafe` block say which.

use super::engine::Engine;
use super::kernels::Kernel;
use crate::comm::{CommError, ReduceOp};

impl Engine {
    /// Ring reduce-scatter phase shared by all_reduce and in-place reduce_scatter: on return,
    /// segment `rank` of `buf` holds the reduction; with `forward_last`, its chunks are already
    /// queued to the right neighbour (the first all-gather step). Returns the send count to the
    /// right neighbour before that last step.
    ///
    /// Segment `rank - 1` is sent first and never written; step `s` receives segment
    /// `rank - 2 - s`, combines it chunk by chunk and forwards each chunk once combined, so
    /// every segment is written once, before it is queued.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of the segments `seg(0..n)`, which lie within it and
    /// do not overlap, lent to the engine.
    unsafe fn ring_rs_in_place<T: Kernel>(
        &mut self,
        buf: *mut T,
        seg: &dyn Fn(usize) -> (usize, usize),
        op: ReduceOp,
        forward_last: bool,
    ) -> Result<u64, CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let ce = self.chunk_elems::<T>();
        let scratch = self.scratch.get::<T>(ce);
        let (a, b) = seg((r + n - 1) % n);
        // SAFETY: segment `r - 1` of `buf`, which this phase never writes.
        unsafe { self.send(right, buf.add(a), b - a)? };
        let mut mark = self.issued(right);
        for s in 0..n - 1 {
            let last = s == n - 2;
            if last {
                mark = self.issued(right);
            }
            let (a, b) = seg((r + 2 * n - 2 - s) % n);
            let div = (last && op == ReduceOp::Avg).then_some(n);
            let mut i = a;
            while i < b {
                let m = ce.min(b - i);
                // SAFETY: `m <= ce` elements of the scratch, which is never sent.
                unsafe { self.recv(left, scratch, m)? };
                // SAFETY: chunk `i..i + m` of segment `(a, b)` of `buf`, not queued yet (it is
                // sent just below, after this write), and the scratch, engine memory disjoint
                // from `buf`.
                unsafe {
                    T::combine(
                        std::slice::from_raw_parts_mut(buf.add(i), m),
                        std::slice::from_raw_parts(scratch, m),
                        op,
                        div,
                    )
                };
                if !last || forward_last {
                    // SAFETY: the chunk just combined, which this phase never writes again.
                    unsafe { self.send(right, buf.add(i), m)? };
                }
                i += m;
            }
        }
        Ok(mark)
    }

    /// all_reduce of `buf` in place.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of `len` elements, lent to the engine.
    pub(super) unsafe fn ring_all_reduce<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let seg = move |i: usize| seg_bounds(len, n, i);
        // SAFETY: `seg_bounds` splits `0..len` into `n` consecutive segments.
        let mark = unsafe { self.ring_rs_in_place(buf, &seg, op, true)? };
        // The segments the all-gather overwrites were sent during the reduce-scatter.
        self.wait_sent((r + 1) % n, mark)?;
        // SAFETY: as above. The all-gather writes every segment but `r`; of the sends still
        // queued after `wait_sent`, all read segment `r`.
        unsafe { self.ring_ag_phase(buf, &seg)? };
        self.wait_all_sent()
    }

    /// reduce_scatter in place: `buf` holds `n * k` elements; afterwards segment `rank` holds
    /// this rank's reduced shard and the other segments are clobbered.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of `n * k` elements, lent to the engine.
    pub(super) unsafe fn ring_reduce_scatter_in_place<T: Kernel>(
        &mut self,
        buf: *mut T,
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let seg = move |i: usize| (i * k, (i + 1) * k);
        // SAFETY: for `i < n`, the segments `i * k..(i + 1) * k` tile `buf`'s `n * k` elements.
        unsafe { self.ring_rs_in_place(buf, &seg, op, false)? };
        self.wait_all_sent()
    }

    /// Out-of-place ring reduce-scatter: partial sums travel through two scratch segments,
    /// the last step lands in `out`; `input` is only read.
    ///
    /// # Safety
    /// `input` is valid for reads of `n * k` elements and `out`, disjoint from it, for reads
    /// and writes of `k`, both lent to the engine.
    pub(super) unsafe fn ring_reduce_scatter<T: Kernel>(
        &mut self,
        input: *const T,
        out: *mut T,
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let ce = self.chunk_elems::<T>();
        let slots = if n > 2 {
            self.scratch.get::<T>(2 * k)
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: segment `r - 1 < n` of `input`, which is never written.
        unsafe { self.send(right, input.add(((r + n - 1) % n) * k), k)? };
        let mut marks = [0u64; 2];
        for s in 0..n - 1 {
            let last = s == n - 2;
            let x = (r + 2 * n - 2 - s) % n;
            let dst = if last {
                out
            } else {
                // SAFETY: not the last step, so `n > 2` and `slots` holds `2 * k` elements;
                // slot `s % 2` is one of its two halves.
                unsafe { slots.add((s % 2) * k) }
            };
            if !last && s >= 2 {
                self.wait_sent(right, marks[s % 2])?;
            }
            let div = (last && op == ReduceOp::Avg).then_some(n);
            let mut i = 0;
            while i < k {
                let m = ce.min(k - i);
                // SAFETY: chunk `i..i + m` of `dst` (`k` elements): `out`, which is never sent,
                // or a scratch slot whose sends from step `s - 2` were waited for just above.
                unsafe { self.recv(left, dst.add(i), m)? };
                // SAFETY: the same chunk of `dst`, not queued yet; `dst` (the scratch or
                // `out`) and `input` are disjoint, and the chunk of segment `x < n` of `input`
                // is in bounds.
                unsafe {
                    T::combine(
                        std::slice::from_raw_parts_mut(dst.add(i), m),
                        std::slice::from_raw_parts(input.add(x * k + i), m),
                        op,
                        div,
                    )
                };
                if !last {
                    // SAFETY: the chunk just combined; its slot is written again only after
                    // `wait_sent` for `marks[s % 2]`, which counts this send.
                    unsafe { self.send(right, dst.add(i), m)? };
                }
                i += m;
            }
            if !last {
                marks[s % 2] = self.issued(right);
            }
        }
        self.wait_all_sent()
    }

    /// Ring all-gather steps after this rank's own segment has been queued to the right:
    /// step s receives segment (rank - s - 1) from the left straight into place and forwards it.
    /// Every segment but `rank` is written, once, before it is queued.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of the segments `seg(0..n)`, which lie within it and
    /// do not overlap, lent to the engine; every send still pending when it is called reads
    /// segment `rank` only.
    unsafe fn ring_ag_phase<T: Kernel>(
        &mut self,
        buf: *mut T,
        seg: &dyn Fn(usize) -> (usize, usize),
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let ce = self.chunk_elems::<T>();
        for s in 0..n - 1 {
            let (a, b) = seg((r + 2 * n - 1 - s) % n);
            let mut i = a;
            while i < b {
                let m = ce.min(b - i);
                // SAFETY: chunk `i..i + m` of segment `r - s - 1 != r` of `buf`, not queued
                // yet (pending sends read segment `r` or chunks received earlier).
                unsafe { self.recv(left, buf.add(i), m)? };
                if s < n - 2 {
                    // SAFETY: the chunk just received, which this phase never writes again.
                    unsafe { self.send(right, buf.add(i), m)? };
                }
                i += m;
            }
        }
        Ok(())
    }

    /// all_gather in place: `out` holds `n * k` elements, this rank's at `rank * k`.
    ///
    /// # Safety
    /// `out` is valid for reads and writes of `n * k` elements, lent to the engine.
    pub(super) unsafe fn ring_all_gather<T: Kernel>(
        &mut self,
        out: *mut T,
        k: usize,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        // SAFETY: segment `r < n` of `out`, which the all-gather phase does not write.
        unsafe { self.send((r + 1) % n, out.add(r * k), k)? };
        let seg = move |i: usize| (i * k, (i + 1) * k);
        // SAFETY: for `i < n`, the segments tile `out`'s `n * k` elements; the one send queued
        // so far reads segment `r`.
        unsafe { self.ring_ag_phase(out, &seg)? };
        self.wait_all_sent()
    }

    /// Pipelined chain from `root` around the ring.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of `len` elements, lent to the engine.
    pub(super) unsafe fn chain_broadcast<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        root: usize,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let pos = (r + n - root) % n;
        if pos == 0 {
            // SAFETY: the root only reads `buf`.
            unsafe { self.send(right, buf, len)? };
        } else {
            let ce = self.chunk_elems::<T>();
            let mut i = 0;
            while i < len {
                let m = ce.min(len - i);
                // SAFETY: chunk `i..i + m` of `buf`, not queued yet (earlier sends read
                // earlier chunks).
                unsafe { self.recv(left, buf.add(i), m)? };
                if pos < n - 1 {
                    // SAFETY: the chunk just received, which is never written again.
                    unsafe { self.send(right, buf.add(i), m)? };
                }
                i += m;
            }
        }
        self.wait_all_sent()
    }
}

/// Bounds of segment `i` when `len` elements are split into `n` nearly equal segments.
fn seg_bounds(len: usize, n: usize, i: usize) -> (usize, usize) {
    let at = |j: usize| ((j as u128 * len as u128) / n as u128) as usize;
    (at(i), at(i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer() {
        for len in [1usize, 2, 3, 7, 10, 1001] {
            for n in 1..=5 {
                let mut next = 0;
                for i in 0..n {
                    let (a, b) = seg_bounds(len, n, i);
                    assert_eq!(a, next);
                    assert!(b >= a && b - a <= len / n + 1);
                    next = b;
                }
                assert_eq!(next, len);
            }
        }
    }
}
