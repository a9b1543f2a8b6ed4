//! The attention mask of packed rows: several sequences laid end to end in one row, each
//! attending only to itself; and what a forward keeps of its packed rows ([`PackedRows`]: the
//! mask, built when a layer first needs it, and on CUDA the sequences' bounds that flash
//! attention takes instead).

use std::sync::Mutex;

use tch::{Kind, Tensor};

use super::varlen::SequenceBounds;

/// A packed batch's rows as a forward sees them: the `[B, 1, T, T]` mask keeping each sequence
/// to itself and the sequences' bounds, each built when a layer first needs it (a forward
/// that runs flash attention by sequence bounds in every layer never builds the mask; one
/// that runs the masked path never reads the positions to the host for the bounds).
#[derive(Debug)]
pub struct PackedRows {
    positions: Tensor,
    mask: Mutex<Option<Tensor>>,
    bounds: Mutex<Option<SequenceBounds>>,
}

impl PackedRows {
    /// The rows of position ids `positions` (`[B, T]`), with their sequences' bounds when the
    /// host already knows them.
    pub fn new(positions: &Tensor, bounds: Option<SequenceBounds>) -> Self {
        PackedRows {
            positions: positions.shallow_clone(),
            mask: Mutex::new(None),
            bounds: Mutex::new(bounds),
        }
    }

    /// The mask ([`packed_attention_mask`]).
    pub fn mask(&self) -> Tensor {
        self.mask
            .lock()
            .expect("packed mask lock")
            .get_or_insert_with(|| packed_attention_mask(&self.positions))
            .shallow_clone()
    }

    /// The sequences' bounds ([`SequenceBounds::of`]).
    pub fn bounds(&self) -> SequenceBounds {
        self.bounds
            .lock()
            .expect("packed bounds lock")
            .get_or_insert_with(|| SequenceBounds::of(&self.positions))
            .shallow_clone()
    }
}

/// The attention mask of packed rows, `[B, 1, T, T]` from position ids `[B, T]`: a position
/// that does not follow its predecessor by one starts a new sequence (as transformers'
/// `find_packed_sequence_indices`), and a query attends to the keys of its own sequence up to
/// itself.
pub fn packed_attention_mask(positions: &Tensor) -> Tensor {
    let t = positions.size()[1];
    let device = positions.device();
    let starts = (positions.narrow(1, 1, t - 1) - positions.narrow(1, 0, t - 1)).ne(1);
    let first = Tensor::zeros([positions.size()[0], 1], (Kind::Bool, device));
    let sequence = Tensor::cat(&[first, starts], 1).cumsum(1, Kind::Int64);
    let same = sequence.unsqueeze(2).eq_tensor(&sequence.unsqueeze(1));
    let causal = Tensor::ones([t, t], (Kind::Bool, device)).tril(0);
    same.logical_and(&causal).unsqueeze(1)
}
