//! What `flotilla run` checks of a LoRA job's starting adapter before it creates anything
//! (exit 2 on a mismatch, naming the tensor and the fix): `peft.init_from` must be a PEFT LoRA
//! adapter directory of the job's rank whose every tensor has the shape the job's base gives
//! it (the base's `config.json` with `model.init_from`, read by `base_model.rs`, else the
//! `model` config). Read from `adapter_config.json` and the safetensors header alone; no
//! libtorch, no tensor data.

use std::collections::BTreeMap;
use std::path::Path;

use flotilla_config::schema::{ExpertTargets, JobConfig, LoraConfig, LoraModule};

/// PEFT's prefix before a parameter's Hugging Face name in an adapter file.
const PEFT_PREFIX: &str = "base_model.model.";

/// The sizes of the base that shape an adapter's tensors.
#[derive(Debug, PartialEq)]
struct BaseDims {
    hidden: i64,
    intermediate: i64,
    q_out: i64,
    kv_out: i64,
    layers: usize,
    vocab: i64,
    /// A block's linear layers (Phi-3's are fused).
    linear: &'static [LoraModule],
    /// A mixture's experts: how many, their width, and which layers are sparse.
    experts: Option<ExpertDims>,
    /// Where they were read (for messages).
    source: String,
}

/// The sizes of a mixture's sparse layers that shape PEFT's expert and router factors.
#[derive(Debug, PartialEq)]
struct ExpertDims {
    count: i64,
    intermediate: i64,
    sparse: Vec<bool>,
    /// The family's names of the fused experts' targets (`ModelConfig::expert_lora_modules`).
    modules: ([LoraModule; 2], LoraModule),
}

impl BaseDims {
    /// The sizes of `job`'s model (a job from a base directory: see
    /// [`crate::base_model::trained_job`]).
    fn of_job(job: &JobConfig) -> Self {
        let m = &job.model;
        let hd = m.head_dim() as i64;
        Self {
            hidden: m.hidden_size as i64,
            intermediate: m.intermediate_size as i64,
            q_out: m.num_attention_heads as i64 * hd,
            kv_out: m.num_key_value_heads as i64 * hd,
            layers: m.num_hidden_layers,
            vocab: m.vocab_size as i64,
            linear: m.linear_modules(),
            experts: m.moe.as_ref().map(|moe| ExpertDims {
                count: moe.num_experts as i64,
                intermediate: m.expert_intermediate_size() as i64,
                sparse: (0..m.num_hidden_layers)
                    .map(|i| m.layer_is_sparse(i))
                    .collect(),
                modules: m.expert_lora_modules(),
            }),
            source: match &m.init_from {
                Some(dir) => Path::new(dir).join("config.json").display().to_string(),
                None => "the model config".into(),
            },
        }
    }

    /// `[out, in]` of a block's linear layer named by its PEFT module name.
    fn linear(&self, module: &str) -> Option<(i64, i64)> {
        Some(match module {
            "self_attn.q_proj" => (self.q_out, self.hidden),
            "self_attn.k_proj" | "self_attn.v_proj" => (self.kv_out, self.hidden),
            "self_attn.o_proj" => (self.hidden, self.q_out),
            "mlp.gate_proj" | "mlp.up_proj" => (self.intermediate, self.hidden),
            "mlp.down_proj" => (self.hidden, self.intermediate),
            "self_attn.qkv_proj" => (self.q_out + 2 * self.kv_out, self.hidden),
            "mlp.gate_up_proj" => (2 * self.intermediate, self.hidden),
            _ => return None,
        })
    }
}

/// The `(name, shape)` of every tensor in a safetensors file's header.
fn header_shapes(path: &Path) -> Result<BTreeMap<String, Vec<i64>>, String> {
    use std::io::Read;
    let bad = |e: String| format!("peft.init_from: {}: {e}", path.display());
    let mut f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| bad(e.to_string()))?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(bad(format!("a header of {len} bytes is not safetensors")));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, info) in v.as_object().into_iter().flatten() {
        if name == "__metadata__" {
            continue;
        }
        let shape = info["shape"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| d.as_i64()).collect())
            .unwrap_or_default();
        out.insert(name.clone(), shape);
    }
    Ok(out)
}

/// Checks `job`'s LoRA adapter to start from, if it names one (`what` names the job in a
/// sweep); `job` is the job as trained ([`crate::base_model::trained_job`]). Nothing to check
/// for jobs without `peft.init_from`.
pub fn check(job: &JobConfig, what: &str) -> Result<(), String> {
    let Some(lora) = job.peft.lora() else {
        return Ok(());
    };
    let Some(dir) = &lora.init_from else {
        return Ok(());
    };
    check_adapter(Path::new(dir), lora, &BaseDims::of_job(job)).map_err(|e| format!("{what}: {e}"))
}

fn check_adapter(dir: &Path, lora: &LoraConfig, base: &BaseDims) -> Result<(), String> {
    let config_path = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| {
        format!(
            "peft.init_from: cannot read {}: {e}; point it at a PEFT adapter directory \
             (adapter_config.json, adapter_model.safetensors)",
            config_path.display()
        )
    })?;
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("peft.init_from: {} is not JSON: {e}", config_path.display()))?;
    if config["peft_type"] != "LORA" {
        return Err(format!(
            "peft.init_from: {} has peft_type {}, not \"LORA\"",
            config_path.display(),
            config["peft_type"]
        ));
    }
    if config["r"].as_u64() != Some(lora.r as u64) {
        return Err(format!(
            "peft.init_from: the adapter in {} has r={}, the job peft.r={}; set peft.r={}",
            dir.display(),
            config["r"],
            lora.r,
            config["r"]
        ));
    }
    let weights = dir.join("adapter_model.safetensors");
    let r = lora.r as i64;
    let mut adapted = std::collections::BTreeSet::new();
    let fused = ExpertTargets::fused_in(
        config["target_parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str()),
    );
    for (key, shape) in header_shapes(&weights)? {
        let name = key.strip_prefix(PEFT_PREFIX).unwrap_or(&key);
        let expected = match name {
            "lm_head.weight" | "model.embed_tokens.weight" => Some(vec![base.vocab, base.hidden]),
            _ => lora_shape(name, r, base, &mut adapted)
                .or_else(|| expert_shape(name, lora, base, fused, &mut adapted)),
        };
        let Some(expected) = expected else {
            return Err(format!(
                "peft.init_from: tensor `{key}` in {} is not a LoRA factor of a {}-layer base \
                 ({}); the adapter was made for another base: set model.init_from to its base \
                 ({})",
                weights.display(),
                base.layers,
                base.source,
                config["base_model_name_or_path"]
            ));
        };
        if shape != expected {
            return Err(format!(
                "peft.init_from: tensor `{key}` in {} has shape {shape:?}, the job's base \
                 ({}) gives it {expected:?}; the adapter was made for another base: set \
                 model.init_from to its base ({})",
                weights.display(),
                base.source,
                config["base_model_name_or_path"]
            ));
        }
    }
    let ours: std::collections::BTreeSet<&str> = lora
        .targets_among(base.linear)
        .iter()
        .map(|m| m.as_str())
        .collect();
    if adapted
        .iter()
        .map(String::as_str)
        .collect::<std::collections::BTreeSet<_>>()
        != ours
    {
        let theirs: Vec<&String> = adapted.iter().collect();
        return Err(format!(
            "peft.init_from: the adapter in {} adapts {theirs:?}, the job {ours:?}; set \
             peft.target_modules=[{}]",
            dir.display(),
            adapted.iter().cloned().collect::<Vec<_>>().join(",")
        ));
    }
    Ok(())
}

/// The shape a LoRA factor `model.layers.{i}.{module}.lora_{A|B}.weight` has on `base`,
/// noting its module; `None` for a name that is no factor of the base.
fn lora_shape(
    name: &str,
    r: i64,
    base: &BaseDims,
    adapted: &mut std::collections::BTreeSet<String>,
) -> Option<Vec<i64>> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.parse::<usize>().ok()? >= base.layers {
        return None;
    }
    let (module, factor) = rest
        .strip_suffix(".lora_A.weight")
        .map(|m| (m, 'A'))
        .or_else(|| rest.strip_suffix(".lora_B.weight").map(|m| (m, 'B')))?;
    let (out, inp) = base.linear(module)?;
    adapted.insert(module.rsplit('.').next()?.to_string());
    Some(match factor {
        'A' => vec![r, inp],
        _ => vec![out, r],
    })
}

/// The shape a mixture's expert or router factor (PEFT's `ParamWrapper`s on transformers 5's
/// fused experts: `model.layers.{i}.mlp.experts[.base_layer].lora_{A|B}.weight`,
/// `model.layers.{i}.mlp.gate.lora_{A|B}.weight`) has on `base`, noting the modules it adapts
/// under the base's names; `None` for a name that is no such factor of the base.
fn expert_shape(
    name: &str,
    lora: &LoraConfig,
    base: &BaseDims,
    fused: ExpertTargets,
    adapted: &mut std::collections::BTreeSet<String>,
) -> Option<Vec<i64>> {
    let experts = base.experts.as_ref()?;
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    if !*experts.sparse.get(layer.parse::<usize>().ok()?)? {
        return None;
    }
    let (module, factor) = rest
        .strip_suffix(".lora_A.weight")
        .map(|m| (m, 'A'))
        .or_else(|| rest.strip_suffix(".lora_B.weight").map(|m| (m, 'B')))?;
    let (e, ie, h) = (experts.count, experts.intermediate, base.hidden);
    let (r, r2) = (lora.r as i64, lora.gate_up_rank() as i64);
    let ([gate, up], down_name) = experts.modules;
    // ([A], [B]) and the modules adapted.
    let gate_up = || ((vec![r2 * e, h], vec![2 * ie, r2 * e]), vec![gate, up]);
    let down = || ((vec![r * e, ie], vec![h, r * e]), vec![down_name]);
    let ((a, b), names) = match module {
        "mlp.gate" => ((vec![r, h], vec![e, r]), vec![LoraModule::Router]),
        "mlp.experts.base_layer" if fused.gate_up && fused.down => gate_up(),
        "mlp.experts" if fused.down => down(),
        "mlp.experts" if fused.gate_up => gate_up(),
        _ => return None,
    };
    adapted.extend(names.into_iter().map(|m| m.as_str().to_string()));
    Some(if factor == 'A' { a } else { b })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PEFT-style adapter directory with `tensors` (name, shape) in its header (no data
    /// needed: the check reads the header alone).
    fn adapter(dir: &Path, r: usize, tensors: &[(&str, [i64; 2])]) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join("adapter_config.json"),
            format!(r#"{{"peft_type": "LORA", "r": {r}, "base_model_name_or_path": "/bases/b"}}"#),
        )
        .unwrap();
        let mut header = serde_json::Map::new();
        let mut offset = 0;
        for (name, shape) in tensors {
            let bytes = shape[0] * shape[1] * 4;
            header.insert(
                format!("{PEFT_PREFIX}{name}"),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
        let text = serde_json::Value::Object(header).to_string();
        let mut file = (text.len() as u64).to_le_bytes().to_vec();
        file.extend(text.as_bytes());
        file.extend(vec![0u8; offset as usize]);
        std::fs::write(dir.join("adapter_model.safetensors"), file).unwrap();
    }

    fn lora(r: usize, targets: &str) -> LoraConfig {
        serde_json::from_value(serde_json::json!({
            "r": r, "alpha": 16.0, "dropout": 0.0, "target_modules": targets.split(',').collect::<Vec<_>>(),
            "use_rslora": false, "modules_to_save": [], "init_from": null, "merge": false
        }))
        .unwrap()
    }

    fn base() -> BaseDims {
        BaseDims {
            hidden: 64,
            intermediate: 96,
            q_out: 64,
            kv_out: 32,
            layers: 2,
            vocab: 32,
            linear: &LoraModule::LINEAR,
            experts: None,
            source: "the model config".into(),
        }
    }

    const Q0A: &str = "model.layers.0.self_attn.q_proj.lora_A.weight";
    const Q0B: &str = "model.layers.0.self_attn.q_proj.lora_B.weight";
    const V0A: &str = "model.layers.0.self_attn.v_proj.lora_A.weight";
    const V0B: &str = "model.layers.0.self_attn.v_proj.lora_B.weight";

    #[test]
    fn a_matching_adapter_passes_and_each_mismatch_names_its_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        adapter(
            &good,
            4,
            &[
                (Q0A, [4, 64]),
                (Q0B, [64, 4]),
                (V0A, [4, 64]),
                (V0B, [32, 4]),
            ],
        );
        check_adapter(&good, &lora(4, "q_proj,v_proj"), &base()).unwrap();

        let err = check_adapter(&good, &lora(8, "q_proj,v_proj"), &base()).unwrap_err();
        assert!(
            err.contains("has r=4, the job peft.r=8; set peft.r=4"),
            "{err}"
        );

        let err = check_adapter(&good, &lora(4, "q_proj"), &base()).unwrap_err();
        assert!(
            err.contains("set peft.target_modules=[q_proj,v_proj]"),
            "{err}"
        );

        // Made for a 32-wide base.
        let narrow = tmp.path().join("narrow");
        adapter(&narrow, 4, &[(Q0A, [4, 32]), (Q0B, [32, 4])]);
        let err = check_adapter(&narrow, &lora(4, "q_proj"), &base()).unwrap_err();
        assert!(
            err.contains(&format!("tensor `{PEFT_PREFIX}{Q0A}`"))
                && err.contains("shape [4, 32]")
                && err.contains("gives it [4, 64]")
                && err.contains("set model.init_from to its base (\"/bases/b\")"),
            "{err}"
        );

        // Made for a deeper base.
        let deep = tmp.path().join("deep");
        adapter(
            &deep,
            4,
            &[("model.layers.5.self_attn.q_proj.lora_A.weight", [4, 64])],
        );
        let err = check_adapter(&deep, &lora(4, "q_proj"), &base()).unwrap_err();
        assert!(
            err.contains("is not a LoRA factor of a 2-layer base"),
            "{err}"
        );

        let err =
            check_adapter(&tmp.path().join("missing"), &lora(4, "q_proj"), &base()).unwrap_err();
        assert!(
            err.contains("point it at a PEFT adapter directory"),
            "{err}"
        );
    }

    /// A mixture's adapter as PEFT writes it on transformers 5 (the fused experts'
    /// `ParamWrapper`s, gate_up at twice the rank, the router) passes on a Mixtral base, and
    /// the modules it adapts are named by Mixtral's names in the fix.
    #[test]
    fn a_mixtures_expert_adapter_is_checked_by_its_target_parameters() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("moe");
        let mixtral = BaseDims {
            linear: &LoraModule::MIXTRAL_LINEAR,
            experts: Some(ExpertDims {
                count: 4,
                intermediate: 48,
                sparse: vec![true, true],
                modules: ([LoraModule::W1, LoraModule::W3], LoraModule::W2),
            }),
            ..base()
        };
        let l0 = |m: &str| format!("model.layers.0.{m}");
        let names = [
            l0("self_attn.q_proj.lora_A.weight"),
            l0("self_attn.q_proj.lora_B.weight"),
            l0("mlp.experts.base_layer.lora_A.weight"),
            l0("mlp.experts.base_layer.lora_B.weight"),
            l0("mlp.experts.lora_A.weight"),
            l0("mlp.experts.lora_B.weight"),
            l0("mlp.gate.lora_A.weight"),
            l0("mlp.gate.lora_B.weight"),
        ];
        let shapes = [
            [4, 64],
            [64, 4],
            [32, 64],
            [96, 32],
            [16, 48],
            [64, 16],
            [4, 64],
            [4, 4],
        ];
        let tensors: Vec<(&str, [i64; 2])> = names.iter().map(String::as_str).zip(shapes).collect();
        adapter(&dir, 4, &tensors);
        std::fs::write(
            dir.join("adapter_config.json"),
            r#"{"peft_type": "LORA", "r": 4, "base_model_name_or_path": "/bases/b",
                "target_modules": ["q_proj"],
                "target_parameters": ["down_proj", "gate_up_proj", "gate.weight"]}"#,
        )
        .unwrap();
        check_adapter(&dir, &lora(4, "q_proj,w1,w3,w2,gate"), &mixtral).unwrap();
        let err = check_adapter(&dir, &lora(4, "q_proj"), &mixtral).unwrap_err();
        assert!(
            err.contains("set peft.target_modules=[gate,q_proj,w1,w2,w3]"),
            "{err}"
        );
        // The same tensors on a dense base are no factors of it.
        let err = check_adapter(&dir, &lora(4, "q_proj"), &base()).unwrap_err();
        assert!(
            err.contains("mlp.experts.base_layer.lora_A.weight"),
            "{err}"
        );
    }
}
