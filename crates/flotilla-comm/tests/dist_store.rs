//! Multi-process tests of the rendezvous store (`flotilla_comm::store`) and rank discovery
//! (`flotilla_contract::rank`) on localhost.
//!
//! Each test re-executes this test binary as worker processes of a world
//! (tests/common/world.rs): it runs the `#[ignore]`d test `store_worker` with the torchrun
//! variables (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT ...) and a scenario name in the
//! environment. The worker reads its rank with `discover_from_process`, plays its scenario,
//! and reports in its log with lines containing `@@`. A normal test run skips the worker (it
//! is ignored, and does nothing without the scenario variable). Every spawned process is
//! waited for, and killed first if a test fails or runs past its deadline.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "../../../tests/common/world.rs"]
mod world;

use common::free_port;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitStatus;
use std::thread;
use std::time::{Duration, Instant};

use flotilla_comm::store::{Store, StoreConfig, StoreError};
use flotilla_contract::rank::{discover_from_process, RankEnv};
use world::World;

const SCENARIO_VAR: &str = "FLOTILLA_STORE_TEST_SCENARIO";
const TIMEOUT_VAR: &str = "FLOTILLA_STORE_TEST_TIMEOUT_MS";
const RUN_ID_VAR: &str = "FLOTILLA_STORE_TEST_RUN_ID";
const WORKER: &str = "store_worker";
/// What starts a worker's report line (after whatever the test harness printed first).
const MARK: &str = "@@";

/// Upper bound for any one test.
const TEST_DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Parent side: workers are processes of a `World` (tests/common/world.rs)
// ---------------------------------------------------------------------------------------------

struct Finished {
    label: String,
    status: ExitStatus,
    /// The `@@` lines, without the marker.
    reports: Vec<String>,
    log: String,
}

impl Finished {
    fn report(&self, prefix: &str) -> &str {
        self.reports
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "{}: no '{prefix}' report in {:?}\n{}",
                    self.label, self.reports, self.log
                )
            })
            .trim()
    }

    fn assert_ok(&self) {
        assert!(
            self.status.success() && self.reports.iter().any(|l| l == "ok"),
            "{} failed ({}): reports {:?}\nlog:\n{}",
            self.label,
            self.status,
            self.reports,
            self.log
        );
    }
}

/// A world for one test's workers (their logs in a temporary directory of its own).
fn workers(test: &str) -> World {
    World::new(test, None)
}

/// Starts the worker playing `scenario` as rank `rank` of `size` ranks whose master listens on
/// `port`, with `extra` variables; its index in `w`.
fn spawn(
    w: &mut World,
    scenario: &str,
    rank: usize,
    size: usize,
    port: u16,
    timeout_ms: u64,
    extra: &[(&str, &str)],
) -> usize {
    let mut cmd = world::test_worker(WORKER);
    cmd.env(SCENARIO_VAR, scenario)
        .env(TIMEOUT_VAR, timeout_ms.to_string())
        .env_remove(RUN_ID_VAR);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let env = RankEnv::on_this_host(rank, 1, size, port);
    w.start(&format!("{scenario}.rank{rank}of{size}"), &env, cmd)
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Waits for a report of worker `i` starting with `prefix`.
fn wait_for(w: &mut World, i: usize, prefix: &str, deadline: Instant) -> String {
    let line = w.wait_for_line(i, &format!("{MARK}{prefix}"), left(deadline));
    report_of(&line).unwrap().to_string()
}

/// The report on a log line, if it has one.
fn report_of(line: &str) -> Option<&str> {
    line.split_once(MARK).map(|(_, r)| r)
}

/// Waits for worker `i` to exit (killing every worker at `deadline`) and collects what it said.
fn finish(w: &mut World, i: usize, deadline: Instant) -> Finished {
    let status = w.finish_rank(i, left(deadline));
    let log = w.log(i);
    Finished {
        label: w.ranks[i].label.clone(),
        status,
        reports: log
            .lines()
            .filter_map(report_of)
            .map(String::from)
            .collect(),
        log,
    }
}

fn deadline() -> Instant {
    Instant::now() + TEST_DEADLINE
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn world_sizes_one_to_four_exchange_keys_counters_and_barriers() {
    let end = deadline();
    let mut w = workers("exchange");
    for size in 1..=4 {
        // A single process may let the store pick its port.
        let port = if size == 1 { 0 } else { free_port() };
        for rank in 0..size {
            spawn(&mut w, "exchange", rank, size, port, 10_000, &[]);
        }
    }
    for i in 0..w.ranks.len() {
        finish(&mut w, i, end).assert_ok();
    }
}

#[test]
fn get_blocks_until_another_rank_sets() {
    let end = deadline();
    let port = free_port();
    let mut w = workers("late_get");
    for r in 0..2 {
        spawn(&mut w, "late_get", r, 2, port, 10_000, &[]);
    }
    let done: Vec<Finished> = (0..2).map(|i| finish(&mut w, i, end)).collect();
    for f in &done {
        f.assert_ok();
    }
    let waited: u64 = done[1].report("waited_ms").parse().unwrap();
    assert!(
        waited >= 400,
        "rank 1 got the key after {waited} ms, before rank 0 set it"
    );
}

#[test]
fn a_rank_that_never_joins_makes_the_others_fail_naming_it() {
    let end = deadline();
    let port = free_port();
    let start = Instant::now();
    // World of 3, rank 2 never starts.
    let mut w = workers("never_joins");
    for r in 0..2 {
        spawn(&mut w, "barrier", r, 3, port, 2_000, &[]);
    }
    for i in 0..2 {
        let f = finish(&mut w, i, end);
        assert!(f.status.success(), "{}: {}", f.label, f.log);
        let e = f.report("err");
        // "within" is the master's uptime: 2 s, or a little more on a loaded machine.
        let rest = e
            .strip_prefix("barrier 'start' timed out after 2 s: rank 2 of 3 did not join within ")
            .unwrap_or_else(|| panic!("{}: {e}", f.label));
        assert!(
            rest.ends_with(" s") && !rest.contains(';'),
            "{}: {e}",
            f.label
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn killing_rank_0_fails_the_others_promptly() {
    let end = deadline();
    let port = free_port();
    let mut w = workers("kill_master");
    let master = spawn(&mut w, "hold", 0, 3, port, 10_000, &[]);
    let others: Vec<usize> = (1..3)
        .map(|r| spawn(&mut w, "wait_master", r, 3, port, 10_000, &[]))
        .collect();
    wait_for(&mut w, master, "ready", end);
    for &i in &others {
        wait_for(&mut w, i, "waiting", end);
    }
    // Let both park their get on the server, then kill rank 0 (SIGKILL: no cleanup at all).
    thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    w.kill_rank(master);
    for &i in &others {
        let f = finish(&mut w, i, end);
        assert!(f.status.success(), "{}: {}", f.label, f.log);
        let e = f.report("err");
        assert!(
            e.starts_with("the master closed the connection (rank 0 exited?) during get 'never'"),
            "{}: {e}",
            f.label
        );
    }
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the others noticed after {took:?}"
    );
    let f = finish(&mut w, master, end);
    assert!(!f.status.success());
}

#[test]
fn port_already_in_use_is_a_clear_error() {
    let end = deadline();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut w = workers("port_in_use");
    let i = spawn(&mut w, "connect", 0, 2, port, 2_000, &[]);
    let f = finish(&mut w, i, end);
    assert_eq!(
        f.report("err"),
        format!("cannot bind 127.0.0.1:{port}: address already in use (another job on this port? set MASTER_PORT)")
    );
    drop(taken);
}

#[test]
fn a_different_world_size_or_run_id_is_rejected_on_both_sides() {
    let end = deadline();
    let (port_a, port_b) = (free_port(), free_port());
    let mut w = workers("rejected");
    let master_a = spawn(
        &mut w,
        "barrier",
        0,
        2,
        port_a,
        2_000,
        &[(RUN_ID_VAR, "main")],
    );
    let stray_a = spawn(
        &mut w,
        "connect",
        1,
        3,
        port_a,
        5_000,
        &[(RUN_ID_VAR, "main")],
    );
    let master_b = spawn(
        &mut w,
        "barrier",
        0,
        2,
        port_b,
        2_000,
        &[(RUN_ID_VAR, "main")],
    );
    let stray_b = spawn(
        &mut w,
        "connect",
        1,
        2,
        port_b,
        5_000,
        &[(RUN_ID_VAR, "other")],
    );

    let f = finish(&mut w, stray_a, end);
    assert_eq!(
        f.report("err"),
        format!(
            "the master 127.0.0.1:{port_a} rejected this process: rank 1 joined with world size 3, \
             but the master expects 2"
        )
    );
    let f = finish(&mut w, stray_b, end);
    assert_eq!(
        f.report("err"),
        format!("the master 127.0.0.1:{port_b} rejected this process: rank 1 has run id 'other', the master 'main'")
    );
    let f = finish(&mut w, master_a, end);
    let e = f.report("err");
    assert!(e.contains("rank 1 of 2 did not join within"), "{e}");
    assert!(
        e.ends_with(
            "the master turned away: rank 1 joined with world size 3, but the master expects 2"
        ),
        "{e}"
    );
    let f = finish(&mut w, master_b, end);
    let e = f.report("err");
    assert!(
        e.ends_with("the master turned away: rank 1 has run id 'other', the master 'main'"),
        "{e}"
    );
}

#[test]
fn garbage_on_the_port_does_not_stop_the_server() {
    let end = deadline();
    let port = free_port();
    let mut w = workers("garbage");
    let master = spawn(&mut w, "serve", 0, 2, port, 10_000, &[]);
    let junk: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09",
        b"\x0d\x00\x00\x00\x01FLOTSTOR\xff\xff\xff\xff",
        b"SSH-2.0-OpenSSH_9.6\r\n",
    ];
    for bytes in junk {
        let mut s = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < end => thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("the master never listened: {e}"),
            }
        };
        s.write_all(bytes).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
    }
    let rank1 = spawn(&mut w, "serve", 1, 2, port, 10_000, &[]);
    finish(&mut w, rank1, end).assert_ok();
    finish(&mut w, master, end).assert_ok();
}

#[test]
fn stores_leave_no_threads_behind_and_drop_is_bounded() {
    let mut w = workers("threads");
    let i = spawn(&mut w, "threads", 0, 1, 0, 500, &[]);
    finish(&mut w, i, deadline()).assert_ok();
}

// ---------------------------------------------------------------------------------------------
// Worker side
// ---------------------------------------------------------------------------------------------

fn report(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@@{line}");
    let _ = out.flush();
}

fn worker_config() -> StoreConfig {
    let info = discover_from_process().expect("rank discovery");
    let ms: u64 = std::env::var(TIMEOUT_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let run_id = std::env::var(RUN_ID_VAR).unwrap_or_else(|_| "test-run".into());
    StoreConfig::from_rank_info(&info, run_id, Duration::from_millis(ms))
}

/// Report an error's message, or fail if there was none.
fn expect_err<T>(what: &str, r: Result<T, StoreError>) {
    match r {
        Ok(_) => panic!("{what} succeeded but should have failed"),
        Err(e) => report(format!("err {e}")),
    }
}

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    // A 251-byte block (prime length, so it does not line up with anything) repeated; built
    // with memcpy so debug builds stay fast.
    let block: Vec<u8> = (0..251)
        .map(|i| ((i * 31 + rank * 7) % 253) as u8)
        .collect();
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        let n = (len - v.len()).min(block.len());
        v.extend_from_slice(&block[..n]);
    }
    v
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[test]
#[ignore = "worker process of the multi-process store tests; they start it"]
fn store_worker() {
    let Ok(scenario) = std::env::var(SCENARIO_VAR) else {
        return;
    };
    let cfg = worker_config();
    match scenario.as_str() {
        "exchange" => exchange(&cfg),
        "late_get" => {
            let store = Store::connect(&cfg).unwrap();
            // Rank 0 sets the key 500 ms after rank 1 says it is about to wait for it, so the
            // measured wait does not depend on how fast the processes started.
            if store.rank() == 0 {
                store.get("ready").unwrap();
                thread::sleep(Duration::from_millis(500));
                store.set("late", b"finally").unwrap();
            } else {
                let t0 = Instant::now();
                store.set("ready", b"1").unwrap();
                assert_eq!(store.get("late").unwrap(), b"finally");
                report(format!("waited_ms {}", t0.elapsed().as_millis()));
            }
            store.barrier("end").unwrap();
            report("ok");
        }
        "barrier" => {
            let store = Store::connect(&cfg).unwrap();
            expect_err("the barrier", store.barrier("start"));
        }
        "connect" => expect_err("connect", Store::connect(&cfg)),
        "hold" => {
            let store = Store::connect(&cfg).unwrap();
            store.set("ready", b"1").unwrap();
            report("ready");
            thread::sleep(Duration::from_secs(30));
        }
        "wait_master" => {
            let store = Store::connect(&cfg).unwrap();
            store.get("ready").unwrap();
            report("waiting");
            expect_err("get", store.get_timeout("never", Duration::from_secs(15)));
        }
        "serve" => {
            let store = Store::connect(&cfg).unwrap();
            store.set(&format!("from{}", store.rank()), b"hi").unwrap();
            store.barrier("start").unwrap();
            assert_eq!(
                store.get(&format!("from{}", 1 - store.rank())).unwrap(),
                b"hi"
            );
            store.barrier("end").unwrap();
            report("ok");
        }
        "threads" => threads(&cfg),
        other => panic!("unknown scenario {other}"),
    }
}

fn exchange(cfg: &StoreConfig) {
    let store = Store::connect(cfg).unwrap();
    let (rank, world) = (store.rank(), store.world_size());
    assert_eq!(world, cfg.world_size);
    // Many small keys and one large value per rank.
    for i in 0..50 {
        store
            .set(&format!("r{rank}/k{i}"), format!("{rank}:{i}").as_bytes())
            .unwrap();
    }
    let big = pattern(rank, 3 << 20);
    store.set(&format!("big/{rank}"), &big).unwrap();
    let joined = store.add("joined", 1).unwrap();
    assert!((1..=world as i64).contains(&joined), "{joined}");
    store.barrier("ready").unwrap();
    assert_eq!(store.get("joined").unwrap(), world.to_string().as_bytes());
    let big_keys: Vec<String> = (0..world).map(|r| format!("big/{r}")).collect();
    store
        .wait(&big_keys.iter().map(|k| k.as_str()).collect::<Vec<_>>())
        .unwrap();
    for peer in 0..world {
        for i in (0..50).step_by(7) {
            assert_eq!(
                store.get(&format!("r{peer}/k{i}")).unwrap(),
                format!("{peer}:{i}").as_bytes()
            );
        }
        assert!(store.get(&format!("big/{peer}")).unwrap() == pattern(peer, 3 << 20));
    }
    // Reuse one barrier name; counters check that nobody ran ahead.
    for round in 0..3 {
        store.add(&format!("round{round}"), 1).unwrap();
        store.barrier("round").unwrap();
        assert_eq!(
            store.get(&format!("round{round}")).unwrap(),
            world.to_string().as_bytes()
        );
    }
    store.barrier("deleted").unwrap();
    assert!(store.delete(&format!("r{rank}/k0")).unwrap());
    assert!(!store.delete(&format!("r{rank}/k0")).unwrap());
    store.barrier("end").unwrap();
    report("ok");
}

fn threads(cfg: &StoreConfig) {
    let before = thread_count();
    let timeout = cfg.timeout;
    let local = |rank: usize, world: usize, port: u16| StoreConfig {
        host: "127.0.0.1".into(),
        port,
        rank,
        world_size: world,
        run_id: cfg.run_id.clone(),
        timeout,
        bind_addr: None,
    };
    for _ in 0..2 {
        // A world of three in one process: rank 0 first, the others from threads.
        let master = Store::connect(&local(0, 3, 0)).unwrap();
        let port = master.port();
        let others: Vec<Store> = (1..3)
            .map(|r| local(r, 3, port))
            .map(|c| thread::spawn(move || Store::connect(&c).unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        thread::scope(|s| {
            for st in std::iter::once(&master).chain(others.iter()) {
                s.spawn(move || {
                    st.set(&format!("k{}", st.rank()), b"v").unwrap();
                    st.barrier("b").unwrap();
                    st.wait(&["k0", "k1", "k2"]).unwrap();
                    st.barrier("b").unwrap();
                });
            }
        });
        // Dropping the master while ranks 1 and 2 are still connected: bounded by the grace
        // period (the timeout here, 0.5 s).
        let t0 = Instant::now();
        drop(master);
        let took = t0.elapsed();
        assert!(
            took < timeout + Duration::from_secs(1),
            "dropping the master took {took:?}"
        );
        for st in &others {
            assert!(st.set("after", b"x").is_err());
        }
        drop(others);
    }
    // Garbage connections that never finish a hello must not keep threads alive either.
    let master = Store::connect(&local(0, 1, 0)).unwrap();
    let idle = TcpStream::connect(("127.0.0.1", master.port())).unwrap();
    drop(master);
    drop(idle);
    let after = thread_count();
    assert_eq!(before, after, "threads before {before}, after {after}");
    report("ok");
}
