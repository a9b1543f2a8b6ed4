//! Validation: [`validate`] reads the top-level sections of the job config and then applies
//! the semantic rules that belong to the config (head counts, batch divisibility, world size,
//! sequence length, vocabulary, ...), naming where each offending value was set.

use super::from_node::{read, Cx, FromNode};
use super::gpus::{gpu_model, gpu_names};
use super::messages::{alternatives, quote_list, set_note, show, suggest, typo_note};
use super::objective::DpoLossType;
use super::types::ModelType;
use super::types::{
    AutoWrapPolicy, Backend, ComputeConfig, DataConfig, DataKind, Device, DistConfig, DistMode,
    JobConfig, Launcher, LoraConfig, LoraModule, ModelConfig, ObjectiveConfig, PeftConfig,
    TaskConfig, TaskRanks, TokenizerSpec, TrainerConfig,
};
use super::{ProblemKind, SchemaError};
use crate::node::{python_float_repr, Dict, Node, Value};

mod data_checks;

/// Fewest model ids the byte-level tokenizer needs (one per byte, before special tokens).
pub const BYTE_VOCAB: usize = 256;

/// Every id of the byte-level tokenizer: its 256 byte ids and PAD, BOS, EOS.
pub const BYTE_TOKENIZER_IDS: usize = BYTE_VOCAB + 3;

/// Largest `data.digits` for the built-in arithmetic data (products must fit in an `i64`).
pub const MAX_ARITHMETIC_DIGITS: usize = 9;

/// Checks the resolved job config tree and returns it typed, or every problem found.
pub fn validate(job: &Node) -> Result<JobConfig, SchemaError> {
    let mut cx = Cx::default();
    let Value::Dict(root) = &job.value else {
        cx.push(
            ProblemKind::WrongType,
            "",
            &job.origin,
            format!(
                "the job config must be a dict, got {}{}",
                show(&job.value),
                set_note(&job.origin)
            ),
        );
        return Err(SchemaError {
            problems: cx.problems,
        });
    };

    let seed = top::<i64>(
        job,
        root,
        "seed",
        "1234",
        "add it, e.g. +seed=1234",
        &mut cx,
    );
    let model = top::<ModelConfig>(
        job,
        root,
        "model",
        "tiny",
        "select a preset in the defaults list (- model: tiny) or with model=tiny",
        &mut cx,
    );
    // `peft` is optional: a config without the group trains every weight.
    let peft = match root.get("peft") {
        Some(node) => read::<PeftConfig>(node, "peft", Some("none"), &mut cx),
        None => Some(PeftConfig::None),
    };
    let trainer = top::<TrainerConfig>(
        job,
        root,
        "trainer",
        "default",
        "select it in the defaults list (- trainer: default) or with trainer=default",
        &mut cx,
    );
    let data = top::<DataConfig>(
        job,
        root,
        "data",
        "arithmetic",
        "select a source in the defaults list (- data: arithmetic) or with data=arithmetic",
        &mut cx,
    );
    let compute = top::<ComputeConfig>(
        job,
        root,
        "compute",
        "local",
        "select one in the defaults list (- compute: local) or with compute=local",
        &mut cx,
    );

    // `objective` is optional: a config without the group fine-tunes on next tokens.
    let objective = match root.get("objective") {
        Some(node) => read::<ObjectiveConfig>(node, "objective", Some("sft"), &mut cx),
        None => Some(ObjectiveConfig::Sft),
    };

    let mut ck = Check { job, cx: &mut cx };
    if let Some(o) = &objective {
        ck.objective(o, data.as_ref());
    }
    if let Some(m) = &model {
        ck.model(m);
    }
    if let Some(t) = &trainer {
        ck.trainer(t, compute.as_ref());
    }
    if let Some(d) = &data {
        ck.data(d, model.as_ref());
    }
    if let Some(c) = &compute {
        ck.compute(c, trainer.as_ref());
    }
    if let (Some(PeftConfig::Lora(l)), Some(m)) = (&peft, &model) {
        ck.lora(l, m);
    }

    match (seed, model, peft, trainer, data, compute, objective) {
        (
            Some(seed),
            Some(model),
            Some(peft),
            Some(trainer),
            Some(data),
            Some(compute),
            Some(objective),
        ) if cx.problems.is_empty() => Ok(JobConfig {
            seed,
            model,
            peft,
            trainer,
            data,
            compute,
            objective,
        }),
        _ => Err(SchemaError {
            problems: cx.problems,
        }),
    }
}

/// `compute` of a job that runs the user's own program and leaves keys of it unset: one local
/// process.
pub const USER_TASK_COMPUTE_DEFAULTS: &str = "launcher: local\nnodes: 1\ntasks_per_node: 1\n\
gpus_per_node: 0\ncpus_per_task: 1\nmem_gb: null\ntimeout_min: 60\npartition: null\n\
account: null\nqos: null\nconstraint: null\narray_parallelism: 256\nsignal_delay_s: 90\n\
max_num_timeout: 3\nsetup: []\nadditional_parameters: {}\ntemplate: null\nmax_parallel: 1\n\
gpu_type: null\ngpu_mem_gb: null\ncheck_memory: true\n";

/// Programs known to start their own workers (`ranks: per_node`): launchers run directly, and
/// Python modules run with `python -m`.
const WORKER_LAUNCHERS: [&str; 3] = ["torchrun", "accelerate", "deepspeed"];
const WORKER_LAUNCHER_MODULES: [&str; 4] = [
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
    "deepspeed.launcher.runner",
];

/// Does `argv` start a known launcher of workers (torchrun, `python -m torch.distributed.run`,
/// accelerate, deepspeed)?
pub fn starts_known_launcher(argv: &[String]) -> bool {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let Some(program) = argv.first().map(|p| base(p)) else {
        return false;
    };
    if WORKER_LAUNCHERS.contains(&program.as_str()) {
        return true;
    }
    program.starts_with("python")
        && argv
            .windows(2)
            .any(|w| w[0] == "-m" && WORKER_LAUNCHER_MODULES.contains(&w[1].as_str()))
}

/// Checks a job that runs the user's own program: the resolved `flotilla.task` node and the
/// job's `compute` section (absent keys take [`USER_TASK_COMPUTE_DEFAULTS`]); the rest of the
/// job config is the user's and is not looked at. Returns the task and compute, or every
/// problem found.
pub fn validate_user_task(
    task: &Node,
    job: &Node,
) -> Result<(TaskConfig, ComputeConfig), SchemaError> {
    let mut cx = Cx::default();
    let mut compute_node = crate::yaml::load_str(USER_TASK_COMPUTE_DEFAULTS, "<compute defaults>")
        .expect("built-in compute defaults are valid YAML");
    if let Some(user) = job.select("compute") {
        if let Err(e) = crate::merge::merge_into(&mut compute_node, user.clone()) {
            cx.push(
                ProblemKind::WrongType,
                "compute",
                &user.origin,
                format!("compute: {e}{}", set_note(&user.origin)),
            );
        }
    }
    let command = task.select("command");
    if let Some(c) = command.filter(|c| matches!(c.value, Value::Str(_))) {
        cx.push(
            ProblemKind::WrongType,
            "flotilla.task.command",
            &c.origin,
            format!(
                "flotilla.task.command must be a list of arguments, got {}{}; write it as a list, e.g. [python, train.py, --lr=0.1] (a string is not split into words)",
                show(&c.value),
                set_note(&c.origin)
            ),
        );
    }
    let typed_task = read::<TaskConfig>(task, "flotilla.task", None, &mut cx);
    let compute = read::<ComputeConfig>(&compute_node, "compute", Some("local"), &mut cx);

    let mut root = Node::empty_dict();
    if let Value::Dict(d) = &mut root.value {
        let mut runtime = Node::empty_dict();
        if let Value::Dict(r) = &mut runtime.value {
            r.insert("task".into(), task.clone());
        }
        d.insert("flotilla".into(), runtime);
        d.insert("compute".into(), compute_node.clone());
    }
    let mut ck = Check {
        job: &root,
        cx: &mut cx,
    };
    if let Some(c) = &compute {
        ck.compute(c, None);
    }
    if let Some(t) = &typed_task {
        ck.user_task(t, compute.as_ref());
    }
    match (typed_task, compute) {
        (Some(t), Some(c)) if cx.problems.is_empty() => Ok((t, c)),
        _ => Err(SchemaError {
            problems: cx.problems,
        }),
    }
}

/// Reads one top-level section; `fix` says how to add it when absent.
fn top<T: FromNode>(
    job: &Node,
    root: &Dict,
    name: &str,
    example: &str,
    fix: &str,
    cx: &mut Cx,
) -> Option<T> {
    if let Some(node) = root.get(name) {
        return read::<T>(node, name, Some(example), cx);
    }
    let message = format!("{name} is missing — {fix}{}", typo_note(root, "", name));
    cx.push(ProblemKind::MissingKey, name, &job.origin, message);
    None
}

/// Semantic checks on typed sections; origins are looked up in the tree by key.
struct Check<'a> {
    job: &'a Node,
    cx: &'a mut Cx,
}

impl Check<'_> {
    fn invalid(&mut self, key: &str, problem: String, fix: String) {
        let origin = self
            .job
            .select(key)
            .map(|n| n.origin.clone())
            .unwrap_or_default();
        let message = format!("{key}: {problem}{}; {fix}", set_note(&origin));
        self.cx.push(ProblemKind::Invalid, key, &origin, message);
    }

    fn at_least(&mut self, key: &str, value: u64, min: u64) -> bool {
        if value < min {
            self.invalid(
                key,
                format!("must be at least {min}, got {value}"),
                format!("set {key}={min} or more"),
            );
            return false;
        }
        true
    }

    fn positive(&mut self, key: &str, value: f64) -> bool {
        if !(value.is_finite() && value > 0.0) {
            self.invalid(
                key,
                format!(
                    "must be a positive number, got {}",
                    python_float_repr(value)
                ),
                format!("set {key} to a number above 0"),
            );
            return false;
        }
        true
    }

    fn non_negative(&mut self, key: &str, value: f64) -> bool {
        if !(value.is_finite() && value >= 0.0) {
            self.invalid(
                key,
                format!("must be 0 or more, got {}", python_float_repr(value)),
                format!("set {key} to a number ≥ 0"),
            );
            return false;
        }
        true
    }

    fn lora(&mut self, l: &LoraConfig, m: &ModelConfig) {
        self.at_least("peft.r", l.r as u64, 1);
        self.positive("peft.alpha", l.alpha);
        if !(0.0..1.0).contains(&l.dropout) {
            self.invalid(
                "peft.dropout",
                format!("must be in [0, 1), got {}", python_float_repr(l.dropout)),
                "set peft.dropout=0.0 (no dropout) or a probability below 1".into(),
            );
        }
        if l.target_modules.is_empty() {
            self.invalid(
                "peft.target_modules",
                "is empty: LoRA would adapt nothing".into(),
                "list the layers to adapt, e.g. peft.target_modules=[q_proj,v_proj], or \
                 peft.target_modules=all-linear"
                    .into(),
            );
        } else if l.target_modules.len() > 1 && l.target_modules.contains(&LoraModule::AllLinear) {
            self.invalid(
                "peft.target_modules",
                "'all-linear' already names every linear layer and cannot be listed with others"
                    .into(),
                "write peft.target_modules=all-linear alone".into(),
            );
        }
        if let Some((problem, fix)) = super::moe::lora_moe_problem(m, l) {
            self.invalid("peft.target_modules", problem, fix);
        }
        // A job from a base is checked against the base's layers, by `run` and the trainer.
        let linear = m.linear_modules();
        let absent: Vec<&str> = l
            .target_modules
            .iter()
            .filter(|t| **t != LoraModule::AllLinear && !linear.contains(t))
            .map(|t| t.as_str())
            .collect();
        if !absent.is_empty() && m.init_from.is_none() {
            self.invalid(
                "peft.target_modules",
                format!(
                    "{} is not a linear layer of {} (its layers: {})",
                    quote_list(&absent),
                    m.architecture().display_name(),
                    quote_list(&linear.iter().map(|t| t.as_str()).collect::<Vec<_>>())
                ),
                "list the model's own layers, or peft.target_modules=all-linear".into(),
            );
        }
        if m.tie_word_embeddings && !l.modules_to_save.is_empty() {
            self.invalid(
                "peft.modules_to_save",
                format!(
                    "{} with tied embeddings (model.tie_word_embeddings=true): the head and \
                     the embedding are one weight, and training a copy of it is not supported",
                    quote_list(
                        &l.modules_to_save
                            .iter()
                            .map(|m| m.as_str())
                            .collect::<Vec<_>>()
                    )
                ),
                "set peft.modules_to_save=[] or use a base with untied embeddings".into(),
            );
        }
    }

    /// The architecture's own keys: `attention_bias` is refused where the architecture fixes its
    /// biases (Mistral, Qwen2), a window where it has none (Llama), `layer_types` without a
    /// window or of another length than the layers, and Gemma's keys on another architecture.
    fn architecture(&mut self, m: &ModelConfig) {
        let arch = m.architecture();
        if m.attention_bias == Some(true) && matches!(arch, ModelType::Mistral | ModelType::Qwen2) {
            self.invalid(
                "model.attention_bias",
                format!(
                    "{} has {}",
                    arch.display_name(),
                    if arch == ModelType::Qwen2 {
                        "its q/k/v biases by model_type"
                    } else {
                        "no biases"
                    }
                ),
                "remove it, or set model.attention_bias=false".into(),
            );
        }
        if let Some(w) = m.sliding_window {
            if arch == ModelType::Llama {
                self.invalid(
                    "model.sliding_window",
                    "Llama has no sliding attention window".into(),
                    "remove it, or set model.model_type=mistral".into(),
                );
            } else {
                self.at_least("model.sliding_window", w as u64, 1);
            }
        }
        if let Some(types) = &m.layer_types {
            if m.sliding_window.is_none() {
                self.invalid(
                    "model.layer_types",
                    "names sliding layers but model.sliding_window is not set".into(),
                    "set model.sliding_window, or remove model.layer_types".into(),
                );
            } else if types.len() != m.num_hidden_layers {
                self.invalid(
                    "model.layer_types",
                    format!(
                        "lists {} layers; the model has {} (model.num_hidden_layers)",
                        types.len(),
                        m.num_hidden_layers
                    ),
                    "give one entry per layer".into(),
                );
            }
        }
        if let Some(d) = m.head_dim {
            if self.at_least("model.head_dim", d as u64, 2) && d % 2 != 0 {
                self.invalid(
                    "model.head_dim",
                    format!("{d} is odd; rotary embeddings need an even head size"),
                    "set an even model.head_dim".into(),
                );
            }
        }
        if let Some(flags) = &m.no_rope_layers {
            if arch != ModelType::SmolLm3 {
                self.invalid(
                    "model.no_rope_layers",
                    format!("is SmolLM3's; {} has none", arch.display_name()),
                    "remove it, or set model.model_type=smollm3".into(),
                );
            } else if flags.len() != m.num_hidden_layers || flags.iter().any(|f| *f > 1) {
                self.invalid(
                    "model.no_rope_layers",
                    format!(
                        "must list one 0 or 1 per layer ({} layers), got {flags:?}",
                        m.num_hidden_layers
                    ),
                    "give 1 (rotary embeddings) or 0 (none) for each layer".into(),
                );
            }
        }
        let gemma_keys = [
            ("model.query_pre_attn_scalar", m.query_pre_attn_scalar),
            ("model.attn_logit_softcapping", m.attn_logit_softcapping),
            ("model.final_logit_softcapping", m.final_logit_softcapping),
            ("model.rope_local_base_freq", m.rope_local_base_freq),
        ];
        for (key, value) in gemma_keys {
            let Some(v) = value else { continue };
            if !arch.is_gemma() {
                self.invalid(
                    key,
                    format!("is Gemma's; {} has none", arch.display_name()),
                    "remove it, or set model.model_type=gemma2 or gemma3_text".to_string(),
                );
            } else {
                self.positive(key, v);
            }
        }
    }

    fn model(&mut self, m: &ModelConfig) {
        self.architecture(m);
        let sizes = [
            ("model.vocab_size", m.vocab_size),
            ("model.hidden_size", m.hidden_size),
            ("model.intermediate_size", m.intermediate_size),
            ("model.num_hidden_layers", m.num_hidden_layers),
            ("model.num_attention_heads", m.num_attention_heads),
            ("model.num_key_value_heads", m.num_key_value_heads),
            ("model.max_position_embeddings", m.max_position_embeddings),
        ];
        let mut all_positive = true;
        for (key, v) in sizes {
            all_positive &= self.at_least(key, v as u64, 1);
        }
        self.positive("model.rms_norm_eps", m.rms_norm_eps);
        self.positive("model.rope_theta", m.rope_theta);
        self.positive("model.initializer_range", m.initializer_range);
        if let Some(problem) = m.partial_rotary_problem() {
            self.invalid(
                "model.partial_rotary_factor",
                problem,
                "remove it, or set model.model_type=phi3".into(),
            );
        }
        for p in m.rope_problems("model.") {
            self.invalid(&p.key, p.problem, p.fix);
        }
        for (field, problem) in super::moe::moe_problems(m) {
            let fix = format!("correct model.{field}");
            self.invalid(&format!("model.{field}"), problem, fix);
        }
        if !all_positive {
            return;
        }
        let heads = m.num_attention_heads;
        if !m.hidden_size.is_multiple_of(heads) {
            self.invalid(
                "model.hidden_size",
                format!(
                    "{} is not divisible by model.num_attention_heads ({heads})",
                    m.hidden_size
                ),
                format!(
                    "use a multiple of {heads}, e.g. model.hidden_size={}, or change \
                     model.num_attention_heads",
                    nearest_multiple(m.hidden_size, heads)
                ),
            );
        } else if !m.head_dim().is_multiple_of(2) {
            self.invalid(
                "model.hidden_size",
                format!(
                    "gives an odd head dimension {} (model.hidden_size / \
                     model.num_attention_heads = {} / {heads}); rotary embeddings need it even",
                    m.head_dim(),
                    m.hidden_size
                ),
                format!(
                    "use a multiple of {}, e.g. model.hidden_size={}",
                    2 * heads,
                    nearest_multiple(m.hidden_size, 2 * heads)
                ),
            );
        }
        let kv = m.num_key_value_heads;
        if !heads.is_multiple_of(kv) {
            let divisors: Vec<String> = (1..=heads)
                .filter(|d| heads.is_multiple_of(*d))
                .map(|d| d.to_string())
                .collect();
            self.invalid(
                "model.num_key_value_heads",
                format!("{kv} does not divide model.num_attention_heads ({heads})"),
                format!("use one of {}", alternatives(&divisors, false)),
            );
        }
    }

    fn trainer(&mut self, t: &TrainerConfig, compute: Option<&ComputeConfig>) {
        self.at_least("trainer.max_steps", t.max_steps, 1);
        let global_ok = self.at_least("trainer.global_batch_size", t.global_batch_size as u64, 1);
        let micro_ok = self.at_least("trainer.micro_batch_size", t.micro_batch_size as u64, 1);
        self.at_least("trainer.log_every", t.log_every, 1);
        let lr_ok = self.positive("trainer.lr", t.lr);
        if self.non_negative("trainer.min_lr", t.min_lr) && lr_ok && t.min_lr > t.lr {
            self.invalid(
                "trainer.min_lr",
                format!(
                    "{} is above trainer.lr ({})",
                    python_float_repr(t.min_lr),
                    python_float_repr(t.lr)
                ),
                "set it to at most trainer.lr (often a tenth of it)".into(),
            );
        }
        // warmup_steps > max_steps is allowed: the warm-up ramp simply never completes (a
        // quick `trainer.max_steps=5` smoke run must not need a second override).
        self.non_negative("trainer.weight_decay", t.weight_decay);
        if t.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            self.invalid(
                "trainer.betas",
                format!(
                    "each beta must be in [0, 1), got [{}, {}]",
                    python_float_repr(t.betas[0]),
                    python_float_repr(t.betas[1])
                ),
                "use e.g. trainer.betas=[0.9,0.95]".into(),
            );
        }
        self.positive("trainer.eps", t.eps);
        self.non_negative("trainer.grad_clip", t.grad_clip);
        if t.eval_every > 0 && t.eval_batches == 0 {
            self.invalid(
                "trainer.eval_batches",
                format!("is 0 but trainer.eval_every is {}", t.eval_every),
                "set trainer.eval_batches=1 or more, or trainer.eval_every=0 to disable evaluation"
                    .into(),
            );
        }

        // The batch must split evenly over micro-batches and ranks.
        let world = compute
            .map(|c| c.world_size())
            .filter(|w| *w > 0)
            .unwrap_or(1);
        if global_ok && micro_ok {
            let per_step = t.micro_batch_size * world;
            if !t.global_batch_size.is_multiple_of(per_step) {
                let problem = if world == 1 {
                    format!(
                        "{} is not divisible by trainer.micro_batch_size ({})",
                        t.global_batch_size, t.micro_batch_size
                    )
                } else {
                    format!(
                        "{} is not divisible by trainer.micro_batch_size × world size = {} × {world} \
                         = {per_step} (world size = compute.nodes × compute.tasks_per_node)",
                        t.global_batch_size, t.micro_batch_size
                    )
                };
                self.invalid(
                    "trainer.global_batch_size",
                    problem,
                    format!(
                        "use a multiple of {per_step}, e.g. trainer.global_batch_size={}, or \
                         change trainer.micro_batch_size",
                        nearest_multiple(t.global_batch_size, per_step)
                    ),
                );
            }
        }

        match &t.dist {
            DistConfig::None => {
                if world > 1 {
                    let c = compute.expect("world > 1 comes from compute");
                    self.invalid(
                        "trainer.dist.mode",
                        format!(
                            "is none but the job starts {world} processes (compute.nodes {} × \
                             compute.tasks_per_node {})",
                            c.nodes, c.tasks_per_node
                        ),
                        "select trainer/dist=ddp or trainer/dist=fsdp, or set compute.nodes=1 \
                         compute.tasks_per_node=1"
                            .into(),
                    );
                }
            }
            DistConfig::Ddp(d) => {
                self.at_least("trainer.dist.timeout_s", d.timeout_s, 1);
                self.positive("trainer.dist.bucket_cap_mb", d.bucket_cap_mb);
            }
            DistConfig::Fsdp(f) => {
                self.at_least("trainer.dist.timeout_s", f.timeout_s, 1);
                if f.auto_wrap_policy == AutoWrapPolicy::Size {
                    self.at_least("trainer.dist.min_num_params", f.min_num_params, 1);
                }
            }
        }
        if t.dist.backend() == Some(Backend::Nccl) && t.device == Device::Cpu {
            self.invalid(
                "trainer.dist.backend",
                "nccl needs CUDA but trainer.device is cpu".into(),
                "set trainer.dist.backend=cpu (or auto), or trainer.device=cuda".into(),
            );
        }
        // The cpu backend's collectives take CPU tensors only, and every rank's are on the GPU:
        // the job would fail at its first collective, once queued and started (one process
        // has no collective and trains).
        if t.dist.backend() == Some(Backend::Cpu) && t.device == Device::Cuda && world > 1 {
            let device_note = self
                .job
                .select("trainer.device")
                .map(|n| set_note(&n.origin))
                .unwrap_or_default();
            self.invalid(
                "trainer.dist.backend",
                format!(
                    "cpu exchanges CPU tensors only, but trainer.device is cuda{device_note}: \
                     the {world} ranks would fail at their first collective, after the job started"
                ),
                "set trainer.dist.backend=nccl (or auto, which is nccl on CUDA), or \
                 trainer.device=cpu"
                    .into(),
            );
        }
    }

    /// Chat and preference data render with a Hugging Face tokenizer directory's: the one named,
    /// or the base model's.
    fn hf_tokenizer(&mut self, tokenizer: Option<&str>, model: Option<&ModelConfig>, kind: &str) {
        let init_from = model.and_then(|m| m.init_from.as_deref());
        if tokenizer.is_none() && init_from.is_none() {
            self.invalid(
                "data.tokenizer",
                format!(
                    "is null and model.init_from names no model whose tokenizer {kind} data could \
                     use"
                ),
                "set data.tokenizer=/path/to/tokenizer_dir (a Hugging Face tokenizer directory \
                 with tokenizer.json and tokenizer_config.json) or model.init_from=/path/to/model"
                    .into(),
            );
        }
    }

    /// DPO's settings, and the data each objective takes: preference pairs for `dpo`, and only
    /// for it.
    fn objective(&mut self, o: &ObjectiveConfig, data: Option<&DataConfig>) {
        let preference = data.map(|d| d.kind() == DataKind::Preference);
        match o {
            ObjectiveConfig::Sft => {
                if preference == Some(true) {
                    self.invalid(
                        "data.kind",
                        "is preference, whose pairs only a preference objective trains on, but \
                         objective is sft"
                            .into(),
                        "select objective=dpo, or a data source for supervised fine-tuning \
                         (data=chat, data=jsonl, ...)"
                            .into(),
                    );
                }
            }
            ObjectiveConfig::Dpo(d) => {
                self.positive("objective.beta", d.beta);
                let upper = if d.loss_type == DpoLossType::Robust {
                    0.5
                } else {
                    1.0
                };
                if !(0.0..upper).contains(&d.label_smoothing) {
                    self.invalid(
                        "objective.label_smoothing",
                        format!(
                            "must be in [0, {upper}) for loss_type {}, got {}",
                            d.loss_type.as_str(),
                            python_float_repr(d.label_smoothing)
                        ),
                        "set objective.label_smoothing=0.0 (no label noise) or e.g. 0.1".into(),
                    );
                }
                if d.label_smoothing > 0.0
                    && !matches!(d.loss_type, DpoLossType::Sigmoid | DpoLossType::Robust)
                {
                    self.invalid(
                        "objective.label_smoothing",
                        format!(
                            "is {} but loss_type {} has no label noise",
                            python_float_repr(d.label_smoothing),
                            d.loss_type.as_str()
                        ),
                        "set objective.label_smoothing=0.0, or objective.loss_type=sigmoid \
                         (conservative DPO) or robust"
                            .into(),
                    );
                }
                if preference == Some(false) {
                    self.invalid(
                        "objective.kind",
                        "is dpo, which trains on preference pairs, but data is not \
                         data=preference"
                            .into(),
                        "select data=preference data.path=/path/to/pairs.jsonl (records with \
                         prompt, chosen and rejected)"
                            .into(),
                    );
                }
            }
        }
    }

    fn non_empty(&mut self, key: &str, value: &str) {
        if value.is_empty() {
            self.invalid(key, "is empty".into(), format!("set {key}"));
        }
    }

    /// The tokenizer's ids must fit the model's embedding table. A job that starts from a base
    /// (`model.init_from`) has the base's vocabulary, not the preset's: it is checked against
    /// the base where the base is read (`run`'s pre-flight, the trainer).
    fn vocab(
        &mut self,
        tokenizer: Option<&TokenizerSpec>,
        vocab_size: usize,
        model: Option<&ModelConfig>,
    ) {
        if model.is_some_and(|m| m.init_from.is_some()) {
            return;
        }
        match &TokenizerSpec::resolve(tokenizer, None) {
            TokenizerSpec::Bpe => {
                if !self.at_least("data.vocab_size", vocab_size as u64, 1) {
                    return;
                }
                if let Some(m) = model.filter(|m| vocab_size > m.vocab_size) {
                    self.invalid(
                        "data.vocab_size",
                        format!(
                            "the bpe tokenizer's {vocab_size} tokens exceed model.vocab_size ({})",
                            m.vocab_size
                        ),
                        format!(
                            "set data.vocab_size={} or less, or raise model.vocab_size",
                            m.vocab_size
                        ),
                    );
                }
            }
            TokenizerSpec::Byte => {
                if let Some(m) = model.filter(|m| m.vocab_size > 0 && m.vocab_size < BYTE_VOCAB) {
                    self.invalid(
                        "model.vocab_size",
                        format!(
                            "{} is too small for data.tokenizer=byte, which needs at least \
                             {BYTE_VOCAB} ids plus its special tokens",
                            m.vocab_size
                        ),
                        "raise model.vocab_size (e.g. model=small), or use data.tokenizer=bpe"
                            .into(),
                    );
                }
            }
            TokenizerSpec::File(_) => {}
        }
    }

    fn user_task(&mut self, t: &TaskConfig, compute: Option<&ComputeConfig>) {
        let Some(command) = &t.command else {
            return;
        };
        if command.is_empty() || command[0].trim().is_empty() {
            self.invalid(
                "flotilla.task.command",
                "is empty: there is no program to run".into(),
                "name the program and its arguments, e.g. [python, train.py]".into(),
            );
            return;
        }
        let Some(c) = compute else { return };
        if t.ranks == TaskRanks::PerNode
            && c.tasks_per_node > 1
            && !t.starts_workers
            && !starts_known_launcher(command)
        {
            self.invalid(
                "flotilla.task.ranks",
                format!(
                    "is per_node (one process per node, which must start the {} workers of its node), but `{}` is not known to start workers (torchrun, python -m torch.distributed.run, accelerate launch, deepspeed)",
                    c.tasks_per_node, command[0]
                ),
                format!(
                    "set flotilla.task.ranks=per_task to have flotilla start the {} processes per node, run the program through torchrun, or set flotilla.task.starts_workers=true if it starts its own",
                    c.tasks_per_node
                ),
            );
        }
    }

    fn compute(&mut self, c: &ComputeConfig, trainer: Option<&TrainerConfig>) {
        self.at_least("compute.nodes", c.nodes as u64, 1);
        self.at_least("compute.tasks_per_node", c.tasks_per_node as u64, 1);
        self.at_least("compute.cpus_per_task", c.cpus_per_task as u64, 1);
        self.at_least("compute.timeout_min", c.timeout_min, 1);
        self.at_least("compute.array_parallelism", c.array_parallelism as u64, 1);
        self.at_least("compute.max_parallel", c.max_parallel as u64, 1);
        if let Some(mem) = c.mem_gb {
            self.at_least("compute.mem_gb", mem, 1);
        }
        self.pack(c);
        if let Some(gb) = c.gpu_mem_gb {
            self.positive("compute.gpu_mem_gb", gb);
        }
        if let Some(name) = &c.gpu_type {
            self.gpu_type(name);
        }
        let Some(t) = trainer else { return };
        if c.launcher == Launcher::Slurm && t.device == Device::Cuda && c.gpus_per_node == 0 {
            self.invalid(
                "compute.gpus_per_node",
                "is 0 but trainer.device is cuda".into(),
                "request GPUs, e.g. compute.gpus_per_node=8, or set trainer.device=cpu".into(),
            );
        }
        if c.gpus_per_node > 0
            && c.tasks_per_node > c.gpus_per_node
            && t.dist.mode() != DistMode::None
            && t.device != Device::Cpu
        {
            self.invalid(
                "compute.tasks_per_node",
                format!(
                    "{} ranks per node would share {} GPUs; each rank needs its own GPU",
                    c.tasks_per_node, c.gpus_per_node
                ),
                format!(
                    "set compute.tasks_per_node={} (or fewer), or raise compute.gpus_per_node",
                    c.gpus_per_node
                ),
            );
        }
    }
}

impl Check<'_> {
    /// `compute.pack`: at least 1; a packed job runs inside one node of the allocation and
    /// takes `tasks_per_node` of its slots.
    fn pack(&mut self, c: &ComputeConfig) {
        let Some(pack) = c.pack else { return };
        self.at_least("compute.pack", pack as u64, 1);
        if pack < 2 {
            return;
        }
        if c.nodes > 1 {
            self.invalid(
                "compute.pack",
                format!(
                    "packs jobs into the slots of one node, but each job asks for {} nodes",
                    c.nodes
                ),
                "set compute.nodes=1 for a packed sweep, or remove compute.pack (one allocation per job)".into(),
            );
        } else if c.tasks_per_node > pack {
            self.invalid(
                "compute.pack",
                format!(
                    "is {pack} slots, fewer than the {} ranks (compute.tasks_per_node) one job takes",
                    c.tasks_per_node
                ),
                format!(
                    "set compute.pack={} or more (a multiple of compute.tasks_per_node)",
                    c.tasks_per_node
                ),
            );
        }
    }

    /// `compute.gpu_type` must name a GPU of the table, or the fix names the nearest ones.
    fn gpu_type(&mut self, name: &str) {
        if gpu_model(name).is_some() {
            return;
        }
        let key = "compute.gpu_type";
        let origin = self
            .job
            .select(key)
            .map(|n| n.origin.clone())
            .unwrap_or_default();
        let names = gpu_names();
        // A family name (`a100`) suggests its memory sizes (`a100-80gb`, `a100-40gb`); else the
        // nearest names.
        let given = name.trim().to_lowercase();
        let first = given.split('-').next().unwrap_or_default();
        let family: Vec<&str> = names
            .iter()
            .filter(|n| n.split('-').next() == Some(first))
            .copied()
            .collect();
        let near = if family.is_empty() {
            suggest(name, &names)
        } else {
            family
        };
        let hint = if near.is_empty() {
            format!("the known GPUs are {}.", alternatives(&names, true))
        } else {
            format!("did you mean {}?", alternatives(&near, true))
        };
        let message = format!(
            "{key}: unknown GPU '{name}'{}; {hint} Or give the memory of one GPU in GiB, e.g. compute.gpu_mem_gb=80",
            set_note(&origin)
        );
        self.cx.push(ProblemKind::BadChoice, key, &origin, message);
    }
}

/// The multiple of `m` nearest to `x` (at least `m`).
fn nearest_multiple(x: usize, m: usize) -> usize {
    (((x + m / 2) / m) * m).max(m)
}
