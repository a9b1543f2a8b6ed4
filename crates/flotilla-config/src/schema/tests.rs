//! Tests of validation: every shipped preset validates, and each kind of problem (unknown
//! and missing keys, wrong types, bad choices, `???`, the semantic rules) is reported with its
//! key, origin and fix.

use super::*;
use crate::node::{Dict, Node, Origin, Value};
use serde_json::json;
use std::sync::Arc;

/// Turns a JSON literal into a tree whose every node has `origin` (`"???"` → Missing).
fn tree(j: &serde_json::Value, origin: &Origin) -> Node {
    use serde_json::Value as J;
    let value = match j {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap()),
        },
        J::String(s) if s == "???" => Value::Missing,
        J::String(s) => Value::Str(s.clone()),
        J::Array(items) => Value::List(items.iter().map(|i| tree(i, origin)).collect()),
        J::Object(m) => Value::Dict(
            m.iter()
                .map(|(k, v)| (k.clone(), tree(v, origin)))
                .collect(),
        ),
    };
    Node::new(value, origin.clone())
}

fn file(path: &str, line: u32) -> Origin {
    Origin::File {
        path: Arc::from(path),
        line,
    }
}

fn ovr(text: &str) -> Origin {
    Origin::Override(Arc::from(text))
}

/// A conf file as a tree: each top-level key's subtree gets the line that key is on.
fn conf(path: &str, text: &str) -> Node {
    let j: serde_json::Value = serde_yaml::from_str(text).unwrap();
    let mut node = tree(&j, &file(path, 0));
    if let Value::Dict(d) = &mut node.value {
        for (k, child) in d.iter_mut() {
            let line = text
                .lines()
                .position(|l| l.starts_with(&format!("{k}:")))
                .map(|i| i as u32 + 1)
                .unwrap_or(0);
            child.set_origin_deep(&file(path, line));
        }
        d.shift_remove("defaults");
    }
    node
}

const MODELS: &[(&str, &str)] = &[
    ("tiny", include_str!("../../../../conf/model/tiny.yaml")),
    ("small", include_str!("../../../../conf/model/small.yaml")),
    (
        "llama-1b",
        include_str!("../../../../conf/model/llama-1b.yaml"),
    ),
    (
        "llama-8b",
        include_str!("../../../../conf/model/llama-8b.yaml"),
    ),
];
const DISTS: &[(&str, &str)] = &[
    (
        "none",
        include_str!("../../../../conf/trainer/dist/none.yaml"),
    ),
    (
        "ddp",
        include_str!("../../../../conf/trainer/dist/ddp.yaml"),
    ),
    (
        "fsdp",
        include_str!("../../../../conf/trainer/dist/fsdp.yaml"),
    ),
];
const DATAS: &[(&str, &str)] = &[
    (
        "arithmetic",
        include_str!("../../../../conf/data/arithmetic.yaml"),
    ),
    ("tokens", include_str!("../../../../conf/data/tokens.yaml")),
    ("text", include_str!("../../../../conf/data/text.yaml")),
    ("jsonl", include_str!("../../../../conf/data/jsonl.yaml")),
];
const COMPUTES: &[(&str, &str)] = &[
    ("local", include_str!("../../../../conf/compute/local.yaml")),
    ("slurm", include_str!("../../../../conf/compute/slurm.yaml")),
];
const TRAINER: &str = include_str!("../../../../conf/trainer/default.yaml");
const PRIMARY: &str = include_str!("../../../../conf/config.yaml");

fn pick<'a>(table: &'a [(&str, &str)], name: &str) -> &'a str {
    table.iter().find(|(n, _)| *n == name).unwrap().1
}

/// Composes the shipped conf files by hand (defaults order, `${seed}` resolved, the
/// runtime node removed).
fn compose(model: &str, dist: &str, data: &str, compute: &str) -> Node {
    let mut trainer = conf("conf/trainer/default.yaml", TRAINER);
    let mut dist_node = conf(&format!("conf/trainer/dist/{dist}.yaml"), pick(DISTS, dist));
    dist_node.origin = Origin::Unknown;
    let primary = conf("conf/config.yaml", PRIMARY);
    let seed = primary.child("seed").unwrap().clone();
    let Value::Dict(t) = &mut trainer.value else {
        unreachable!()
    };
    t.shift_insert(0, "dist".into(), dist_node);
    t.insert("seed".into(), seed.clone());
    let mut root = Dict::new();
    let m = format!("conf/model/{model}.yaml");
    let d = format!("conf/data/{data}.yaml");
    let c = format!("conf/compute/{compute}.yaml");
    root.insert("model".into(), conf(&m, pick(MODELS, model)));
    root.insert("trainer".into(), trainer);
    root.insert("data".into(), conf(&d, pick(DATAS, data)));
    root.insert("compute".into(), conf(&c, pick(COMPUTES, compute)));
    root.insert("seed".into(), seed);
    let mut job = Node::from(Value::Dict(root));
    if dist == "none" && compute == "local" {
        // The shipped local compute starts 2 ranks (for DDP); one process here.
        set(
            &mut job,
            "compute.tasks_per_node",
            json!(1),
            ovr("compute.tasks_per_node=1"),
        );
    }
    job
}

fn base() -> Node {
    compose("tiny", "none", "arithmetic", "local")
}

fn set(job: &mut Node, key: &str, value: serde_json::Value, origin: Origin) {
    let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
    let node = tree(&value, &origin);
    let parent = if parent.is_empty() {
        job
    } else {
        job.get_path_mut(&super::super::node::split_key(parent))
            .unwrap()
    };
    parent
        .value
        .as_dict_mut()
        .unwrap()
        .insert(last.into(), node);
}

fn remove(job: &mut Node, key: &str) {
    let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
    let parent = if parent.is_empty() {
        job
    } else {
        job.get_path_mut(&super::super::node::split_key(parent))
            .unwrap()
    };
    parent.value.as_dict_mut().unwrap().shift_remove(last);
}

fn problems(job: &Node) -> Vec<Problem> {
    match validate(job) {
        Ok(_) => panic!("expected problems"),
        Err(e) => e.problems,
    }
}

fn only(job: &Node) -> Problem {
    let p = problems(job);
    assert_eq!(p.len(), 1, "{p:#?}");
    p.into_iter().next().unwrap()
}

#[test]
fn default_config_validates() {
    let cfg = validate(&base()).unwrap();
    assert_eq!(cfg.seed, 1234);
    assert_eq!(cfg.trainer.seed, 1234);
    assert_eq!(cfg.model.name, "tiny");
    assert_eq!(cfg.model.head_dim(), 32);
    assert!((700_000..1_200_000).contains(&cfg.model.num_parameters()));
    assert_eq!(cfg.trainer.dist, DistConfig::None);
    assert_eq!(cfg.trainer.precision, Precision::Auto);
    assert_eq!(
        cfg.precision(),
        Precision::Full32,
        "auto on the default CPU job"
    );
    assert_eq!(cfg.trainer.schedule, LrSchedule::Cosine);
    assert_eq!(cfg.trainer.resume, Resume::Auto);
    assert_eq!(cfg.trainer.betas, [0.9, 0.95]);
    assert_eq!(cfg.trainer.grad_accum_steps(cfg.compute.world_size()), 2);
    assert_eq!(cfg.data.kind(), DataKind::Arithmetic);
    assert_eq!(cfg.compute.launcher, Launcher::Local);
    assert_eq!(cfg.compute.world_size(), 1);
}

#[test]
fn every_shipped_preset_validates() {
    let mut n = 0;
    for (model, _) in MODELS {
        for (dist, _) in DISTS {
            for (data, _) in DATAS {
                for (compute, _) in COMPUTES {
                    let mut job = compose(model, dist, data, compute);
                    // Presets that need each other: multi-rank compute needs a dist mode
                    // and a batch that splits over 8 ranks; tiny's 256 positions and 32
                    // ids only fit the arithmetic data.
                    if *compute == "slurm" && *dist == "none" {
                        continue;
                    }
                    if *model == "tiny" && *data != "arithmetic" {
                        continue;
                    }
                    if *compute == "slurm" {
                        set(&mut job, "trainer.global_batch_size", json!(128), ovr("g"));
                    }
                    match *data {
                        "tokens" => set(&mut job, "data.path", json!("/x.bin"), ovr("x")),
                        "jsonl" => set(&mut job, "data.path", json!("/x.jsonl"), ovr("x")),
                        "text" => set(&mut job, "data.paths", json!(["/a.txt"]), ovr("x")),
                        _ => {}
                    }
                    let cfg = validate(&job)
                        .unwrap_or_else(|e| panic!("{model}/{dist}/{data}/{compute}:\n{e}"));
                    assert_eq!(cfg.trainer.dist.mode().as_str(), *dist);
                    assert_eq!(cfg.data.kind().as_str(), *data);
                    // Serialize / Deserialize round-trip, and serde agrees with the walk.
                    let j = serde_json::to_value(&cfg).unwrap();
                    assert_eq!(serde_json::from_value::<JobConfig>(j).unwrap(), cfg);
                    let raw = super::super::node::to_json(&job);
                    assert_eq!(serde_json::from_value::<JobConfig>(raw).unwrap(), cfg);
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 96 - 16 - 18 + 3);
}

#[test]
fn preset_sizes_are_the_documented_ones() {
    let params = |m: &str| {
        validate(&compose(m, "none", "arithmetic", "local"))
            .unwrap()
            .model
            .num_parameters()
    };
    assert_eq!(params("llama-1b"), 1_235_814_400);
    assert_eq!(params("llama-8b"), 8_030_261_248);
    assert!((20_000_000..30_000_000).contains(&params("small")));
}

#[test]
fn unknown_key_names_origin_and_near_miss() {
    let mut job = base();
    set(
        &mut job,
        "trainer.lrr",
        json!(0.1),
        file("conf/trainer/default.yaml", 4),
    );
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::UnknownKey);
    assert_eq!(p.key, "trainer.lrr");
    assert_eq!(
        p.message,
        "unknown key 'trainer.lrr' (set in conf/trainer/default.yaml:4); did you mean \
         'trainer.lr'?"
    );
}

#[test]
fn unknown_key_without_near_miss_lists_known_keys() {
    let mut job = base();
    set(
        &mut job,
        "model.flavour",
        json!("x"),
        ovr("+model.flavour=x"),
    );
    let p = only(&job);
    assert!(p.message.starts_with(
        "unknown key 'model.flavour' (set by override '+model.flavour=x'); remove it \
         ('model' accepts name, vocab_size,"
    ));
}

#[test]
fn unknown_key_contained_suggests_all_candidates() {
    let mut job = base();
    set(
        &mut job,
        "trainer.batch_size",
        json!(8),
        ovr("+trainer.batch_size=8"),
    );
    let p = only(&job);
    assert!(
        p.message
            .ends_with("did you mean 'trainer.global_batch_size' or 'trainer.micro_batch_size'?"),
        "{}",
        p.message
    );
}

#[test]
fn extra_top_level_keys_are_allowed() {
    let mut job = base();
    set(
        &mut job,
        "notes",
        json!({"who": "me"}),
        ovr("+notes.who=me"),
    );
    set(
        &mut job,
        "flotilla",
        json!({"run": {"dir": "x"}}),
        Origin::Unknown,
    );
    assert!(validate(&job).is_ok());
}

#[test]
fn wrong_type_names_expected_type_and_override() {
    let mut job = base();
    set(
        &mut job,
        "trainer.max_steps",
        json!("ten"),
        ovr("trainer.max_steps=ten"),
    );
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::WrongType);
    assert_eq!(
        p.message,
        "trainer.max_steps: expected an integer, got str 'ten' (set by override \
         'trainer.max_steps=ten')"
    );
    assert_eq!(p.origin, ovr("trainer.max_steps=ten"));
}

#[test]
fn wrong_types_of_other_shapes() {
    let mut job = base();
    set(
        &mut job,
        "trainer.lr",
        json!("fast"),
        ovr("trainer.lr=fast"),
    );
    set(
        &mut job,
        "trainer.betas",
        json!([0.9]),
        ovr("trainer.betas=[0.9]"),
    );
    set(&mut job, "model.tie_word_embeddings", json!(1), ovr("t=1"));
    set(&mut job, "compute.setup", json!({"a": 1}), ovr("s"));
    set(&mut job, "compute.partition", json!([1]), ovr("p"));
    set(
        &mut job,
        "compute.additional_parameters",
        json!({"x": [1]}),
        ovr("a"),
    );
    let msgs: Vec<String> = problems(&job).into_iter().map(|p| p.message).collect();
    let expect = [
        "trainer.lr: expected a number, got str 'fast' (set by override 'trainer.lr=fast')",
        "trainer.betas: expected a list of 2 numbers, got list [0.9]",
        "model.tie_word_embeddings: expected a bool (true or false), got int 1",
        "compute.setup: expected a list of strings, got dict {'a': 1}",
        "compute.partition: expected a string or null, got list [1]",
        "compute.additional_parameters.x: expected a scalar (string, number, bool or null)",
    ];
    assert_eq!(msgs.len(), expect.len(), "{msgs:#?}");
    for e in expect {
        assert!(msgs.iter().any(|m| m.starts_with(e)), "{e}\n{msgs:#?}");
    }
}

#[test]
fn negative_count_is_out_of_range() {
    let mut job = base();
    set(
        &mut job,
        "trainer.eval_every",
        json!(-5),
        ovr("trainer.eval_every=-5"),
    );
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::Invalid);
    assert_eq!(
        p.message,
        "trainer.eval_every: expected a non-negative integer, got int -5 (set by override \
         'trainer.eval_every=-5'); set it to 0 or more"
    );
}

#[test]
fn bad_enum_lists_allowed_values_and_suggests() {
    let mut job = base();
    set(
        &mut job,
        "trainer.precision",
        json!("bf16"),
        ovr("trainer.precision=bf16"),
    );
    set(
        &mut job,
        "trainer.schedule",
        json!("cosin"),
        file("conf/trainer/default.yaml", 9),
    );
    set(
        &mut job,
        "trainer.device",
        json!(32),
        ovr("trainer.device=32"),
    );
    let p = problems(&job);
    assert_eq!(p.len(), 3, "{p:#?}");
    assert!(p.iter().all(|p| p.kind == ProblemKind::BadChoice));
    // Reading order follows the file: schedule, precision, device.
    assert_eq!(
        p[0].message,
        "trainer.schedule: expected one of 'constant', 'cosine', 'linear', got str \
         'cosin' (set in conf/trainer/default.yaml:9); did you mean 'cosine'?"
    );
    assert_eq!(
        p[1].message,
        "trainer.precision: expected one of '32-true', 'bf16-mixed', 'bf16-true', \
         '16-mixed', 'auto', got str 'bf16' (set by override 'trainer.precision=bf16'); did you \
         mean 'bf16-mixed' or 'bf16-true'?"
    );
    assert_eq!(
        p[2].message,
        "trainer.device: expected one of 'auto', 'cpu', 'cuda', got int 32 (set by \
         override 'trainer.device=32')"
    );
    let mut job = compose("tiny", "fsdp", "arithmetic", "local");
    set(
        &mut job,
        "trainer.dist.backward_prefetch",
        json!("None"),
        ovr("b=None"),
    );
    assert_eq!(
        only(&job).message,
        "trainer.dist.backward_prefetch: expected one of 'BACKWARD_PRE', 'BACKWARD_POST' or \
         null, got str 'None' (set by override 'b=None'); write null for no value"
    );
    // Case is significant, but suggested.
    let mut job = compose("tiny", "fsdp", "arithmetic", "local");
    set(
        &mut job,
        "trainer.dist.sharding_strategy",
        json!("full_shard"),
        ovr("s"),
    );
    assert!(only(&job).message.ends_with("did you mean 'FULL_SHARD'?"));
}

#[test]
fn mandatory_value_names_the_fix() {
    let job = compose("small", "none", "tokens", "local");
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::Mandatory);
    assert_eq!(p.key, "data.path");
    assert_eq!(
        p.message,
        "data.path is mandatory (???) — set it, e.g. data.path=/path/to/tokens.bin (left \
         as ??? in conf/data/tokens.yaml:3)"
    );
    let job = compose("small", "none", "text", "local");
    assert!(only(&job).message.starts_with(
        "data.paths is mandatory (???) — set it, e.g. \
         data.paths=[/path/to/a.txt,/path/to/b.txt]"
    ));
    // A ??? inside a list, set by an override.
    let mut job = base();
    set(
        &mut job,
        "compute.setup",
        json!(["echo hi", "???"]),
        ovr("compute.setup=[echo hi,???]"),
    );
    assert_eq!(
        only(&job).message,
        "compute.setup[1] is mandatory (???) — set it, e.g. compute.setup[1]=... (set to \
         ??? by override 'compute.setup=[echo hi,???]')"
    );
}

#[test]
fn missing_key_and_missing_section() {
    let mut job = base();
    remove(&mut job, "trainer.eps");
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::MissingKey);
    assert_eq!(
        p.message,
        "trainer.eps is missing (in the dict from conf/trainer/default.yaml) — add it, e.g. \
         +trainer.eps=0.1"
    );
    let mut job = base();
    let model = job
        .value
        .as_dict_mut()
        .unwrap()
        .shift_remove("model")
        .unwrap();
    job.value
        .as_dict_mut()
        .unwrap()
        .insert("modle".into(), model);
    let p = only(&job);
    assert_eq!(
        p.message,
        "model is missing — select a preset in the defaults list (- model: tiny) or with \
         model=tiny; is 'modle' (set in conf/model/tiny.yaml) a misspelling of it?"
    );
    let mut job = base();
    remove(&mut job, "trainer.dist");
    assert_eq!(
        only(&job).message,
        "trainer.dist is missing (in the dict from conf/trainer/default.yaml) — add it, e.g. \
         +trainer.dist={mode: none}"
    );
    // Optional keys may be left out.
    let mut job = base();
    remove(&mut job, "model.init_from");
    remove(&mut job, "model.rope_scaling");
    assert_eq!(validate(&job).unwrap().model.init_from, None);
}

#[test]
fn all_problems_are_collected_one_per_line() {
    let mut job = base();
    set(&mut job, "trainer.lrr", json!(0.1), ovr("+trainer.lrr=0.1"));
    set(
        &mut job,
        "trainer.max_steps",
        json!("ten"),
        ovr("trainer.max_steps=ten"),
    );
    set(
        &mut job,
        "model.hidden_size",
        json!(130),
        ovr("model.hidden_size=130"),
    );
    set(
        &mut job,
        "data.seq_len",
        json!(4096),
        ovr("data.seq_len=4096"),
    );
    set(
        &mut job,
        "compute.launcher",
        json!("slurmm"),
        ovr("compute.launcher=slurmm"),
    );
    set(&mut job, "seed", json!("???"), file("conf/config.yaml", 9));
    let e = validate(&job).unwrap_err();
    let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
    // Reading order (seed, model, trainer, data, compute), then the semantic checks.
    assert_eq!(
        keys,
        [
            "seed",
            "trainer.lrr",
            "trainer.max_steps",
            "compute.launcher",
            "model.hidden_size",
            "data.seq_len"
        ]
    );
    let text = e.to_string();
    assert_eq!(text.lines().count(), e.problems.len());
    assert!(text.contains("seed is mandatory (???) — set it, e.g. seed=1234"));
    assert!(text.contains("did you mean 'slurm'?"));
}

#[test]
fn model_shape_rules() {
    let mut job = base();
    set(
        &mut job,
        "model.hidden_size",
        json!(130),
        ovr("model.hidden_size=130"),
    );
    assert_eq!(
        only(&job).message,
        "model.hidden_size: 130 is not divisible by model.num_attention_heads (4) (set by \
         override 'model.hidden_size=130'); use a multiple of 4, e.g. \
         model.hidden_size=132, or change model.num_attention_heads"
    );
    let mut job = base();
    set(&mut job, "model.num_key_value_heads", json!(3), ovr("kv=3"));
    assert_eq!(
        only(&job).message,
        "model.num_key_value_heads: 3 does not divide model.num_attention_heads (4) (set by \
         override 'kv=3'); use one of 1, 2 or 4"
    );
    let mut job = base();
    set(&mut job, "model.hidden_size", json!(12), ovr("h"));
    assert!(only(&job).message.contains("odd head dimension 3"));
    let mut job = base();
    set(
        &mut job,
        "model.num_attention_heads",
        json!(0),
        ovr("model.num_attention_heads=0"),
    );
    assert_eq!(
        only(&job).message,
        "model.num_attention_heads: must be at least 1, got 0 (set by override \
         'model.num_attention_heads=0'); set model.num_attention_heads=1 or more"
    );
    let mut job = compose("llama-8b", "none", "arithmetic", "local");
    set(
        &mut job,
        "model.rope_scaling.high_freq_factor",
        json!(0.5),
        ovr("r"),
    );
    assert!(only(&job)
        .message
        .contains("must be above model.rope_scaling.low_freq_factor"));
}

#[test]
fn batch_must_split_over_micro_batches_and_ranks() {
    let mut job = base();
    set(
        &mut job,
        "trainer.global_batch_size",
        json!(30),
        ovr("trainer.global_batch_size=30"),
    );
    assert_eq!(
        only(&job).message,
        "trainer.global_batch_size: 30 is not divisible by trainer.micro_batch_size (16) \
         (set by override 'trainer.global_batch_size=30'); use a multiple of 16, e.g. \
         trainer.global_batch_size=32, or change trainer.micro_batch_size"
    );
    let mut job = compose("small", "ddp", "arithmetic", "slurm");
    set(&mut job, "trainer.global_batch_size", json!(64), ovr("g"));
    let p = only(&job);
    assert!(
        p.message.contains("× world size = 16 × 8 = 128"),
        "{}",
        p.message
    );
    assert!(p.message.contains("trainer.global_batch_size=128"));
}

#[test]
fn multi_rank_compute_needs_a_dist_mode() {
    let job = compose("small", "none", "arithmetic", "slurm");
    let p = problems(&job);
    assert_eq!(p.len(), 2, "{p:#?}"); // also 32 % (16 × 8)
    assert!(p.iter().any(|p| p.key == "trainer.dist.mode"
        && p.message
            .contains("select trainer/dist=ddp or trainer/dist=fsdp")));
}

#[test]
fn keys_of_another_mode_are_named_as_such() {
    let mut job = compose("tiny", "fsdp", "arithmetic", "local");
    set(
        &mut job,
        "trainer.dist.bucket_cap_mb",
        json!(50),
        ovr("+trainer.dist.bucket_cap_mb=50"),
    );
    assert_eq!(
        only(&job).message,
        "unknown key 'trainer.dist.bucket_cap_mb' for trainer.dist.mode=fsdp (set by \
         override '+trainer.dist.bucket_cap_mb=50'): it only applies when \
         trainer.dist.mode is ddp; select trainer/dist=ddp, or remove it"
    );
    let mut job = base();
    set(&mut job, "trainer.dist.timeout_s", json!(60), ovr("t"));
    assert!(only(&job)
        .message
        .contains("applies when trainer.dist.mode is ddp or fsdp"));
    let mut job = base();
    set(
        &mut job,
        "trainer.dist.mode",
        json!("dpp"),
        ovr("trainer.dist.mode=dpp"),
    );
    set(&mut job, "trainer.dist.wat", json!(1), ovr("w"));
    let p = problems(&job);
    assert_eq!(p.len(), 2, "{p:#?}");
    assert!(p[0].message.ends_with("did you mean 'ddp'?"));
    assert_eq!(p[1].key, "trainer.dist.wat");
}

#[test]
fn data_rules() {
    let mut job = base();
    set(
        &mut job,
        "data.seq_len",
        json!(4096),
        ovr("data.seq_len=4096"),
    );
    assert_eq!(
        only(&job).message,
        "data.seq_len: 4096 exceeds model.max_position_embeddings (256) (set by override \
         'data.seq_len=4096'); set data.seq_len=256 or less, or raise \
         model.max_position_embeddings"
    );
    let mut job = compose("tiny", "none", "text", "local");
    set(
        &mut job,
        "data.paths",
        json!("/data/*.txt"),
        ovr("data.paths=/data/*.txt"),
    );
    set(&mut job, "data.seq_len", json!(128), ovr("s"));
    let p = only(&job);
    assert_eq!(p.key, "model.vocab_size");
    assert!(p.message.contains("too small for data.tokenizer=byte"));
    set(&mut job, "data.tokenizer", json!("bpe"), ovr("t"));
    let p = only(&job);
    assert!(p.message.starts_with(
        "data.vocab_size: the bpe tokenizer's 4096 tokens exceed model.vocab_size (32)"
    ));
    set(&mut job, "data.tokenizer", json!("bytes"), ovr("t"));
    assert!(only(&job).message.ends_with("did you mean 'byte'?"));
    set(&mut job, "data.tokenizer", json!("./tok.json"), ovr("t"));
    let cfg = validate(&job).unwrap();
    let DataConfig::Text(t) = &cfg.data else {
        panic!()
    };
    assert_eq!(t.paths, ["/data/*.txt"]);
    assert_eq!(t.tokenizer, Some(TokenizerSpec::File("./tok.json".into())));
    let mut job = base();
    set(&mut job, "data.digits", json!(0), ovr("d"));
    assert!(only(&job).message.contains("must be between 1 and 9"));
    let mut job = base();
    set(
        &mut job,
        "data.kind",
        json!("tokens"),
        ovr("data.kind=tokens"),
    );
    let p = problems(&job);
    // arithmetic keys are named as such; path and dtype are missing.
    assert!(p.iter().any(|p| p.key == "data.digits"
        && p.message
            .contains("only applies when data.kind is arithmetic; select data=arithmetic")));
    assert!(p
        .iter()
        .any(|p| p.key == "data.path" && p.kind == ProblemKind::MissingKey));
}

#[test]
fn trainer_rules() {
    let mut job = base();
    set(&mut job, "trainer.min_lr", json!(0.1), ovr("m"));
    set(&mut job, "trainer.warmup_steps", json!(1000), ovr("w"));
    set(&mut job, "trainer.betas", json!([0.9, 1.5]), ovr("b"));
    set(&mut job, "trainer.eval_batches", json!(0), ovr("e"));
    set(&mut job, "trainer.lr", json!(0), ovr("l"));
    let keys: Vec<String> = problems(&job).into_iter().map(|p| p.key).collect();
    assert_eq!(
        keys,
        ["trainer.lr", "trainer.betas", "trainer.eval_batches"]
    );
    let mut job = base();
    set(&mut job, "trainer.min_lr", json!(0.1), ovr("m"));
    assert!(only(&job).message.contains("at most trainer.lr"));
    let mut job = compose("tiny", "ddp", "arithmetic", "local");
    set(&mut job, "trainer.dist.backend", json!("nccl"), ovr("b"));
    set(&mut job, "trainer.device", json!("cpu"), ovr("d"));
    assert!(only(&job).message.contains("nccl needs CUDA"));
    set(
        &mut job,
        "trainer.resume",
        json!("/ckpt/step_100"),
        ovr("r"),
    );
    set(&mut job, "trainer.dist.backend", json!("cpu"), ovr("b"));
    let cfg = validate(&job).unwrap();
    assert_eq!(cfg.trainer.resume, Resume::Path("/ckpt/step_100".into()));
    assert_eq!(cfg.trainer.dist.backend(), Some(Backend::Cpu));
}

#[test]
fn cuda_ranks_with_the_cpu_backend_are_refused() {
    // The cpu backend's collectives take CPU tensors only: CUDA ranks fail at the first one.
    for dist in ["ddp", "fsdp"] {
        let mut job = compose("tiny", dist, "arithmetic", "local");
        set(
            &mut job,
            "trainer.device",
            json!("cuda"),
            ovr("trainer.device=cuda"),
        );
        set(
            &mut job,
            "trainer.dist.backend",
            json!("cpu"),
            ovr("trainer.dist.backend=cpu"),
        );
        let p = only(&job);
        assert_eq!(p.key, "trainer.dist.backend", "{dist}");
        for text in [
            "trainer.device is cuda (set by override 'trainer.device=cuda')",
            "the 2 ranks would fail",
            "(set by override 'trainer.dist.backend=cpu')",
            "set trainer.dist.backend=nccl",
            "or trainer.device=cpu",
        ] {
            assert!(p.message.contains(text), "{text:?} not in {}", p.message);
        }
        // nccl and auto are what CUDA ranks use; one process has no collective and trains.
        for backend in ["nccl", "auto"] {
            set(&mut job, "trainer.dist.backend", json!(backend), ovr("b"));
            validate(&job).unwrap();
        }
        set(&mut job, "trainer.dist.backend", json!("cpu"), ovr("b"));
        set(&mut job, "compute.tasks_per_node", json!(1), ovr("t"));
        validate(&job).unwrap();
    }
}

#[test]
fn compute_rules() {
    // The local launcher simulates several nodes on one host (hybrid sharding tests).
    let mut job = base();
    set(&mut job, "compute.nodes", json!(2), ovr("compute.nodes=2"));
    set(&mut job, "trainer.global_batch_size", json!(64), ovr("g"));
    let p = problems(&job);
    assert!(!p.iter().any(|p| p.key == "compute.nodes"), "{p:?}");
    let mut job = compose("small", "fsdp", "arithmetic", "slurm");
    set(&mut job, "compute.tasks_per_node", json!(16), ovr("t"));
    set(&mut job, "trainer.global_batch_size", json!(256), ovr("g"));
    assert!(only(&job)
        .message
        .contains("16 ranks per node would share 8 GPUs"));
    let mut job = compose("small", "fsdp", "arithmetic", "slurm");
    set(&mut job, "trainer.global_batch_size", json!(128), ovr("g"));
    set(
        &mut job,
        "compute.additional_parameters",
        json!({"exclusive": true}),
        ovr("a"),
    );
    set(
        &mut job,
        "compute.setup",
        json!("module load cuda"),
        ovr("s"),
    );
    let cfg = validate(&job).unwrap();
    assert_eq!(cfg.compute.additional_parameters["exclusive"], json!(true));
    assert_eq!(cfg.compute.setup, ["module load cuda"]);
    assert_eq!(cfg.compute.world_size(), 8);
    assert_eq!(cfg.trainer.grad_accum_steps(8), 1);
}

#[test]
fn root_must_be_a_dict_and_origins_may_be_unknown() {
    let e = validate(&Node::from(Value::Int(3))).unwrap_err();
    assert_eq!(e.to_string(), "the job config must be a dict, got int 3");
    let mut j = serde_json::to_value(validate(&base()).unwrap()).unwrap();
    j["trainer"]["lr"] = json!("x");
    let job = tree(&j, &Origin::Unknown);
    assert_eq!(
        only(&job).message,
        "trainer.lr: expected a number, got str 'x'"
    );
}

#[test]
fn gpu_type_names_a_gpu_of_the_table_or_gets_near_misses() {
    let mut job = base();
    set(
        &mut job,
        "compute.gpu_type",
        json!("H100"),
        ovr("compute.gpu_type=H100"),
    );
    set(
        &mut job,
        "compute.gpu_mem_gb",
        json!(80),
        ovr("compute.gpu_mem_gb=80"),
    );
    let cfg = validate(&job).unwrap();
    assert_eq!(cfg.compute.gpu_type.as_deref(), Some("H100"));
    assert_eq!(cfg.compute.gpu_mem_gb, Some(80.0));
    assert!(cfg.compute.check_memory);
    assert_eq!(gpu_model("H100").unwrap().mib, 81_559);

    set(
        &mut job,
        "compute.gpu_type",
        json!("a100"),
        ovr("compute.gpu_type=a100"),
    );
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::BadChoice);
    assert_eq!(p.key, "compute.gpu_type");
    assert_eq!(
        p.message,
        "compute.gpu_type: unknown GPU 'a100' (set by override 'compute.gpu_type=a100'); did \
         you mean 'a100-80gb' or 'a100-40gb'? Or give the memory of one GPU in GiB, e.g. \
         compute.gpu_mem_gb=80"
    );
    set(
        &mut job,
        "compute.gpu_type",
        json!("h10"),
        ovr("compute.gpu_type=h10"),
    );
    let m = only(&job).message;
    assert!(m.contains("did you mean"), "{m}");
    set(
        &mut job,
        "compute.gpu_type",
        json!("tpu-v5"),
        ovr("compute.gpu_type=tpu-v5"),
    );
    assert!(only(&job)
        .message
        .contains("the known GPUs are 'b200', 'h200', 'gh200'"));

    let mut job = base();
    set(
        &mut job,
        "compute.gpu_mem_gb",
        json!(0),
        ovr("compute.gpu_mem_gb=0"),
    );
    assert!(only(&job)
        .message
        .starts_with("compute.gpu_mem_gb: must be a positive number"));
}

#[test]
fn wrap_policy_groups_units() {
    use super::AutoWrapPolicy;
    let owned = [10, 40, 40, 40, 5];
    assert_eq!(
        AutoWrapPolicy::Block.groups(&owned, 0),
        vec![0..1, 1..2, 2..3, 3..4, 4..5]
    );
    assert_eq!(
        AutoWrapPolicy::Size.groups(&owned, 50),
        vec![0..2, 2..4, 4..5]
    );
    assert_eq!(AutoWrapPolicy::Size.groups(&owned, 1000), vec![0..5]);
    assert!(AutoWrapPolicy::Size.groups(&[], 10).is_empty());
}

#[test]
fn architecture_keys_and_the_sliding_window() {
    // A Qwen2 model from the `model` section: biases counted, no window.
    let mut job = base();
    set(
        &mut job,
        "model.model_type",
        json!("qwen2"),
        ovr("+model.model_type=qwen2"),
    );
    let cfg = validate(&job).unwrap();
    let llama = validate(&base()).unwrap();
    assert_eq!(cfg.model.model_type, Some(ModelType::Qwen2));
    // tiny: 4 blocks of q_proj.bias [128], k_proj.bias and v_proj.bias [64].
    assert_eq!(
        cfg.model.num_parameters(),
        llama.model.num_parameters() + 4 * (128 + 2 * 64)
    );

    // A Mistral window below data.seq_len (32) is trained as transformers trains it.
    let mut job = base();
    set(
        &mut job,
        "model.model_type",
        json!("mistral"),
        ovr("+model.model_type=mistral"),
    );
    set(
        &mut job,
        "model.sliding_window",
        json!(16),
        ovr("+model.sliding_window=16"),
    );
    assert_eq!(validate(&job).unwrap().model.sliding_window, Some(16));

    // Keys of another architecture.
    let mut job = base();
    set(
        &mut job,
        "model.sliding_window",
        json!(64),
        ovr("+model.sliding_window=64"),
    );
    let p = only(&job);
    assert!(
        p.key == "model.sliding_window" && p.message.contains("Llama has no sliding"),
        "{}",
        p.message
    );
    let mut job = base();
    set(
        &mut job,
        "model.model_type",
        json!("mistral"),
        ovr("+model.model_type=mistral"),
    );
    set(
        &mut job,
        "model.attention_bias",
        json!(true),
        ovr("+model.attention_bias=true"),
    );
    let p = only(&job);
    assert!(
        p.key == "model.attention_bias" && p.message.contains("Mistral has no biases"),
        "{}",
        p.message
    );
}

#[test]
fn shard_sizes_read_as_transformers_writes_them() {
    use super::ShardSize;
    for (text, bytes) in [
        ("50GB", 50_000_000_000u64),
        ("5GB", 5_000_000_000),
        ("500MB", 500_000_000),
        ("1.5MB", 1_500_000),
        ("2GiB", 2 << 30),
        ("20KB", 20_000),
        ("1000", 1000),
    ] {
        assert_eq!(ShardSize::parse(text), Some(ShardSize(bytes)), "{text}");
    }
    for bad in ["", "GB", "5XB", "-1GB", "0"] {
        assert_eq!(ShardSize::parse(bad), None, "{bad}");
    }
    let mut job = compose("tiny", "ddp", "arithmetic", "local");
    set(
        &mut job,
        "trainer.max_shard_size",
        json!("5 gigs"),
        ovr("t"),
    );
    let err = validate(&job).unwrap_err().to_string();
    assert!(
        err.contains("trainer.max_shard_size: expected a size such as '5GB'"),
        "{err}"
    );
    set(&mut job, "trainer.max_shard_size", json!(1234), ovr("t"));
    assert_eq!(validate(&job).unwrap().trainer.max_shard_bytes(), 1234);
}

#[test]
fn precision_auto_is_bf16_mixed_on_gpus_and_32_true_on_cpus() {
    let mut job = compose("tiny", "ddp", "arithmetic", "local");
    let cfg = validate(&job).unwrap();
    assert_eq!(
        cfg.trainer.precision,
        Precision::Auto,
        "the shipped default"
    );
    for (device, gpus, want) in [
        ("cpu", 0, Precision::Full32),
        ("cuda", 0, Precision::Bf16Mixed),
        ("auto", 0, Precision::Full32),
        ("auto", 8, Precision::Bf16Mixed),
    ] {
        set(&mut job, "trainer.device", json!(device), ovr("t"));
        set(&mut job, "compute.gpus_per_node", json!(gpus), ovr("t"));
        let cfg = validate(&job).unwrap();
        assert_eq!(cfg.precision(), want, "{device}, {gpus} GPUs");
    }
    set(&mut job, "trainer.precision", json!("bf16-true"), ovr("t"));
    assert_eq!(validate(&job).unwrap().precision(), Precision::Bf16True);
}

#[test]
fn chat_sources_and_held_out_records_are_checked_with_their_fix() {
    let chat = || {
        let mut job = base();
        let data = conf(
            "conf/data/chat.yaml",
            include_str!("../../../../conf/data/chat.yaml"),
        );
        job.value.as_dict_mut().unwrap().insert("data".into(), data);
        set(&mut job, "data.tokenizer", json!("/tok"), ovr("t"));
        set(&mut job, "data.seq_len", json!(128), ovr("s"));
        job
    };
    let p = only(&chat());
    assert_eq!(p.key, "data.path");
    assert!(p.message.contains("data.sources=["), "{}", p.message);
    let mut job = chat();
    set(&mut job, "data.path", json!(null), ovr("p"));
    let sources = json!([{"path": "/a.parquet", "weight": 2}, {"path": "/b", "fraction": 0.5}]);
    set(&mut job, "data.sources", sources, ovr("s"));
    let p = only(&job);
    assert_eq!(p.key, "data.sources[1].weight");
    assert!(
        p.message.contains("give data.sources[1] a weight"),
        "{}",
        p.message
    );
    set(
        &mut job,
        "data.sources",
        json!([{"path": "/a", "weigth": 1}]),
        ovr("s"),
    );
    let p = only(&job);
    assert_eq!(p.kind, ProblemKind::UnknownKey);
    assert!(p.message.contains("weight"), "{}", p.message);
    let mut job = chat();
    set(&mut job, "data.path", json!("/a.jsonl"), ovr("p"));
    set(&mut job, "data.eval_fraction", json!(1.5), ovr("f"));
    let p = only(&job);
    assert_eq!(p.key, "data.eval_fraction");
    set(&mut job, "data.eval_fraction", json!(0.1), ovr("f"));
    set(&mut job, "data.eval_path", json!("/e.jsonl"), ovr("e"));
    let p = only(&job);
    assert!(p
        .message
        .contains("set data.eval_fraction=null, or data.eval_path=null"));
}

#[test]
fn preference_sources_and_held_out_pairs_are_checked_as_chat_data_s() {
    let preference = || {
        let mut job = base();
        let data = conf(
            "conf/data/preference.yaml",
            include_str!("../../../../conf/data/preference.yaml"),
        );
        job.value.as_dict_mut().unwrap().insert("data".into(), data);
        let objective = conf(
            "conf/objective/dpo.yaml",
            include_str!("../../../../conf/objective/dpo.yaml"),
        );
        job.value
            .as_dict_mut()
            .unwrap()
            .insert("objective".into(), objective);
        set(&mut job, "data.tokenizer", json!("/tok"), ovr("t"));
        set(&mut job, "data.seq_len", json!(128), ovr("s"));
        job
    };
    let p = only(&preference());
    assert_eq!(p.key, "data.path");
    assert!(
        p.message.contains("preference data needs records")
            && p.message.contains("data.path=/path/to/pairs.jsonl")
            && p.message.contains("data.sources=["),
        "{}",
        p.message
    );
    let mut job = preference();
    set(&mut job, "data.path", json!("/pairs.jsonl"), ovr("p"));
    set(&mut job, "data.sources", json!([{"path": "/b"}]), ovr("s"));
    assert_eq!(only(&job).key, "data.sources");
    set(&mut job, "data.path", json!(null), ovr("p"));
    set(&mut job, "data.eval_records", json!(0), ovr("e"));
    let p = only(&job);
    assert_eq!(p.key, "data.eval_records");
    set(&mut job, "data.eval_records", json!(100), ovr("e"));
    let typed = validate(&job).unwrap();
    let DataConfig::Preference(d) = &typed.data else {
        panic!("{:?}", typed.data)
    };
    assert!(d.has_eval());
    assert_eq!(d.selection().sources.map(<[_]>::len), Some(1));
}
