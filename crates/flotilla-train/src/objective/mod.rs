//! The objective: what turns a forward's logits and a batch into the loss the engine
//! differentiates and the trainer reports. Today that is next-token cross-entropy
//! ([`next_token`]), the loss of supervised fine-tuning and pre-training; the engine sums it per
//! micro-batch and divides by the global batch's labelled tokens.

pub mod next_token;

pub use next_token::next_token_loss_sum;
