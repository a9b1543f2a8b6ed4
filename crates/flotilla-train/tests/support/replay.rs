//! What a Python training oracle replays (tests/oracle/train_oracle.py's loop, also behind
//! peft_oracle.py): the micro-batches a trainer will see, written as a safetensors file
//! (`x.{step}.{k}` input ids, `y.{step}.{k}` shifted labels, `tok.{step}` labelled tokens of
//! the global batch), and the loop's hyperparameter arguments.

use std::path::Path;

use flotilla_config::schema::TrainerConfig;
use flotilla_train::data::DataLoader;
use tch::Tensor;

/// Writes the next `steps` steps of `loader` to `path`.
pub fn write_step_batches(loader: &mut DataLoader, steps: u64, path: &Path) {
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for s in 0..steps {
        let step = loader.next_step().unwrap();
        tensors.push((
            format!("tok.{s}"),
            Tensor::from(step.global_loss_tokens as i64),
        ));
        for (k, b) in step.micro_batches.iter().enumerate() {
            tensors.push((format!("x.{s}.{k}"), b.input_ids.copy()));
            tensors.push((format!("y.{s}.{k}"), b.labels.copy()));
        }
    }
    Tensor::write_safetensors(&tensors, path).unwrap();
}

/// `LR MIN_LR WARMUP SCHEDULE WD BETA1 BETA2 EPS CLIP` of `t`.
pub fn hyperparameters(t: &TrainerConfig, schedule: &str) -> Vec<String> {
    vec![
        t.lr.to_string(),
        t.min_lr.to_string(),
        t.warmup_steps.to_string(),
        schedule.to_string(),
        t.weight_decay.to_string(),
        t.betas[0].to_string(),
        t.betas[1].to_string(),
        t.eps.to_string(),
        t.grad_clip.to_string(),
    ]
}
