//! How the fused head and next-token loss split a micro-batch's tokens into chunks: as few
//! equal chunks as keep each chunk's fp32 logits within a bound, the one rule the trainer and
//! the memory planner share.

use super::ModelConfig;

impl ModelConfig {
    /// Tokens a chunk of the next-token loss takes when the head and the loss are fused:
    /// `tokens` split into as few equal chunks as keep each chunk's fp32 logits within
    /// [`ModelConfig::LOSS_CHUNK_BYTES`]. Llama 3 8B's 16384 tokens of a 128256 vocabulary
    /// make the 32 chunks of Liger's fused linear cross-entropy (`ceil(vocab / hidden)`); a
    /// small vocabulary is not split where its whole logits are small (the chunks' products
    /// would be smaller and slower for no memory saved), and a large vocabulary over a small
    /// hidden size (Gemma 3 1B: 262144 over 1152) keeps chunks of 256 tokens where Liger's
    /// rule would cut 228 chunks.
    pub fn loss_chunk_rows(&self, tokens: usize) -> usize {
        let logits = tokens as u64 * self.vocab_size as u64 * 4;
        let chunks = logits.div_ceil(Self::LOSS_CHUNK_BYTES).max(1) as usize;
        tokens.div_ceil(chunks).max(1)
    }

    /// The most bytes of fp32 logits a chunk of the fused head and loss holds (256 MiB).
    pub const LOSS_CHUNK_BYTES: u64 = 256 << 20;
}

#[cfg(test)]
mod tests {
    use super::ModelConfig;

    fn model(vocab: usize, hidden: usize) -> ModelConfig {
        serde_yaml::from_str(&format!(
            "{{name: t, vocab_size: {vocab}, hidden_size: {hidden}, intermediate_size: 8, \
             num_hidden_layers: 1, num_attention_heads: 1, num_key_value_heads: 1, \
             max_position_embeddings: 8, rms_norm_eps: 1.0e-5, rope_theta: 10000.0, \
             rope_scaling: null, tie_word_embeddings: true, initializer_range: 0.02, \
             init_from: null}}"
        ))
        .unwrap()
    }

    /// Chunks of at most 256 MiB of fp32 logits: Liger's 32 chunks at Llama 3 8B's shape, one
    /// chunk for small logits, 256-token chunks for Gemma 3's vocabulary over a small hidden
    /// size, and never a chunk of no token.
    #[test]
    fn chunks_hold_at_most_256_mib_of_logits() {
        let llama_8b = model(128256, 4096);
        assert_eq!(llama_8b.loss_chunk_rows(16384), 16384 / 32);
        assert_eq!(model(4096, 512).loss_chunk_rows(1024), 1024);
        assert_eq!(model(262144, 1152).loss_chunk_rows(32768), 256);
        assert_eq!(model(262144, 1152).loss_chunk_rows(1), 1);
        assert_eq!(model(262144, 1152).loss_chunk_rows(0), 1);
        for tokens in [1usize, 255, 4097, 100_003] {
            let rows = llama_8b.loss_chunk_rows(tokens);
            assert!(
                rows as u64 * 128256 * 4 <= ModelConfig::LOSS_CHUNK_BYTES,
                "{tokens}"
            );
        }
    }
}
