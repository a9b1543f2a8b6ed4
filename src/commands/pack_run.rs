//! `flotilla pack-run SPEC` (hidden): the packing loop of one allocation of a packed sweep
//! (`compute.pack`). The allocation's batch shell execs it; it runs the sweep's jobs as job
//! steps until none is left (`flotilla_launch::slurm::pack`). Exit status 1 when a job it ran
//! failed, so that `--dependency=afterok` on the allocations means "every job completed".

use std::path::PathBuf;

use clap::Args;
use flotilla_launch::slurm::pack::run_allocation;

use super::Failure;

#[derive(Args)]
pub struct PackRunArgs {
    /// The allocation's pack spec (`submit-<k>.pack.json` beside its sbatch script).
    spec: PathBuf,
}

pub fn pack_run(args: PackRunArgs) -> Result<(), Failure> {
    let outcome = run_allocation(&args.spec).map_err(|e| Failure::Other(e.into()))?;
    if outcome.failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Silent(1))
    }
}
