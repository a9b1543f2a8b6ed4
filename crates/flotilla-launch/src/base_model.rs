//! The architecture a job really trains: its `model` config, or with `model.init_from` the
//! base directory's `config.json`, read and checked by the same code as the trainer's
//! (`flotilla_config::schema::hf_config`), so that a base the trainer would refuse (an
//! architecture, activation, head size or rope type it does not implement) is refused here. The memory planner (`plan --memory`, `run`'s fit check) and `run`'s adapter
//! pre-flight price and check a fine-tuning job against it, read without libtorch; a job whose
//! `data.seq_len` exceeds the base's positions, or whose LoRA targets a mixture of experts' MLP,
//! is refused here, before anything is created.

use std::borrow::Cow;
use std::path::Path;

use flotilla_config::schema::hf_config::{read_model_config, HfConfigError};
use flotilla_config::schema::{
    lora_moe_problem, JobConfig, ModelConfig, TokenizerSpec, BYTE_TOKENIZER_IDS,
};

/// `job` with its `model` replaced by the sizes and architecture of `model.init_from`'s
/// `config.json` (the job itself when it starts from no directory). An unreadable or
/// incomplete `config.json`, an architecture flotilla does not implement, or a `data.seq_len`
/// beyond the base's positions is an error naming the file and the fix.
pub fn trained_job(job: &JobConfig) -> Result<Cow<'_, JobConfig>, String> {
    let Some(dir) = &job.model.init_from else {
        return Ok(Cow::Borrowed(job));
    };
    let mut owned = job.clone();
    owned.model = base_model(Path::new(dir), &job.model)?;
    let positions = owned.model.max_position_embeddings;
    if positions > 0 && job.data.seq_len() > positions {
        return Err(format!(
            "data.seq_len: {} exceeds model.init_from's max_position_embeddings ({positions}); \
             set data.seq_len={positions} or less",
            job.data.seq_len()
        ));
    }
    check_tokenizer(job, &owned.model)?;
    if let Some(problem) = job
        .peft
        .lora()
        .and_then(|l| lora_moe_problem(&owned.model, l))
    {
        return Err(format!("{}: {}", problem.0, problem.1));
    }
    Ok(Cow::Owned(owned))
}

/// Text and JSONL data with `data.tokenizer` unset take the base's `tokenizer.json`, which must
/// be there; the byte tokenizer needs a base vocabulary that holds its ids.
fn check_tokenizer(job: &JobConfig, base: &ModelConfig) -> Result<(), String> {
    let init_from = job.model.init_from.as_deref();
    match job.data.tokenizer(init_from) {
        Some(TokenizerSpec::File(path)) if !Path::new(&path).is_file() => Err(format!(
            "data.tokenizer: {path} does not exist; with model.init_from and data.tokenizer \
             unset, text and jsonl data take the base's tokenizer.json: add it to the base, or \
             set data.tokenizer to a tokenizer.json, byte or bpe"
        )),
        Some(TokenizerSpec::Byte) if base.vocab_size < BYTE_TOKENIZER_IDS => Err(format!(
            "data.tokenizer=byte needs {BYTE_TOKENIZER_IDS} ids, and model.init_from's \
             vocabulary has {}: use the base's tokenizer (leave data.tokenizer unset) or a \
             tokenizer.json",
            base.vocab_size
        )),
        _ => Ok(()),
    }
}

/// The model `dir/config.json` describes, read and checked as the trainer reads it
/// (`flotilla_config::schema::hf_config`: the architecture, activation, head size, rope type and
/// its parameters), with the job's own name and `init_from`.
fn base_model(dir: &Path, job_model: &ModelConfig) -> Result<ModelConfig, String> {
    let model = read_model_config(dir).map_err(|e| match e {
        HfConfigError::Io { path, source } => format!(
            "model.init_from: cannot read {}: {source}; point it at a Hugging Face model \
             directory (config.json and *.safetensors)",
            path.display()
        ),
        e => format!("model.init_from: {e}"),
    })?;
    Ok(ModelConfig {
        name: job_model.name.clone(),
        init_from: job_model.init_from.clone(),
        ..model
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory;
    use flotilla_config::schema::ModelType;

    #[test]
    fn a_job_from_a_base_directory_is_priced_as_that_base() {
        let tmp = tempfile::tempdir().unwrap();
        let mut job = memory::tests::job("");
        assert!(matches!(trained_job(&job).unwrap(), Cow::Borrowed(_)));

        // llama-8b's sizes in a base directory; the job's `model` still says tiny.
        std::fs::write(
            tmp.path().join("config.json"),
            r#"{"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 131072, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        job.model.init_from = Some(tmp.path().display().to_string());
        let trained = trained_job(&job).unwrap();
        assert_eq!(trained.model.hidden_size, 4096);
        assert_eq!(trained.model.num_key_value_heads, 8);
        assert!(!trained.model.tie_word_embeddings);
        assert_eq!(
            memory::Units::of(&trained).total(),
            8_030_261_248,
            "llama-8b's parameters"
        );
        assert!(memory::estimate(&trained).peak_bytes > 10 * memory::estimate(&job).peak_bytes);

        job.model.init_from = Some(tmp.path().join("missing").display().to_string());
        let err = trained_job(&job).unwrap_err();
        assert!(err.contains("model.init_from: cannot read"), "{err}");
    }

    #[test]
    fn qwen2_biases_gemma_norms_and_windows_below_seq_len_are_priced() {
        let tmp = tempfile::tempdir().unwrap();
        let mut job = memory::tests::job(""); // data.seq_len 32
        job.model.init_from = Some(tmp.path().display().to_string());
        let sizes = r#""vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2"#;
        let write = |extra: &str| {
            std::fs::write(
                tmp.path().join("config.json"),
                format!("{{{sizes}, {extra}}}"),
            )
            .unwrap()
        };

        write(r#""model_type": "llama", "tie_word_embeddings": true"#);
        let llama = memory::Units::of(&trained_job(&job).unwrap()).total();
        write(
            r#""model_type": "qwen2", "tie_word_embeddings": true, "use_sliding_window": false,
               "sliding_window": 16"#,
        );
        let trained = trained_job(&job).unwrap();
        assert_eq!(trained.model.model_type, Some(ModelType::Qwen2));
        assert_eq!(
            trained.model.sliding_window, None,
            "use_sliding_window is false"
        );
        // q_proj.bias [64] + k_proj.bias and v_proj.bias [2 heads x 16] per layer.
        let biases = 3 * (64 + 2 * 32);
        assert_eq!(memory::Units::of(&trained).total(), llama + biases);
        assert_eq!(trained.model.num_parameters(), llama + biases);

        // A window shorter than data.seq_len (32) is attention as transformers computes it.
        write(r#""model_type": "mistral", "sliding_window": 16"#);
        assert_eq!(trained_job(&job).unwrap().model.sliding_window, Some(16));

        // Gemma 2: four norms a block, heads of their own size.
        write(
            r#""model_type": "gemma2", "head_dim": 32, "tie_word_embeddings": true,
               "sliding_window": 8"#,
        );
        let gemma = trained_job(&job).unwrap();
        assert_eq!(gemma.model.head_dim(), 32);
        let units = memory::Units::of(&gemma);
        assert_eq!(units.total(), gemma.model.num_parameters());
        assert!(
            units.total() > llama,
            "wider heads and two more norms a block"
        );

        write(r#""model_type": "gemma""#);
        let err = trained_job(&job).unwrap_err();
        assert!(err.contains("`gemma` is not supported"), "{err}");
    }
}

#[cfg(test)]
mod moe_tests {
    use super::*;
    use crate::memory;

    /// A LoRA job that targets a mixture of experts' MLP is refused before anything is made,
    /// naming the fix; one on its attention is priced as the base.
    #[test]
    fn lora_on_a_mixtures_experts_as_peft_cannot_is_refused_before_the_queue() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("config.json"),
            r#"{"model_type": "mixtral", "vocab_size": 100, "hidden_size": 64,
                "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}"#,
        )
        .unwrap();
        let mut job = memory::tests::job("");
        job.model.init_from = Some(tmp.path().display().to_string());
        let lora_with = |targets: serde_json::Value, dropout: f64| {
            serde_json::from_value(serde_json::json!({
                "method": "lora", "r": 4, "alpha": 8, "dropout": dropout,
                "target_modules": targets, "use_rslora": false, "modules_to_save": [],
                "init_from": null, "merge": false,
            }))
            .unwrap()
        };
        let lora = |targets: serde_json::Value| lora_with(targets, 0.0);
        job.peft = lora(serde_json::json!(["q_proj", "w1"]));
        let err = trained_job(&job).unwrap_err();
        assert!(
            err.contains("lists `w1` without `w3`") && err.contains("list both `w1` and `w3`"),
            "{err}"
        );
        job.peft = lora_with(serde_json::json!(["all-linear"]), 0.05);
        let err = trained_job(&job).unwrap_err();
        assert!(
            err.contains("peft.dropout is 0.05") && err.contains("set peft.dropout=0.0"),
            "{err}"
        );
        job.peft = lora(serde_json::json!(["all-linear"]));
        assert!(trained_job(&job).is_ok());
        job.peft = lora(serde_json::json!(["q_proj", "v_proj"]));
        let trained = trained_job(&job).unwrap();
        // 4 experts of [96, 64] x 3 and a router of [4, 64] in each of the 2 layers.
        assert_eq!(trained.model.mlp_elements(0), 4 * 64 + 4 * 3 * 64 * 96);
    }
}
