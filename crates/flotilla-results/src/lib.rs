//! What a sweep found, read from its directories after (or while) it ran:
//! * [`report`]: one row per job (state, differing params, final and best metric, steps, wall
//!   time, tokens/s) as a table, CSV, JSON or Markdown, a self-contained HTML page and SVG/PNG
//!   figures;
//! * [`status`]: `flotilla status` with the best value so far under the table;
//! * [`diff`]: the config values two jobs differ in, with the file:line or override behind
//!   each side.
//!
//! It reads what launching wrote (`flotilla_launch::rundir`) and what jobs logged
//! (`flotilla_contract::metrics`); it never writes into a run directory.

pub mod diff;
pub mod report;
pub mod status;
