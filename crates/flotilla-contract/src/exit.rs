//! How flotilla's processes end: the exit statuses, one list for the CLI, the training task and
//! the launchers that read them (a launcher requeues a job whose task exits with [`REQUEUE`]; a
//! task reports a config error with [`USAGE`]), and the one line an error is reported in
//! ([`error_message`]).

/// Success.
pub const SUCCESS: u8 = 0;
/// A failure that is not the user's input: a failed job, a rank that died, an I/O error, a
/// libtorch error (out of memory included).
pub const FAILURE: u8 = 1;
/// The user's input is wrong: a config or override error, an unknown option, a job refused
/// before anything was created (a missing program, a job that will not fit).
pub const USAGE: u8 = 2;
/// The task stopped on request (SIGUSR2/SIGTERM) after writing a checkpoint: the launchers
/// requeue such a job, and the same command resumes it (`EX_TEMPFAIL`).
pub const REQUEUE: u8 = 75;

/// An error and its causes on one line, `a: b: c`, as flotilla's commands print them. A cause
/// whose message the line already ends with (a wrapper that writes its cause into its own
/// message) is not written again, so no message appears twice.
pub fn error_message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let part = e.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{outer}")]
    struct Wrapper {
        outer: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let naming = Wrapper {
            outer: "loading m: no such file".into(),
            source: io(),
        };
        assert_eq!(error_message(&naming), "loading m: no such file");
        let plain = Wrapper {
            outer: "loading m".into(),
            source: io(),
        };
        assert_eq!(error_message(&plain), "loading m: no such file");
    }
}
