//! The direct-exchange algorithms of the CPU backend, for small buffers and barriers: every
//! rank sends its data to every peer at once and reduces all contributions in rank order (one
//! round trip, the same result bits on every rank). The contract of these `unsafe fn`s is the
//! engine's (see `engine.rs`).

use super::engine::Engine;
use super::kernels::{reduce_ordered, Kernel};
use crate::comm::{CommError, ReduceOp};

static BARRIER_TOKEN: [u8; 1] = [0xB7];

impl Engine {
    /// Sends a token to every peer and waits for theirs.
    pub(super) fn barrier(&mut self) -> Result<(), CommError> {
        let mut got = [0u8; 1];
        for q in 0..self.n {
            if q != self.rank {
                // SAFETY: one byte of a static that is never written.
                unsafe { self.send(q, BARRIER_TOKEN.as_ptr(), 1)? };
            }
        }
        for q in 0..self.n {
            if q != self.rank {
                // SAFETY: one byte of a local that nothing else reads or writes.
                unsafe { self.recv(q, got.as_mut_ptr(), 1)? };
            }
        }
        self.wait_all_sent()
    }

    /// Scratch slot of peer `q` when every peer's `len` elements are received at once.
    fn slot_index(&self, q: usize) -> usize {
        if q < self.rank {
            q
        } else {
            q - 1
        }
    }

    /// all_reduce of `buf` in place.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of `len` elements, lent to the engine.
    pub(super) unsafe fn direct_all_reduce<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: `buf` holds `len` elements, and is not written before `wait_all_sent`.
            unsafe { self.send(q, buf, len)? };
        }
        let scratch = self.scratch.get::<T>((n - 1) * len);
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: `slot_index(q) < n - 1`, so the slot lies within the `(n - 1) * len`
            // scratch elements; each peer has its own slot, and no send reads the scratch.
            unsafe { self.recv(q, scratch.add(self.slot_index(q) * len), len)? };
        }
        self.wait_all_sent()?;
        let srcs: Vec<*const T> = (0..n)
            .map(|q| {
                if q == r {
                    buf as *const T
                } else {
                    // SAFETY: a slot within the scratch, as above.
                    unsafe { scratch.add(self.slot_index(q) * len) as *const T }
                }
            })
            .collect();
        // SAFETY: every source holds `len` elements (`buf` or a scratch slot) and `out` is
        // `buf`, one of them, which `reduce_ordered` allows; every send is done, so nothing
        // else reads `buf` while it is written.
        unsafe { reduce_ordered(&srcs, buf, len, op) };
        Ok(())
    }

    /// reduce_scatter of `input` (`n * k` elements) into `out` (`k`), which is either disjoint
    /// from `input` or is `input + rank * k` (in place).
    ///
    /// # Safety
    /// `input` is valid for reads of `n * k` elements and `out` for reads and writes of `k`,
    /// lent to the engine.
    pub(super) unsafe fn direct_reduce_scatter<T: Kernel>(
        &mut self,
        input: *const T,
        out: *mut T,
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: segment `q < n` of `input` (`n * k` elements), not written before
            // `wait_all_sent` (only `out`, segment `r`, is written, and only after it).
            unsafe { self.send(q, input.add(q * k), k)? };
        }
        let scratch = self.scratch.get::<T>((n - 1) * k);
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: `slot_index(q) < n - 1`, so the slot lies within the `(n - 1) * k`
            // scratch elements; each peer has its own slot, and no send reads the scratch.
            unsafe { self.recv(q, scratch.add(self.slot_index(q) * k), k)? };
        }
        self.wait_all_sent()?;
        let srcs: Vec<*const T> = (0..n)
            .map(|q| {
                // SAFETY: segment `r < n` of `input`, or a slot within the scratch.
                unsafe {
                    if q == r {
                        input.add(r * k)
                    } else {
                        scratch.add(self.slot_index(q) * k) as *const T
                    }
                }
            })
            .collect();
        // SAFETY: every source holds `k` elements; `out` is either disjoint from them or is
        // `input + r * k` (in place), one of them, which `reduce_ordered` allows; every send
        // is done, so nothing else reads `out` while it is written.
        unsafe { reduce_ordered(&srcs, out, k, op) };
        Ok(())
    }

    /// all_gather in place: `out` holds `n * k` elements, this rank's at `rank * k`.
    ///
    /// # Safety
    /// `out` is valid for reads and writes of `n * k` elements, lent to the engine.
    pub(super) unsafe fn direct_all_gather<T: Kernel>(
        &mut self,
        out: *mut T,
        k: usize,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        // SAFETY: `r < n`, so segment `r` lies within `out`'s `n * k` elements.
        let own = unsafe { out.add(r * k) };
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: segment `r` of `out`, which no receive below writes.
            unsafe { self.send(q, own, k)? };
        }
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: segment `q < n`, `q != r`, of `out`: disjoint from the one being sent
            // and from the other peers' segments.
            unsafe { self.recv(q, out.add(q * k), k)? };
        }
        self.wait_all_sent()
    }

    /// broadcast of `buf` from `root`.
    ///
    /// # Safety
    /// `buf` is valid for reads and writes of `len` elements, lent to the engine.
    pub(super) unsafe fn direct_broadcast<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        root: usize,
    ) -> Result<(), CommError> {
        if self.rank == root {
            for q in (0..self.n).filter(|&q| q != root) {
                // SAFETY: the root only reads `buf`.
                unsafe { self.send(q, buf, len)? };
            }
            self.wait_all_sent()
        } else {
            // SAFETY: other ranks only write `buf`, and send nothing from it.
            unsafe { self.recv(root, buf, len) }
        }
    }
}
