//! Two implementations of one layer run side by side on the same inputs, as the benchmarks that
//! check a fast path against its reference do (`bench attention`, `bench experts`): each path's
//! forward and backward timed on its device, and the largest relative differences of the two
//! paths' outputs and gradients.

use tch::{Device, Kind, Tensor};

/// A path's output, the gradients of `sum(output * seed)` with respect to `leaves`, and the
/// best time in seconds of `repeat` runs of its forward and backward (the device synchronised
/// before and after each).
pub fn timed_forward_backward(
    device: Device,
    repeat: usize,
    leaves: &[&Tensor],
    seed: &Tensor,
    forward: &dyn Fn() -> Tensor,
) -> (Tensor, Vec<Tensor>, f64) {
    let sync = || crate::cuda::synchronize(device);
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..repeat.max(1) {
        sync();
        let start = std::time::Instant::now();
        let out = forward();
        let grads = Tensor::run_backward(&[(&out * seed).sum(Kind::Float)], leaves, false, false);
        sync();
        best = best.min(start.elapsed().as_secs_f64());
        last = Some((out, grads));
    }
    let (out, grads) = last.expect("at least one run");
    (out, grads, best)
}

/// The largest relative differences (over the reference's largest magnitude) of a path's
/// output and of its gradients, against the reference's.
pub fn differences(
    (out, grads): (&Tensor, &[Tensor]),
    (reference, reference_grads): (&Tensor, &[Tensor]),
) -> (f64, f64) {
    let relative = |a: &Tensor, b: &Tensor| {
        let scale = b.abs().max().double_value(&[]).max(1e-6);
        (a - b).abs().max().double_value(&[]) / scale
    };
    let gradients = grads
        .iter()
        .zip(reference_grads)
        .map(|(a, b)| relative(a, b))
        .fold(0.0, f64::max);
    (relative(out, reference), gradients)
}
