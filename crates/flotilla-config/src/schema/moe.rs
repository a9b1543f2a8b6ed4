//! Mixtures of experts as a model config describes them: `model.moe` ([`MoeConfig`]: the number
//! of experts, how many each token is routed to, the experts' MLP width, the router's options and
//! the auxiliary load-balancing loss), which layers are sparse
//! ([`ModelConfig::layer_is_sparse`]), the parameters they add, and the reading and writing of
//! the `config.json` keys of `MixtralForCausalLM` (`num_local_experts`, `router_jitter_noise`)
//! and `Qwen3MoeForCausalLM` (`num_experts`, `moe_intermediate_size`, `norm_topk_prob`,
//! `decoder_sparse_step`, `mlp_only_layers`).

use serde::{Deserialize, Serialize};

use super::from_node::{field, Cx, Fail, FromNode, Parsed};
use super::hf_config::HfLlamaConfig;
use super::peft::{LoraConfig, LoraModule};
use super::types::{section, ModelConfig, ModelType};
use crate::node::{Dict, Node, Value};

section! {
    /// `model.moe`: the sparse MLP of a mixture-of-experts model (Mixtral, Qwen3-MoE). Each
    /// token's router (`gate`) scores every expert; the token goes through the
    /// `num_experts_per_tok` best, whose outputs are summed weighted by their softmax scores.
    pub struct MoeConfig {
        /// Experts per sparse layer (`num_local_experts` in Mixtral's config.json,
        /// `num_experts` in Qwen3-MoE's).
        num_experts: usize => "8",
        /// Experts each token is routed to (top-k).
        num_experts_per_tok: usize => "2",
        /// Each expert's MLP width (Qwen3-MoE's `moe_intermediate_size`); absent:
        /// `intermediate_size` (Mixtral's experts).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        moe_intermediate_size: Option<usize> => "768",
        /// Whether the top-k scores are renormalised to sum to one; absent: the architecture's
        /// (Mixtral: always; Qwen3-MoE: no).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        norm_topk_prob: Option<bool> => "true",
        /// Whether the load-balancing loss (transformers' `load_balancing_loss_func`), times
        /// `router_aux_loss_coef`, is added to the loss that training differentiates; absent:
        /// no.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_router_logits: Option<bool> => "true",
        /// The load-balancing loss's weight; absent: 0.001.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        router_aux_loss_coef: Option<f64> => "0.001",
        /// Mixtral: in training, the router's input is multiplied by noise uniform in
        /// `[1 - jitter, 1 + jitter]`; absent: 0 (none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        router_jitter_noise: Option<f64> => "0.0",
        /// Qwen3-MoE: every this many layers is sparse (the others dense); absent: 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decoder_sparse_step: Option<usize> => "1",
        /// Qwen3-MoE: layers with a dense MLP of `intermediate_size` whatever the step; absent:
        /// none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mlp_only_layers: Option<Vec<usize>> => "[0]",
    }
}

/// transformers' default `router_aux_loss_coef` (Mixtral's and Qwen3-MoE's).
pub const DEFAULT_ROUTER_AUX_LOSS_COEF: f64 = 0.001;

impl MoeConfig {
    /// The auxiliary loss's weight when the loss is on (`output_router_logits`), else `None`.
    pub fn aux_loss_coef(&self) -> Option<f64> {
        self.output_router_logits.unwrap_or(false).then(|| {
            self.router_aux_loss_coef
                .unwrap_or(DEFAULT_ROUTER_AUX_LOSS_COEF)
        })
    }

    /// The router's input noise in training (0: none).
    pub fn jitter(&self) -> f64 {
        self.router_jitter_noise.unwrap_or(0.0)
    }
}

impl MoeConfig {
    /// What is wrong with these values, each `(field, message)` under `MoeConfig`'s field
    /// names; `experts` is how the messages name the expert count.
    fn problems(&self, experts: &str) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.num_experts == 0 {
            problems.push(("num_experts", "must be positive".to_string()));
        }
        if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_experts {
            problems.push((
                "num_experts_per_tok",
                format!(
                    "{} must be between 1 and {experts} ({})",
                    self.num_experts_per_tok, self.num_experts
                ),
            ));
        }
        if self.moe_intermediate_size == Some(0) {
            problems.push(("moe_intermediate_size", "must be positive".into()));
        }
        if let Some(step) = self.decoder_sparse_step.filter(|s| *s == 0) {
            problems.push(("decoder_sparse_step", format!("{step} must be positive")));
        }
        if let Some(j) = self.router_jitter_noise.filter(|j| !(0.0..1.0).contains(j)) {
            problems.push(("router_jitter_noise", format!("{j} must be in [0, 1)")));
        }
        if let Some(coef) = self
            .router_aux_loss_coef
            .filter(|c| !c.is_finite() || *c < 0.0)
        {
            problems.push((
                "router_aux_loss_coef",
                format!("{coef} must be a non-negative number"),
            ));
        }
        problems
    }
}

impl ModelConfig {
    /// Whether layer `i` has a sparse MLP (a router and experts): every layer of a Mixtral;
    /// Qwen3-MoE's layers at `decoder_sparse_step` not listed in `mlp_only_layers`, as
    /// `Qwen3MoeDecoderLayer` decides; none of a dense model's.
    pub fn layer_is_sparse(&self, i: usize) -> bool {
        let Some(moe) = &self.moe else {
            return false;
        };
        let step = moe.decoder_sparse_step.unwrap_or(1).max(1);
        moe.num_experts > 0
            && (i + 1).is_multiple_of(step)
            && !moe.mlp_only_layers.as_ref().is_some_and(|l| l.contains(&i))
    }

    /// The sparse layers' count.
    pub fn sparse_layers(&self) -> usize {
        (0..self.num_hidden_layers)
            .filter(|&i| self.layer_is_sparse(i))
            .count()
    }

    /// Each expert's MLP width.
    pub fn expert_intermediate_size(&self) -> usize {
        self.moe
            .as_ref()
            .and_then(|m| m.moe_intermediate_size)
            .unwrap_or(self.intermediate_size)
    }

    /// Whether a token's top-k scores are renormalised: always for Mixtral, as Qwen3-MoE's
    /// `norm_topk_prob` says (absent: no).
    pub fn norm_topk_prob(&self) -> bool {
        match self.architecture() {
            ModelType::Mixtral => true,
            _ => self
                .moe
                .as_ref()
                .and_then(|m| m.norm_topk_prob)
                .unwrap_or(false),
        }
    }

    /// The MLP elements of layer `i`: the router and every expert's three projections for a
    /// sparse layer, the dense SwiGLU's otherwise.
    pub fn mlp_elements(&self, i: usize) -> u64 {
        let h = self.hidden_size as u64;
        match &self.moe {
            Some(moe) if self.layer_is_sparse(i) => {
                let e = moe.num_experts as u64;
                e * h + e * 3 * h * self.expert_intermediate_size() as u64
            }
            _ => 3 * h * self.intermediate_size as u64,
        }
    }

    /// Whether the architecture is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.moe.is_some()
    }

    /// The load-balancing loss's weight when a mixture computes it (`output_router_logits`),
    /// else `None` (also for a dense model).
    pub fn aux_loss_coef(&self) -> Option<f64> {
        self.moe.as_ref().and_then(MoeConfig::aux_loss_coef)
    }

    /// The LoRA target names of a mixture's fused experts in this family: the pair that
    /// adapts `gate_up_proj` (Mixtral's `w1`, `w3`; Qwen3-MoE's `gate_proj`, `up_proj`) and the
    /// one that adapts `down_proj` (`w2`; `down_proj`).
    pub fn expert_lora_modules(&self) -> ([LoraModule; 2], LoraModule) {
        match self.architecture() {
            ModelType::Mixtral => ([LoraModule::W1, LoraModule::W3], LoraModule::W2),
            _ => (
                [LoraModule::GateProj, LoraModule::UpProj],
                LoraModule::DownProj,
            ),
        }
    }
}

/// Why a `config.json`'s experts cannot be read: the field and the reason.
pub(super) type MoeFieldProblem = (&'static str, String);

/// `model.moe` of a Mixtral or Qwen3-MoE `config.json` (`None` for the other architectures),
/// every value as the file says or as transformers' config class fills it in.
pub(super) fn hf_moe(
    hf: &HfLlamaConfig,
    model_type: ModelType,
) -> Result<Option<MoeConfig>, MoeFieldProblem> {
    // transformers maps each spelling onto the other (Qwen3-MoE's config class saves
    // `num_local_experts`; its Hub checkpoints have `num_experts`).
    let (experts_field, experts, default_experts) = match model_type {
        ModelType::Mixtral => (
            "num_local_experts",
            hf.num_local_experts.or(hf.num_experts),
            8,
        ),
        ModelType::Qwen3Moe => ("num_experts", hf.num_experts.or(hf.num_local_experts), 128),
        _ => return Ok(None),
    };
    let num_experts = experts.unwrap_or(default_experts);
    let default_k = if model_type == ModelType::Mixtral {
        2
    } else {
        8
    };
    let num_experts_per_tok = hf.num_experts_per_tok.unwrap_or(default_k);
    let qwen = model_type == ModelType::Qwen3Moe;
    let moe = MoeConfig {
        num_experts,
        num_experts_per_tok,
        moe_intermediate_size: qwen.then(|| hf.moe_intermediate_size.unwrap_or(768)),
        norm_topk_prob: qwen.then(|| hf.norm_topk_prob.unwrap_or(false)),
        output_router_logits: Some(hf.output_router_logits.unwrap_or(false)),
        router_aux_loss_coef: Some(
            hf.router_aux_loss_coef
                .unwrap_or(DEFAULT_ROUTER_AUX_LOSS_COEF),
        ),
        router_jitter_noise: (!qwen).then(|| hf.router_jitter_noise.unwrap_or(0.0)),
        decoder_sparse_step: qwen.then(|| hf.decoder_sparse_step.unwrap_or(1)),
        mlp_only_layers: qwen.then(|| hf.mlp_only_layers.clone().unwrap_or_default()),
    };
    // The same checks as `model.moe`'s, under the file's own names.
    match moe.problems(experts_field).into_iter().next() {
        Some(("num_experts", message)) => Err((experts_field, message)),
        Some((field, message)) => Err((field, message)),
        None => Ok(Some(moe)),
    }
}

/// Writes `model.moe` into a `config.json` of its architecture, under that architecture's keys.
pub(super) fn write_hf_moe(c: &ModelConfig, hf: &mut HfLlamaConfig) {
    let Some(moe) = &c.moe else {
        return;
    };
    let qwen = c.architecture() == ModelType::Qwen3Moe;
    hf.num_experts_per_tok = Some(moe.num_experts_per_tok);
    hf.output_router_logits = Some(moe.output_router_logits.unwrap_or(false));
    hf.router_aux_loss_coef = Some(
        moe.router_aux_loss_coef
            .unwrap_or(DEFAULT_ROUTER_AUX_LOSS_COEF),
    );
    if qwen {
        hf.num_experts = Some(moe.num_experts);
        hf.moe_intermediate_size = Some(c.expert_intermediate_size());
        hf.norm_topk_prob = Some(c.norm_topk_prob());
        hf.decoder_sparse_step = Some(moe.decoder_sparse_step.unwrap_or(1));
        hf.mlp_only_layers = Some(moe.mlp_only_layers.clone().unwrap_or_default());
    } else {
        hf.num_local_experts = Some(moe.num_experts);
        hf.router_jitter_noise = Some(moe.jitter());
    }
}

/// The problems of `model.moe` against the rest of the model config, each `(field, message)`.
pub(super) fn moe_problems(c: &ModelConfig) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let arch = c.architecture();
    let moe_arch = matches!(arch, ModelType::Mixtral | ModelType::Qwen3Moe);
    match (&c.moe, moe_arch) {
        (None, true) => problems.push((
            "moe".into(),
            format!(
                "{} is a mixture of experts: set model.moe (num_experts, num_experts_per_tok)",
                arch.display_name()
            ),
        )),
        (Some(_), false) => problems.push((
            "moe".into(),
            format!(
                "{} has no experts: model.moe belongs to model_type mixtral or qwen3_moe",
                arch.display_name()
            ),
        )),
        _ => {}
    }
    if let Some(moe) = &c.moe {
        problems.extend(
            moe.problems("moe.num_experts")
                .into_iter()
                .map(|(field, message)| (format!("moe.{field}"), message)),
        );
    }
    problems
}

/// Why LoRA `lora` cannot adapt mixture-of-experts `model` as PEFT would (`None` when it can,
/// or when the model is dense), as `(problem, fix)`. PEFT adapts a transformers 5 mixture's
/// experts and router as parameters (`target_parameters`): the experts' gate and up
/// projections are one fused parameter, adapted together or not at all, and a parameter's
/// adapter takes no dropout.
pub fn lora_moe_problem(model: &ModelConfig, lora: &LoraConfig) -> Option<(String, String)> {
    if !model.is_moe() {
        return None;
    }
    let listed = |m: LoraModule| lora.target_modules.contains(&m);
    let pairs = [
        (LoraModule::GateProj, LoraModule::UpProj),
        (LoraModule::W1, LoraModule::W3),
    ];
    for (a, b) in pairs {
        if listed(a) != listed(b) {
            let (present, missing) = if listed(a) { (a, b) } else { (b, a) };
            return Some((
                format!(
                    "peft.target_modules lists `{present}` without `{missing}`: {}'s experts \
                     hold the two as one fused parameter (gate_up_proj), adapted as one",
                    model.architecture().display_name()
                ),
                format!("list both `{a}` and `{b}`, or neither"),
            ));
        }
    }
    let experts = lora.expert_targets(model);
    if experts.any() && lora.dropout > 0.0 {
        return Some((
            format!(
                "peft.dropout is {}: PEFT adapts {}'s experts and router as parameters \
                 (target_parameters), whose adapters take no dropout",
                lora.dropout,
                model.architecture().display_name()
            ),
            "set peft.dropout=0.0, or adapt the attention only: \
             peft.target_modules=[q_proj,k_proj,v_proj,o_proj]"
                .into(),
        ));
    }
    None
}
