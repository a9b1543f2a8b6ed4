//! Peak host memory (resident set) of this rank by phase of a run: start-up, resume, a training
//! step, an evaluation, a checkpoint and the final model. Linux keeps the process's high-water
//! mark (`VmHWM` in `/proc/self/status`) and resets it when `5` is written to
//! `/proc/self/clear_refs`; a phase resets it when it starts and reads it when it ends. Rank
//! logs carry the figures (`peak host RSS by phase`); benches read them. Elsewhere than Linux,
//! or where the files cannot be used, nothing is measured.

use std::fmt;

/// The phases of a run whose peaks are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostPhase {
    Startup,
    Resume,
    Step,
    Evaluation,
    Checkpoint,
    Final,
}

impl HostPhase {
    const ALL: [HostPhase; 6] = [
        HostPhase::Startup,
        HostPhase::Resume,
        HostPhase::Step,
        HostPhase::Evaluation,
        HostPhase::Checkpoint,
        HostPhase::Final,
    ];

    pub fn label(self) -> &'static str {
        match self {
            HostPhase::Startup => "start-up",
            HostPhase::Resume => "resume",
            HostPhase::Step => "step",
            HostPhase::Evaluation => "evaluation",
            HostPhase::Checkpoint => "checkpoint",
            HostPhase::Final => "final",
        }
    }
}

/// The process's resident-set high-water mark in bytes (`VmHWM`), if readable.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Resets the high-water mark to the current resident set; false where it cannot.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The largest peak seen in each phase so far.
#[derive(Clone, Debug, Default)]
pub struct HostPeaks {
    peaks: [Option<u64>; 6],
}

impl HostPeaks {
    /// Starts a phase: the high-water mark is reset.
    pub fn begin(&self) {
        reset_peak_rss();
    }

    /// Ends `phase`: its peak is the high-water mark since [`HostPeaks::begin`].
    pub fn end(&mut self, phase: HostPhase) {
        if let Some(now) = peak_rss() {
            let slot = &mut self.peaks[phase as usize];
            *slot = Some(slot.map_or(now, |p| p.max(now)));
        }
    }

    /// Runs `f` as `phase`.
    pub fn measure<T>(&mut self, phase: HostPhase, f: impl FnOnce() -> T) -> T {
        self.begin();
        let out = f();
        self.end(phase);
        out
    }

    pub fn get(&self, phase: HostPhase) -> Option<u64> {
        self.peaks[phase as usize]
    }
}

impl fmt::Display for HostPeaks {
    /// `start-up 812 MiB, step 640 MiB, ...` (phases not measured left out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for phase in HostPhase::ALL {
            if let Some(b) = self.get(phase) {
                if !first {
                    f.write_str(", ")?;
                }
                first = false;
                write!(f, "{} {} MiB", phase.label(), b / (1 << 20))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_sees_its_own_allocation_and_not_an_earlier_one() {
        if peak_rss().is_none() || !reset_peak_rss() {
            return; // not Linux
        }
        let mut peaks = HostPeaks::default();
        let big = peaks.measure(HostPhase::Step, || {
            let v = vec![1u8; 256 << 20];
            std::hint::black_box(&v);
            v.len()
        });
        let small = peaks.measure(HostPhase::Evaluation, || 1);
        assert_eq!((big, small), (256 << 20, 1));
        let step = peaks.get(HostPhase::Step).unwrap();
        let eval = peaks.get(HostPhase::Evaluation).unwrap();
        assert!(step >= eval + (200 << 20), "step {step} eval {eval}");
        assert!(peaks.to_string().starts_with("step "), "{peaks}");
    }
}
