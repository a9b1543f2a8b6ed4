//! flotilla's TPE and random samplers, in process, on seeded synthetic objectives: prints one
//! JSON line `{"sampler", "objective", "seed", "best"}` per (sampler, objective, seed).
//! `benches/tpe_vs_optuna.py` runs it beside the real optuna package on the same objectives.
//!
//! Objectives (all minimised; each trial is evaluated as soon as it is sampled, one at a time):
//! * `branin`: Branin over `x1=interval(-5, 10)`, `x2=interval(0, 15)` (minimum 0.397887);
//! * `noisy_quadratic`: `(log10 lr + 3)² + offset(opt) + noise` over
//!   `lr=tag(log, interval(1e-5, 1))` and `opt=choice(adam, rmsprop, sgd)` (offsets 0, 0.3,
//!   1), the noise uniform in [−0.1, 0.1) from splitmix64 of `(seed << 32) ^ trial number`;
//! * `discrete`: `(log2 width − 8)²/4 + (layers − 7)²/10 + 10 (dropout − 0.2)²` over
//!   `width=tag(log, int(interval(16, 1024)))`, `layers=range(1, 12)`,
//!   `dropout=range(0.0, 0.5, step=0.05)` (minimum 0).
//!
//! Usage: `cargo run --release -p flotilla-study --example tpe_objectives -- [--seeds N]
//! [--budget B] [--samplers tpe,tpe-mv,random]`
//!
//! With `--propose OBJECTIVE --history TRIALS.json [--draws N]`, it instead proposes the next
//! trial after the given trials (flotilla's `Trial` JSON, any states) once per seed `0..N`
//! with the first sampler, and prints `{param: [internal values]}`: the sampler's proposal
//! distribution for a fixed history, which the bench compares with optuna's.

use flotilla_study::{
    next_number, Direction, Params, RandomSampler, Sampler, SearchSpace, TpeOptions, TpeSampler,
    Trial, TrialState,
};

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in [−0.1, 0.1): the same numbers as the Python side.
fn noise(seed: u64, number: u64) -> f64 {
    let u = (splitmix64((seed << 32) ^ number) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    0.2 * (u - 0.5)
}

fn branin(x1: f64, x2: f64) -> f64 {
    let pi = std::f64::consts::PI;
    let b = 5.1 / (4.0 * pi * pi);
    let c = 5.0 / pi;
    let t = 1.0 / (8.0 * pi);
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

struct Objective {
    name: &'static str,
    overrides: &'static [&'static str],
    f: fn(&Params, u64, u64) -> f64,
}

/// A param's internal value (a categorical's index).
fn value(p: &Params, name: &str) -> f64 {
    p[name]
}

const OBJECTIVES: [Objective; 4] = [
    Objective {
        name: "branin",
        overrides: &["x1=interval(-5, 10)", "x2=interval(0, 15)"],
        f: |p, _, _| branin(value(p, "x1"), value(p, "x2")),
    },
    Objective {
        name: "noisy_quadratic",
        overrides: &[
            "lr=tag(log, interval(1e-5, 1))",
            "opt=choice(adam, rmsprop, sgd)",
        ],
        f: |p, seed, number| {
            let offset = [0.0, 0.3, 1.0][value(p, "opt") as usize];
            (value(p, "lr").log10() + 3.0).powi(2) + offset + noise(seed, number)
        },
    },
    Objective {
        name: "discrete",
        overrides: &[
            "width=tag(log, int(interval(16, 1024)))",
            "layers=range(1, 12)",
            "dropout=range(0.0, 0.5, step=0.05)",
        ],
        f: |p, _, _| {
            (value(p, "width").log2() - 8.0).powi(2) / 4.0
                + (value(p, "layers") - 7.0).powi(2) / 10.0
                + 10.0 * (value(p, "dropout") - 0.2).powi(2)
        },
    },
    Objective {
        name: "branin_lr",
        overrides: &[
            "x1=interval(-5, 10)",
            "x2=interval(0, 15)",
            "lr=tag(log, interval(1e-5, 1))",
        ],
        f: |p, _, _| {
            branin(value(p, "x1"), value(p, "x2")) + (value(p, "lr").log10() + 3.0).powi(2)
        },
    },
];

/// The best value of a study of `n` trials with `parallel` in flight: the oldest running trial
/// finishes first (trials of equal length), and a new one is sampled as soon as a slot frees,
/// seeing the others still running.
fn run(
    sampler: &mut dyn Sampler,
    obj: &Objective,
    space: &SearchSpace,
    seed: u64,
    n: usize,
    parallel: usize,
) -> f64 {
    let mut trials: Vec<Trial> = Vec::with_capacity(n);
    let mut in_flight: std::collections::VecDeque<usize> = Default::default();
    let mut best = f64::INFINITY;
    while trials.len() < n || !in_flight.is_empty() {
        if trials.len() < n && in_flight.len() < parallel.max(1) {
            let params = sampler.sample(space, &trials);
            let number = next_number(&trials);
            in_flight.push_back(trials.len());
            trials.push(Trial::new(number, params));
            continue;
        }
        let Some(i) = in_flight.pop_front() else {
            break;
        };
        let t = &mut trials[i];
        let v = (obj.f)(&t.params, seed, t.number);
        best = best.min(v);
        t.value = Some(v);
        t.state = TrialState::Complete;
    }
    best
}

fn sampler_named(name: &str, seed: u64) -> Box<dyn Sampler> {
    match name {
        "tpe" | "tpe-mv" => Box::new(TpeSampler::new(
            TpeOptions {
                seed,
                multivariate: name == "tpe-mv",
                ..TpeOptions::default()
            },
            Direction::Minimize,
        )),
        "random" => Box::new(RandomSampler::new(seed)),
        other => {
            eprintln!("unknown sampler {other} (tpe, tpe-mv, random)");
            std::process::exit(2);
        }
    }
}

fn propose(objective: &str, history: &str, draws: u64, sampler: &str) {
    let obj = OBJECTIVES
        .iter()
        .find(|o| o.name == objective)
        .unwrap_or_else(|| {
            eprintln!("unknown objective {objective}");
            std::process::exit(2);
        });
    let space = SearchSpace::from_overrides(obj.overrides).expect("valid space");
    let text = std::fs::read_to_string(history).expect("readable history");
    let trials: Vec<Trial> = serde_json::from_str(&text).expect("a JSON list of trials");
    let mut out: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for seed in 0..draws {
        for (k, v) in sampler_named(sampler, seed).sample(&space, &trials) {
            out.entry(k).or_default().push(v);
        }
    }
    println!("{}", serde_json::to_string(&out).expect("JSON"));
}

fn main() {
    let mut seeds = 10u64;
    let mut propose_for: Option<String> = None;
    let mut history = String::new();
    let mut draws = 2000u64;
    let mut budget = 40usize;
    let mut parallel = 1usize;
    let mut only: Option<String> = None;
    let mut samplers = vec!["tpe".to_string(), "random".to_string()];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--seeds" => seeds = next.parse().expect("--seeds N"),
            "--budget" => budget = next.parse().expect("--budget B"),
            "--parallel" => parallel = next.parse().expect("--parallel P"),
            "--objective" => only = Some(next),
            "--samplers" => samplers = next.split(',').map(str::to_string).collect(),
            "--propose" => propose_for = Some(next),
            "--history" => history = next,
            "--draws" => draws = next.parse().expect("--draws N"),
            other => {
                eprintln!(
                    "unknown argument {other}; usage: tpe_objectives [--seeds N] [--budget B] \
                     [--parallel P] [--objective NAME] [--samplers tpe,tpe-mv,random] \
                     [--propose OBJECTIVE --history FILE --draws N]"
                );
                std::process::exit(2);
            }
        }
        i += 2;
    }
    if let Some(objective) = propose_for {
        propose(&objective, &history, draws, &samplers[0]);
        return;
    }
    for obj in OBJECTIVES
        .iter()
        .filter(|o| only.as_deref().is_none_or(|n| n == o.name))
    {
        let space = SearchSpace::from_overrides(obj.overrides).expect("valid space");
        for name in &samplers {
            for seed in 0..seeds {
                let mut sampler = sampler_named(name, seed);
                let best = run(sampler.as_mut(), obj, &space, seed, budget, parallel);
                println!(
                    "{}",
                    serde_json::json!({
                        "sampler": name,
                        "objective": obj.name,
                        "seed": seed,
                        "best": best,
                    })
                );
            }
        }
    }
}
