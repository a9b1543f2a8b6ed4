//! The attention mask of packed rows: several sequences laid end to end in one row, each
//! attending only to itself.

use tch::{Kind, Tensor};

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
