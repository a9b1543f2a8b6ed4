//! libtorch failures as errors, never as panics. tch's infallible tensor methods panic when
//! libtorch throws (a CUDA out-of-memory, a kernel that refuses its inputs); [`guarded`] runs a
//! part of the job with such a panic caught and returned as [`TrainError::Libtorch`], which
//! names the optimizer step the job was at ([`set_step`], kept by the trainer) and, for an
//! out-of-memory, what ran out and where to look (`flotilla plan --memory`). Errors that the
//! fallible (`f_`) methods return are given the same form. [`install_panic_hook`] keeps the
//! default panic report for everything outside [`guarded`], so a bug elsewhere still prints
//! its location.

use crate::error::TrainError;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
thread_local! {
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The step of the training loop running on this thread.
    static STEP: Cell<u64> = const { Cell::new(0) };
}

/// Records the optimizer step this thread's job is at (0-based: the step being computed).
pub fn set_step(step: u64) {
    STEP.with(|s| s.set(step));
}

/// The step [`set_step`] last recorded.
pub fn current_step() -> u64 {
    STEP.with(Cell::get)
}

/// Replaces the panic hook with one that stays quiet on a thread inside [`guarded`] (the error
/// is reported by whoever receives it) and defers to the previous hook everywhere else.
pub fn install_panic_hook() {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !GUARDED.with(Cell::get) {
            previous(info);
        }
    }));
}

/// Runs `f`; a panic inside it (libtorch's exceptions surface as panics through tch) and a
/// [`TrainError::Torch`] it returns become [`TrainError::Libtorch`] at the current step.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, TrainError>) -> Result<T, TrainError> {
    let was = GUARDED.with(|g| g.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(was));
    match result {
        Ok(Err(TrainError::Torch(e))) => Err(libtorch_error(&e.to_string())),
        Ok(other) => other,
        Err(payload) => {
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            Err(libtorch_error(&text))
        }
    }
}

/// The error for a libtorch failure message at the current step: its first meaningful line
/// (libtorch appends a C++ backtrace), unwrapped from tch's `Torch("...")` form.
pub fn libtorch_error(text: &str) -> TrainError {
    let inner = match text.find("Torch(\"") {
        Some(i) => &text[i + "Torch(\"".len()..],
        None => text,
    };
    let first = inner
        .split("\\n")
        .flat_map(|s| s.lines())
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .trim_end_matches("\")")
        .to_string();
    TrainError::Libtorch {
        step: current_step(),
        out_of_memory: text.contains("out of memory") || text.contains("can't allocate memory"),
        message: first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_at_the_step() {
        install_panic_hook();
        set_step(12);
        let r: Result<(), TrainError> = guarded(|| {
            panic!(
                "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. \
                 Tried to allocate 2.00 GiB\\nException raised from malloc at alloc.cpp:1\")"
            )
        });
        let e = r.unwrap_err();
        assert!(matches!(
            e,
            TrainError::Libtorch {
                step: 12,
                out_of_memory: true,
                ..
            }
        ));
        let text = e.to_string();
        assert!(text.contains("at step 12"), "{text}");
        assert!(
            text.contains("CUDA out of memory. Tried to allocate 2.00 GiB"),
            "{text}"
        );
        assert!(!text.contains("Exception raised"), "{text}");
        assert!(text.contains("flotilla plan --memory"), "{text}");
    }

    #[test]
    fn a_real_libtorch_exception_is_caught() {
        set_step(3);
        let r = guarded(|| {
            let a = tch::Tensor::zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu));
            let b = tch::Tensor::zeros([4, 5], (tch::Kind::Float, tch::Device::Cpu));
            Ok(a.matmul(&b))
        });
        let e = r.unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                TrainError::Libtorch {
                    step: 3,
                    out_of_memory: false,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("cannot be multiplied"), "{text}");
    }

    #[test]
    fn fallible_errors_take_the_same_form() {
        set_step(5);
        let r: Result<(), TrainError> = guarded(|| {
            let a = tch::Tensor::zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu));
            let b = tch::Tensor::zeros([4, 5], (tch::Kind::Float, tch::Device::Cpu));
            let _ = a.f_matmul(&b)?;
            Ok(())
        });
        assert!(matches!(r, Err(TrainError::Libtorch { step: 5, .. })));
    }
}
