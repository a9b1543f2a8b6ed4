//! Freeing and re-allocating a tensor's storage in place, through the C++ shim
//! `csrc/storage.cpp` (compiled by `build.rs` against libtorch's headers). FSDP's FULL_SHARD
//! frees a gathered parameter group while the autograd graph still holds views of it, then
//! gathers into the same storage before the backward that reads it. Between the two, reading
//! any view of the storage is undefined: only the strategy that owns the buffer may call these.
//! [`storage_address`] and [`held_bytes`] only read: memory accounting counts distinct storages
//! with them.

use std::ffi::{c_int, c_void};

use tch::Tensor;

use crate::error::TrainError;

extern "C" {
    fn flotilla_storage_free(tensor: *const c_void) -> c_int;
    fn flotilla_storage_alloc(tensor: *const c_void, nbytes: usize) -> c_int;
    fn flotilla_storage_nbytes(tensor: *const c_void) -> usize;
    fn flotilla_storage_data(tensor: *const c_void) -> *const c_void;
}

fn check(op: &str, code: c_int) -> Result<(), TrainError> {
    match code {
        0 => Ok(()),
        1 => Err(TrainError::BadState(format!(
            "{op}: the tensor has no storage of its own"
        ))),
        _ => Err(TrainError::BadState(format!(
            "{op}: libtorch raised an exception"
        ))),
    }
}

/// Releases the memory of `t`'s storage; every view of it becomes unreadable until
/// [`realloc`].
pub fn free(t: &Tensor) -> Result<(), TrainError> {
    // SAFETY: `t` is a live tch tensor handle (a pointer to an at::Tensor).
    check("storage free", unsafe {
        flotilla_storage_free(t.as_ptr() as *const c_void)
    })
}

/// Gives `t`'s storage fresh (uninitialised) memory for `t`'s elements, if it was freed. `t`
/// must span its whole storage from offset 0 (a tensor made by `empty`).
pub fn realloc(t: &Tensor) -> Result<(), TrainError> {
    let nbytes = t.numel() * t.kind().elt_size_in_bytes();
    // SAFETY: as in `free`.
    check("storage alloc", unsafe {
        flotilla_storage_alloc(t.as_ptr() as *const c_void, nbytes)
    })
}

/// Bytes `t`'s storage holds now (0 once freed).
pub fn held_bytes(t: &Tensor) -> usize {
    // SAFETY: as in `free`.
    let n = unsafe { flotilla_storage_nbytes(t.as_ptr() as *const c_void) };
    if n == usize::MAX {
        0
    } else {
        n
    }
}

/// The address of `t`'s storage (the start of its memory, whatever `t`'s offset into it), or
/// `None` without storage or once freed: tensors sharing a storage give the same address.
pub fn storage_address(t: &Tensor) -> Option<usize> {
    // SAFETY: as in `free`.
    let p = unsafe { flotilla_storage_data(t.as_ptr() as *const c_void) };
    (!p.is_null()).then_some(p as usize)
}

/// Bytes of the distinct storages behind `tensors` (each storage counted once, however many
/// tensors view it).
pub fn distinct_storage_bytes<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> usize {
    let mut seen = std::collections::HashSet::new();
    tensors
        .into_iter()
        .filter(|t| storage_address(t).is_some_and(|a| seen.insert(a)))
        .map(held_bytes)
        .sum()
}
