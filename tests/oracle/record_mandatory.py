#!/usr/bin/env python
"""Record where hydra-core 1.3.8 raises MissingMandatoryValue for a `???` left unset.

    .venv/bin/python tests/oracle/record_mandatory.py             # rewrite tests/oracle/fixtures/mandatory.json
    .venv/bin/python tests/oracle/record_mandatory.py --out DIR   # write DIR/mandatory.json
    .venv/bin/python tests/oracle/record_mandatory.py try run|multirun [OVERRIDES...]   # one case

Every case runs a real `@hydra.main` app (it does nothing: it reads no value of its config) on
`tests/oracle/conf/mandatory/config.yaml`, in-process, with HYDRA_FULL_ERROR=1:

    run:       app --config-dir <tree> --config-name config hydra.run.dir=<tmp> <overrides>
    multirun:  app --config-dir <tree> --config-name config -m b=1,2 hydra.sweep.dir=<tmp> <overrides>

and records whether Hydra itself failed, and whether a MissingMandatoryValue is the failure or
its cause: {"name", "mode", "overrides", "raises": null | {"type", "missing_key"}} where "type" is
the class of the exception Hydra raised and "missing_key" the full key of the
MissingMandatoryValue in its chain (null when there is none). `tests/hydra_oracle.rs` runs
`flotilla` on the same cases: where Hydra raises MissingMandatoryValue, `compose`, `plan` and
`run --dry-run` (a run case) or `plan -m` and `run -m --dry-run` (a multirun case) must exit 2
naming the key; where Hydra runs the app, they must succeed.

What the fixture shows: Hydra never raises for a `???` of the job config (the primary config's
`user_missing`, a `???` override of a user key) unless the app reads it; it raises for the
runtime keys it reads or writes itself (hydra.job.chdir, hydra.verbose, hydra.output_subdir,
hydra.job.env_set and env_copy, hydra.job.config.override_dirname.*, hydra.job_logging,
hydra.hydra_logging, hydra.overrides.*, hydra.runtime.choices, and the nodes above them), and
in a multirun also for hydra.sweep.dir, hydra.sweeper.max_batch_size, hydra.sweeper.params and
hydra.launcher. It does not raise for hydra.run.dir or hydra.sweep.subdir (OmegaConf.select
turns `???` into None: the directory is named "None"), nor for the keys it overwrites
(hydra.job.name, hydra.job.num, hydra.runtime.output_dir, ...).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
TREE = HERE / "conf" / "mandatory"
VENV_PYTHON = HERE.parent.parent / ".venv" / "bin" / "python"

try:
    import hydra  # noqa: F401
except ImportError:  # run with a Python that lacks Hydra: switch to the project's .venv
    if VENV_PYTHON.exists() and not os.environ.get("_FLOTILLA_ORACLE_REEXEC"):
        os.environ["_FLOTILLA_ORACLE_REEXEC"] = "1"
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])
    raise SystemExit("record_mandatory.py needs hydra-core 1.3.8; run scripts/setup.sh first")

from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from omegaconf.errors import MissingMandatoryValue  # noqa: E402

FIXTURE = HERE / "fixtures" / "mandatory.json"

BOTH = ("run", "multirun")
RUN = ("run",)
MULTIRUN = ("multirun",)

# (name, overrides, modes). Every case is one `???` somewhere; the names say where.
CASES: List[tuple] = [
    # The job config: Hydra reads none of it.
    ("primary_config_only", [], BOTH),
    ("user_key", ["b=???"], BOTH),
    ("user_key_added", ["+c=???"], BOTH),
    ("user_key_nested", ["nested.also_missing=???"], BOTH),
    # Runtime keys Hydra reads or writes itself.
    ("job_chdir", ["hydra.job.chdir=???"], BOTH),
    ("verbose", ["hydra.verbose=???"], BOTH),
    ("output_subdir", ["hydra.output_subdir=???"], BOTH),
    ("job_env_set_value", ["+hydra.job.env_set.FLOTILLA_ORACLE_X=???"], BOTH),
    ("job_env_set", ["hydra.job.env_set=???"], BOTH),
    ("job_env_copy", ["hydra.job.env_copy=???"], BOTH),
    ("job_env_copy_item", ["hydra.job.env_copy=[???]"], BOTH),
    ("override_dirname_kv_sep", ["hydra.job.config.override_dirname.kv_sep=???"], BOTH),
    ("override_dirname_item_sep", ["hydra.job.config.override_dirname.item_sep=???"], BOTH),
    ("override_dirname_exclude_keys",
     ["hydra.job.config.override_dirname.exclude_keys=???"], BOTH),
    ("override_dirname_node", ["hydra.job.config.override_dirname=???"], BOTH),
    ("job_config_node", ["hydra.job.config=???"], BOTH),
    ("job_node", ["hydra.job=???"], BOTH),
    ("job_logging", ["hydra.job_logging=???"], BOTH),
    ("hydra_logging", ["hydra.hydra_logging=???"], BOTH),
    ("overrides_task", ["hydra.overrides.task=???"], BOTH),
    ("overrides_hydra", ["hydra.overrides.hydra=???"], BOTH),
    ("overrides_node", ["hydra.overrides=???"], BOTH),
    ("runtime_choices", ["hydra.runtime.choices=???"], BOTH),
    ("runtime_node", ["hydra.runtime=???"], BOTH),
    # Read only by a multirun.
    ("sweep_dir", ["hydra.sweep.dir=???"], BOTH),
    ("sweep_node", ["hydra.sweep=???"], BOTH),
    ("sweeper_max_batch_size", ["hydra.sweeper.max_batch_size=???"], BOTH),
    ("sweeper_params", ["hydra.sweeper.params=???"], BOTH),
    ("sweeper_node", ["hydra.sweeper=???"], BOTH),
    ("launcher_node", ["hydra.launcher=???"], BOTH),
    # Selected leniently (`???` becomes None) or overwritten: Hydra runs the app.
    ("run_dir", ["hydra.run.dir=???"], RUN),
    ("sweep_subdir", ["hydra.sweep.subdir=???"], RUN),
    ("mode", ["hydra.mode=???"], BOTH),
    ("job_name", ["hydra.job.name=???"], BOTH),
    ("job_id", ["hydra.job.id=???"], BOTH),
    ("job_num", ["hydra.job.num=???"], BOTH),
    ("job_config_name", ["hydra.job.config_name=???"], BOTH),
    ("job_override_dirname", ["hydra.job.override_dirname=???"], BOTH),
    ("runtime_output_dir", ["hydra.runtime.output_dir=???"], BOTH),
    ("runtime_cwd", ["hydra.runtime.cwd=???"], BOTH),
    ("runtime_version", ["hydra.runtime.version=???"], BOTH),
    ("callbacks_node", ["hydra.callbacks=???"], BOTH),
    ("help_node", ["hydra.help=???"], BOTH),
    ("hydra_help_node", ["hydra.hydra_help=???"], BOTH),
    ("env_node", ["hydra.env=???"], BOTH),
]


@hydra.main(version_base="1.3", config_path=None)
def app(cfg: DictConfig) -> None:
    """Reads nothing of its config: only Hydra's own reads can fail."""
    HydraConfig.get()


def missing_in_chain(ex: BaseException) -> Optional[MissingMandatoryValue]:
    seen = set()
    while ex is not None and id(ex) not in seen:
        seen.add(id(ex))
        if isinstance(ex, MissingMandatoryValue):
            return ex
        ex = ex.__cause__ or ex.__context__
    return None


def run_case(mode: str, overrides: List[str]) -> Optional[Dict[str, Any]]:
    """None when the app ran; else the exception Hydra raised."""
    with tempfile.TemporaryDirectory(prefix="flotilla-mandatory-") as tmp:
        argv = ["app", "--config-dir", str(TREE), "--config-name", "config"]
        if mode == "run":
            argv.append(f"hydra.run.dir={tmp}/run")
        else:
            argv += ["-m", "b=1,2", f"hydra.sweep.dir={tmp}/multirun"]
        argv += ["hydra/hydra_logging=none", "hydra/job_logging=none", *overrides]
        saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
        sys.argv = argv
        os.environ["HYDRA_FULL_ERROR"] = "1"
        os.chdir(tmp)
        try:
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                app()
            return None
        except BaseException as ex:  # noqa: B902 - every failure is an oracle answer
            missing = missing_in_chain(ex)
            return {
                "type": type(ex).__name__,
                "missing_key": None if missing is None else str(missing.full_key),
            }
        finally:
            sys.argv = saved_argv
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            GlobalHydra.instance().clear()


def record_one(c: Dict[str, Any]) -> Dict[str, Any]:
    return {**c, "raises": run_case(c["mode"], c["overrides"])}


def record(jobs: int) -> List[Dict[str, Any]]:
    """Every case, in CASES order; Hydra composes slowly (~0.3 s a case), so on `jobs`
    processes (each runs its cases in-process, one after another)."""
    cases = [
        {"name": f"{name}.{mode}", "mode": mode, "overrides": list(overrides)}
        for name, overrides, modes in CASES
        for mode in modes
    ]
    if jobs <= 1:
        return [record_one(c) for c in cases]
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(record_one, cases, chunksize=4))


def hydra_version() -> str:
    import omegaconf
    return f"hydra-core {hydra.__version__}, omegaconf {omegaconf.__version__}"


def main(argv: List[str]) -> int:
    if argv and argv[0] == "try":
        if len(argv) < 2 or argv[1] not in BOTH:
            print("usage: record_mandatory.py try run|multirun [OVERRIDES...]", file=sys.stderr)
            return 2
        print(json.dumps(run_case(argv[1], argv[2:])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", type=Path, default=FIXTURE.parent, help="output folder")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                    help="processes recording cases at once")
    args = ap.parse_args(argv)
    cases = record(args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"hydra_core": hydra_version(), "cases": cases}, indent=1)
    (args.out / FIXTURE.name).write_text(text + "\n", encoding="utf-8")
    raised = sum(c["raises"] is not None for c in cases)
    print(f"mandatory: {len(cases)} cases ({raised} raise) -> {args.out / FIXTURE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
