//! The one mapping between the architecture's parameters and transformers' weight names:
//! [`ParamName`] (a parameter of any family's `*ForCausalLM`: they share their names, each
//! family with its own subset of a block's weights), [`LayerWeight`] (a weight of one
//! decoder layer) and a sparse layer's router and stacked experts ([`MoeNames`],
//! [`ExpertProj`]), with their Hugging Face names and the parsing of those names; and a
//! parameter's tensors in a Hugging Face weights file ([`file_tensors_of`]: itself, or a
//! stacked expert parameter's per-expert tensors, as `save_pretrained` writes them). The
//! decoder (`decoder/`) builds its parameter table from them and the Hugging Face format
//! (`state/`) reads and writes files under them; this module depends on neither.

/// The weights of one decoder layer, in the order a block unit takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerWeight {
    InputNorm,
    Q,
    K,
    V,
    O,
    PostAttentionNorm,
    Gate,
    Up,
    Down,
    /// Qwen3's and Gemma 3's per-head norm of the queries (`[head_dim]`).
    QNorm,
    /// ... and of the keys.
    KNorm,
    /// Gemma's norm of the MLP's input (its `post_attention_layernorm` norms the attention's
    /// output).
    PreFeedforwardNorm,
    /// Gemma's norm of the MLP's output.
    PostFeedforwardNorm,
    /// Phi-3's fused q/k/v projection (`[(heads + 2 kv_heads) head_dim, hidden]`).
    Qkv,
    /// Phi-3's fused gate and up projection (`[2 intermediate, hidden]`).
    GateUp,
}

impl LayerWeight {
    /// Every layer weight of every family.
    pub const ALL: [LayerWeight; 15] = [
        LayerWeight::InputNorm,
        LayerWeight::Q,
        LayerWeight::K,
        LayerWeight::V,
        LayerWeight::O,
        LayerWeight::PostAttentionNorm,
        LayerWeight::Gate,
        LayerWeight::Up,
        LayerWeight::Down,
        LayerWeight::QNorm,
        LayerWeight::KNorm,
        LayerWeight::PreFeedforwardNorm,
        LayerWeight::PostFeedforwardNorm,
        LayerWeight::Qkv,
        LayerWeight::GateUp,
    ];

    /// The weights of a Llama block, in the order its unit takes them (other families add
    /// theirs after these).
    pub const LLAMA: [LayerWeight; 9] = [
        LayerWeight::InputNorm,
        LayerWeight::Q,
        LayerWeight::K,
        LayerWeight::V,
        LayerWeight::O,
        LayerWeight::PostAttentionNorm,
        LayerWeight::Gate,
        LayerWeight::Up,
        LayerWeight::Down,
    ];

    /// The module under `model.layers.{i}.` (`self_attn.q_proj`): the weight's name without
    /// `.weight`.
    pub fn module(self) -> &'static str {
        let s = self.suffix();
        s.strip_suffix(".weight").unwrap_or(s)
    }

    /// The name under `model.layers.{i}.`.
    pub fn suffix(self) -> &'static str {
        match self {
            LayerWeight::InputNorm => "input_layernorm.weight",
            LayerWeight::Q => "self_attn.q_proj.weight",
            LayerWeight::K => "self_attn.k_proj.weight",
            LayerWeight::V => "self_attn.v_proj.weight",
            LayerWeight::O => "self_attn.o_proj.weight",
            LayerWeight::PostAttentionNorm => "post_attention_layernorm.weight",
            LayerWeight::Gate => "mlp.gate_proj.weight",
            LayerWeight::Up => "mlp.up_proj.weight",
            LayerWeight::Down => "mlp.down_proj.weight",
            LayerWeight::QNorm => "self_attn.q_norm.weight",
            LayerWeight::KNorm => "self_attn.k_norm.weight",
            LayerWeight::PreFeedforwardNorm => "pre_feedforward_layernorm.weight",
            LayerWeight::PostFeedforwardNorm => "post_feedforward_layernorm.weight",
            LayerWeight::Qkv => "self_attn.qkv_proj.weight",
            LayerWeight::GateUp => "mlp.gate_up_proj.weight",
        }
    }
}

/// How a family names its sparse MLP's weights in the Hub's files (per expert, as
/// `save_pretrained` writes them whatever layout transformers keeps in memory). In memory the
/// experts are stacked, as transformers 5 keeps them: `{block}.experts.gate_up_proj`
/// (`[experts, 2 moe_intermediate, hidden]`, each expert's gate rows then its up rows) and
/// `{block}.experts.down_proj` (`[experts, hidden, moe_intermediate]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeNames {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up), `w2` (down).
    Mixtral,
    /// `mlp.gate`, `mlp.experts.{e}.gate_proj`, `up_proj`, `down_proj`.
    Qwen,
}

/// One projection of an expert's SwiGLU MLP, as a Hub file names it per expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertWeight {
    Gate,
    Up,
    Down,
}

impl ExpertWeight {
    pub const ALL: [ExpertWeight; 3] = [ExpertWeight::Gate, ExpertWeight::Up, ExpertWeight::Down];
}

/// One tensor of a Hugging Face weights file that holds (part of) a parameter: its name, its
/// shape, and where its elements start in the parameter's flattened elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileTensor {
    pub name: String,
    pub shape: Vec<i64>,
    pub offset: i64,
}

impl FileTensor {
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }
}

impl MoeNames {
    const BOTH: [MoeNames; 2] = [MoeNames::Mixtral, MoeNames::Qwen];

    /// The sparse MLP's module under `model.layers.{i}.`.
    fn block(self) -> &'static str {
        match self {
            MoeNames::Mixtral => "block_sparse_moe",
            MoeNames::Qwen => "mlp",
        }
    }

    /// An expert projection's module name.
    fn expert(self, w: ExpertWeight) -> &'static str {
        match (self, w) {
            (MoeNames::Mixtral, ExpertWeight::Gate) => "w1",
            (MoeNames::Mixtral, ExpertWeight::Up) => "w3",
            (MoeNames::Mixtral, ExpertWeight::Down) => "w2",
            (MoeNames::Qwen, ExpertWeight::Gate) => "gate_proj",
            (MoeNames::Qwen, ExpertWeight::Up) => "up_proj",
            (MoeNames::Qwen, ExpertWeight::Down) => "down_proj",
        }
    }

    /// The router or a stacked expert parameter named by `suffix` (what follows
    /// `model.layers.{i}.`).
    fn parse(self, i: usize, suffix: &str) -> Option<ParamName> {
        let rest = suffix.strip_prefix(self.block())?.strip_prefix('.')?;
        if rest == "gate.weight" {
            return Some(ParamName::Router(i, self));
        }
        let stacked = rest.strip_prefix("experts.")?;
        [ExpertProj::GateUp, ExpertProj::Down]
            .into_iter()
            .find(|p| p.param() == stacked)
            .map(|p| ParamName::Experts(i, p, self))
    }

    /// Expert `e`'s projection `w` in layer `i`, as a Hub file names it.
    fn expert_file_name(self, i: usize, e: i64, w: ExpertWeight) -> String {
        format!(
            "model.layers.{i}.{}.experts.{e}.{}.weight",
            self.block(),
            self.expert(w)
        )
    }
}

/// Where an expert adapter sits in PEFT's nesting of `ParamWrapper`s around a sparse layer's
/// `mlp.experts` (transformers 5 fuses the experts into `gate_up_proj` and `down_proj`
/// parameters; PEFT wraps the module once per adapted parameter): the outer wrapper's factors
/// are `mlp.experts.lora_A.weight`, the inner's `mlp.experts.base_layer.lora_A.weight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertWrap {
    Outer,
    Inner,
}

/// A sparse layer's stacked expert parameter (which LoRA also adapts as one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertProj {
    /// `gate_up_proj`, `[experts, 2 moe_intermediate, hidden]`: the gate rows, then the up rows.
    GateUp,
    /// `down_proj`, `[experts, hidden, moe_intermediate]`.
    Down,
}

impl ExpertProj {
    /// The parameter's name under the block's `experts.`.
    fn param(self) -> &'static str {
        match self {
            ExpertProj::GateUp => "gate_up_proj",
            ExpertProj::Down => "down_proj",
        }
    }

    /// The per-expert projections it stacks, in the order of each expert's rows.
    fn parts(self) -> &'static [ExpertWeight] {
        match self {
            ExpertProj::GateUp => &[ExpertWeight::Gate, ExpertWeight::Up],
            ExpertProj::Down => &[ExpertWeight::Down],
        }
    }
}

impl ExpertWrap {
    /// The wrapper of `proj` when a layer adapts `gate_up` and `down` as said: with both,
    /// `gate_up_proj` is wrapped first (inner) and `down_proj` around it; alone, either is the
    /// outer one.
    pub fn of(proj: ExpertProj, gate_up: bool, down: bool) -> ExpertWrap {
        match proj {
            ExpertProj::GateUp if gate_up && down => ExpertWrap::Inner,
            _ => ExpertWrap::Outer,
        }
    }

    fn module(self) -> &'static str {
        match self {
            ExpertWrap::Outer => "mlp.experts",
            ExpertWrap::Inner => "mlp.experts.base_layer",
        }
    }
}

/// A parameter of `LlamaForCausalLM`. Its Hugging Face name is the name everywhere in
/// flotilla (parameter sets, FSDP groups, optimizer state), so this is the only mapping. The
/// one parameter a Hub file does not hold whole is a stacked expert parameter, named as
/// transformers 5 names its fused experts (under the family's block: Mixtral's
/// `block_sparse_moe`) and held per expert in weights files ([`ParamName::file_parts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamName {
    /// `model.embed_tokens.weight`, `[vocab, hidden]`.
    Embed,
    /// `model.layers.{i}.…`.
    Layer(usize, LayerWeight),
    /// The bias of an attention projection, `model.layers.{i}.self_attn.q_proj.bias` (`[out]`):
    /// Qwen2's q/k/v, a biased Llama's q/k/v/o.
    Bias(usize, LayerWeight),
    /// `model.norm.weight`, `[hidden]`.
    Norm,
    /// `lm_head.weight`, `[vocab, hidden]`; absent with tied embeddings.
    LmHead,
    /// A LoRA factor of a block's linear layer: `model.layers.{i}.self_attn.q_proj.lora_A.weight`
    /// (`[r, in]`) or `…lora_B.weight` (`[out, r]`), PEFT's names under `base_model.model.`.
    Lora(usize, LayerWeight, LoraFactor),
    /// A sparse layer's router, `[experts, hidden]`: `model.layers.{i}.mlp.gate.weight`
    /// (`block_sparse_moe.gate` for Mixtral).
    Router(usize, MoeNames),
    /// Layer `i`'s experts' projections, stacked: `model.layers.{i}.mlp.experts.gate_up_proj`
    /// (`[experts, 2 moe_intermediate, hidden]`) or `…experts.down_proj` (`[experts, hidden,
    /// moe_intermediate]`), under `block_sparse_moe` for Mixtral. A Hub file holds them per
    /// expert ([`ParamName::file_parts`]).
    Experts(usize, ExpertProj, MoeNames),
    /// A LoRA factor of a sparse layer's fused expert parameter, under PEFT's name for it
    /// (`model.layers.{i}.mlp.experts[.base_layer].lora_A.weight`, both families): `A` is
    /// `[r·experts, in]` (expert-major rows), `B` `[out, r·experts]` (rank-major columns).
    /// Which parameter the wrapper adapts is the layer's targets' ([`ExpertWrap::of`]).
    ExpertLora(usize, ExpertWrap, LoraFactor),
    /// A LoRA factor of a sparse layer's router, `model.layers.{i}.mlp.gate.lora_A.weight`
    /// (`[r, hidden]`; `B` `[experts, r]`).
    RouterLora(usize, LoraFactor),
}

/// The two factors of a LoRA update `B·A`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoraFactor {
    A,
    B,
}

impl LoraFactor {
    fn tag(self) -> &'static str {
        match self {
            LoraFactor::A => "lora_A",
            LoraFactor::B => "lora_B",
        }
    }
}

impl ParamName {
    pub fn hf_name(&self) -> String {
        match self {
            ParamName::Embed => "model.embed_tokens.weight".into(),
            ParamName::Layer(i, w) => format!("model.layers.{i}.{}", w.suffix()),
            ParamName::Bias(i, w) => format!("model.layers.{i}.{}.bias", w.module()),
            ParamName::Norm => "model.norm.weight".into(),
            ParamName::LmHead => "lm_head.weight".into(),
            ParamName::Lora(i, w, f) => {
                format!("model.layers.{i}.{}.{}.weight", w.module(), f.tag())
            }
            ParamName::Router(i, n) => format!("model.layers.{i}.{}.gate.weight", n.block()),
            ParamName::Experts(i, p, n) => {
                format!("model.layers.{i}.{}.experts.{}", n.block(), p.param())
            }
            ParamName::ExpertLora(i, wrap, f) => {
                format!("model.layers.{i}.{}.{}.weight", wrap.module(), f.tag())
            }
            ParamName::RouterLora(i, f) => format!("model.layers.{i}.mlp.gate.{}.weight", f.tag()),
        }
    }

    /// The tensors that hold this parameter (of shape `shape`) in a Hugging Face weights file
    /// when it is not held whole: a stacked expert parameter's per-expert tensors, in the
    /// order of its flattened elements (expert by expert; `gate_up_proj`'s gate, then up).
    pub fn file_parts(&self, shape: &[i64]) -> Option<Vec<FileTensor>> {
        match self {
            ParamName::Experts(i, proj, names) if shape.len() == 3 => {
                let parts = proj.parts();
                let rows = shape[1] / parts.len() as i64;
                let part_shape = vec![rows, shape[2]];
                let numel = rows * shape[2];
                let mut offset = 0;
                let mut out = Vec::with_capacity(shape[0] as usize * parts.len());
                for e in 0..shape[0] {
                    for &w in parts {
                        out.push(FileTensor {
                            name: names.expert_file_name(*i, e, w),
                            shape: part_shape.clone(),
                            offset,
                        });
                        offset += numel;
                    }
                }
                Some(out)
            }
            _ => None,
        }
    }

    /// Whether the parameter is a LoRA factor (of a linear layer, the experts or the router).
    pub fn is_lora_factor(&self) -> bool {
        matches!(
            self,
            ParamName::Lora(..) | ParamName::ExpertLora(..) | ParamName::RouterLora(..)
        )
    }

    /// The parameter a Hugging Face weight name denotes, if any.
    pub fn parse(name: &str) -> Option<ParamName> {
        match name {
            "model.embed_tokens.weight" => return Some(ParamName::Embed),
            "model.norm.weight" => return Some(ParamName::Norm),
            "lm_head.weight" => return Some(ParamName::LmHead),
            _ => {}
        }
        let rest = name.strip_prefix("model.layers.")?;
        let (index, suffix) = rest.split_once('.')?;
        let i = index.parse().ok()?;
        if let Some(p) = MoeNames::BOTH.iter().find_map(|n| n.parse(i, suffix)) {
            return Some(p);
        }
        for f in [LoraFactor::A, LoraFactor::B] {
            let tail = format!(".{}.weight", f.tag());
            let Some(module) = suffix.strip_suffix(&tail) else {
                continue;
            };
            for wrap in [ExpertWrap::Outer, ExpertWrap::Inner] {
                if module == wrap.module() {
                    return Some(ParamName::ExpertLora(i, wrap, f));
                }
            }
            if module == "mlp.gate" {
                return Some(ParamName::RouterLora(i, f));
            }
        }
        let of_module = |module: &str| LayerWeight::ALL.into_iter().find(|w| w.module() == module);
        for f in [LoraFactor::A, LoraFactor::B] {
            let tail = format!(".{}.weight", f.tag());
            if let Some(module) = suffix.strip_suffix(&tail) {
                return of_module(module).map(|w| ParamName::Lora(i, w, f));
            }
        }
        if let Some(module) = suffix.strip_suffix(".bias") {
            return of_module(module).map(|w| ParamName::Bias(i, w));
        }
        LayerWeight::ALL
            .into_iter()
            .find(|w| w.suffix() == suffix)
            .map(|w| ParamName::Layer(i, w))
    }
}

/// The tensors that hold parameter `name` (of shape `shape`) in a Hugging Face weights file,
/// in the order of its flattened elements: its parts ([`ParamName::file_parts`]), else itself.
pub fn file_tensors_of(name: &str, shape: &[i64]) -> Vec<FileTensor> {
    ParamName::parse(name)
        .and_then(|p| p.file_parts(shape))
        .unwrap_or_else(|| {
            vec![FileTensor {
                name: name.to_string(),
                shape: shape.to_vec(),
                offset: 0,
            }]
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let mut all = vec![ParamName::Embed, ParamName::Norm, ParamName::LmHead];
        for w in LayerWeight::ALL {
            all.push(ParamName::Layer(13, w));
            all.push(ParamName::Bias(7, w));
            all.push(ParamName::Lora(2, w, LoraFactor::A));
            all.push(ParamName::Lora(2, w, LoraFactor::B));
        }
        for f in [LoraFactor::A, LoraFactor::B] {
            all.push(ParamName::ExpertLora(1, ExpertWrap::Outer, f));
            all.push(ParamName::ExpertLora(1, ExpertWrap::Inner, f));
            all.push(ParamName::RouterLora(1, f));
        }
        for p in all {
            assert_eq!(ParamName::parse(&p.hf_name()), Some(p), "{}", p.hf_name());
        }
        assert_eq!(
            ParamName::Layer(2, LayerWeight::Gate).hf_name(),
            "model.layers.2.mlp.gate_proj.weight"
        );
        assert_eq!(
            ParamName::Lora(0, LayerWeight::V, LoraFactor::B).hf_name(),
            "model.layers.0.self_attn.v_proj.lora_B.weight"
        );
        assert_eq!(ParamName::parse("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(
            ParamName::Bias(3, LayerWeight::K).hf_name(),
            "model.layers.3.self_attn.k_proj.bias"
        );
        assert_eq!(
            ParamName::parse("model.layers.0.mlp.up_proj.bias"),
            Some(ParamName::Bias(0, LayerWeight::Up))
        );
        assert_eq!(ParamName::parse("model.layers.0.mlp.up.bias"), None);
        for n in MoeNames::BOTH {
            for p in [
                ParamName::Router(4, n),
                ParamName::Experts(4, ExpertProj::GateUp, n),
                ParamName::Experts(4, ExpertProj::Down, n),
            ] {
                assert_eq!(ParamName::parse(&p.hf_name()), Some(p), "{}", p.hf_name());
            }
        }
        assert_eq!(
            ParamName::Experts(1, ExpertProj::GateUp, MoeNames::Mixtral).hf_name(),
            "model.layers.1.block_sparse_moe.experts.gate_up_proj"
        );
        assert_eq!(
            ParamName::Router(0, MoeNames::Qwen).hf_name(),
            "model.layers.0.mlp.gate.weight"
        );
        assert_eq!(
            ParamName::Experts(2, ExpertProj::Down, MoeNames::Qwen).hf_name(),
            "model.layers.2.mlp.experts.down_proj"
        );
    }

    /// A stacked expert parameter is its experts' tensors in a Hub file, expert by expert (gate
    /// then up in `gate_up_proj`); anything else is itself.
    #[test]
    fn stacked_experts_are_per_expert_tensors_in_a_file() {
        let p = ParamName::Experts(1, ExpertProj::GateUp, MoeNames::Mixtral);
        let got: Vec<(String, Vec<i64>, i64)> = file_tensors_of(&p.hf_name(), &[2, 6, 4])
            .into_iter()
            .map(|t| (t.name, t.shape, t.offset))
            .collect();
        let name =
            |e: i64, w: &str| format!("model.layers.1.block_sparse_moe.experts.{e}.{w}.weight");
        assert_eq!(
            got,
            vec![
                (name(0, "w1"), vec![3, 4], 0),
                (name(0, "w3"), vec![3, 4], 12),
                (name(1, "w1"), vec![3, 4], 24),
                (name(1, "w3"), vec![3, 4], 36),
            ]
        );
        let down = ParamName::Experts(0, ExpertProj::Down, MoeNames::Qwen);
        let files = down.file_parts(&[3, 4, 5]).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(
            files[2].name,
            "model.layers.0.mlp.experts.2.down_proj.weight"
        );
        assert_eq!((files[2].shape.clone(), files[2].offset), (vec![4, 5], 40));
        assert_eq!(ParamName::Embed.file_parts(&[10, 4]), None);
        let embed = file_tensors_of("model.embed_tokens.weight", &[10, 4]);
        assert_eq!(
            embed,
            vec![FileTensor {
                name: "model.embed_tokens.weight".into(),
                shape: vec![10, 4],
                offset: 0
            }]
        );
    }
}
