//! Composition of one job's config: defaults list → merge → overrides → runtime split →
//! interpolation, as Hydra 1.3 composes it, with provenance kept on every value. The merge of
//! one tree into another is [`merge_into`], re-exported here from the lower `merge` module
//! (the schema merges with it too).

use super::defaults::{DefaultsBuilder, GroupOverrides};
use super::interp::{self, ResolveContext};
use super::node::{split_key, Dict, Node, Origin, Value};
use super::overrides::{parse_override, Override};
use super::repo::{lock, ConfigRepo};
use super::schema::{self, JobConfig};
use super::{near_miss, yaml, ConfigError};
pub use crate::merge::merge_into;
use indexmap::IndexMap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Root keys that hold the runtime node rather than job config. `hydra` is accepted as an alias
/// of `flotilla` so that Hydra config trees work unchanged.
pub const RUNTIME_KEYS: [&str; 2] = ["flotilla", "hydra"];

/// What to compose.
#[derive(Clone, Debug)]
pub struct ComposeOptions {
    pub config_dir: PathBuf,
    pub config_name: String,
}

impl Default for ComposeOptions {
    fn default() -> Self {
        ComposeOptions {
            config_dir: PathBuf::from("conf"),
            config_name: "config".into(),
        }
    }
}

/// A composed job.
#[derive(Clone, Debug)]
pub struct Composed {
    /// The resolved job config (no runtime node), in composition order.
    pub job: Node,
    /// The runtime node, unresolved (it may refer to job values and to `now`).
    pub runtime: Node,
    /// Chosen option of every config group (`hydra.runtime.choices`).
    pub choices: IndexMap<String, Option<String>>,
    /// The job's task overrides, verbatim (`hydra.overrides.task`).
    pub task_overrides: Vec<String>,
    /// The typed job config, when the tree is a flotilla job (see [`is_flotilla_job`]) and
    /// validation is on.
    pub typed: Option<JobConfig>,
}

/// The sections every flotilla job config has; a tree holding all of them is validated
/// against the typed schema, any other tree (a plain Hydra tree) is composed as it is.
pub const JOB_SECTIONS: [&str; 4] = ["model", "trainer", "data", "compute"];

/// Does this resolved tree describe a flotilla job?
pub fn is_flotilla_job(job: &Node) -> bool {
    job.value
        .as_dict()
        .is_some_and(|d| JOB_SECTIONS.iter().all(|k| d.contains_key(*k)))
}

/// Does the (unresolved) runtime node name a program of the user's (`flotilla.task.command`
/// set) instead of the built-in trainer?
pub fn runs_user_task(runtime: &Node) -> bool {
    runtime
        .select("task.command")
        .is_some_and(|c| !matches!(c.value, Value::Null))
}

impl Composed {
    /// Does the job run the user's own program (see [`runs_user_task`])?
    pub fn runs_user_task(&self) -> bool {
        runs_user_task(&self.runtime)
    }

    /// The resolved runtime node (run and sweep directories, job name, ...), resolved against
    /// the job's resolved values.
    pub fn resolve_runtime(&self, ctx: &ResolveContext) -> Result<Node, ConfigError> {
        let mut root = self.job.clone();
        if let Value::Dict(d) = &mut root.value {
            for key in RUNTIME_KEYS {
                d.insert(key.to_string(), self.runtime.clone());
            }
        }
        Ok(interp::resolve_at(&root, &["flotilla".to_string()], ctx)?)
    }
}

/// Composes jobs from one config directory, caching parsed files across calls.
pub struct Composer {
    repo: ConfigRepo,
    options: ComposeOptions,
    ctx: ResolveContext,
    validate: bool,
    runtime_defaults: Node,
    fallbacks: Vec<Fallback>,
    merged: Mutex<MergedDefaultsCache>,
}

/// A defaults list merged into one tree, before any value override.
#[derive(Debug)]
struct MergedDefaults {
    config: Node,
    runtime: Node,
    choices: IndexMap<String, Option<String>>,
}

/// Merged trees by `(skip_missing, defaults-shaping overrides)`.
type MergedDefaultsCache = HashMap<(bool, Vec<String>), Arc<MergedDefaults>>;

/// Distinct group-choice combinations kept merged at once (a sweep over many group options
/// starts over when it has more).
const MERGED_DEFAULTS_CACHE_SIZE: usize = 256;

/// A value a composed job takes where its config leaves the key unset: absent, null, or an
/// empty list. Site and user settings (a cluster account, module loads) reach the job this
/// way: any config file or override that sets the key wins, and the value keeps its own
/// origin for `--provenance`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fallback {
    /// A dotted key of the job config, e.g. `compute.account`. Its parent must exist in the
    /// composed config (a config without a `compute` section gets nothing).
    pub key: String,
    pub value: Node,
}

/// Sets every fallback whose key `tree` leaves unset.
fn apply_fallbacks(tree: &mut Node, fallbacks: &[Fallback]) {
    for fallback in fallbacks {
        let mut path = split_key(&fallback.key);
        let Some(leaf) = path.pop() else { continue };
        let Some(parent) = tree.get_path_mut(&path).and_then(|n| n.value.as_dict_mut()) else {
            continue;
        };
        let unset = match parent.get(&leaf).map(|n| &n.value) {
            None | Some(Value::Null) => true,
            Some(Value::List(items)) => items.is_empty(),
            Some(_) => false,
        };
        if unset {
            parent.insert(leaf, fallback.value.clone());
        }
    }
}

/// Is this override aimed at the runtime node (`hydra.*`, `hydra/...`, `flotilla.*`)?
pub fn is_runtime_override(o: &Override) -> bool {
    let k = o.key_or_group.as_str();
    RUNTIME_KEYS.iter().any(|r| {
        k == *r
            || k.strip_prefix(r)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('/'))
    })
}

impl Composer {
    pub fn new(options: ComposeOptions) -> Result<Composer, ConfigError> {
        if !options.config_dir.is_dir() {
            return Err(ConfigError::Composition(format!(
                "config directory '{}' does not exist (set it with --config-dir)",
                options.config_dir.display()
            )));
        }
        let options_name = options.config_name.clone();
        Ok(Composer {
            repo: ConfigRepo::new(options.config_dir.clone()),
            options,
            ctx: ResolveContext::from_process_env(),
            validate: true,
            runtime_defaults: default_runtime(&options_name),
            fallbacks: Vec::new(),
            merged: Mutex::new(HashMap::new()),
        })
    }

    pub fn repo(&self) -> &ConfigRepo {
        &self.repo
    }

    pub fn options(&self) -> &ComposeOptions {
        &self.options
    }

    pub fn context(&self) -> &ResolveContext {
        &self.ctx
    }

    /// Turns typed validation of flotilla job configs on or off (on by default).
    /// Whether the known sections of a job are validated into typed structs.
    pub fn validates(&self) -> bool {
        self.validate
    }

    pub fn set_validate(&mut self, validate: bool) {
        self.validate = validate;
    }

    /// Values every composed job takes where its config leaves the key unset.
    pub fn set_fallbacks(&mut self, fallbacks: Vec<Fallback>) {
        self.fallbacks = fallbacks;
    }

    /// Replaces the resolution context (fixed time, injected environment).
    pub fn set_context(&mut self, ctx: ResolveContext) {
        self.ctx = ctx;
    }

    /// Parses the override strings.
    pub fn parse_overrides(&self, overrides: &[String]) -> Result<Vec<Override>, ConfigError> {
        overrides
            .iter()
            .map(|o| parse_override(o).map_err(ConfigError::from))
            .collect()
    }

    /// Composes one job (run mode: sweep overrides are an error).
    pub fn compose(&self, overrides: &[String]) -> Result<Composed, ConfigError> {
        let parsed = self.parse_overrides(overrides)?;
        for o in &parsed {
            if o.is_sweep() {
                return Err(ConfigError::Override(sweep_in_run_mode(o)));
            }
        }
        self.compose_parsed(&parsed, None)
    }

    /// Composes the unresolved runtime node of a sweep's master config (missing group choices
    /// allowed, sweep overrides skipped), to read its sweeper params.
    pub fn compose_master_runtime(&self, parsed: &[Override]) -> Result<Node, ConfigError> {
        let (_, runtime, _) = self.merge_tree(parsed, true)?;
        Ok(runtime)
    }

    /// Composes one job from parsed overrides; `job_num` is set in the runtime node.
    pub fn compose_parsed(
        &self,
        parsed: &[Override],
        job_num: Option<usize>,
    ) -> Result<Composed, ConfigError> {
        let (mut tree, mut runtime, choices) = self.merge_tree(parsed, false)?;
        // A `???` that hydra-core itself would read fails the job before it starts: refused
        // here, before the runtime's derived values (overrides, choices) fill it.
        schema::check_runtime_mandatory(&runtime, schema::RuntimeMode::Run)?;
        apply_fallbacks(&mut tree, &self.fallbacks);
        let task_overrides: Vec<String> = parsed
            .iter()
            .filter(|o| !is_runtime_override(o))
            .map(|o| o.input.clone())
            .collect();
        fill_runtime(
            &mut runtime,
            &self.options.config_name,
            job_num,
            &choices,
            parsed,
        );
        // Job values may refer to the runtime node under either of its names.
        if let Value::Dict(root) = &mut tree.value {
            for key in RUNTIME_KEYS {
                root.insert(key.to_string(), runtime.clone());
            }
        }
        let job = self.resolve_job(&tree)?;
        // A job that runs the user's own program is free-form (as in Hydra): its task and
        // compute are checked when its directory is prepared.
        let typed = if self.validate && !runs_user_task(&runtime) && is_flotilla_job(&job) {
            Some(schema::validate(&job)?)
        } else {
            None
        };
        Ok(Composed {
            job,
            runtime,
            choices,
            task_overrides,
            typed,
        })
    }

    /// Defaults list → merged tree → overrides applied. Returns the job tree, the runtime node
    /// (taken out of it) and the group choices.
    #[allow(clippy::type_complexity)]
    fn merge_tree(
        &self,
        parsed: &[Override],
        skip_missing: bool,
    ) -> Result<(Node, Node, IndexMap<String, Option<String>>), ConfigError> {
        let (runtime_overrides, job_overrides): (Vec<&Override>, Vec<&Override>) =
            parsed.iter().partition(|o| is_runtime_override(o));
        let job_overrides: Vec<Override> = job_overrides.into_iter().cloned().collect();
        let mut groups = GroupOverrides::new(&self.repo, &job_overrides)?;
        let merged = self.merged_defaults(&mut groups, skip_missing)?;
        let mut cfg = merged.config.clone();
        let mut runtime = merged.runtime.clone();
        for o in &groups.config_overrides {
            apply_override(&mut cfg, o, o.key_or_group.as_str(), false).map_err(|e| {
                let absent = cfg.get_path(&split_key(&o.key_or_group)).is_none();
                match group_suggestion(&self.repo, o) {
                    Some(hint) if absent && o.key_or_group.contains('/') => {
                        ConfigError::Override(hint)
                    }
                    _ => e,
                }
            })?;
        }
        for o in runtime_overrides {
            if o.is_sweep() || o.key_or_group.contains('/') {
                // Hydra's own config groups (hydra/launcher=..., hydra/job_logging=...) have no
                // counterpart here and are accepted and ignored; sweeps are refused by the planner.
                continue;
            }
            let key = o
                .key_or_group
                .split_once('.')
                .map(|(_, rest)| rest)
                .unwrap_or("");
            if key.is_empty() {
                return Err(ConfigError::Override(format!(
                    "'{}': the runtime node itself cannot be replaced; set one of its keys (e.g. flotilla.run.dir=...)",
                    o.input
                )));
            }
            apply_override(&mut runtime, o, key, true)?;
        }
        Ok((cfg, runtime, merged.choices.clone()))
    }

    /// The defaults list of `groups` merged into one tree, with the runtime node taken out of
    /// it: built once per distinct set of defaults-shaping overrides and shared by every job of
    /// a sweep that makes the same group choices (value overrides are applied afterwards).
    fn merged_defaults(
        &self,
        groups: &mut GroupOverrides,
        skip_missing: bool,
    ) -> Result<Arc<MergedDefaults>, ConfigError> {
        let key = (skip_missing, std::mem::take(&mut groups.defaults_key));
        if let Some(hit) = lock(&self.merged).get(&key) {
            return Ok(hit.clone());
        }
        let defaults = DefaultsBuilder::new(&self.repo, skip_missing)
            .build(&self.options.config_name, groups)?;
        let mut config = Node::empty_dict();
        for d in &defaults {
            let loaded = self.repo.load(&d.config_path)?.ok_or_else(|| {
                ConfigError::Composition(format!("could not load '{}'", d.config_path))
            })?;
            let mut body = loaded.body.clone();
            if !d.package.is_empty() {
                body = embed_at_package(body, &d.package);
            }
            if let Err(path) = merge_into(&mut config, body) {
                return Err(merge_error(&d.config_path, &config, &path));
            }
        }
        // The runtime node: built-in defaults, then `hydra:` and `flotilla:` from the configs.
        let mut runtime = self.runtime_defaults.clone();
        if let Value::Dict(root) = &mut config.value {
            for key in ["hydra", "flotilla"] {
                if let Some(node) = root.shift_remove(key) {
                    if let Err(path) = merge_into(&mut runtime, node) {
                        return Err(merge_error(key, &runtime, &path));
                    }
                }
            }
        }
        let merged = Arc::new(MergedDefaults {
            config,
            runtime,
            choices: std::mem::take(&mut groups.known_choices),
        });
        let mut cache = lock(&self.merged);
        if cache.len() >= MERGED_DEFAULTS_CACHE_SIZE {
            cache.clear();
        }
        cache.insert(key, merged.clone());
        Ok(merged)
    }

    fn resolve_job(&self, tree: &Node) -> Result<Node, ConfigError> {
        let Value::Dict(root) = &tree.value else {
            return Ok(tree.clone());
        };
        let mut out = Dict::with_capacity(root.len());
        let mut resolver = interp::Resolver::new(tree, &self.ctx);
        for key in root.keys() {
            if RUNTIME_KEYS.contains(&key.as_str()) {
                continue;
            }
            let resolved = resolver.resolve_at(std::slice::from_ref(key))?;
            out.insert(key.clone(), resolved);
        }
        Ok(Node::new(Value::Dict(out), tree.origin.clone()))
    }
}

fn sweep_in_run_mode(o: &Override) -> String {
    format!(
        "ambiguous value for argument '{}'\n1. To use it as a list, use key=[value1,value2]\n2. To use it as string, quote the value: key='value1,value2'\n3. To sweep over it, add --multirun (-m) to your command line",
        o.input
    )
}

/// Runtime sub-nodes that take any key (Hydra fills them from plugin configs).
const OPEN_RUNTIME_NODES: [&str; 7] = [
    "launcher",
    "sweeper",
    "help",
    "hydra_help",
    "hydra_logging",
    "job_logging",
    "callbacks",
];

/// The built-in runtime node: Hydra's `hydra:` keys, with flotilla's own defaults.
fn default_runtime(config_name: &str) -> Node {
    let text = format!(
        "run:\n  dir: outputs/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}\n\
         sweep:\n  dir: outputs/multirun/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}\n  subdir: ${{hydra.job.num}}\n\
         launcher: {{}}\n\
         sweeper:\n  max_batch_size: null\n  params: null\n  sampler: grid\n  n_trials: null\n  seed: 0\n  metric: null\n  direction: null\n  max_parallel: null\n  pruner: null\n  min_resource: null\n  reduction_factor: 4\n  min_early_stopping_rate: 0\n  multivariate: false\n\
         help: {{}}\nhydra_help: {{}}\nhydra_logging: {{}}\njob_logging: {{}}\n\
         env: {{}}\nmode: RUN\nsearchpath: []\ncallbacks: {{}}\noutput_subdir: null\n\
         overrides:\n  hydra: []\n  task: []\n\
         job:\n  name: {config_name}\n  chdir: null\n  override_dirname: ''\n  id: ???\n  num: ???\n  config_name: {config_name}\n  env_set: {{}}\n  env_copy: []\n  config:\n    override_dirname:\n      kv_sep: '='\n      item_sep: ','\n      exclude_keys: []\n\
         runtime:\n  version: {version}\n  cwd: ''\n  output_dir: ???\n  choices: {{}}\n\
         verbose: false\n\
         task:\n  command: null\n  ranks: per_task\n  cwd: null\n  env: {{}}\n  config_arg: null\n  starts_workers: false\n",
        version = env!("CARGO_PKG_VERSION"),
    );
    let mut node = yaml::load_str(&text, "<flotilla runtime defaults>")
        .expect("built-in runtime defaults are valid YAML");
    node.set_origin_deep(&Origin::Unknown);
    node
}

fn set_path(runtime: &mut Node, path: &[&str], value: Value) {
    let mut node = runtime;
    for key in &path[..path.len() - 1] {
        let Value::Dict(d) = &mut node.value else {
            return;
        };
        node = d.entry((*key).to_string()).or_insert_with(Node::empty_dict);
    }
    if let Value::Dict(d) = &mut node.value {
        d.insert(path[path.len() - 1].to_string(), Node::from(value));
    }
}

/// Fills in the runtime node's derived values: job number, choices, overrides, override_dirname.
fn fill_runtime(
    runtime: &mut Node,
    config_name: &str,
    job_num: Option<usize>,
    choices: &IndexMap<String, Option<String>>,
    parsed: &[Override],
) {
    let task: Vec<&Override> = parsed.iter().filter(|o| !is_runtime_override(o)).collect();
    let hydra: Vec<&Override> = parsed.iter().filter(|o| is_runtime_override(o)).collect();
    {
        if let Some(num) = job_num {
            set_path(runtime, &["job", "num"], Value::Int(num as i64));
            set_path(runtime, &["mode"], Value::Str("MULTIRUN".into()));
        }
        set_path(
            runtime,
            &["job", "config_name"],
            Value::Str(config_name.to_string()),
        );
        // Hydra names the job when `job.name` is left `???` (to OmegaConf a missing value is
        // not `in` its dict); the name is then flotilla's default, the primary config's.
        if runtime
            .select("job.name")
            .is_some_and(|n| n.value == Value::Missing)
        {
            set_path(
                runtime,
                &["job", "name"],
                Value::Str(config_name.to_string()),
            );
        }
        let mut choice_dict = Dict::new();
        for (k, v) in choices {
            choice_dict.insert(
                k.clone(),
                Node::from(v.clone().map(Value::Str).unwrap_or(Value::Null)),
            );
        }
        set_path(runtime, &["runtime", "choices"], Value::Dict(choice_dict));
        let list = |items: &[&Override]| {
            Value::List(
                items
                    .iter()
                    .map(|o| Node::from(Value::Str(o.input.clone())))
                    .collect(),
            )
        };
        set_path(runtime, &["overrides", "task"], list(&task));
        set_path(runtime, &["overrides", "hydra"], list(&hydra));
        let dirname_cfg = runtime.select("job.config.override_dirname");
        let kv_sep = dirname_cfg
            .and_then(|n| n.child("kv_sep"))
            .and_then(|n| n.value.as_str().map(str::to_string))
            .unwrap_or_else(|| "=".into());
        let item_sep = dirname_cfg
            .and_then(|n| n.child("item_sep"))
            .and_then(|n| n.value.as_str().map(str::to_string))
            .unwrap_or_else(|| ",".into());
        let exclude: Vec<String> = match dirname_cfg.and_then(|n| n.child("exclude_keys")) {
            Some(Node {
                value: Value::List(items),
                ..
            }) => items
                .iter()
                .filter_map(|n| n.value.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        set_path(
            runtime,
            &["job", "override_dirname"],
            Value::Str(override_dirname(&task, &exclude, &item_sep, &kv_sep)),
        );
    }
}

/// Hydra's `job.override_dirname`: the task overrides sorted, joined, `=` replaced by `kv_sep`.
pub fn override_dirname(
    task: &[&Override],
    exclude: &[String],
    item_sep: &str,
    kv_sep: &str,
) -> String {
    let mut lines: Vec<&str> = task
        .iter()
        .filter(|o| !exclude.contains(&o.key_or_group))
        .map(|o| o.input.as_str())
        .collect();
    lines.sort();
    lines.join(item_sep).replace('=', kv_sep)
}

/// Wraps `body` in dictionaries along a dotted package path.
fn embed_at_package(body: Node, package: &str) -> Node {
    let mut node = body;
    for key in package.rsplit('.') {
        let origin = node.origin.clone();
        let mut d = Dict::new();
        d.insert(key.to_string(), node);
        node = Node::new(Value::Dict(d), origin);
    }
    node
}

fn merge_error(config_path: &str, dest: &Node, path: &str) -> ConfigError {
    let kind = |n: Option<&Node>| n.map(|n| n.value.type_name()).unwrap_or("value");
    ConfigError::Composition(format!(
        "in '{config_path}': cannot merge a {} into the {} at '{path}' (set in {})",
        if kind(dest.select(path)) == "dict" {
            "list"
        } else {
            "dict"
        },
        kind(dest.select(path)),
        dest.select(path)
            .map(|n| n.origin.to_string())
            .unwrap_or_default()
    ))
}

/// Merge that rejects keys `dest` does not have (OmegaConf struct mode).
fn merge_struct(dest: &mut Node, src: Node, path: &str, o: &Override) -> Result<(), ConfigError> {
    match (&mut dest.value, src.value) {
        (Value::Dict(d), Value::Dict(s)) => {
            for (key, value) in s {
                let child_path = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match d.get_mut(&key) {
                    Some(existing) => {
                        if value.value == Value::Missing {
                            continue;
                        }
                        merge_struct(existing, value, &child_path, o)?;
                    }
                    None => {
                        let hint = near_miss(&key, d.keys().map(|k| k.as_str()))
                            .map(|n| format!(" (did you mean '{n}'?)"))
                            .unwrap_or_default();
                        return Err(ConfigError::Override(format!(
                            "could not override '{}': key '{child_path}' is not in the config{hint}\nTo add it use +{}",
                            o.key_or_group, o.input
                        )));
                    }
                }
            }
            Ok(())
        }
        (Value::Dict(_), Value::List(_)) => Err(ConfigError::Override(format!(
            "'{}': cannot merge a list into the dictionary at '{path}' (OmegaConf merges only \
             like into like); to replace the dictionary, delete it first: '~{path}' '+{path}=[...]'",
            o.input
        ))),
        (Value::List(_), Value::Dict(_)) => Err(ConfigError::Override(format!(
            "'{}': cannot merge a dictionary into the list at '{path}' (OmegaConf merges only \
             like into like); to replace the list, delete it first: '~{path}' '+{path}={{...}}'",
            o.input
        ))),
        (current, Value::Missing) if !matches!(current, Value::Missing) => Ok(()),
        (_, value) => {
            dest.value = value;
            dest.origin = src.origin;
            Ok(())
        }
    }
}

/// An override's `???` (quoted or not, also inside a list or dict) is the mandatory-missing
/// value, as OmegaConf stores the string `???` wherever it is assigned: `key=???` leaves the key
/// to be set, and what reads it fails as in Hydra.
fn mark_missing(node: &mut Node) {
    if matches!(&node.value, Value::Str(s) if s == "???") {
        node.value = Value::Missing;
        return;
    }
    match &mut node.value {
        Value::List(items) => items.iter_mut().for_each(mark_missing),
        Value::Dict(d) => d.values_mut().for_each(mark_missing),
        _ => {}
    }
}

/// Every dotted key path in a tree (for "did you mean" suggestions).
fn all_paths(node: &Node, prefix: &str, out: &mut Vec<String>) {
    if let Value::Dict(d) = &node.value {
        for (k, v) in d {
            let p = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(p.clone());
            all_paths(v, &p, out);
        }
    }
}

fn suggestion(root: &Node, key: &str) -> String {
    let mut paths = Vec::new();
    all_paths(root, "", &mut paths);
    let paths: Vec<&str> = paths
        .iter()
        .map(|p| p.as_str())
        .filter(|p| {
            !RUNTIME_KEYS
                .iter()
                .any(|r| p == r || p.starts_with(&format!("{r}.")))
        })
        .collect();
    match near_miss(key, paths.iter().copied()) {
        Some(n) => format!(" (did you mean '{n}'?)"),
        None => String::new(),
    }
}

/// For a `group/path=option` override naming no group (a value override to Hydra, which fails
/// as "no such key"): the message naming the config group it most likely meant.
fn group_suggestion(repo: &ConfigRepo, o: &Override) -> Option<String> {
    let groups = repo.group_names();
    let near = near_miss(&o.key_or_group, groups.iter().map(|g| g.as_str()))?;
    let value = o.input.split_once('=').map(|(_, v)| v).unwrap_or("");
    Some(format!(
        "could not override '{}': there is no config group '{}' and no such key in the config (did you mean the config group '{near}'? {near}={value})",
        o.key_or_group, o.key_or_group
    ))
}

/// The value at a key as OmegaConf.select(throw_on_missing=False) sees it: `None` when absent,
/// null or `???`.
fn select_present<'a>(root: &'a Node, segments: &[String]) -> Option<&'a Node> {
    let node = root.get_path(segments)?;
    match node.value {
        Value::Null | Value::Missing => None,
        _ => Some(node),
    }
}

/// Applies one value override (Hydra's `_apply_overrides_to_config`). `key` is the dotted key
/// inside `root` (the override's key, or its remainder for runtime overrides).
fn apply_override(
    root: &mut Node,
    o: &Override,
    key: &str,
    runtime: bool,
) -> Result<(), ConfigError> {
    if o.package.is_some() {
        return Err(ConfigError::Override(format!(
            "override '{}' looks like a config group override, but config group '{}' does not exist",
            o.input, o.key_or_group
        )));
    }
    let segments = split_key(key);
    if segments.is_empty() {
        return Err(ConfigError::Override(format!("'{}': empty key", o.input)));
    }
    let origin = Origin::Override(Arc::from(o.input.as_str()));
    let mut value = o.value().map(|v| {
        let mut n = Node::new(v, origin.clone());
        n.set_origin_deep(&origin);
        n
    });
    if o.is_delete() {
        let Some(existing) = select_present(root, &segments) else {
            return Err(ConfigError::Override(format!(
                "could not delete from config: '{}' does not exist{}",
                o.key_or_group,
                if runtime {
                    String::new()
                } else {
                    suggestion(root, key)
                }
            )));
        };
        if let Some(expected) = value.as_ref().filter(|v| v.value != Value::Null) {
            if !values_equal(&expected.value, &existing.value) {
                return Err(ConfigError::Override(format!(
                    "could not delete from config: the value of '{}' is {} and not {}",
                    o.key_or_group,
                    super::node::python_str(&existing.value),
                    super::node::python_str(&expected.value)
                )));
            }
        }
        let (last, parents) = segments.split_last().expect("non-empty");
        let parent = root
            .get_path_mut(parents)
            .expect("parent of an existing key");
        match &mut parent.value {
            Value::Dict(d) => {
                d.shift_remove(last);
            }
            Value::List(items) => {
                if let Ok(i) = last.parse::<usize>() {
                    items.remove(i);
                }
            }
            _ => {}
        }
        return Ok(());
    }
    let mut value = value
        .take()
        .unwrap_or_else(|| Node::new(Value::Null, origin.clone()));
    mark_missing(&mut value);
    // Plugin sub-nodes of the runtime node take any key, as Hydra's plugin configs would.
    let open_node = runtime && OPEN_RUNTIME_NODES.contains(&segments[0].as_str());
    let force_add = o.is_force_add() || o.is_add() || open_node;
    if o.is_add() && select_present(root, &segments).is_some() && !value.value.is_container() {
        return Err(ConfigError::Override(format!(
            "could not append to config: an item is already at '{}'.\nEither remove the + prefix: '{}'\nOr add a second + to add or override '{}': '+{}'",
            o.key_or_group,
            &o.input[1..],
            o.key_or_group,
            o.input
        )));
    }
    if !force_add && root.get_path(&segments).is_none() {
        return Err(ConfigError::Override(format!(
            "could not override '{}': no such key in the config{}\nTo append to your config use +{}",
            o.key_or_group,
            if runtime { String::new() } else { suggestion(root, key) },
            o.input
        )));
    }
    // Walk to the parent, creating dictionaries where a key is absent or not a container.
    let (last, parents) = segments.split_last().expect("non-empty");
    let mut node = &mut *root;
    for seg in parents {
        if !node.child(seg).is_some_and(|c| c.value.is_container()) {
            let fresh = Node::new(Value::dict(), origin.clone());
            match &mut node.value {
                Value::Dict(d) => {
                    d.insert(seg.clone(), fresh);
                }
                Value::List(items) => {
                    match seg.parse::<usize>().ok().filter(|i| *i < items.len()) {
                        Some(i) => items[i] = fresh,
                        None => return Err(bad_index(o, seg, items.len())),
                    }
                }
                _ => unreachable!("parents are containers"),
            }
        }
        node = node.child_mut(seg).expect("just ensured");
    }
    if value.value.is_container() {
        if let Some(existing) = node.child_mut(last) {
            if existing.value.is_container() {
                if force_add {
                    return merge_into(existing, value).map_err(|p| {
                        ConfigError::Override(format!(
                            "'{}': cannot merge a list and a dictionary at '{key}{}{p}'",
                            o.input,
                            if p.is_empty() { "" } else { "." }
                        ))
                    });
                }
                return merge_struct(existing, value, key, o);
            }
        }
    }
    match &mut node.value {
        Value::Dict(d) => {
            d.insert(last.clone(), value);
        }
        Value::List(items) => match last.parse::<usize>().ok().filter(|i| *i < items.len()) {
            Some(i) => items[i] = value,
            None => return Err(bad_index(o, last, items.len())),
        },
        _ => unreachable!("parents are containers"),
    }
    Ok(())
}

fn bad_index(o: &Override, index: &str, len: usize) -> ConfigError {
    ConfigError::Override(format!(
        "'{}': list index '{index}' is out of range (the list has {len} items)",
        o.input
    ))
}

/// Python's `==` on config values (1 == 1.0, True == 1).
fn values_equal(a: &Value, b: &Value) -> bool {
    let num = |v: &Value| match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        Value::Bool(b) => Some(*b as i64 as f64),
        _ => None,
    };
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}
