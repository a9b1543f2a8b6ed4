//! Seeded, device-independent parameter initialisation.
//!
//! Values come from a counter-based generator: element `i` of parameter `name` under seed `s`
//! is a pure function of `(s, name, i)`. So the same seed gives the same weights on CPU and
//! CUDA, whatever the number of threads, and any slice of any parameter (an FSDP rank's shard)
//! can be produced on its own, without generating the rest ([`Init::fill`]).
//!
//! The normal variates are Box–Muller over SplitMix64 outputs: pair `j` of a parameter uses
//! the 64-bit words `2j` and `2j + 1` of its stream and yields elements `2j` (cosine branch) and
//! `2j + 1` (sine branch).

use std::f64::consts::TAU;

/// How one parameter is initialised (transformers' `LlamaPreTrainedModel._init_weights`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Linear and embedding weights: N(0, std²), `std = initializer_range`.
    Normal { std: f64 },
    /// RMSNorm weights: all ones.
    Ones,
    /// LoRA's `B`: all zeros.
    Zeros,
    /// LoRA's `A`, as PEFT initialises it (`kaiming_uniform_(a=sqrt(5))`): U(−bound, bound)
    /// with `bound = 1/sqrt(fan_in)`.
    Uniform { bound: f64 },
}

impl Init {
    /// Writes elements `start .. start + out.len()` of the flattened parameter `name`, as
    /// initialised under `seed`, into `out`.
    pub fn fill(&self, seed: u64, name: &str, start: usize, out: &mut [f32]) {
        match *self {
            Init::Ones => out.fill(1.0),
            Init::Zeros => out.fill(0.0),
            Init::Normal { std } => fill_normal(stream_key(seed, name), std, start, out),
            Init::Uniform { bound } => {
                let key = stream_key(seed, name);
                for (k, o) in out.iter_mut().enumerate() {
                    let u = unit_open(word(key, (start + k) as u64));
                    *o = ((2.0 * u - 1.0) * bound) as f32;
                }
            }
        }
    }

    /// The whole parameter of `numel` elements, as initialised under `seed`.
    pub fn values(&self, seed: u64, name: &str, numel: usize) -> Vec<f32> {
        let mut out = vec![0f32; numel];
        self.fill_parallel(seed, name, 0, &mut out);
        out
    }

    /// [`Init::fill`] on several threads for large slices; the values do not depend on how
    /// many.
    pub fn fill_parallel(&self, seed: u64, name: &str, start: usize, out: &mut [f32]) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        const CHUNK: usize = 1 << 20;
        if threads <= 1 || out.len() <= CHUNK {
            self.fill(seed, name, start, out);
            return;
        }
        let per = out.len().div_ceil(threads).next_multiple_of(2);
        std::thread::scope(|s| {
            for (k, chunk) in out.chunks_mut(per).enumerate() {
                s.spawn(move || self.fill(seed, name, start + k * per, chunk));
            }
        });
    }
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The stream of one parameter: the seed mixed with an FNV-1a hash of its name.
fn stream_key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    mix(seed ^ mix(h))
}

/// Word `n` of the stream `key` (SplitMix64 started at `key`).
fn word(key: u64, n: u64) -> u64 {
    mix(key.wrapping_add(n.wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A uniform in (0, 1] from the top 53 bits of a word (never 0, so the logarithm is finite).
fn unit_open(w: u64) -> f64 {
    ((w >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn fill_normal(key: u64, std: f64, start: usize, out: &mut [f32]) {
    let mut i = start;
    let end = start + out.len();
    let mut k = 0;
    while i < end {
        let pair = (i / 2) as u64;
        let r = (-2.0 * unit_open(word(key, 2 * pair)).ln()).sqrt() * std;
        let theta = TAU * unit_open(word(key, 2 * pair + 1));
        let (sin, cos) = theta.sin_cos();
        if i.is_multiple_of(2) {
            out[k] = (r * cos) as f32;
            k += 1;
            i += 1;
            if i < end {
                out[k] = (r * sin) as f32;
                k += 1;
                i += 1;
            }
        } else {
            out[k] = (r * sin) as f32;
            k += 1;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_equal_the_whole() {
        let init = Init::Normal { std: 0.02 };
        let whole = init.values(7, "model.embed_tokens.weight", 1001);
        for (start, len) in [(0, 1), (1, 1), (3, 10), (500, 501), (999, 2)] {
            let mut part = vec![0f32; len];
            init.fill(7, "model.embed_tokens.weight", start, &mut part);
            assert_eq!(part, whole[start..start + len], "slice {start}+{len}");
        }
    }

    #[test]
    fn threaded_fill_equals_serial_fill() {
        let init = Init::Normal { std: 1.0 };
        let n = (1 << 21) + 3;
        let threaded = init.values(1, "w", n);
        let mut serial = vec![0f32; n];
        init.fill(1, "w", 0, &mut serial);
        assert_eq!(threaded, serial);
    }

    #[test]
    fn moments_seeds_and_names() {
        let init = Init::Normal { std: 0.02 };
        let v = init.values(3, "a", 200_000);
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 0.02 * 0.01, "mean {mean}");
        assert!((var.sqrt() / 0.02 - 1.0).abs() < 0.01, "std {}", var.sqrt());
        assert_ne!(
            v[..8],
            init.values(4, "a", 8)[..],
            "seed changes the values"
        );
        assert_ne!(
            v[..8],
            init.values(3, "b", 8)[..],
            "name changes the values"
        );
        assert_eq!(Init::Ones.values(3, "a", 4), vec![1.0; 4]);
        assert_eq!(Init::Zeros.values(3, "a", 4), vec![0.0; 4]);
        let u = Init::Uniform { bound: 0.25 }.values(3, "a", 100_000);
        let (lo, hi) = u
            .iter()
            .fold((1f32, -1f32), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(
            lo >= -0.25 && hi <= 0.25 && lo < -0.249 && hi > 0.249,
            "{lo} {hi}"
        );
        let mean = u.iter().map(|&x| f64::from(x)).sum::<f64>() / u.len() as f64;
        assert!(mean.abs() < 0.003, "mean {mean}");
    }
}
