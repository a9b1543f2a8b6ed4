//! The key/value cache of generation: each block's keys and values of the positions a model
//! has seen, so that a prompt runs once and every new token attends to them.

use tch::Tensor;

use super::CausalLm;

/// The keys and values of the positions a model has seen, per block, for
/// [`CausalLm::forward_cached`]: each block's `[B, kv_heads, capacity, head_dim]` buffers,
/// allocated at its first forward in the dtype and on the device of its keys.
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    pub(super) capacity: i64,
    pub(super) len: i64,
}

impl KvCache {
    /// An empty cache for `capacity` positions (the prompt and every token to generate).
    pub fn new(model: &CausalLm, capacity: usize) -> Self {
        KvCache {
            layers: (0..model.config().num_hidden_layers)
                .map(|_| None)
                .collect(),
            capacity: capacity as i64,
            len: 0,
        }
    }

    /// The positions seen so far.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Writes block `layer`'s keys and values of the new positions after the cached ones and
    /// returns views of all of them.
    pub(super) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let (start, t) = (self.len, k.size()[2]);
        let capacity = self.capacity;
        let (kc, vc) = self.layers[layer].get_or_insert_with(|| {
            let mut shape = k.size();
            shape[2] = capacity;
            let buffer = || Tensor::zeros(shape.as_slice(), (k.kind(), k.device()));
            (buffer(), buffer())
        });
        kc.narrow(2, start, t).copy_(k);
        vc.narrow(2, start, t).copy_(v);
        (kc.narrow(2, 0, start + t), vc.narrow(2, 0, start + t))
    }
}
