//! A sweep directory that grows one job at a time, as an adaptive study samples its trials:
//! [`StudyDir::create`] makes the sweep directory (the copy of the config directory and a
//! `sweep.json` with no jobs yet, created atomically like any run directory), and
//! [`StudyDir::add_job`] composes and validates one more job, writes its directory the way `prepare`
//! writes a sweep's jobs, and appends its record to the plan. A study on SLURM cannot pack its
//! trials ([`ADAPTIVE_REFUSAL`]; the SLURM launcher refuses the same way when asked to).

use super::{
    install_dir, io_err, job_runs, provenance_for, replayable_runtime_overrides, runtime_path,
    snapshot, staging_dir, write_job_files, JobRecord, Plan, PlanFile, PreparedJob, Provenance,
    RunDirError, Staged,
};
use flotilla_config::overrides::{parse_override, Override};
use flotilla_config::schema::Launcher as LauncherKind;
use flotilla_config::yaml::{to_yaml, EmitOptions};
use flotilla_config::{Composed, Composer, ConfigError};
use std::path::{Component, Path, PathBuf};

/// Why an adaptive study refuses `compute.pack`.
pub const ADAPTIVE_REFUSAL: &str = "an adaptive sweep submits each trial alone as it samples \
     it, so there is no queue of jobs to pack; remove compute.pack (or use a grid sweep, whose \
     jobs are all known at once)";

/// What every job of a study shares.
pub struct StudyDir {
    pub plan: PlanFile,
    /// The runtime overrides every job is composed with.
    pub runtime: Vec<Override>,
    provenance: Provenance,
    launcher: LauncherKind,
    snapshot_kept: bool,
    start_dir: PathBuf,
}

impl StudyDir {
    /// Creates the (empty) sweep directory of a study from `first`, a composed job of it (its
    /// `flotilla.sweep.dir` names the directory, its launcher and job name go into the plan).
    pub fn create(
        composer: &Composer,
        first: &Composed,
        runtime: Vec<Override>,
        argv: &[String],
    ) -> Result<StudyDir, RunDirError> {
        let ctx = composer.context();
        let start_dir = std::env::current_dir().map_err(|e| io_err(Path::new("."), e))?;
        let runs = job_runs(first, ctx, &start_dir)?;
        let dest = runtime_path(first, ctx, "sweep.dir")?;
        let job_name = runtime_path(first, ctx, "job.name")?;
        let dest = std::path::absolute(&dest).map_err(|e| io_err(Path::new(&dest), e))?;
        let provenance = provenance_for(composer, argv, None);
        let launcher = runs.compute.launcher;
        if let Some(k) = runs.compute.pack.filter(|&k| k >= 2) {
            if launcher == LauncherKind::Slurm {
                return Err(ConfigError::Composition(format!(
                    "compute.pack={k}: {}",
                    ADAPTIVE_REFUSAL
                ))
                .into());
            }
        }
        let tmp = staging_dir(&dest)?;
        let built = (|| -> Result<bool, RunDirError> {
            let kept = snapshot::copy_config_dir(
                &composer.options().config_dir,
                &tmp.join(snapshot::SNAPSHOT_DIR),
            )?;
            let plan = Plan::new(
                true,
                provenance.time.clone(),
                launcher,
                argv.to_vec(),
                Vec::new(),
                Some(&job_name),
            );
            super::plan::write_new(&PlanFile::sweep(&tmp), &plan)?;
            Ok(kept)
        })();
        let snapshot_kept = match built {
            Ok(kept) => kept,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        let root = install_dir(&tmp, &dest)?;
        Ok(StudyDir {
            plan: PlanFile::sweep(&root),
            runtime,
            provenance,
            launcher,
            snapshot_kept,
            start_dir,
        })
    }

    /// `local` or `slurm`: the launcher the study's jobs run on.
    pub fn launcher(&self) -> LauncherKind {
        self.launcher
    }

    /// The study directory of an existing sweep (to add jobs after a restart).
    pub fn open(
        composer: &Composer,
        plan: PlanFile,
        runtime: Vec<Override>,
        argv: &[String],
    ) -> Result<StudyDir, RunDirError> {
        let read = plan.read()?;
        let snapshot_kept = plan.dir().join(snapshot::SNAPSHOT_DIR).is_dir();
        Ok(StudyDir {
            runtime,
            provenance: provenance_for(composer, argv, None),
            launcher: read.launcher,
            snapshot_kept,
            start_dir: std::env::current_dir().map_err(|e| io_err(Path::new("."), e))?,
            plan,
        })
    }

    /// Composes job `num` from the study's runtime overrides and `task` (`key=value`), checks
    /// it, writes its directory and appends its PENDING record to the plan.
    pub fn add_job(
        &self,
        composer: &Composer,
        num: usize,
        task: &[String],
    ) -> Result<PreparedJob, RunDirError> {
        let mut parsed = self.runtime.clone();
        for text in task {
            parsed.push(parse_override(text).map_err(ConfigError::from)?);
        }
        let what = |e: ConfigError| {
            ConfigError::Composition(format!("trial {num} ({}): {e}", task.join(" ")))
        };
        let composed = composer.compose_parsed(&parsed, Some(num)).map_err(what)?;
        let ctx = composer.context();
        let runs = job_runs(&composed, ctx, &self.start_dir).map_err(what)?;
        if runs.compute.launcher != self.launcher {
            return Err(what(ConfigError::Composition(format!(
                "it uses compute.launcher={} but the study runs on {}",
                runs.compute.launcher, self.launcher
            )))
            .into());
        }
        let sub = runtime_path(&composed, ctx, "sweep.subdir").map_err(what)?;
        let subdir = PathBuf::from(&sub);
        if !subdir
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(what(ConfigError::Composition(format!(
                "flotilla.sweep.subdir='{sub}' must be a relative path inside the sweep directory"
            )))
            .into());
        }
        let dest = self.plan.dir().join(&subdir);
        if dest.exists() {
            return Err(what(ConfigError::Composition(format!(
                "flotilla.sweep.subdir='{sub}' is the directory of an earlier trial; make it unique per trial (e.g. ${{flotilla.job.num}})"
            )))
            .into());
        }
        let staged = Staged {
            num,
            subdir: subdir.clone(),
            overrides: composed.task_overrides.clone(),
            runtime_overrides: replayable_runtime_overrides(&composed.runtime),
            config_yaml: to_yaml(&composed.job, EmitOptions { provenance: false }),
            config: runs.config,
            compute: runs.compute,
            task: runs.task,
        };
        let tmp = staging_dir(&dest)?;
        let conf = self
            .snapshot_kept
            .then(|| snapshot::snapshot_path_from_job(&subdir));
        if let Err(e) = write_job_files(
            &tmp,
            &staged,
            &self.provenance,
            self.launcher.as_str(),
            conf,
        ) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let dir = install_dir(&tmp, &dest)?;
        self.plan.update(|p| {
            p.jobs
                .push(JobRecord::pending(num, subdir, staged.overrides.clone()))
        })?;
        Ok(PreparedJob {
            num,
            dir,
            overrides: staged.overrides,
            config: staged.config,
            compute: staged.compute,
            task: staged.task,
        })
    }
}
