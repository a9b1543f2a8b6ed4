//! Rank discovery: where this process sits in a distributed job, read from the environment.
//!
//! This module owns the rules that turn launcher environment variables into a [`RankInfo`]
//! (rank, local rank, world size, node, master address and port), the SLURM host-list
//! parser ([`parse_hostlist`], with `scontrol show hostnames` semantics) and the parser for
//! SLURM's compressed tasks-per-node form (`4(x2),3`). Discovery reads nothing but the
//! variables named below and never touches the network. The other direction lives here too:
//! [`RankEnv`] builds the torchrun variables a launcher gives each rank it starts (the local
//! launcher, `flotilla bench comm`, the multi-process tests), and [`free_port`] finds a
//! `MASTER_PORT` on this host.
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

/// A free TCP port on [`DEFAULT_MASTER_ADDR`] for `MASTER_PORT` (bound, read, released).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind((DEFAULT_MASTER_ADDR, 0))?;
    Ok(listener.local_addr()?.port())
}

/// The environment of one rank a launcher starts: the torchrun variables that place it in the
/// job (what [`discover`] reads back as `place`), and as asked its thread count and its GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// Where the rank sits. `source` is not written (the variables are torchrun's); `job_id`,
    /// when set, becomes `TORCHELASTIC_RUN_ID` with the other variables torchrun's elastic
    /// agent sets (`ROLE_NAME`/`ROLE_RANK`/`ROLE_WORLD_SIZE`, the restart counters).
    pub place: RankInfo,
    /// `OMP_NUM_THREADS`; `None` leaves the inherited value.
    pub threads: Option<usize>,
    /// `CUDA_VISIBLE_DEVICES`; `None` leaves the inherited value.
    pub visible_devices: Option<String>,
}

impl RankEnv {
    /// Rank `rank` of `num_nodes × local_world_size` processes started on this host (rank `r`
    /// is local rank `r % local_world_size` of node `r / local_world_size`), with rank 0's
    /// store on [`DEFAULT_MASTER_ADDR`]`:master_port`; nothing optional set.
    pub fn on_this_host(
        rank: usize,
        num_nodes: usize,
        local_world_size: usize,
        master_port: u16,
    ) -> RankEnv {
        RankEnv {
            place: RankInfo {
                rank,
                local_rank: rank % local_world_size,
                world_size: num_nodes * local_world_size,
                local_world_size,
                node_rank: rank / local_world_size,
                num_nodes,
                master_addr: DEFAULT_MASTER_ADDR.to_string(),
                master_port,
                source: RankSource::Torchrun,
                job_id: None,
                restart_count: 0,
            },
            threads: None,
            visible_devices: None,
        }
    }

    /// The variables to set (in addition to the inherited environment), in a fixed order.
    pub fn vars(&self) -> Vec<(String, String)> {
        let p = &self.place;
        let mut vars: Vec<(&str, String)> = vec![
            ("RANK", p.rank.to_string()),
            ("LOCAL_RANK", p.local_rank.to_string()),
            ("WORLD_SIZE", p.world_size.to_string()),
            ("LOCAL_WORLD_SIZE", p.local_world_size.to_string()),
            ("NODE_RANK", p.node_rank.to_string()),
            ("GROUP_RANK", p.node_rank.to_string()),
            ("GROUP_WORLD_SIZE", p.num_nodes.to_string()),
        ];
        if p.job_id.is_some() {
            vars.extend([
                ("ROLE_NAME", "default".to_string()),
                ("ROLE_RANK", p.rank.to_string()),
                ("ROLE_WORLD_SIZE", p.world_size.to_string()),
            ]);
        }
        vars.extend([
            ("MASTER_ADDR", p.master_addr.clone()),
            ("MASTER_PORT", p.master_port.to_string()),
        ]);
        if let Some(run_id) = &p.job_id {
            vars.extend([
                ("TORCHELASTIC_RUN_ID", run_id.clone()),
                ("TORCHELASTIC_RESTART_COUNT", p.restart_count.to_string()),
                ("TORCHELASTIC_MAX_RESTARTS", "0".to_string()),
            ]);
        }
        if let Some(threads) = self.threads {
            vars.push(("OMP_NUM_THREADS", threads.to_string()));
        }
        if let Some(devices) = &self.visible_devices {
            vars.push(("CUDA_VISIBLE_DEVICES", devices.clone()));
        }
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}

#[cfg(test)]
mod tests;
