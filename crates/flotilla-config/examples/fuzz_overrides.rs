//! Fuzzes the Hydra override parser.
//!
//! ```text
//! cargo run --release --example fuzz_overrides -- 1000000 [seed]
//! ```
//!
//! Generates N inputs with a small xorshift generator (random bytes, random text over the
//! grammar's alphabet, grammar-shaped overrides, and mutations of a seed corpus), parses each
//! under `catch_unwind` (also rendering the value and expanding sweeps when it parses), and
//! prints `inputs: N, panics: P, parse ok: K, errors: E, elapsed: S s`. Inputs that panic are
//! printed to stderr (the first ten). Exits with status 1 if anything panicked.

use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use flotilla_config::overrides::parse_override;

/// xorshift64*
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
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const SEEDS: &[&str] = &[
    "a=1",
    "trainer.lr=1e-4",
    "+a.b=[1,2,{c:d}]",
    "++db@pkg=mysql",
    "~trainer",
    "~a=1",
    "hydra/launcher=basic",
    "opt=glob([a*,s*],exclude=adamw)",
    "lr=0.1,0.01,0.001",
    "seed=range(1,5)",
    "x=range(0,1,0.25)",
    "x=sort(range(5,0,-1))",
    "x=shuffle(a,b,c)",
    "x=tag(log,interval(0,1))",
    "x=choice('a b',\"c,d\",[1,2])",
    "x=int(float(str(5)))",
    "x=bool('True')",
    "x=${oc.env:USER,me}",
    "x='it\\'s'",
    "x=\"say \\\"hi\\\"\"",
    "x=a\\ b\\,c",
    "x={1:a,true:b,null:c,1.5:d}",
    "x=  spaced  out  ",
    "x=1_000.5e-3",
    "x=-inf,nan,+3",
    "group@pkg:x=y",
    "x=sort(b,a,reverse=true)",
    "x=range(start=1,stop=3,step=1)",
    "x=[glob(*)]",
    "x={a:shuffle(),a:1}",
];

const TOKENS: &[&str] = &[
    "=",
    "+",
    "++",
    "~",
    "@",
    "/",
    ":",
    ".",
    ",",
    ", ",
    " ",
    "\t",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "'",
    "\"",
    "\\",
    "\\\\",
    "\\,",
    "\\ ",
    "$",
    "${",
    "${x}",
    "}",
    "a",
    "_b",
    "x-y",
    "1",
    "-5",
    "+3",
    "1_0",
    "1.5",
    ".5",
    "5.",
    "1e-4",
    "inf",
    "nan",
    "true",
    "False",
    "null",
    "choice(",
    "range(",
    "interval(",
    "glob(",
    "sort(",
    "shuffle(",
    "tag(",
    "int(",
    "float(",
    "str(",
    "bool(",
    "reverse=true",
    "value=",
    "sweep=",
    "list=",
    "exclude=",
    "*",
    "?",
    "%",
    "|",
    "é",
    "!",
    "#",
    "'a,b'",
    "\"q\"",
];

fn random_bytes(rng: &mut Rng) -> String {
    let n = rng.below(40);
    let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn random_tokens(rng: &mut Rng) -> String {
    let n = 1 + rng.below(16);
    (0..n).map(|_| rng.pick(TOKENS)).collect()
}

fn element(rng: &mut Rng, depth: usize) -> String {
    let atoms = [
        "a", "abc", "1", "-2", "3.5", "1e-3", "inf", "nan", "true", "null", "'q'", "\"d\"", "${x}",
        "a b", "\\,", "/p/q", "*", "x-y", "1:2", "", "1_0",
    ];
    if depth > 3 || rng.chance(45) {
        return rng.pick(&atoms).to_string();
    }
    let n = rng.below(4);
    let items: Vec<String> = (0..n).map(|_| element(rng, depth + 1)).collect();
    match rng.below(4) {
        0 => format!("[{}]", items.join(",")),
        1 => {
            let pairs: Vec<String> = items
                .iter()
                .map(|v| format!("{}:{}", rng.pick(&["a", "1", "true", "null", "k k"]), v))
                .collect();
            format!("{{{}}}", pairs.join(","))
        }
        _ => {
            let f = rng.pick(&[
                "choice", "range", "interval", "glob", "sort", "shuffle", "tag", "int", "float",
                "str", "bool", "nope",
            ]);
            let args: Vec<String> = items
                .iter()
                .map(|v| {
                    let name = rng.pick(&["", "", "", "value=", "reverse=", "sweep=", "list="]);
                    format!("{name}{v}")
                })
                .collect();
            format!("{f}({})", args.join(","))
        }
    }
}

fn grammar_shaped(rng: &mut Rng) -> String {
    let prefix = rng.pick(&["", "", "", "+", "++", "~"]);
    let key = rng.pick(&["a", "a.b", "g/h", "db@pkg", "x@", "", "1.2", "$k"]);
    let mut value = element(rng, 0);
    while rng.chance(20) {
        value.push(',');
        value.push_str(&element(rng, 0));
    }
    format!("{prefix}{key}={value}")
}

fn mutate(rng: &mut Rng) -> String {
    let mut chars: Vec<char> = rng.pick(SEEDS).chars().collect();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(chars.len() + 1);
        match rng.below(6) {
            0 => {
                let tok: Vec<char> = rng.pick(TOKENS).chars().collect();
                chars.splice(at..at, tok);
            }
            1 if at < chars.len() => {
                let end = (at + 1 + rng.below(4)).min(chars.len());
                chars.drain(at..end);
            }
            2 if at < chars.len() => {
                let end = (at + 1 + rng.below(6)).min(chars.len());
                let span: Vec<char> = chars[at..end].to_vec();
                chars.splice(at..at, span);
            }
            3 if chars.len() > 1 => {
                let other = rng.below(chars.len());
                let at = at.min(chars.len() - 1);
                chars.swap(at, other);
            }
            4 => {
                let other: Vec<char> = rng.pick(SEEDS).chars().collect();
                let from = rng.below(other.len());
                chars.truncate(at);
                chars.extend_from_slice(&other[from..]);
            }
            _ if at < chars.len() => chars[at] = rng.pick(TOKENS).chars().next().unwrap_or('x'),
            _ => {}
        }
    }
    chars.into_iter().collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0x5EED);
    let mut rng = Rng(seed | 1);
    let options: Vec<String> = ["adam", "adamw", "lion", "sgd"].map(String::from).to_vec();

    panic::set_hook(Box::new(|_| {}));
    let (mut panics, mut ok, mut errors) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    for _ in 0..n {
        let input = match rng.below(10) {
            0 | 1 => random_bytes(&mut rng),
            2 | 3 => random_tokens(&mut rng),
            4..=6 => grammar_shaped(&mut rng),
            _ => mutate(&mut rng),
        };
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| match parse_override(&input) {
            Ok(o) => {
                let _ = o.value_element_as_str();
                let _ = o.value();
                if o.is_discrete_sweep() {
                    let _ = o.sweep_value_strings(&options);
                }
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        }));
        match outcome {
            Ok(true) => ok += 1,
            Ok(false) => errors += 1,
            Err(_) => {
                panics += 1;
                if panics <= 10 {
                    eprintln!("panic on input {input:?}");
                }
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "inputs: {n}, panics: {panics}, parse ok: {ok}, errors: {errors}, elapsed: {elapsed:.2} s"
    );
    if panics > 0 {
        std::process::exit(1);
    }
}
