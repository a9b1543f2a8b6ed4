//! Fuzzes the interpolation parser and resolver:
//! `cargo run --release --example fuzz_interp -- N [SEED]`.
//!
//! Generates N inputs (random strings over an interpolation-heavy alphabet, and grammar-aware
//! mutations of a seed corpus), parses each, and resolves a small tree that holds it in
//! several places, all under `catch_unwind`. Prints
//! `inputs: N, panics: P, parsed ok: K, errors: E, elapsed: S s`, where `errors` counts
//! inputs whose tree failed to resolve. Exits non-zero when anything panicked.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use flotilla_config::interp::{parse, resolve_tree, ResolveContext};
use flotilla_config::node::{Dict, Node, Origin, Value};

/// xorshift64*: tiny, deterministic, good enough for fuzzing.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const SEEDS: &[&str] = &[
    "${a}",
    "${b.c}",
    "${b.d[1]}",
    "${b.d.0}",
    "${.s}",
    "${..a}",
    "${...a}",
    "${b.${k}}",
    "${${k}}",
    "x-${a}-${b.c}",
    "\\${a}",
    "\\\\${a}",
    "\\\\\\${a}",
    "${oc.env:FUZZ_HOME}",
    "${oc.env:FUZZ_NOPE,default}",
    "${oc.env:FUZZ_NOPE,null}",
    "${oc.select:b.c}",
    "${oc.select:nope,[1, 2]}",
    "${oc.select:.s,'q'}",
    "${oc.decode:'[1, 2, {a: 3}]'}",
    "${oc.decode:'{x: ${a}}'}",
    "${oc.decode:${b.c}}",
    "${oc.create:{a: [1, ${b}]}}",
    "${oc.dict.keys:b}",
    "${oc.dict.values:b}",
    "${oc.deprecated:a}",
    "${now:%Y-%m-%d_%H-%M-%S}",
    "${hydra:job.name}",
    "${flotilla:job}",
    "${oc.select:nope,\"a\\\"b\"}",
    "${oc.env:FUZZ_NOPE,'it\\'s'}",
    "${oc.env:FUZZ_NOPE,a\\,b\\ c}",
    "${ a }",
    "${oc.env: FUZZ_HOME , x }",
    "${e}",
    "${m}",
    "${u}",
    "???",
    "plain text",
    "${nope:1}",
];

const TOKENS: &[&str] = &[
    "${",
    "}",
    "{",
    ".",
    "..",
    "[",
    "]",
    ":",
    ",",
    "'",
    "\"",
    "\\",
    "\\\\",
    " ",
    "\t",
    "$",
    "a",
    "b",
    "c",
    "d",
    "e",
    "k",
    "m",
    "s",
    "u",
    "0",
    "1",
    "-1",
    "1.5",
    "1e3",
    "inf",
    "nan",
    "true",
    "null",
    "oc.env",
    "oc.select",
    "oc.decode",
    "oc.create",
    "oc.dict.keys",
    "oc.dict.values",
    "now",
    "hydra",
    "%Y",
    "\\${",
    "\\'",
    "\\,",
    "=",
    "#",
    "(",
    ")",
    "é",
    "\u{1F600}",
    "???",
];

fn mutate(rng: &mut Rng, base: &str) -> String {
    let mut s: Vec<char> = base.chars().collect();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(s.len() + 1);
        match rng.below(6) {
            0 | 1 => {
                let tok: Vec<char> = rng.pick(TOKENS).chars().collect();
                s.splice(at..at, tok);
            }
            2 if !s.is_empty() => {
                let end = (at + 1 + rng.below(4)).min(s.len());
                let start = at.min(end);
                s.drain(start..end);
            }
            3 => {
                let other: Vec<char> = rng.pick(SEEDS).chars().collect();
                s.splice(at..at, other);
            }
            4 if !s.is_empty() => {
                let i = rng.below(s.len());
                let j = (i + 1 + rng.below(6)).min(s.len());
                let piece: Vec<char> = s[i..j].to_vec();
                s.splice(at.min(s.len())..at.min(s.len()), piece);
            }
            _ => {
                // Wrap in an interpolation or a resolver argument.
                let inner: String = s.iter().collect();
                let wrapped = match rng.below(4) {
                    0 => format!("${{{inner}}}"),
                    1 => format!("${{oc.decode:'{inner}'}}"),
                    2 => format!("${{oc.select:nope,{inner}}}"),
                    _ => format!("x{inner}y"),
                };
                s = wrapped.chars().collect();
            }
        }
    }
    s.into_iter().take(400).collect()
}

fn random_string(rng: &mut Rng) -> String {
    let n = rng.below(12);
    let mut s = String::new();
    for _ in 0..n {
        if rng.below(5) == 0 {
            let c = char::from_u32(rng.below(0x3000) as u32).unwrap_or('?');
            s.push(c);
        } else {
            s.push_str(rng.pick(TOKENS));
        }
    }
    s
}

fn node(v: Value) -> Node {
    Node::new(v, Origin::Override(Arc::from("fuzz")))
}

fn dict(entries: Vec<(&str, Node)>) -> Node {
    node(Value::Dict(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<Dict>(),
    ))
}

fn tree_with(text: &str) -> Node {
    let s = |t: &str| node(Value::Str(t.to_string()));
    dict(vec![
        ("a", node(Value::Int(1))),
        (
            "b",
            dict(vec![
                ("c", s("x")),
                (
                    "d",
                    node(Value::List(vec![node(Value::Float(1.5)), s(text)])),
                ),
            ]),
        ),
        ("k", s("c")),
        ("e", s("\\${a}")),
        ("m", node(Value::Missing)),
        ("u", node(Value::Null)),
        ("s", s(text)),
        ("t", dict(vec![("v", s(text)), ("w", s("${..a}"))])),
        ("hydra", dict(vec![("job", dict(vec![("name", s(text))]))])),
    ])
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let first_panic: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    {
        let first_panic = first_panic.clone();
        panic::set_hook(Box::new(move |info| {
            let mut slot = first_panic.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(info.to_string());
            }
        }));
    }
    let ctx = ResolveContext {
        now: chrono::Local::now(),
        env: std::sync::Arc::new(|k| (k == "FUZZ_HOME").then(|| "/home/fuzz".to_string())),
    };
    let seed: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    // An odd multiplier spreads small seeds; xorshift only needs a non-zero state.
    let mut rng = Rng(seed
        .wrapping_add(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .max(1));
    let (mut panics, mut parsed_ok, mut errors) = (0usize, 0usize, 0usize);
    let mut panicking_inputs = Vec::new();
    let start = Instant::now();
    for _ in 0..n {
        let input = match rng.below(3) {
            0 => random_string(&mut rng),
            _ => {
                let seed = rng.pick(SEEDS);
                mutate(&mut rng, seed)
            }
        };
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            let parsed = parse(&input).is_ok();
            let resolved = resolve_tree(&tree_with(&input), &ctx).is_ok();
            (parsed, resolved)
        }));
        match outcome {
            Ok((parsed, resolved)) => {
                parsed_ok += usize::from(parsed);
                errors += usize::from(!resolved);
            }
            Err(_) => {
                panics += 1;
                if panicking_inputs.len() < 10 {
                    panicking_inputs.push(input);
                }
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "inputs: {n}, panics: {panics}, parsed ok: {parsed_ok}, errors: {errors}, elapsed: {elapsed:.2} s"
    );
    if panics > 0 {
        if let Some(msg) = first_panic.lock().unwrap_or_else(|e| e.into_inner()).take() {
            eprintln!("first panic: {msg}");
        }
        for input in &panicking_inputs {
            eprintln!("panicking input: {input:?}");
        }
        std::process::exit(1);
    }
}
