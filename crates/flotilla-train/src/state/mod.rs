//! A model's tensors in and out of files, below the parallelism that uses them: where a rank's
//! starting weights come from, read by ranges ([`param_source`]: seeded, safetensors files,
//! in-memory tensors, overlays), Hugging Face model directories read and written
//! ([`hf_weights`], their weights split into shards as `save_pretrained` splits them:
//! [`hf_shards`]), LoRA adapters in PEFT's format ([`peft`]) and merged into their base ([`merge`]), and whole safetensors files
//! ([`whole_file`]). Checkpoints (which save a trainer) are `checkpoint/`'s.

pub mod hf_shards;
pub mod hf_weights;
pub mod merge;
pub mod param_source;
pub mod peft;
pub mod whole_file;
