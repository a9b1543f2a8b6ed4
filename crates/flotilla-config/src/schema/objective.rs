//! `objective`: what the trainer optimises — next-token cross-entropy (`sft`) or direct
//! preference optimisation (`dpo`, TRL's `DPOConfig` names) — with the string enums it uses.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::from_node::{field, parse_choice, parse_tagged, Choice, Cx, Fail, FromNode, Parsed};
use super::messages::quote_list;
use super::types::{choice, section, JobConfig};
use crate::node::{Dict, Node, Value};

choice! {
    /// What the trainer optimises (`objective.kind`): next-token cross-entropy (supervised
    /// fine-tuning and pre-training) or direct preference optimisation.
    pub enum ObjectiveKind { Sft = "sft", Dpo = "dpo" }
}

choice! {
    /// DPO's loss of a pair's reward margin (`objective.loss_type`, TRL's names): `sigmoid`
    /// (DPO; conservative DPO with `label_smoothing`), `ipo` (on length-averaged log-ratios),
    /// `hinge` (SLiC), `robust` (rDPO, `label_smoothing` the flip probability), `sigmoid_norm`
    /// (DPO on length-averaged log-ratios), `apo_zero` (APO: chosen up, rejected down, each
    /// against the reference on its own).
    pub enum DpoLossType {
        Sigmoid = "sigmoid",
        Ipo = "ipo",
        Hinge = "hinge",
        Robust = "robust",
        SigmoidNorm = "sigmoid_norm",
        ApoZero = "apo_zero",
    }
}

choice! {
    /// Where DPO's reference log-probabilities come from (`objective.reference`): `auto` (a
    /// LoRA job's base with the adapters off, otherwise a frozen copy of the starting weights
    /// held like the policy's) or `precomputed` (one pass over the data before training, kept
    /// in the run directory; no second model).
    pub enum ReferenceModel { Auto = "auto", Precomputed = "precomputed" }
}

/// `objective`, chosen by `objective.kind` (the `objective` config group); absent means `sft`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum ObjectiveConfig {
    /// Next-token cross-entropy over the labelled tokens.
    #[default]
    #[serde(rename = "sft")]
    Sft,
    #[serde(rename = "dpo")]
    Dpo(DpoConfig),
}

section! {
    /// `objective` with `kind: dpo` (TRL's `DPOConfig` names).
    pub struct DpoConfig {
        /// How far the policy may move from the reference (IPO's tau).
        beta: f64,
        /// `sigmoid`, `ipo`, `hinge` or `robust`.
        loss_type: DpoLossType,
        /// `sigmoid`: conservative DPO's label noise; `robust`: the flip probability, below 0.5.
        label_smoothing: f64,
        /// `auto` or `precomputed`.
        reference: ReferenceModel,
    }
}

impl ObjectiveConfig {
    pub fn kind(&self) -> ObjectiveKind {
        match self {
            ObjectiveConfig::Sft => ObjectiveKind::Sft,
            ObjectiveConfig::Dpo(_) => ObjectiveKind::Dpo,
        }
    }

    /// The DPO settings, when `kind: dpo`.
    pub fn dpo(&self) -> Option<&DpoConfig> {
        match self {
            ObjectiveConfig::Dpo(d) => Some(d),
            ObjectiveConfig::Sft => None,
        }
    }

    fn keys_of(kind: ObjectiveKind) -> &'static [&'static str] {
        match kind {
            ObjectiveKind::Sft => &[],
            ObjectiveKind::Dpo => DpoConfig::KEYS,
        }
    }
}

impl FromNode for ObjectiveConfig {
    fn expected() -> String {
        "a dict".into()
    }
    fn example() -> String {
        "{kind: sft}".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let (kind, dict, skip) = parse_tagged::<ObjectiveKind>(
            node,
            key,
            "kind",
            "objective",
            ObjectiveConfig::keys_of,
            cx,
        )?;
        Ok(match kind {
            ObjectiveKind::Sft => {
                cx.unknown_keys(dict, key, &[], &skip);
                ObjectiveConfig::Sft
            }
            ObjectiveKind::Dpo => {
                ObjectiveConfig::Dpo(DpoConfig::parse_fields(node, dict, key, cx, &skip)?)
            }
        })
    }
}

impl JobConfig {
    /// Whether a DPO job holds a frozen copy of its starting weights as the reference: the
    /// whole model with `reference: auto`, or under LoRA the adapter it retrains
    /// (`peft.init_from`, as TRL's "ref" adapter; with `precomputed` too, for the pass that
    /// computes the table). A new adapter's reference is the base with the adapters off, and a
    /// full model's precomputed one needs no copy. The trainer keeps what this says and the
    /// memory planner prices it.
    pub fn keeps_reference_copy(&self) -> bool {
        let Some(dpo) = self.objective.dpo() else {
            return false;
        };
        match self.peft.lora() {
            Some(lora) => lora.init_from.is_some(),
            None => dpo.reference == ReferenceModel::Auto,
        }
    }
}
