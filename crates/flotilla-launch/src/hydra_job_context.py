"""Written by flotilla into a job directory: a Hydra callback that gives an unchanged
@hydra.main app, started by flotilla as one job, the job context Hydra itself would give it.

flotilla starts the app with --config-path=<job dir> --config-name=config: to Hydra that is a
single run with no task overrides. Before the job starts (on_run_start, so that the job's
.hydra/ files and every ${hydra:...} interpolation see it too) this sets what Hydra's own
multirun or run sets: hydra.mode, hydra.job.num and hydra.job.id (a sweep's jobs),
hydra.overrides.task and hydra.job.override_dirname, read from the job's task.json.
"""

import json

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import open_dict, read_write


class JobContext(Callback):
    def __init__(self, task_file: str) -> None:
        with open(task_file, encoding="utf-8") as f:
            self.job = json.load(f)["hydra_job"]

    def on_run_start(self, config, **kwargs) -> None:
        job = self.job
        hydra = config.hydra
        with read_write(hydra), open_dict(hydra):
            hydra.mode = RunMode[job["mode"]]
            if job.get("num") is not None:
                hydra.job.num = job["num"]
                hydra.job.id = job["num"]
            hydra.overrides.task = list(job["task"])
            hydra.job.override_dirname = job["override_dirname"]
