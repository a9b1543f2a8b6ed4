"""An unchanged Hydra application that flotilla runs as its task.

With `flotilla.task.config_arg: hydra`, flotilla composes the config (the same groups and
overrides Hydra would), writes the job's resolved config to <job dir>/config.yaml and starts

    python app.py --config-path=<job dir> --config-name=config hydra.run.dir=<job dir>

so `cfg` is exactly the job's config and Hydra's output directory is the job directory. Run
alone, `python app.py db=postgres` behaves as it always did.

It saves what it got as app_result.json in FLOTILLA_JOB_DIR (its output directory when run
alone): the resolved config, the working directory and Hydra's output directory.
"""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


@hydra.main(config_path="conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    output_dir = HydraConfig.get().runtime.output_dir
    out = os.environ.get("FLOTILLA_JOB_DIR", output_dir)
    result = {
        "cfg": OmegaConf.to_container(cfg, resolve=True),
        "cwd": os.getcwd(),
        "output_dir": output_dir,
    }
    with open(os.path.join(out, "app_result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"{cfg.app.name}: connecting to {cfg.app.url} as {cfg.db.user} "
          f"({cfg.app.retries} retries)")


if __name__ == "__main__":
    main()
