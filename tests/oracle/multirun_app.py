"""Tiny Hydra app used by record_hydra.py to record real multirun sweeps.

Every job appends one JSON line to the file named by $FLOTILLA_ORACLE_JSONL:
    {"num": <job number>, "overrides": [<overrides.task>...], "config": <resolved job config>}

Run it like Hydra runs any app, e.g.
    python multirun_app.py --config-dir conf/sweep --config-name config -m \
        hydra.sweep.dir=/tmp/x hydra/hydra_logging=disabled hydra/job_logging=disabled lr=1,2
"""

import json
import os

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base="1.3", config_path=None)
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    record = {
        "num": hc.job.num,
        "overrides": list(hc.overrides.task),
        "config": OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False),
    }
    with open(os.environ["FLOTILLA_ORACLE_JSONL"], "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    # With HYDRA_FULL_ERROR=1 Hydra re-raises the original exception; record its type and
    # message for the recorder (in $FLOTILLA_ORACLE_ERROR), then fail as Hydra would.
    try:
        main()
    except BaseException as ex:  # noqa: B902 - SystemExit from argparse included
        err_path = os.environ.get("FLOTILLA_ORACLE_ERROR")
        if err_path and not (isinstance(ex, SystemExit) and ex.code in (0, None)):
            err = {"type": type(ex).__name__, "message": str(ex)}
            cause = ex.__cause__
            if cause is not None:
                err["cause"] = {"type": type(cause).__name__, "message": str(cause)}
            with open(err_path, "w", encoding="utf-8") as f:
                json.dump(err, f)
        raise
