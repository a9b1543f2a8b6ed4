//! `flotilla train` against a plain PyTorch fp32 loop (tests/oracle/train_oracle.py, `tokens`
//! mode) for 50 steps: the oracle creates the initial weights with transformers and a uint16
//! token file, trains on them by the `kind: tokens`, `shuffle: false` batch contract, and
//! flotilla trains from the same directory and file through the command line. Loss, grad_norm
//! and lr of every step agree within 1e-4 relative. The run covers warmup then cosine decay to
//! `min_lr`, clipping active at some steps and not at others, weight decay, and gradient
//! accumulation (4 micro-batches per step).

mod common;

use std::path::Path;
use std::process::Command;

const STEPS: u64 = 50;
const SEQ: u64 = 16;
const GLOBAL: u64 = 8;
const MICRO: u64 = 2;
const LR: f64 = 3e-3;
const MIN_LR: f64 = 3e-4;
const WARMUP: u64 = 5;
const CLIP: f64 = 0.8;
const TOL: f64 = 1e-4;

/// Runs the oracle into `dir` (writing `init/` and `tokens.bin`); its [loss, grad_norm, lr] rows.
fn oracle(dir: &Path) -> Vec<[f64; 3]> {
    let root = env!("CARGO_MANIFEST_DIR");
    let args = [
        STEPS.to_string(),
        SEQ.to_string(),
        GLOBAL.to_string(),
        MICRO.to_string(),
        LR.to_string(),
        MIN_LR.to_string(),
        WARMUP.to_string(),
        "cosine".into(),
        "0.1".into(),
        "0.9".into(),
        "0.95".into(),
        "1e-8".into(),
        CLIP.to_string(),
    ];
    common::run_oracle(
        common::python(format!("{root}/tests/oracle/train_oracle.py"))
            .arg("tokens")
            .arg(dir)
            .args(args),
    )
}

/// `flotilla train` on the oracle's weights and tokens; the (step, loss, grad_norm, lr) rows of
/// its metrics.csv.
fn flotilla(dir: &Path) -> Vec<(u64, [f64; 3])> {
    let run_dir = dir.join("run");
    let init = dir.join("init");
    let tokens = dir.join("tokens.bin");
    let overrides = [
        "trainer/dist=none".into(),
        "compute.tasks_per_node=1".into(),
        format!("model.init_from={}", init.display()),
        "data=tokens".into(),
        format!("data.path={}", tokens.display()),
        "data.token_dtype=uint16".into(),
        format!("data.seq_len={SEQ}"),
        "data.shuffle=false".into(),
        format!("trainer.max_steps={STEPS}"),
        format!("trainer.global_batch_size={GLOBAL}"),
        format!("trainer.micro_batch_size={MICRO}"),
        format!("trainer.lr={LR}"),
        format!("trainer.min_lr={MIN_LR}"),
        format!("trainer.warmup_steps={WARMUP}"),
        "trainer.schedule=cosine".into(),
        "trainer.weight_decay=0.1".into(),
        "trainer.betas=[0.9,0.95]".into(),
        "trainer.eps=1e-8".into(),
        format!("trainer.grad_clip={CLIP}"),
        "trainer.precision=32-true".into(),
        "trainer.device=cpu".into(),
        "trainer.eval_every=0".into(),
        "trainer.checkpoint_every=0".into(),
        "trainer.resume=never".into(),
        "trainer.log_every=1".into(),
        "trainer.activation_checkpointing=false".into(),
    ];
    common::train_binary();
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("train")
        .arg("--run-dir")
        .arg(&run_dir)
        .args(&overrides)
        .env("FLOTILLA_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut reader = csv::Reader::from_path(run_dir.join("metrics.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (step, loss, norm, lr) = (col("step"), col("loss"), col("grad_norm"), col("lr"));
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            let f = |i: usize| r[i].parse::<f64>().unwrap();
            (r[step].parse().unwrap(), [f(loss), f(norm), f(lr)])
        })
        .collect()
}

#[test]
fn train_matches_torch_loop_for_50_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let want = oracle(tmp.path());
    let got = flotilla(tmp.path());

    assert_eq!(want.len(), STEPS as usize);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..STEPS).collect::<Vec<_>>()
    );
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
    let names = ["loss", "grad_norm", "lr"];
    let mut worst = [(0f64, 0u64); 3];
    let mut bad = vec![];
    for ((step, g), w) in got.iter().zip(&want) {
        for c in 0..3 {
            let d = rel(g[c], w[c]);
            if d > worst[c].0 {
                worst[c] = (d, *step);
            }
            // NaN counts as a mismatch.
            if d.is_nan() || d >= TOL {
                bad.push(format!(
                    "step {step} {}: flotilla {} torch {} (rel {d:e})",
                    names[c], g[c], w[c]
                ));
            }
        }
    }
    for c in 0..3 {
        eprintln!(
            "{}: max rel diff {:e} (step {})",
            names[c], worst[c].0, worst[c].1
        );
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );

    // The run exercised what it claims to: warmup, cosine decay to min_lr, clipping at some
    // steps but not all, and learning.
    let lr: Vec<f64> = want.iter().map(|w| w[2]).collect();
    assert!(lr[..WARMUP as usize].windows(2).all(|p| p[0] < p[1]));
    assert!(rel(lr[WARMUP as usize], LR) < 1e-12);
    assert!(lr[WARMUP as usize..].windows(2).all(|p| p[0] > p[1]));
    assert!(rel(lr[STEPS as usize - 1], MIN_LR) < 1e-12);
    let clipped = want.iter().filter(|w| w[1] > CLIP).count();
    assert!(clipped > 0 && clipped < STEPS as usize, "clipped {clipped}");
    let first = want[..5].iter().map(|w| w[0]).sum::<f64>();
    let last = want[want.len() - 5..].iter().map(|w| w[0]).sum::<f64>();
    assert!(last < 0.8 * first, "loss {first} -> {last} (sums of 5)");
}
