"""An unchanged Hydra application that flotilla runs as its task.

With `flotilla.task.config_arg: hydra`, flotilla composes the config (the same groups and
overrides Hydra would), writes the job's resolved config to <job dir>/config.yaml and starts

    python app.py --config-path=<job dir> --config-name=config hydra.run.dir=<job dir>

so `cfg` is exactly the job's config and Hydra's output directory is the job directory. Run
alone, `python app.py db=postgres` behaves as it always did.

It saves what it got as app_result.json in FLOTILLA_JOB_DIR (its output directory when run
alone): the resolved config, the working directory, Hydra's output directory and the job
context HydraConfig gives (mode, job.num, overrides.task, job.override_dirname), which under
flotilla is what Hydra's own multirun gives for the same command.
"""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    output_dir = hc.runtime.output_dir
    out = os.environ.get("FLOTILLA_JOB_DIR", output_dir)
    result = {
        "cfg": OmegaConf.to_container(cfg, resolve=True),
        "cwd": os.getcwd(),
        "output_dir": output_dir,
        "hydra": {
            "mode": hc.mode.name,
            "num": None if OmegaConf.is_missing(hc.job, "num") else hc.job.num,
            "id": None if OmegaConf.is_missing(hc.job, "id") else hc.job.id,
            "task": list(hc.overrides.task),
            "override_dirname": hc.job.override_dirname,
        },
    }
    with open(os.path.join(out, "app_result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"{cfg.app.name}: connecting to {cfg.app.url} as {cfg.db.user} "
          f"({cfg.app.retries} retries)")


if __name__ == "__main__":
    main()
