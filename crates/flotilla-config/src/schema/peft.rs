//! `peft`: parameter-efficient fine-tuning — the method (`none`, `lora`), LoRA's settings
//! with PEFT's names, and the layers LoRA can adapt.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::from_node::{field, parse_choice, parse_tagged, Choice, Cx, Fail, FromNode, Parsed};
use super::messages::quote_list;
use super::types::{choice, section, ModelConfig};
use crate::node::{Dict, Node, Value};

choice! {
    /// Parameter-efficient fine-tuning method (`peft.method`, the `peft` config group).
    pub enum PeftMethod { None = "none", Lora = "lora" }
}

choice! {
    /// A linear layer of a decoder block that LoRA adapts (Hugging Face module names), or
    /// `all-linear`: every linear layer but `lm_head` (PEFT's shorthand).
    pub enum LoraModule {
        QProj = "q_proj",
        KProj = "k_proj",
        VProj = "v_proj",
        OProj = "o_proj",
        GateProj = "gate_proj",
        UpProj = "up_proj",
        DownProj = "down_proj",
        /// Phi-3's fused q/k/v projection.
        QkvProj = "qkv_proj",
        /// Phi-3's fused gate and up projection.
        GateUpProj = "gate_up_proj",
        /// Mixtral's experts' gate projection (with `w3`, their fused `gate_up_proj`).
        W1 = "w1",
        /// Mixtral's experts' down projection.
        W2 = "w2",
        /// Mixtral's experts' up projection.
        W3 = "w3",
        /// A mixture's router (`mlp.gate`).
        Router = "gate",
        AllLinear = "all-linear",
    }
}

impl LoraModule {
    /// Whether the layer belongs to a block's MLP (a mixture's experts and router included).
    pub fn in_mlp(self) -> bool {
        matches!(
            self,
            LoraModule::GateProj
                | LoraModule::UpProj
                | LoraModule::DownProj
                | LoraModule::GateUpProj
                | LoraModule::W1
                | LoraModule::W2
                | LoraModule::W3
                | LoraModule::Router
        )
    }

    /// A block's linear layers, in Hugging Face order.
    pub const LINEAR: [LoraModule; 7] = [
        LoraModule::QProj,
        LoraModule::KProj,
        LoraModule::VProj,
        LoraModule::OProj,
        LoraModule::GateProj,
        LoraModule::UpProj,
        LoraModule::DownProj,
    ];

    /// A Qwen3-MoE block's adaptable layers: the attention's, the experts' projections under
    /// their transformers 4 names (PEFT maps them to the fused `gate_up_proj` and `down_proj`)
    /// and the router.
    pub const QWEN_MOE_LINEAR: [LoraModule; 8] = [
        LoraModule::QProj,
        LoraModule::KProj,
        LoraModule::VProj,
        LoraModule::OProj,
        LoraModule::GateProj,
        LoraModule::UpProj,
        LoraModule::DownProj,
        LoraModule::Router,
    ];

    /// A Mixtral block's adaptable layers, as [`LoraModule::QWEN_MOE_LINEAR`] with Mixtral's
    /// expert names.
    pub const MIXTRAL_LINEAR: [LoraModule; 8] = [
        LoraModule::QProj,
        LoraModule::KProj,
        LoraModule::VProj,
        LoraModule::OProj,
        LoraModule::W1,
        LoraModule::W3,
        LoraModule::W2,
        LoraModule::Router,
    ];

    /// A Phi-3 block's linear layers (q/k/v and gate/up fused), in Hugging Face order.
    pub const FUSED_LINEAR: [LoraModule; 4] = [
        LoraModule::QkvProj,
        LoraModule::OProj,
        LoraModule::GateUpProj,
        LoraModule::DownProj,
    ];
}

choice! {
    /// A module PEFT's `modules_to_save` trains in full beside the adapters.
    pub enum SavedModule { LmHead = "lm_head", EmbedTokens = "embed_tokens" }
}

/// `peft`, chosen by `peft.method` (the `peft` config group); absent means `none`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method")]
pub enum PeftConfig {
    /// Every weight is trained.
    #[default]
    #[serde(rename = "none")]
    None,
    #[serde(rename = "lora")]
    Lora(LoraConfig),
}

section! {
    /// `peft` with `method: lora` (PEFT's `LoraConfig` names where they exist).
    pub struct LoraConfig {
        /// Rank of the update `B·A`.
        r: usize,
        /// `lora_alpha`: the update is scaled by `alpha / r` (`alpha / sqrt(r)` with rsLoRA).
        alpha: f64,
        /// Dropout on the adapter's input (PEFT's `lora_dropout`).
        dropout: f64,
        /// Linear layers to adapt, or `all-linear`.
        target_modules: Vec<LoraModule>,
        /// Rank-stabilised scaling `alpha / sqrt(r)`.
        use_rslora: bool,
        /// Modules trained in full beside the adapters.
        modules_to_save: Vec<SavedModule>,
        /// A PEFT adapter directory to start from.
        init_from: Option<String> => "/path/to/adapter-dir",
        /// Also write `final/merged/`: the base with `W + scale·B·A` folded in.
        merge: bool,
    }
}

impl LoraConfig {
    /// The adapted layers of `model`, `all-linear` expanded, in Hugging Face order.
    pub fn targets(&self, model: &ModelConfig) -> Vec<LoraModule> {
        self.targets_among(model.linear_modules())
    }

    /// The adapted layers among a block's `linear` layers, `all-linear` expanded.
    pub fn targets_among(&self, linear: &[LoraModule]) -> Vec<LoraModule> {
        linear
            .iter()
            .copied()
            .filter(|m| {
                self.target_modules
                    .iter()
                    .any(|t| t == m || *t == LoraModule::AllLinear)
            })
            .collect()
    }

    /// The factor of `B·A`: `alpha / r`, or `alpha / sqrt(r)` with rsLoRA.
    pub fn scale(&self) -> f64 {
        self.scale_of(self.r, self.alpha)
    }

    /// PEFT's rank of a mixture's fused `gate_up_proj` adapter: twice `r` (its `rank_pattern`),
    /// so that the gate and the up projections each keep `r`.
    pub fn gate_up_rank(&self) -> usize {
        2 * self.r
    }

    /// ... and its alpha, twice `alpha` (its `alpha_pattern`).
    pub fn gate_up_alpha(&self) -> f64 {
        2.0 * self.alpha
    }

    /// The factor of the fused `gate_up_proj` adapter's `B·A`.
    pub fn gate_up_scale(&self) -> f64 {
        self.scale_of(self.gate_up_rank(), self.gate_up_alpha())
    }

    /// The factor of an update of rank `r` and `alpha`.
    fn scale_of(&self, r: usize, alpha: f64) -> f64 {
        if self.use_rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        }
    }

    /// What LoRA adapts in a mixture's sparse layers, as PEFT does on transformers 5, where the
    /// experts are fused parameters (`target_parameters`): `gate_proj` and `up_proj` (`w1`,
    /// `w3`) together adapt `gate_up_proj` at twice the rank and alpha, `down_proj` (`w2`)
    /// adapts `down_proj`, `gate` the router; `all-linear` adapts all three. Nothing for a
    /// dense model.
    pub fn expert_targets(&self, model: &ModelConfig) -> ExpertTargets {
        if !model.is_moe() {
            return ExpertTargets::default();
        }
        let targets = self.targets(model);
        let has = |m: &[LoraModule]| m.iter().any(|m| targets.contains(m));
        ExpertTargets {
            gate_up: has(&[
                LoraModule::GateProj,
                LoraModule::UpProj,
                LoraModule::W1,
                LoraModule::W3,
            ]),
            down: has(&[LoraModule::DownProj, LoraModule::W2]),
            router: has(&[LoraModule::Router]),
        }
    }
}

/// The parameters LoRA adapts in each sparse layer of a mixture (PEFT's `target_parameters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertTargets {
    /// The experts' fused `gate_up_proj` (`[experts, 2 moe_intermediate, hidden]`).
    pub gate_up: bool,
    /// The experts' `down_proj`.
    pub down: bool,
    /// The router, `mlp.gate.weight`.
    pub router: bool,
}

impl ExpertTargets {
    /// The fused expert parameters an adapter's `target_parameters` name (`down_proj`,
    /// `gate_up_proj`, or longer paths ending so); the router is PEFT's `gate.weight`, told
    /// apart by its own factors' names rather than here.
    pub fn fused_in<'a>(target_parameters: impl IntoIterator<Item = &'a str>) -> Self {
        let mut found = ExpertTargets::default();
        for t in target_parameters {
            found.gate_up |= t.ends_with("gate_up_proj");
            found.down |= t.ends_with("down_proj");
        }
        found
    }

    pub fn any(self) -> bool {
        self.gate_up || self.down || self.router
    }

    /// PEFT's `target_parameters`, in the order it writes them.
    pub fn parameter_names(self) -> Vec<&'static str> {
        [
            (self.down, "down_proj"),
            (self.gate_up, "gate_up_proj"),
            (self.router, "gate.weight"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

impl PeftConfig {
    pub fn method(&self) -> PeftMethod {
        match self {
            PeftConfig::None => PeftMethod::None,
            PeftConfig::Lora(_) => PeftMethod::Lora,
        }
    }

    /// The LoRA settings, when `method: lora`.
    pub fn lora(&self) -> Option<&LoraConfig> {
        match self {
            PeftConfig::Lora(l) => Some(l),
            PeftConfig::None => None,
        }
    }

    fn keys_of(method: PeftMethod) -> &'static [&'static str] {
        match method {
            PeftMethod::None => &[],
            PeftMethod::Lora => LoraConfig::KEYS,
        }
    }
}

impl FromNode for PeftConfig {
    fn expected() -> String {
        "a dict".into()
    }
    fn example() -> String {
        "{method: none}".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let (method, dict, skip) =
            parse_tagged::<PeftMethod>(node, key, "method", "peft", PeftConfig::keys_of, cx)?;
        Ok(match method {
            PeftMethod::None => {
                cx.unknown_keys(dict, key, &[], &skip);
                PeftConfig::None
            }
            PeftMethod::Lora => {
                PeftConfig::Lora(LoraConfig::parse_fields(node, dict, key, cx, &skip)?)
            }
        })
    }
}
