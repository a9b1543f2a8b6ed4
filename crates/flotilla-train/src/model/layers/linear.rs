//! Linear projections: `x @ W.T`, with a bias where the architecture has one and PEFT's LoRA
//! update where a job adapts the weight ([`Projections`]).

use tch::Tensor;

use crate::model::ForwardCtx;

/// `x @ W.T`.
pub fn linear(x: &Tensor, w: &Tensor) -> Tensor {
    x.linear::<&Tensor>(w, None)
}

/// The projections of one block: for each of its weights (in the family's order), where its
/// bias and its LoRA factors sit in the block's parameter list.
#[derive(Clone, Debug)]
pub struct Projections {
    /// The block's index (its dropout masks are seeded by it).
    pub block: usize,
    /// For each weight, where its bias sits in the parameter list.
    pub biases: Vec<Option<usize>>,
    /// For each weight, where its LoRA `A` sits in the parameter list (`B` follows it).
    pub adapters: Vec<Option<usize>>,
    pub lora_scale: f64,
    pub lora_dropout: f64,
}

impl Projections {
    /// `x @ W.T` (`+ b` when weight `k` has a bias), plus PEFT's LoRA update `lora_B(lora_A(dropout(x))) * scale` when weight
    /// `k` is adapted. Dropout is applied only in training (a context with a dropout seed),
    /// seeded per block and weight so that a recomputed block draws the same mask.
    pub fn project(&self, params: &[Tensor], k: usize, x: &Tensor, ctx: &ForwardCtx) -> Tensor {
        let y = x.linear(&params[k], self.biases[k].map(|b| &params[b]));
        let Some(a) = self.adapters[k].filter(|_| !ctx.adapters_off) else {
            return y;
        };
        let dropped = match ctx.dropout_seed {
            Some(seed) if self.lora_dropout > 0.0 => {
                let weights = self.biases.len();
                tch::manual_seed(
                    seed.wrapping_add((self.block * weights + k) as u64 * 0x9E37_79B9) as i64,
                );
                x.dropout(self.lora_dropout, true)
            }
            _ => x.shallow_clone(),
        };
        y + linear(&linear(&dropped, &params[a]), &params[a + 1]) * self.lora_scale
    }
}
