//! Tests of rank discovery: the torchrun, SLURM and single-process sources, host lists and
//! tasks-per-node strings.

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
