//! The layers every family is built from, each a plain function of tensors (no parameters of
//! its own, no knowledge of units or parallelism): [`norm`] (RMSNorm), [`rope`] (rotary
//! embeddings), [`mask`] (packed rows' attention mask), [`attention`] (causal scaled
//! dot-product attention with grouped-query heads), [`linear`] (projections with biases and
//! LoRA adapters), [`mlp`] (the gated MLP), [`moe`] (a mixture of experts' sparse MLP),
//! [`softcap`] (Gemma's soft-capping), [`varlen`] (packed rows by their sequences' bounds: flash
//! attention's variable lengths on CUDA); [`side_by_side`] runs a fast path beside its reference
//! for the benchmarks that check one. The decoder (`model/decoder/`) puts them together as a
//! family's style says. Numerics follow transformers': each function's docs name its original.

pub mod attention;
pub mod linear;
pub mod mask;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod side_by_side;
pub mod softcap;
pub mod varlen;
