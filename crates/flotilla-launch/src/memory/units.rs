//! The parameter elements of the model's units ([`Units`]): what each unit owns, reads and
//! trains, and its largest tensor, for every family, a mixture's routers, experts and their
//! LoRA adapters included. The step's memory model (`model.rs`) prices them.

use flotilla_config::schema::{JobConfig, LoraModule, SavedModule};

/// The parameter elements of the model's units: what each owns and reads, and its largest
/// tensor (`flotilla-train`'s `model/llama.rs`: the embedding, the blocks with their attention
/// biases, the final norm with the head; a tied head reads the embedding's weight).
#[derive(Clone, Debug, PartialEq)]
pub struct Units {
    pub owned: Vec<u64>,
    pub reads: Vec<u64>,
    pub largest: Vec<u64>,
    /// What each unit owns that is trained: everything, or for a LoRA job its adapters and
    /// modules to save (the rest is the frozen base).
    pub trained: Vec<u64>,
    /// The largest trained tensor.
    pub largest_trained: u64,
}

impl Units {
    pub fn of(job: &JobConfig) -> Self {
        let m = &job.model;
        let (h, inter, vocab) = (
            m.hidden_size as u64,
            m.intermediate_size as u64,
            m.vocab_size as u64,
        );
        let q = (m.num_attention_heads * m.head_dim()) as u64;
        let kv = (m.num_key_value_heads * m.head_dim()) as u64;
        // Norms (two a block, Gemma's four, per-head q/k norms), projections, the attention
        // biases the architecture has (Qwen2's q/k/v), and the MLP: a dense one, or a sparse
        // layer's router and all its experts.
        let attention =
            m.block_norm_elements() + 2 * q * h + 2 * kv * h + m.attention_biases().elements(m);
        let embed = vocab * h;
        let head = h + if m.tie_word_embeddings { 0 } else { embed };
        let layers = m.num_hidden_layers;
        let mut owned = vec![embed];
        owned.extend((0..layers).map(|i| attention + m.mlp_elements(i)));
        owned.push(head);
        let mut reads = owned.clone();
        if m.tie_word_embeddings {
            *reads.last_mut().expect("a head unit") += embed;
        }
        let mut largest = vec![embed];
        largest.extend((0..layers).map(|i| {
            match &m.moe {
                Some(moe) if m.layer_is_sparse(i) => (q * h)
                    .max(m.expert_intermediate_size() as u64 * h)
                    .max(moe.num_experts as u64 * h),
                _ => (q * h).max(inter * h),
            }
        }));
        largest.push(if m.tie_word_embeddings { h } else { embed });
        let Some(lora) = job.peft.lora() else {
            let largest_trained = *largest.iter().max().unwrap_or(&0);
            return Self {
                trained: owned.clone(),
                owned,
                reads,
                largest,
                largest_trained,
            };
        };
        // LoRA (`Llama::with_lora`): A [r, in] and B [out, r] per adapted layer of a block.
        // A mixture's MLP modules are adapted in its sparse layers only, as PEFT adapts
        // transformers 5's fused experts: gate_up A [2r·E, h], B [2·I, 2r·E]; down A [r·E, I],
        // B [h, r·E]; the router A [r, h], B [E, r]. Its dense layers keep their MLP as it is.
        let r = lora.r as u64;
        let (mut adapter, mut attention_adapter, mut largest_factor) = (0, 0, 0);
        for t in lora.targets(m) {
            let (inp, out) = match t {
                LoraModule::QProj => (h, q),
                LoraModule::QkvProj => (h, q + 2 * kv),
                LoraModule::GateUpProj => (h, 2 * inter),
                LoraModule::KProj | LoraModule::VProj => (h, kv),
                LoraModule::OProj => (q, h),
                LoraModule::GateProj | LoraModule::UpProj => (h, inter),
                LoraModule::DownProj | LoraModule::AllLinear => (inter, h),
                // A mixture's: counted below.
                LoraModule::W1 | LoraModule::W2 | LoraModule::W3 | LoraModule::Router => continue,
            };
            if !t.in_mlp() {
                attention_adapter += r * (inp + out);
            }
            if !m.is_moe() || !t.in_mlp() {
                adapter += r * (inp + out);
                largest_factor = largest_factor.max(r * inp.max(out));
            }
        }
        let mut sparse_adapter = attention_adapter;
        if let Some(moe) = &m.moe {
            let on = lora.expert_targets(m);
            let (e, ie) = (moe.num_experts as u64, m.expert_intermediate_size() as u64);
            let mut factor = |on: bool, a: u64, b: u64| {
                if on {
                    sparse_adapter += a + b;
                    largest_factor = largest_factor.max(a.max(b));
                }
            };
            let r2 = lora.gate_up_rank() as u64;
            factor(on.gate_up, r2 * e * h, 2 * ie * r2 * e);
            factor(on.down, r * e * ie, h * r * e);
            factor(on.router, r * h, e * r);
        }
        let adapters: Vec<u64> = (0..layers)
            .map(|i| {
                if m.layer_is_sparse(i) {
                    sparse_adapter
                } else {
                    adapter
                }
            })
            .collect();
        let saved = |s: SavedModule| lora.modules_to_save.contains(&s);
        let mut trained = vec![if saved(SavedModule::EmbedTokens) {
            embed
        } else {
            0
        }];
        trained.extend(adapters.iter().copied());
        trained.push(if saved(SavedModule::LmHead) && !m.tie_word_embeddings {
            embed
        } else {
            0
        });
        for u in 1..=layers {
            owned[u] += adapters[u - 1];
            reads[u] += adapters[u - 1];
        }
        let largest_trained = if trained[0] + trained[layers + 1] > 0 {
            embed.max(largest_factor)
        } else {
            largest_factor
        };
        Self {
            owned,
            reads,
            largest,
            trained,
            largest_trained,
        }
    }

    pub fn total(&self) -> u64 {
        self.owned.iter().sum()
    }

    /// Trained elements of the whole model.
    pub fn trained_total(&self) -> u64 {
        self.trained.iter().sum()
    }

    /// Units in forward order: the embedding, the blocks, the head.
    pub fn count(&self) -> usize {
        self.owned.len()
    }
}
