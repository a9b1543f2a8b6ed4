//! Scratch memory of a CPU group's engine: one growable buffer, reused across operations, that
//! holds incoming chunks until they are reduced (and the partial sums of the out-of-place ring
//! reduce-scatter).

/// Reusable scratch memory, aligned for every element type.
#[derive(Default)]
pub(super) struct Scratch {
    /// `u64` words, so the memory is 8-byte aligned (no element type needs more).
    words: Vec<u64>,
}

impl Scratch {
    /// Room for `elems` elements of `T` (8-byte aligned), growing the buffer if needed. The
    /// pointer is valid for reads and writes of `elems` elements until the next call, which
    /// may move the buffer.
    pub(super) fn get<T>(&mut self, elems: usize) -> *mut T {
        let words = (elems * std::mem::size_of::<T>()).div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        self.words.as_mut_ptr() as *mut T
    }
}
