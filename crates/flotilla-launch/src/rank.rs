//! Rank discovery: where this process sits in a distributed job, read from the environment.
//!
//! This module owns the rules that turn launcher environment variables into a [`RankInfo`]
//! (rank, local rank, world size, node, master address and port), the SLURM host-list
//! parser ([`parse_hostlist`], with `scontrol show hostnames` semantics) and the parser for
//! SLURM's compressed tasks-per-node form (`4(x2),3`). It reads nothing but the variables
//! named below and never touches the network.
//!
//! Sources, in order of precedence:
//!
//! 1. **torchrun** (`RANK` or `WORLD_SIZE` set): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!    `LOCAL_WORLD_SIZE`, `GROUP_RANK` (or `NODE_RANK`), `GROUP_WORLD_SIZE`, `MASTER_ADDR`,
//!    `MASTER_PORT`, `TORCHELASTIC_RESTART_COUNT`. Missing local values are derived as for a
//!    single node (`LOCAL_WORLD_SIZE` = `WORLD_SIZE`, `LOCAL_RANK` = `RANK % LOCAL_WORLD_SIZE`).
//! 2. **SLURM** (`SLURM_PROCID` set): `SLURM_PROCID`, `SLURM_NTASKS` (or the older
//!    `SLURM_NPROCS`), `SLURM_LOCALID`, `SLURM_NODEID`, `SLURM_NNODES` (or
//!    `SLURM_JOB_NUM_NODES`), `SLURM_TASKS_PER_NODE` (or else `SLURM_NTASKS_PER_NODE`),
//!    `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`), `SLURM_JOB_ID`, `SLURM_RESTART_COUNT`.
//!    `MASTER_ADDR` defaults to the first host of the node list; `MASTER_PORT` defaults to
//!    [`slurm_port`]`(SLURM_JOB_ID)` = `20000 + SLURM_JOB_ID % 20000`, so every task of a job
//!    agrees on a port without talking, and jobs sharing a node rarely collide. Explicit
//!    `MASTER_ADDR` / `MASTER_PORT` always win.
//! 3. **Single process**: rank 0 of 1, master `127.0.0.1`, port 0 (the store picks a free one),
//!    unless `MASTER_ADDR` / `MASTER_PORT` say otherwise.
//!
//! Values are trimmed; an empty variable counts as unset. Inconsistent or malformed values are
//! errors that name the variables and their values.

use std::fmt;

/// Which launcher's variables a [`RankInfo`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RankSource {
    /// torchrun / torch.distributed.elastic (or anything that sets `RANK` and `WORLD_SIZE`).
    Torchrun,
    /// A task started by `srun` (`SLURM_PROCID` and friends).
    Slurm,
    /// No launcher: a single process.
    Single,
}

impl fmt::Display for RankSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RankSource::Torchrun => "torchrun",
            RankSource::Slurm => "slurm",
            RankSource::Single => "single",
        })
    }
}

/// Where this process sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Rank on this node, `0..local_world_size`.
    pub local_rank: usize,
    /// Number of processes in the job.
    pub world_size: usize,
    /// Number of processes on this node.
    pub local_world_size: usize,
    /// Index of this node, `0..num_nodes`.
    pub node_rank: usize,
    /// Number of nodes in the job.
    pub num_nodes: usize,
    /// Host of rank 0's rendezvous store.
    pub master_addr: String,
    /// Port of rank 0's rendezvous store; 0 means "pick a free port" (single process only).
    pub master_port: u16,
    /// Which variables this came from.
    pub source: RankSource,
    /// The scheduler's job id (`SLURM_JOB_ID`, or torchrun's `TORCHELASTIC_RUN_ID`).
    pub job_id: Option<String>,
    /// How often the job was restarted (requeued by SLURM, or restarted by torchrun).
    pub restart_count: u32,
}

impl RankInfo {
    /// The defaults for a process started without a launcher.
    pub fn single() -> RankInfo {
        RankInfo {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            local_world_size: 1,
            node_rank: 0,
            num_nodes: 1,
            master_addr: DEFAULT_MASTER_ADDR.to_string(),
            master_port: 0,
            source: RankSource::Single,
            job_id: None,
            restart_count: 0,
        }
    }

    /// True for global rank 0 (the process that serves the rendezvous store).
    pub fn is_master(&self) -> bool {
        self.rank == 0
    }
}

/// Master address used when a single process needs one.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// First port of the range [`slurm_port`] derives ports from.
pub const SLURM_PORT_BASE: u16 = 20000;
/// Size of the range [`slurm_port`] derives ports from (ports 20000..=39999).
pub const SLURM_PORT_SPAN: u16 = 20000;
/// Most hosts one bracket range (or the prefix ranges of one name) may expand to; Slurm's limit.
pub const MAX_HOSTLIST_RANGE: u64 = 64 * 1024;
/// Most names a whole host list may expand to (a guard against `a[0-65535]b[0-65535]`).
pub const MAX_HOSTLIST_NAMES: usize = 1 << 20;

/// The master port derived from a SLURM job id: `20000 + job_id % 20000`.
pub fn slurm_port(job_id: u64) -> u16 {
    SLURM_PORT_BASE + (job_id % u64::from(SLURM_PORT_SPAN)) as u16
}

/// What is wrong with the environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A variable that must be a number is not one.
    #[error("{var}='{value}' is not {expected}")]
    NotANumber {
        var: String,
        value: String,
        expected: &'static str,
    },
    /// A port variable is out of range or unusable.
    #[error("{var}='{value}' is not a usable port: {reason}")]
    BadPort {
        var: String,
        value: String,
        reason: String,
    },
    /// An index is not below the count it indexes.
    #[error("{index_var}={index} is out of range: it must be below {count_var}={count}")]
    OutOfRange {
        index_var: String,
        index: usize,
        count_var: String,
        count: usize,
    },
    /// A count that must be at least 1 is 0.
    #[error("{var}=0: there must be at least one")]
    Zero { var: String },
    /// One variable needs another that is not set.
    #[error("{present} is set but {missing} is not ({hint})")]
    Missing {
        present: String,
        missing: String,
        hint: String,
    },
    /// More than one process, but no way to find rank 0.
    #[error("{size_var}={size} (more than one process) but {missing} is not set; {hint}")]
    NoMaster {
        size_var: String,
        size: usize,
        missing: String,
        hint: String,
    },
    /// Two variables contradict each other.
    #[error("{0}")]
    Inconsistent(String),
    /// A structured value (such as `SLURM_TASKS_PER_NODE`) does not parse.
    #[error("cannot parse {var}='{value}': {reason}")]
    BadValue {
        var: String,
        value: String,
        reason: String,
    },
    /// A host list does not parse. `position` is 1-based, in characters of `list`.
    #[error("cannot parse {}'{list}': {reason} at character {position}", what_prefix(.var))]
    Hostlist {
        var: Option<String>,
        list: String,
        position: usize,
        reason: String,
    },
}

fn what_prefix(var: &Option<String>) -> String {
    match var {
        Some(v) => format!("{v}="),
        None => "host list ".to_string(),
    }
}

/// Discover the rank from the process environment (see the module documentation).
pub fn discover_from_process() -> Result<RankInfo, EnvError> {
    discover(&|name| std::env::var(name).ok())
}

/// Discover the rank from an environment given as a lookup function (see the module
/// documentation for the rules).
pub fn discover(env: &dyn Fn(&str) -> Option<String>) -> Result<RankInfo, EnvError> {
    let env = Env(env);
    if env.get("RANK").is_some() || env.get("WORLD_SIZE").is_some() {
        from_torchrun(&env)
    } else if env.get("SLURM_PROCID").is_some() {
        from_slurm(&env)
    } else {
        from_single(&env)
    }
}

/// A lookup with trimming and "empty means unset".
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// The first of `names` that is set, with its name.
    fn first(&self, names: &[&'static str]) -> Option<(&'static str, String)> {
        names.iter().find_map(|n| self.get(n).map(|v| (*n, v)))
    }

    fn usize(&self, name: &str) -> Result<Option<usize>, EnvError> {
        self.get(name).map(|v| parse_usize(name, &v)).transpose()
    }

    fn usize_first(
        &self,
        names: &[&'static str],
    ) -> Result<Option<(&'static str, usize)>, EnvError> {
        self.first(names)
            .map(|(n, v)| parse_usize(n, &v).map(|x| (n, x)))
            .transpose()
    }

    fn u32(&self, name: &str) -> Result<Option<u32>, EnvError> {
        self.get(name)
            .map(|v| {
                v.parse::<u32>().map_err(|_| EnvError::NotANumber {
                    var: name.to_string(),
                    value: v.clone(),
                    expected: "a non-negative integer",
                })
            })
            .transpose()
    }

    /// `MASTER_PORT`, validated; `None` when unset.
    fn master_port(&self, world_size: usize, size_var: &str) -> Result<Option<u16>, EnvError> {
        let Some(v) = self.get("MASTER_PORT") else {
            return Ok(None);
        };
        let bad = |reason: String| EnvError::BadPort {
            var: "MASTER_PORT".to_string(),
            value: v.clone(),
            reason,
        };
        let n: u64 = v
            .parse()
            .map_err(|_| bad("not a number (expected 1-65535)".to_string()))?;
        if n > 65535 {
            return Err(bad("above 65535".to_string()));
        }
        if n == 0 && world_size > 1 {
            return Err(bad(format!(
                "0 means \"pick a free port\", which only works for a single process, \
                 but {size_var}={world_size}"
            )));
        }
        Ok(Some(n as u16))
    }
}

fn parse_usize(var: &str, value: &str) -> Result<usize, EnvError> {
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(EnvError::NotANumber {
            var: var.to_string(),
            value: value.to_string(),
            expected: "a non-negative integer",
        });
    }
    value.parse().map_err(|_| EnvError::NotANumber {
        var: var.to_string(),
        value: value.to_string(),
        expected: "a non-negative integer that fits in 64 bits",
    })
}

fn check_below(
    index_var: &str,
    index: usize,
    count_var: &str,
    count: usize,
) -> Result<(), EnvError> {
    if index < count {
        Ok(())
    } else {
        Err(EnvError::OutOfRange {
            index_var: index_var.to_string(),
            index,
            count_var: count_var.to_string(),
            count,
        })
    }
}

fn check_nonzero(var: &str, n: usize) -> Result<(), EnvError> {
    if n == 0 {
        Err(EnvError::Zero {
            var: var.to_string(),
        })
    } else {
        Ok(())
    }
}

fn from_torchrun(env: &Env) -> Result<RankInfo, EnvError> {
    let hint = "torchrun sets RANK and WORLD_SIZE together";
    let rank = env.usize("RANK")?.ok_or_else(|| EnvError::Missing {
        present: "WORLD_SIZE".into(),
        missing: "RANK".into(),
        hint: hint.into(),
    })?;
    let world_size = env.usize("WORLD_SIZE")?.ok_or_else(|| EnvError::Missing {
        present: "RANK".into(),
        missing: "WORLD_SIZE".into(),
        hint: hint.into(),
    })?;
    check_nonzero("WORLD_SIZE", world_size)?;
    check_below("RANK", rank, "WORLD_SIZE", world_size)?;

    let local_world_size = env.usize("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
    check_nonzero("LOCAL_WORLD_SIZE", local_world_size)?;
    if local_world_size > world_size {
        return Err(EnvError::Inconsistent(format!(
            "LOCAL_WORLD_SIZE={local_world_size} is larger than WORLD_SIZE={world_size}"
        )));
    }
    let local_rank = env.usize("LOCAL_RANK")?.unwrap_or(rank % local_world_size);
    check_below(
        "LOCAL_RANK",
        local_rank,
        "LOCAL_WORLD_SIZE",
        local_world_size,
    )?;

    let node = env.usize_first(&["GROUP_RANK", "NODE_RANK"])?;
    let node_rank = node.map_or(rank / local_world_size, |(_, n)| n);
    let nodes = env.usize_first(&["GROUP_WORLD_SIZE"])?;
    let num_nodes = match nodes {
        Some((var, n)) => {
            check_nonzero(var, n)?;
            n
        }
        None => world_size.div_ceil(local_world_size).max(node_rank + 1),
    };
    if let (Some((node_var, n)), Some((nodes_var, count))) = (node, nodes) {
        check_below(node_var, n, nodes_var, count)?;
    }

    let (master_addr, master_port) = master(env, world_size, "WORLD_SIZE", None)?;
    let job_id = env.get("SLURM_JOB_ID").or_else(|| {
        env.get("TORCHELASTIC_RUN_ID")
            .filter(|id| !id.eq_ignore_ascii_case("none"))
    });
    let restart_count = match env.u32("TORCHELASTIC_RESTART_COUNT")? {
        Some(n) => n,
        None => env.u32("SLURM_RESTART_COUNT")?.unwrap_or(0),
    };
    Ok(RankInfo {
        rank,
        local_rank,
        world_size,
        local_world_size,
        node_rank,
        num_nodes,
        master_addr,
        master_port,
        source: RankSource::Torchrun,
        job_id,
        restart_count,
    })
}

/// Master address and port. `slurm_first_host` gives the node-list fallback for the address
/// and enables the job-id-derived port.
fn master(
    env: &Env,
    world_size: usize,
    size_var: &str,
    slurm: Option<&dyn Fn() -> Result<Option<String>, EnvError>>,
) -> Result<(String, u16), EnvError> {
    let addr = match env.get("MASTER_ADDR") {
        Some(a) => a,
        None => {
            let from_nodes = match slurm {
                Some(first_host) => first_host()?,
                None => None,
            };
            match from_nodes {
                Some(h) => h,
                None if world_size == 1 => DEFAULT_MASTER_ADDR.to_string(),
                None => {
                    return Err(EnvError::NoMaster {
                        size_var: size_var.to_string(),
                        size: world_size,
                        missing: if slurm.is_some() {
                            "MASTER_ADDR (nor SLURM_JOB_NODELIST)".to_string()
                        } else {
                            "MASTER_ADDR".to_string()
                        },
                        hint: "set MASTER_ADDR to the host of rank 0".to_string(),
                    })
                }
            }
        }
    };
    let port = match env.master_port(world_size, size_var)? {
        Some(p) => p,
        None if world_size == 1 => 0,
        None if slurm.is_some() => match env.get("SLURM_JOB_ID") {
            Some(id) => {
                // Array jobs look like "123_4" in some variables; SLURM_JOB_ID is numeric.
                let n = parse_usize("SLURM_JOB_ID", &id)?;
                slurm_port(n as u64)
            }
            None => {
                return Err(EnvError::NoMaster {
                    size_var: size_var.to_string(),
                    size: world_size,
                    missing: "MASTER_PORT (nor SLURM_JOB_ID to derive it from)".to_string(),
                    hint: "set MASTER_PORT to a free port on rank 0's host".to_string(),
                })
            }
        },
        None => {
            return Err(EnvError::NoMaster {
                size_var: size_var.to_string(),
                size: world_size,
                missing: "MASTER_PORT".to_string(),
                hint: "set MASTER_PORT to a free port on rank 0's host".to_string(),
            })
        }
    };
    Ok((addr, port))
}

fn from_slurm(env: &Env) -> Result<RankInfo, EnvError> {
    let rank = env.usize("SLURM_PROCID")?.unwrap_or(0);
    let (size_var, world_size) = env
        .usize_first(&["SLURM_NTASKS", "SLURM_NPROCS"])?
        .ok_or_else(|| EnvError::Missing {
            present: "SLURM_PROCID".into(),
            missing: "SLURM_NTASKS".into(),
            hint: "srun sets both; was this started by srun?".into(),
        })?;
    check_nonzero(size_var, world_size)?;
    check_below("SLURM_PROCID", rank, size_var, world_size)?;

    let (nodes_var, num_nodes) = env
        .usize_first(&["SLURM_NNODES", "SLURM_JOB_NUM_NODES"])?
        .unwrap_or(("SLURM_NNODES", 1));
    check_nonzero(nodes_var, num_nodes)?;
    let node_rank = match env.usize("SLURM_NODEID")? {
        Some(n) => n,
        None if num_nodes == 1 => 0,
        None => {
            return Err(EnvError::Missing {
                present: format!("{nodes_var}={num_nodes}"),
                missing: "SLURM_NODEID".into(),
                hint: "srun sets it for every task".into(),
            })
        }
    };
    check_below("SLURM_NODEID", node_rank, nodes_var, num_nodes)?;

    let (local_var, local_world_size) = if let Some(v) = env.get("SLURM_TASKS_PER_NODE") {
        let per_node = parse_tasks_per_node("SLURM_TASKS_PER_NODE", &v)?;
        match per_node.get(node_rank) {
            Some(&n) => ("SLURM_TASKS_PER_NODE", n),
            None => {
                return Err(EnvError::Inconsistent(format!(
                    "SLURM_TASKS_PER_NODE='{v}' describes {} node(s), but SLURM_NODEID={node_rank}",
                    per_node.len()
                )))
            }
        }
    } else if let Some(n) = env.usize("SLURM_NTASKS_PER_NODE")? {
        ("SLURM_NTASKS_PER_NODE", n)
    } else if world_size % num_nodes == 0 {
        (size_var, world_size / num_nodes)
    } else {
        return Err(EnvError::Missing {
            present: format!("{size_var}={world_size} over {nodes_var}={num_nodes}"),
            missing: "SLURM_TASKS_PER_NODE".into(),
            hint: "the tasks do not divide evenly over the nodes, so the tasks on this node \
                   cannot be derived"
                .into(),
        });
    };
    check_nonzero(local_var, local_world_size)?;
    if local_world_size > world_size {
        return Err(EnvError::Inconsistent(format!(
            "{local_var} gives {local_world_size} tasks on node {node_rank}, more than \
             {size_var}={world_size}"
        )));
    }
    let local_rank = match env.usize("SLURM_LOCALID")? {
        Some(n) => n,
        None if num_nodes == 1 => rank,
        None => {
            return Err(EnvError::Missing {
                present: "SLURM_PROCID".into(),
                missing: "SLURM_LOCALID".into(),
                hint: "srun sets it for every task".into(),
            })
        }
    };
    if local_rank >= local_world_size {
        return Err(EnvError::Inconsistent(format!(
            "SLURM_LOCALID={local_rank} is out of range: node {node_rank} has \
             {local_world_size} task(s) (from {local_var})"
        )));
    }

    let first_host = || -> Result<Option<String>, EnvError> {
        let Some((var, list)) = env.first(&["SLURM_JOB_NODELIST", "SLURM_NODELIST"]) else {
            return Ok(None);
        };
        let hosts = parse_hostlist(&list).map_err(|e| match e {
            EnvError::Hostlist {
                list,
                position,
                reason,
                ..
            } => EnvError::Hostlist {
                var: Some(var.to_string()),
                list,
                position,
                reason,
            },
            other => other,
        })?;
        Ok(hosts.into_iter().next())
    };
    let (master_addr, master_port) = master(env, world_size, size_var, Some(&first_host))?;
    Ok(RankInfo {
        rank,
        local_rank,
        world_size,
        local_world_size,
        node_rank,
        num_nodes,
        master_addr,
        master_port,
        source: RankSource::Slurm,
        job_id: env.get("SLURM_JOB_ID"),
        restart_count: env.u32("SLURM_RESTART_COUNT")?.unwrap_or(0),
    })
}

fn from_single(env: &Env) -> Result<RankInfo, EnvError> {
    let mut info = RankInfo::single();
    if let Some(addr) = env.get("MASTER_ADDR") {
        info.master_addr = addr;
    }
    if let Some(port) = env.master_port(1, "WORLD_SIZE")? {
        info.master_port = port;
    }
    info.job_id = env.get("SLURM_JOB_ID");
    info.restart_count = env.u32("SLURM_RESTART_COUNT")?.unwrap_or(0);
    Ok(info)
}

/// Parse SLURM's compressed per-node counts, e.g. `4(x2),3` → `[4, 4, 3]`.
pub fn parse_tasks_per_node(var: &str, value: &str) -> Result<Vec<usize>, EnvError> {
    let bad = |reason: String| EnvError::BadValue {
        var: var.to_string(),
        value: value.to_string(),
        reason,
    };
    let digits = |s: &str| -> Option<usize> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    let mut out = Vec::new();
    for item in value.split(',') {
        let item = item.trim();
        let (count, times) = match item.split_once('(') {
            None => (item, None),
            Some((count, rest)) => {
                let inner = rest
                    .strip_suffix(')')
                    .and_then(|r| r.strip_prefix('x'))
                    .ok_or_else(|| bad(format!("'{item}' is not of the form N or N(xM)")))?;
                (count, Some(inner))
            }
        };
        let n =
            digits(count).ok_or_else(|| bad(format!("'{item}' is not of the form N or N(xM)")))?;
        let times = match times {
            None => 1,
            Some(t) => digits(t)
                .ok_or_else(|| bad(format!("'{item}': repeat count '{t}' is not a number")))?,
        };
        if out.len().saturating_add(times) > MAX_HOSTLIST_RANGE as usize {
            return Err(bad(format!("more than {MAX_HOSTLIST_RANGE} nodes")));
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Host lists
// ---------------------------------------------------------------------------------------------

/// Expand a SLURM host list the way `scontrol show hostnames` does.
///
/// * Names are separated by `,`, space, tab or newline, except inside brackets.
/// * `prefix[ranges]suffix` expands the *last* bracket of a name: `ranges` is a comma list of
///   `N` or `LO-HI`; numbers are printed zero-padded to the width of `LO` as written
///   (`[08-11]` → `08 09 10 11`, `[8-11]` → `8 9 10 11`). `node-[1-3]-ib` keeps the suffix.
/// * Brackets in the prefix are expanded too (`rack[1-2]-n[1-2]` → `rack1-n1 rack1-n2
///   rack2-n1 rack2-n2`), in Slurm's order: the last prefix bracket varies slowest.
/// * Order and duplicates are kept; a name without brackets is taken as is.
///
/// Errors (with the 1-based character position): an unclosed `[`, an empty or non-numeric
/// range, `HI < LO`, a range of more than 65536 hosts, and `{…}` node-set expressions (which
/// only the Slurm controller can expand).
pub fn parse_hostlist(s: &str) -> Result<Vec<String>, EnvError> {
    let err = |pos: usize, reason: String| EnvError::Hostlist {
        var: None,
        list: s.to_string(),
        position: s[..pos.min(s.len())].chars().count() + 1,
        reason,
    };
    if let Some(p) = s.find('{') {
        return Err(err(
            p,
            "'{' node-set expressions can only be expanded by the Slurm controller".to_string(),
        ));
    }
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some((start, end)) = next_token(bytes, &mut pos) {
        let tok = &s[start..end];
        let Some(open) = tok.rfind('[') else {
            out.push(tok.to_string());
            continue;
        };
        let after = &tok[open + 1..];
        let Some(close_rel) = after.find(']') else {
            return Err(err(start + open, "'[' is never closed".to_string()));
        };
        let inner = &after[..close_rel];
        let rest = &after[close_rel + 1..];
        // Slurm ignores whatever follows "]," (unreachable after tokenising, kept for parity).
        let suffix = if rest.starts_with(',') { "" } else { rest };
        let ranges =
            parse_range_list(inner).map_err(|(off, reason)| err(start + open + 1 + off, reason))?;
        push_range_list(&tok[..open], suffix, &ranges, &mut out)
            .map_err(|(off, reason)| err(start + off, reason))?;
    }
    Ok(out)
}

/// One `LO-HI` range of a bracket, with the print width of `LO`.
#[derive(Debug, Clone, Copy)]
struct HostRange {
    lo: u64,
    hi: u64,
    width: usize,
}

/// Slurm's `_next_tok`: skip separators, then take everything up to the next separator that
/// is not inside a bracket pair. Returns byte offsets.
fn next_token(s: &[u8], pos: &mut usize) -> Option<(usize, usize)> {
    let is_sep = |c: u8| matches!(c, b'\t' | b',' | b' ' | b'\n');
    let find = |from: usize, c: u8| s[from..].iter().position(|&b| b == c).map(|i| i + from);
    while *pos < s.len() && is_sep(s[*pos]) {
        *pos += 1;
    }
    if *pos >= s.len() {
        return None;
    }
    let tok = *pos;
    let mut parse = tok;
    let mut cur = tok;
    'token: loop {
        while cur < s.len() && !is_sep(s[cur]) {
            cur += 1;
        }
        loop {
            let open = match find(parse, b'[') {
                Some(o) if o <= cur => o,
                _ => break 'token,
            };
            let close = match find(parse, b']') {
                Some(c) if c >= open => c,
                _ => break 'token,
            };
            if close < cur {
                parse = close + 1;
            } else {
                cur = close;
                continue 'token;
            }
        }
    }
    let end = cur;
    while cur < s.len() && is_sep(s[cur]) {
        cur += 1;
    }
    *pos = cur;
    Some((tok, end))
}

/// Parse `1,3-5,08-10` into ranges; errors carry a byte offset into `s`.
fn parse_range_list(s: &str) -> Result<Vec<HostRange>, (usize, String)> {
    let mut out = Vec::new();
    let mut off = 0;
    for part in s.split(',') {
        out.push(parse_single_range(part).map_err(|reason| (off, reason))?);
        off += part.len() + 1;
    }
    Ok(out)
}

/// Slurm's `_parse_single_range` (decimal digits only).
fn parse_single_range(s: &str) -> Result<HostRange, String> {
    let invalid = |why: &str| format!("invalid range '{s}' ({why})");
    if s.is_empty() {
        return Err("empty range".to_string());
    }
    let (lo_s, hi_s) = match s.split_once('-') {
        Some((lo, hi)) => (lo, Some(hi)),
        None => (s, None),
    };
    if hi_s.is_some_and(|h| h.starts_with('-')) {
        return Err(invalid("negative numbers are not allowed"));
    }
    let number = |t: &str| -> Result<u64, String> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("expected N or LO-HI with decimal numbers"));
        }
        t.parse().map_err(|_| invalid("number too large"))
    };
    let lo = number(lo_s)?;
    // As in Slurm, "5-" means just 5.
    let hi = match hi_s {
        Some(h) if !h.is_empty() => number(h)?,
        _ => lo,
    };
    if lo > hi {
        return Err(invalid("the start is after the end"));
    }
    if hi - lo + 1 > MAX_HOSTLIST_RANGE {
        return Err(invalid(&format!("more than {MAX_HOSTLIST_RANGE} hosts")));
    }
    Ok(HostRange {
        lo,
        hi,
        width: lo_s.len(),
    })
}

/// Slurm's `_push_range_list`: expand one bracket in the prefix (the last one), recursing while
/// the remaining prefix still holds a `[`, then append the token's own ranges and suffix.
/// Errors carry a byte offset into the token (prefix positions are those of the original
/// token, since only text after the expanded bracket is rewritten).
fn push_range_list(
    prefix: &str,
    suffix: &str,
    ranges: &[HostRange],
    out: &mut Vec<String>,
) -> Result<(), (usize, String)> {
    if let Some(open) = prefix.rfind('[') {
        if let Some(close_rel) = prefix[open..].rfind(']') {
            let close = open + close_rel;
            let head = &prefix[..open];
            let tail = &prefix[close + 1..];
            let recurse = head.contains('[');
            let prefix_ranges = parse_range_list(&prefix[open + 1..close])
                .map_err(|(off, reason)| (open + 1 + off, reason))?;
            let count: u64 = prefix_ranges.iter().map(|r| r.hi - r.lo + 1).sum();
            if count > MAX_HOSTLIST_RANGE {
                return Err((
                    open,
                    format!("the prefix expands to more than {MAX_HOSTLIST_RANGE} names"),
                ));
            }
            for r in &prefix_ranges {
                for j in r.lo..=r.hi {
                    let new_prefix = format!("{head}{j:0w$}{tail}", w = r.width);
                    if recurse {
                        push_range_list(&new_prefix, suffix, ranges, out)?;
                    } else {
                        push_hosts(&new_prefix, suffix, ranges, out)?;
                    }
                }
            }
            return Ok(());
        }
    }
    push_hosts(prefix, suffix, ranges, out)
}

fn push_hosts(
    prefix: &str,
    suffix: &str,
    ranges: &[HostRange],
    out: &mut Vec<String>,
) -> Result<(), (usize, String)> {
    for r in ranges {
        if out.len() as u64 + (r.hi - r.lo + 1) > MAX_HOSTLIST_NAMES as u64 {
            return Err((
                0,
                format!("the list expands to more than {MAX_HOSTLIST_NAMES} names"),
            ));
        }
        for i in r.lo..=r.hi {
            out.push(format!("{prefix}{i:0w$}{suffix}", w = r.width));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn run(pairs: &[(&str, &str)]) -> Result<RankInfo, EnvError> {
        let map = env_of(pairs);
        discover(&|k| map.get(k).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        match run(pairs) {
            Ok(info) => panic!("expected an error, got {info:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn hosts(s: &str) -> Vec<String> {
        parse_hostlist(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    // ---- single process ----

    #[test]
    fn empty_environment_is_a_single_process() {
        let info = run(&[]).unwrap();
        assert_eq!(info, RankInfo::single());
        assert_eq!(info.master_addr, "127.0.0.1");
        assert_eq!(info.master_port, 0);
        assert!(info.is_master());
    }

    #[test]
    fn single_process_honours_master_variables_and_job_id() {
        let info = run(&[
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_RESTART_COUNT", "2"),
        ])
        .unwrap();
        assert_eq!(info.source, RankSource::Single);
        assert_eq!(info.master_addr, "node7");
        assert_eq!(info.master_port, 29500);
        assert_eq!(info.job_id.as_deref(), Some("77"));
        assert_eq!(info.restart_count, 2);
    }

    #[test]
    fn empty_and_blank_values_count_as_unset() {
        let info = run(&[("RANK", ""), ("WORLD_SIZE", "  "), ("MASTER_PORT", "")]).unwrap();
        assert_eq!(info.source, RankSource::Single);
        assert_eq!(info.master_port, 0);
    }

    // ---- torchrun ----

    #[test]
    fn torchrun_full_set() {
        let info = run(&[
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("GROUP_RANK", "1"),
            ("GROUP_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RESTART_COUNT", "3"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ])
        .unwrap();
        assert_eq!(
            info,
            RankInfo {
                rank: 5,
                local_rank: 1,
                world_size: 8,
                local_world_size: 4,
                node_rank: 1,
                num_nodes: 2,
                master_addr: "10.0.0.1".into(),
                master_port: 29500,
                source: RankSource::Torchrun,
                job_id: Some("abc".into()),
                restart_count: 3,
            }
        );
    }

    #[test]
    fn torchrun_values_are_trimmed() {
        let info = run(&[
            ("RANK", " 1 "),
            ("WORLD_SIZE", "2\n"),
            ("MASTER_ADDR", " host "),
            ("MASTER_PORT", "29500 "),
        ])
        .unwrap();
        assert_eq!((info.rank, info.world_size), (1, 2));
        assert_eq!(info.master_addr, "host");
    }

    #[test]
    fn torchrun_derives_local_values_for_one_node() {
        let info = run(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap();
        assert_eq!((info.local_rank, info.local_world_size), (3, 4));
        assert_eq!((info.node_rank, info.num_nodes), (0, 1));
    }

    #[test]
    fn torchrun_derives_node_from_local_world_size_and_accepts_node_rank() {
        let base = [
            ("RANK", "6"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1234"),
        ];
        let info = run(&base).unwrap();
        assert_eq!((info.local_rank, info.node_rank, info.num_nodes), (2, 1, 2));
        let mut with_node_rank = base.to_vec();
        with_node_rank.push(("NODE_RANK", "1"));
        assert_eq!(run(&with_node_rank).unwrap().node_rank, 1);
        // GROUP_RANK wins over NODE_RANK.
        with_node_rank.push(("GROUP_RANK", "0"));
        assert_eq!(run(&with_node_rank).unwrap().node_rank, 0);
    }

    #[test]
    fn torchrun_wins_over_slurm() {
        let info = run(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1234"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_JOB_ID", "99"),
            ("SLURM_RESTART_COUNT", "4"),
        ])
        .unwrap();
        assert_eq!(info.source, RankSource::Torchrun);
        assert_eq!((info.rank, info.world_size), (1, 2));
        assert_eq!(info.job_id.as_deref(), Some("99"));
        assert_eq!(info.restart_count, 4);
    }

    #[test]
    fn torchrun_run_id_none_is_no_job_id() {
        let info = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("TORCHELASTIC_RUN_ID", "none"),
        ])
        .unwrap();
        assert_eq!(info.job_id, None);
        assert_eq!(info.master_addr, "127.0.0.1");
        assert_eq!(info.master_port, 0);
    }

    #[test]
    fn rank_must_be_below_world_size() {
        let e = err(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]);
        assert_eq!(e, "RANK=4 is out of range: it must be below WORLD_SIZE=4");
    }

    #[test]
    fn local_rank_must_be_below_local_world_size() {
        let e = err(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]);
        assert_eq!(
            e,
            "LOCAL_RANK=2 is out of range: it must be below LOCAL_WORLD_SIZE=2"
        );
    }

    #[test]
    fn local_world_size_cannot_exceed_world_size() {
        let e = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]);
        assert!(
            e.contains("LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"),
            "{e}"
        );
    }

    #[test]
    fn group_rank_must_be_below_group_world_size() {
        let e = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("GROUP_RANK", "2"),
            ("GROUP_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]);
        assert_eq!(
            e,
            "GROUP_RANK=2 is out of range: it must be below GROUP_WORLD_SIZE=2"
        );
    }

    #[test]
    fn world_size_zero_is_an_error() {
        assert_eq!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            "WORLD_SIZE=0: there must be at least one"
        );
    }

    #[test]
    fn rank_without_world_size_and_vice_versa() {
        assert_eq!(
            err(&[("RANK", "0")]),
            "RANK is set but WORLD_SIZE is not (torchrun sets RANK and WORLD_SIZE together)"
        );
        assert_eq!(
            err(&[("WORLD_SIZE", "2")]),
            "WORLD_SIZE is set but RANK is not (torchrun sets RANK and WORLD_SIZE together)"
        );
    }

    #[test]
    fn multi_process_needs_master_addr_and_port() {
        let e = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")]);
        assert_eq!(
            e,
            "WORLD_SIZE=2 (more than one process) but MASTER_ADDR is not set; \
             set MASTER_ADDR to the host of rank 0"
        );
        let e = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]);
        assert!(
            e.starts_with("WORLD_SIZE=2 (more than one process) but MASTER_PORT is not set"),
            "{e}"
        );
    }

    #[test]
    fn non_numeric_values_are_errors_naming_the_variable() {
        assert_eq!(
            err(&[("RANK", "one"), ("WORLD_SIZE", "2")]),
            "RANK='one' is not a non-negative integer"
        );
        assert_eq!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "-2")]),
            "WORLD_SIZE='-2' is not a non-negative integer"
        );
        assert_eq!(
            err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1.5")]),
            "LOCAL_RANK='1.5' is not a non-negative integer"
        );
        assert_eq!(
            err(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("TORCHELASTIC_RESTART_COUNT", "x")
            ]),
            "TORCHELASTIC_RESTART_COUNT='x' is not a non-negative integer"
        );
        assert!(
            err(&[("RANK", "99999999999999999999999"), ("WORLD_SIZE", "2")])
                .contains("fits in 64 bits")
        );
    }

    #[test]
    fn port_out_of_range_or_not_a_number() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
        let with = |p: &'static str| {
            let mut v = base.to_vec();
            v.push(("MASTER_PORT", p));
            err(&v)
        };
        assert_eq!(
            with("70000"),
            "MASTER_PORT='70000' is not a usable port: above 65535"
        );
        assert_eq!(
            with("http"),
            "MASTER_PORT='http' is not a usable port: not a number (expected 1-65535)"
        );
        assert!(with("0").contains("only works for a single process, but WORLD_SIZE=2"));
        // Port 0 is fine for one process.
        assert_eq!(run(&[("MASTER_PORT", "0")]).unwrap().master_port, 0);
        assert!(run(&[("MASTER_PORT", "65536")]).is_err());
    }

    // ---- SLURM ----

    fn slurm_base() -> Vec<(&'static str, &'static str)> {
        vec![
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_NODEID", "1"),
            ("SLURM_NNODES", "2"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "123456"),
        ]
    }

    fn with(
        mut base: Vec<(&'static str, &'static str)>,
        extra: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        for (k, v) in extra {
            base.retain(|(bk, _)| bk != k);
            base.push((k, v));
        }
        base
    }

    fn without(
        mut base: Vec<(&'static str, &'static str)>,
        keys: &[&str],
    ) -> Vec<(&'static str, &'static str)> {
        base.retain(|(k, _)| !keys.contains(k));
        base
    }

    #[test]
    fn slurm_full_set() {
        let info = run(&with(slurm_base(), &[("SLURM_RESTART_COUNT", "1")])).unwrap();
        assert_eq!(
            info,
            RankInfo {
                rank: 5,
                local_rank: 1,
                world_size: 8,
                local_world_size: 4,
                node_rank: 1,
                num_nodes: 2,
                master_addr: "gpu07".into(),
                master_port: 23456,
                source: RankSource::Slurm,
                job_id: Some("123456".into()),
                restart_count: 1,
            }
        );
        assert_eq!(info.master_port, 23456);
    }

    #[test]
    fn slurm_port_range_is_fixed() {
        assert_eq!(slurm_port(0), 20000);
        assert_eq!(slurm_port(19999), 39999);
        assert_eq!(slurm_port(20000), 20000);
        assert_eq!(slurm_port(u64::MAX), 20000 + (u64::MAX % 20000) as u16);
    }

    #[test]
    fn slurm_master_variables_win() {
        let info = run(&with(
            slurm_base(),
            &[("MASTER_ADDR", "10.1.1.1"), ("MASTER_PORT", "29400")],
        ))
        .unwrap();
        assert_eq!(info.master_addr, "10.1.1.1");
        assert_eq!(info.master_port, 29400);
        // With MASTER_ADDR set, a node list is not needed at all.
        let info = run(&without(
            with(slurm_base(), &[("MASTER_ADDR", "m")]),
            &["SLURM_JOB_NODELIST"],
        ))
        .unwrap();
        assert_eq!(info.master_addr, "m");
    }

    #[test]
    fn slurm_uneven_tasks_per_node() {
        let env = with(
            slurm_base(),
            &[
                ("SLURM_NTASKS", "11"),
                ("SLURM_NNODES", "3"),
                ("SLURM_TASKS_PER_NODE", "4(x2),3"),
                ("SLURM_PROCID", "9"),
                ("SLURM_NODEID", "2"),
                ("SLURM_LOCALID", "1"),
                ("SLURM_JOB_NODELIST", "a[1-3]"),
            ],
        );
        let info = run(&env).unwrap();
        assert_eq!(
            (info.local_world_size, info.node_rank, info.num_nodes),
            (3, 2, 3)
        );
        let e = err(&with(env, &[("SLURM_LOCALID", "3")]));
        assert_eq!(
            e,
            "SLURM_LOCALID=3 is out of range: node 2 has 3 task(s) (from SLURM_TASKS_PER_NODE)"
        );
    }

    #[test]
    fn slurm_ntasks_per_node_and_even_split_fallbacks() {
        let env = without(slurm_base(), &["SLURM_TASKS_PER_NODE"]);
        assert_eq!(
            run(&with(env.clone(), &[("SLURM_NTASKS_PER_NODE", "4")]))
                .unwrap()
                .local_world_size,
            4
        );
        assert_eq!(run(&env).unwrap().local_world_size, 4);
        let e = err(&with(env, &[("SLURM_NTASKS", "7")]));
        assert!(e.contains("SLURM_TASKS_PER_NODE is not"), "{e}");
    }

    #[test]
    fn slurm_single_node_defaults() {
        let info = run(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_NODELIST", "n1"),
            ("SLURM_JOB_ID", "5"),
        ])
        .unwrap();
        assert_eq!(
            (info.rank, info.local_rank, info.node_rank, info.num_nodes),
            (2, 2, 0, 1)
        );
        assert_eq!(info.local_world_size, 4);
        assert_eq!(info.master_addr, "n1");
        assert_eq!(info.master_port, 20005);
    }

    #[test]
    fn slurm_single_task_uses_a_free_port() {
        let info = run(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_JOB_ID", "5"),
        ])
        .unwrap();
        assert_eq!(info.source, RankSource::Slurm);
        assert_eq!(
            (info.master_addr.as_str(), info.master_port),
            ("127.0.0.1", 0)
        );
    }

    #[test]
    fn slurm_nodelist_fallback_variable() {
        let env = with(
            without(slurm_base(), &["SLURM_JOB_NODELIST"]),
            &[("SLURM_NODELIST", "x[3-4]")],
        );
        assert_eq!(run(&env).unwrap().master_addr, "x3");
    }

    #[test]
    fn slurm_procid_without_ntasks() {
        assert_eq!(
            err(&[("SLURM_PROCID", "0")]),
            "SLURM_PROCID is set but SLURM_NTASKS is not (srun sets both; was this started by srun?)"
        );
        // The deprecated alias is accepted.
        assert_eq!(
            run(&[("SLURM_PROCID", "0"), ("SLURM_NPROCS", "1")])
                .unwrap()
                .world_size,
            1
        );
    }

    #[test]
    fn slurm_rank_out_of_range() {
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_PROCID", "8")])),
            "SLURM_PROCID=8 is out of range: it must be below SLURM_NTASKS=8"
        );
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_NODEID", "2")])),
            "SLURM_NODEID=2 is out of range: it must be below SLURM_NNODES=2"
        );
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_LOCALID", "4")])),
            "SLURM_LOCALID=4 is out of range: node 1 has 4 task(s) (from SLURM_TASKS_PER_NODE)"
        );
    }

    #[test]
    fn slurm_tasks_per_node_shorter_than_node_id() {
        let e = err(&with(slurm_base(), &[("SLURM_TASKS_PER_NODE", "4")]));
        assert_eq!(
            e,
            "SLURM_TASKS_PER_NODE='4' describes 1 node(s), but SLURM_NODEID=1"
        );
    }

    #[test]
    fn slurm_missing_node_and_local_ids_on_many_nodes() {
        assert!(err(&without(slurm_base(), &["SLURM_NODEID"])).contains("SLURM_NODEID is not"));
        assert!(err(&without(slurm_base(), &["SLURM_LOCALID"])).contains("SLURM_LOCALID is not"));
    }

    #[test]
    fn slurm_bad_values() {
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_TASKS_PER_NODE", "4(2)")])),
            "cannot parse SLURM_TASKS_PER_NODE='4(2)': '4(2)' is not of the form N or N(xM)"
        );
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_JOB_ID", "12_3")])),
            "SLURM_JOB_ID='12_3' is not a non-negative integer"
        );
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_RESTART_COUNT", "-1")])),
            "SLURM_RESTART_COUNT='-1' is not a non-negative integer"
        );
        assert_eq!(
            err(&with(slurm_base(), &[("SLURM_NTASKS", "eight")])),
            "SLURM_NTASKS='eight' is not a non-negative integer"
        );
    }

    #[test]
    fn slurm_without_nodelist_or_job_id() {
        let e = err(&without(slurm_base(), &["SLURM_JOB_NODELIST"]));
        assert!(e.starts_with("SLURM_NTASKS=8 (more than one process) but MASTER_ADDR (nor SLURM_JOB_NODELIST) is not set"), "{e}");
        let e = err(&without(slurm_base(), &["SLURM_JOB_ID"]));
        assert!(
            e.contains("MASTER_PORT (nor SLURM_JOB_ID to derive it from) is not set"),
            "{e}"
        );
    }

    #[test]
    fn slurm_unparsable_nodelist_says_where() {
        let e = err(&with(
            slurm_base(),
            &[("SLURM_JOB_NODELIST", "gpu[01-04,07")],
        ));
        assert_eq!(
            e,
            "cannot parse SLURM_JOB_NODELIST='gpu[01-04,07': '[' is never closed at character 4"
        );
    }

    #[test]
    fn tasks_per_node_forms() {
        let p = |s| parse_tasks_per_node("V", s).unwrap();
        assert_eq!(p("4(x2),3"), vec![4, 4, 3]);
        assert_eq!(p("2"), vec![2]);
        assert_eq!(p("1(x3)"), vec![1, 1, 1]);
        assert_eq!(p("8,8,4(x2)"), vec![8, 8, 4, 4]);
        for bad in ["", "x", "4(x)", "4(xa)", "4(x2", "(x2)", "4,,3"] {
            assert!(parse_tasks_per_node("V", bad).is_err(), "{bad:?}");
        }
    }

    // ---- host lists (expected output from `scontrol show hostnames`) ----

    #[test]
    fn hostlist_plain_and_separators() {
        assert_eq!(hosts("node1"), strs(&["node1"]));
        assert_eq!(
            hosts("a1,b2 c3\td4\ne5"),
            strs(&["a1", "b2", "c3", "d4", "e5"])
        );
        assert_eq!(hosts(",, a1 ,,"), strs(&["a1"]));
        assert_eq!(hosts(""), Vec::<String>::new());
        // Order and duplicates are kept, as scontrol prints them.
        assert_eq!(hosts("n2,n1,n1"), strs(&["n2", "n1", "n1"]));
    }

    #[test]
    fn hostlist_ranges_and_padding() {
        assert_eq!(
            hosts("gpu[01-04,07],cpu3"),
            strs(&["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"])
        );
        assert_eq!(hosts("tux[1,3-4]"), strs(&["tux1", "tux3", "tux4"]));
        assert_eq!(
            hosts("node[8-11]"),
            strs(&["node8", "node9", "node10", "node11"])
        );
        assert_eq!(
            hosts("node[08-11]"),
            strs(&["node08", "node09", "node10", "node11"])
        );
        assert_eq!(hosts("n[098-101]"), strs(&["n098", "n099", "n100", "n101"]));
        assert_eq!(hosts("n[0001-2]"), strs(&["n0001", "n0002"]));
        assert_eq!(hosts("[1-3]"), strs(&["1", "2", "3"]));
        assert_eq!(hosts("lx[10-20]").len(), 11);
        // Slurm reads "5-" as just 5.
        assert_eq!(hosts("n[5-]"), strs(&["n5"]));
    }

    #[test]
    fn hostlist_suffix() {
        assert_eq!(
            hosts("node-[1-3]-ib"),
            strs(&["node-1-ib", "node-2-ib", "node-3-ib"])
        );
        assert_eq!(
            hosts("node[1-2].cluster.org,login"),
            strs(&["node1.cluster.org", "node2.cluster.org", "login"])
        );
    }

    #[test]
    fn hostlist_nested_prefixes() {
        assert_eq!(
            hosts("rack[1-2]-node[01-02]"),
            strs(&[
                "rack1-node01",
                "rack1-node02",
                "rack2-node01",
                "rack2-node02"
            ])
        );
        assert_eq!(hosts("r[1-2]n[3]-ib,x"), strs(&["r1n3-ib", "r2n3-ib", "x"]));
        // Three brackets: Slurm expands the last prefix bracket outermost.
        assert_eq!(
            hosts("a[1-2]b[3-4]c[5-6]"),
            strs(&["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"])
        );
    }

    #[test]
    fn hostlist_oddities_match_slurm() {
        // A ']' without '[' is part of the name.
        assert_eq!(hosts("n]1"), strs(&["n]1"]));
        // A prefix '[' without its ']' stays literal.
        assert_eq!(hosts("a[1b[2]"), strs(&["a[1b2"]));
    }

    #[test]
    fn hostlist_errors_say_where() {
        let e = |s: &str| parse_hostlist(s).unwrap_err().to_string();
        assert_eq!(
            e("gpu[01-04"),
            "cannot parse host list 'gpu[01-04': '[' is never closed at character 4"
        );
        assert_eq!(
            e("ok1,gpu[1-x]"),
            "cannot parse host list 'ok1,gpu[1-x]': invalid range '1-x' (expected N or LO-HI with decimal numbers) at character 9"
        );
        assert_eq!(
            e("n[3-1]"),
            "cannot parse host list 'n[3-1]': invalid range '3-1' (the start is after the end) at character 3"
        );
        assert_eq!(
            e("n[]"),
            "cannot parse host list 'n[]': empty range at character 3"
        );
        assert_eq!(
            e("n[1,,2]"),
            "cannot parse host list 'n[1,,2]': empty range at character 5"
        );
        assert!(e("n[1--2]").contains("negative numbers are not allowed"));
        assert!(e("n[0-70000]").contains("more than 65536 hosts"));
        assert!(e("n[1x2]").contains("invalid range"));
        assert!(e("n{1-2}").contains("only be expanded by the Slurm controller"));
        // Errors inside a prefix bracket point into the prefix.
        assert_eq!(
            e("r[a]n[1-2]"),
            "cannot parse host list 'r[a]n[1-2]': invalid range 'a' (expected N or LO-HI with decimal numbers) at character 3"
        );
        assert!(e("a[0-65535]b[0-65535]").contains("more than 1048576 names"));
    }

    #[test]
    fn hostlist_large_but_legal() {
        let v = hosts("n[00000-65535]");
        assert_eq!(v.len(), 65536);
        assert_eq!(v[0], "n00000");
        assert_eq!(v[65535], "n65535");
    }
}
