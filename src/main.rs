//! The `flotilla` command line.
fn main() {}
