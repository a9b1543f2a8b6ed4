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
        AllLinear = "all-linear",
    }
}

impl LoraModule {
    /// Whether the layer belongs to a block's MLP (a mixture of experts' sparse layers have no
    /// dense one to adapt).
    pub fn in_mlp(self) -> bool {
        matches!(
            self,
            LoraModule::GateProj
                | LoraModule::UpProj
                | LoraModule::DownProj
                | LoraModule::GateUpProj
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
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
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
