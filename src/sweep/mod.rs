//! Multirun sweep expansion in the order Hydra's BasicSweeper produces jobs.
