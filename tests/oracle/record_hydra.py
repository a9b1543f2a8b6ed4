#!/usr/bin/env python
"""Record the real Hydra (hydra-core 1.3.8, omegaconf 2.3.1) as the oracle for flotilla.

    .venv/bin/python tests/oracle/record_hydra.py             # rewrite tests/oracle/fixtures/*.json
    .venv/bin/python tests/oracle/record_hydra.py --out DIR   # write DIR/compose.json, DIR/multirun.json
    .venv/bin/python tests/oracle/record_hydra.py try TREE CONFIG [OVERRIDES...]    # one compose
    .venv/bin/python tests/oracle/record_hydra.py try-m TREE CONFIG [OVERRIDES...]  # one multirun

Compose cases run in-process through `hydra.initialize_config_dir` + `hydra.compose(...,
return_hydra_config=False)` and `OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)`.
Multirun cases run the real `@hydra.main` app (multirun_app.py) end to end with `-m`, one
subprocess per case, and collect every job's `HydraConfig.get().overrides.task` and resolved config.

Every fixture case is
    {"name", "tree", "config_name", "overrides", "env", "result" | "error"}
where "overrides" are the user's overrides only (never the recorder's own hydra.sweep.dir /
hydra logging overrides), "env" maps variable -> value, or -> null for "must be unset", and
"error" is {"type": <exception class>, "message": <str(exception)>, "cause"?: {...}}; absolute paths
inside messages are replaced by <CONF> (the conf/ folder) and <TMP> (the recorder's temp dir).
Output is deterministic: re-running produces byte-identical files.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

HERE = Path(__file__).resolve().parent
CONF = HERE / "conf"
VENV_PYTHON = HERE.parent.parent / ".venv" / "bin" / "python"

try:
    import hydra  # noqa: F401
except ImportError:  # run with a Python that lacks Hydra: switch to the project's .venv
    if VENV_PYTHON.exists() and not os.environ.get("_FLOTILLA_ORACLE_REEXEC"):
        os.environ["_FLOTILLA_ORACLE_REEXEC"] = "1"
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])
    raise SystemExit("record_hydra.py needs hydra-core 1.3.8; run scripts/setup.sh first")

FIXTURES = HERE / "fixtures"
APP = HERE / "multirun_app.py"

# Every variable the cases may touch; all of them are unset unless a case sets them.
ENV_PREFIX = "FLOTILLA_ORACLE_"


def case(name: str, tree: str, config_name: str, overrides: Optional[List[str]] = None,
         env: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
    return {
        "name": name,
        "tree": tree,
        "config_name": config_name,
        "overrides": list(overrides or []),
        "env": dict(env or {}),
    }


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

COMPOSE_CASES: List[Dict[str, Any]] = []
MULTIRUN_CASES: List[Dict[str, Any]] = []


def _compose(tree: str, config_name: str, items: List[tuple]) -> None:
    """items: (name, overrides) or (name, overrides, env)."""
    for it in items:
        name, ovs = it[0], it[1]
        env = it[2] if len(it) > 2 else None
        COMPOSE_CASES.append(case(f"{tree}.{config_name}.{name}", tree, config_name, ovs, env))


def _multirun(tree: str, config_name: str, items: List[tuple]) -> None:
    for it in items:
        name, ovs = it[0], it[1]
        env = it[2] if len(it) > 2 else None
        MULTIRUN_CASES.append(case(f"{tree}.{config_name}.{name}", tree, config_name, ovs, env))


HOME = "FLOTILLA_ORACLE_HOME"
NUM = "FLOTILLA_ORACLE_NUM"
UNSET = "FLOTILLA_ORACLE_UNSET"
REQUIRED = "FLOTILLA_ORACLE_REQUIRED"

# ---- basic: groups, _self_ position, plain overrides, override grammar ----------------------
_compose("basic", "config", [
    ("default", []),
    ("group_db_postgres_model_large", ["db=postgres", "model=large"]),
    ("group_db_sqlite", ["db=sqlite"]),
    ("group_then_value", ["db=postgres", "db.port=1"]),
    ("value_then_group", ["db.port=1", "db=postgres"]),
    ("group_twice_last_wins", ["db=postgres", "db=sqlite"]),
    ("group_list_value", ["db=[postgres,sqlite]"]),
    ("group_value_into_option", ["model=large", "model.extra.heads=2"]),
    ("delete_in_option", ["model=large", "~model.extra"]),
    ("delete_group_default", ["~db"]),
    ("delete_group_default_matching", ["~db=mysql"]),
    ("delete_group_default_mismatch", ["~db=postgres"]),
    ("append_existing_group", ["+db=postgres"]),
    ("force_add_group", ["++db=postgres"]),
    ("missing_group_option", ["db=nope"]),
    ("group_null_on_cli", ["db=null"]),
    ("append_group_with_package", ["+db@backup=postgres"]),
    ("append_group_with_package_and_switch", ["+db@backup=postgres", "db=sqlite"]),
    ("override_group_with_unknown_package", ["db@backup=postgres"]),
    ("append_group_at_global", ["+db@_global_=sqlite"]),
    ("append_group_at_global_replaces_root", ["+db@_global_=postgres"]),
    ("node_to_null", ["app=null"]),
    ("list_to_empty", ["app.tags=[]"]),
    ("list_index", ["app.tags.1=x"]),
    ("dict_value_merges", ["app={name:n}"]),
    ("fill_missing", ["missing_value=5"]),
    ("keep_missing", ["missing_value=???"]),
    ("unknown_group_is_value", ["+newgroup=x"]),
    ("slash_key_not_group", ["db/x=1"]),
    ("sweep_in_compose", ["model=small,large"]),
    ("hydra_override_ignored", ["hydra.verbose=true", "hydra.job.name=foo"]),
    ("hydra_append_ignored", ["+hydra.foo=1"]),
    ("hydra_unknown_key", ["hydra.nope=1"]),
    ("hydra_group_override", ["hydra/job_logging=disabled"]),
    ("list_index_in_option", ["db=postgres", "db.schemas.0=x"]),
    ("new_key_in_option_without_plus", ["db.schemas=[x]"]),
    ("new_key_in_option_with_plus", ["+db.schemas=[x]"]),
    ("option_path_value", ["db=sqlite", "db.path=/x"]),
])
_compose("basic", "self_first", [
    ("default", []),
    ("group_db_postgres", ["db=postgres"]),
])
_compose("basic", "no_self", [
    ("default", []),
    ("group_db_postgres", ["db=postgres"]),
])
_compose("basic", "only_self", [
    ("default", []),
    ("append_group", ["+db=mysql"]),
])
_compose("basic", "empty_defaults", [
    ("default", []),
    ("append_group", ["+db=postgres"]),
])
_compose("basic", "plain", [
    ("default", []),
    ("int", ["a=2"]),
    ("float", ["a=2.0"]),
    ("float_exp", ["a=1e3"]),
    ("int_underscore", ["a=1_000"]),
    ("hex_is_string", ["a=0x1F"]),
    ("yes_is_string", ["a=yes"]),
    ("bool_upper", ["a=TRUE"]),
    ("bool_title", ["a=True"]),
    ("null", ["a=null"]),
    ("tilde_is_parse_error", ["a=~"]),
    ("empty_value", ["a="]),
    ("quoted_with_comma", ["a='quoted, with comma'"]),
    ("double_quoted", ['a="double"']),
    ("quoted_number_is_string", ["a='1'"]),
    ("quoted_null_is_string", ["a='null'"]),
    ("quoted_empty", ["a=''"]),
    ("quoted_escaped_quote", ["a='esc\\'q'"]),
    ("unquoted_spaces", ["a=hello world"]),
    ("unquoted_inner_spaces_kept", ["a=x y  z"]),
    ("surrounding_spaces_trimmed", ["a= 5 "]),
    ("escaped_comma", ["a=a\\,b"]),
    ("nested_list", ["a=[1,2,[3]]"]),
    ("dict", ["a={x:1,y:[a,b]}"]),
    ("empty_list", ["a=[]"]),
    ("empty_dict", ["a={}"]),
    ("interpolation", ["a=${e}"]),
    ("escaped_interpolation", ["a=\\${e}"]),
    ("cast_int", ["a=int(3.7)"]),
    ("cast_float", ["a=float(1)"]),
    ("cast_str", ["a=str(10)"]),
    ("cast_bool", ["a=bool(0)"]),
    ("sort_list", ["a=sort([3,1,2])"]),
    ("sort_args_is_sweep", ["a=sort(3,1,2)"]),
    ("choice_needs_multirun", ["a=choice(1,2)"]),
    ("range_needs_multirun", ["a=range(3)"]),
    ("interval_needs_multirun", ["a=interval(0,1)"]),
    ("negative_int", ["a=-5"]),
    ("plus_int", ["a=+5"]),
    ("leading_dot_float", ["a=.5"]),
    ("trailing_dot_float", ["a=5."]),
    ("leading_zero_is_string", ["a=010"]),
    ("colon_is_string", ["a=1:30"]),
    ("date_is_string", ["a=2024-01-01"]),
    ("path_value", ["a=/abs/path"]),
    ("second_equals_is_error", ["a=a=b"]),
    ("non_ascii_is_error", ["a=\u00fcn\u00ef"]),
    ("unknown_function", ["a=f(x)"]),
    ("unclosed_list", ["a=[1,2"]),
    ("no_equals", ["a"]),
    ("empty_key", ["=1"]),
    ("bracket_index_is_error", ["b.d[0]=9"]),
    ("nested_value", ["b.c=3"]),
    ("dict_to_scalar", ["b=5"]),
    ("list_replace", ["b.d=[9]"]),
    ("list_index", ["b.d.0=9"]),
    ("scalar_to_dict_without_plus", ["b.c.x=1"]),
    ("scalar_to_dict_with_plus", ["+b.c.x=1"]),
    ("append_nested", ["+b.new=1"]),
    ("append_deep", ["+new.deep.key=1"]),
    ("append_existing", ["+a=1"]),
    ("force_add_existing", ["++a=7"]),
    ("force_add_new", ["++z=7"]),
    ("force_add_deep", ["++b.z.w=7"]),
    ("unknown_key", ["nope=1"]),
    ("delete", ["~a"]),
    ("delete_nested", ["~b.c"]),
    ("delete_matching_value", ["~a=1"]),
    ("delete_mismatching_value", ["~a=2"]),
    ("delete_missing_key", ["~nope"]),
    ("delete_subtree", ["~b"]),
    ("repeat_key_last_wins", ["a=1", "a=2"]),
    ("append_twice", ["+x=1", "+x=2"]),
    ("delete_then_set", ["~a", "a=3"]),
    ("delete_then_append", ["~a", "+a=3"]),
    ("append_interpolation", ["+x=${b.c}"]),
    ("append_quoted_interpolation", ["+x='${b.c}'", "+y='a ${b.c} b'"]),
    ("append_escaped_quoted_interpolation", ["+w='\\${b.c}'"]),
    ("append_env_interpolation", ["+x=${oc.env:FLOTILLA_ORACLE_HOME,dflt}"], {HOME: "/from/env"}),
    ("append_env_interpolation_default", ["+x=${oc.env:FLOTILLA_ORACLE_HOME,dflt}"], {HOME: None}),
    ("append_groups", ["+db=mysql", "+model=large"]),
    ("append_groups_reversed", ["+model=large", "+db=mysql"]),
    ("append_group_then_value", ["+db=mysql", "db.port=1"]),
    ("append_group_then_append_value", ["+db=mysql", "+db.extra=1"]),
    # Type-changing overrides: OmegaConf merges a dict only into a dict and a list only into a
    # list; anything else replaces the value.
    ("type_dict_over_list", ["b.d={x:1}"]),
    ("type_dict_over_list_append", ["+b.d={x:1}"]),
    ("type_dict_over_list_force", ["++b.d={x:1}"]),
    ("type_dict_over_list_nested", ["b={d:{x:1}}"]),
    ("type_list_over_dict", ["b=[1,2]"]),
    ("type_list_over_dict_append", ["+b=[1,2]"]),
    ("type_list_over_dict_force", ["++b=[1,2]"]),
    ("type_dict_over_scalar", ["a={x:1}"]),
    ("type_dict_over_scalar_append", ["+a={x:1}"]),
    ("type_dict_over_scalar_force", ["++a={x:1}"]),
    ("type_dict_over_scalar_nested", ["b.c={x:1}"]),
    ("type_list_over_scalar", ["a=[1]"]),
    ("type_list_over_scalar_force", ["++b.c=[1]"]),
    ("type_list_over_scalar_in_dict", ["b={c:[1]}"]),
    ("type_scalar_over_dict_force", ["++b=5"]),
    ("type_scalar_over_dict_append", ["+b=5"]),
    ("type_scalar_over_list", ["b.d=5"]),
    ("type_scalar_over_list_force", ["++b.d=5"]),
    ("type_scalar_over_list_in_dict", ["b={d:5}"]),
    ("type_list_over_list_in_dict", ["b={d:[7]}"]),
    ("type_dict_into_list_item", ["b.d.0={x:1}"]),
    ("type_list_over_dict_after_delete", ["~b", "+b=[1,2]"]),
])

# ---- defaults: optional, null, ???, override, nested defaults, list options ------------------
_compose("defaults", "config", [
    ("default", []),
    ("optional_switch", ["logger=wandb"]),
    ("optional_null_on_cli", ["logger=null"]),
    ("optional_delete", ["~logger"]),
    ("optional_absent_now_present", ["profiler=simple"]),
    ("null_default_set", ["callbacks=early_stop"]),
    ("null_default_append", ["+callbacks=early_stop"]),
    ("nested_group_switch_parent", ["trainer=fast"]),
    ("slash_group_override", ["trainer/dist=fsdp"]),
    ("slash_group_override_beats_nested_default", ["trainer=fast", "trainer/dist=ddp"]),
    ("nested_self_first", ["trainer=self_first"]),
    ("nested_self_absent", ["trainer=no_self"]),
    ("nested_override_in_same_list", ["trainer=with_override"]),
    ("nested_override_then_cli", ["trainer=with_override", "trainer/dist=ddp"]),
    ("list_option_one", ["augment=[noise]"]),
    ("list_option_reordered", ["augment=[crop,flip]"]),
    ("list_option_to_scalar", ["augment=noise"]),
    ("global_experiment", ["+experiment=exp1"]),
    ("experiment_override_not_in_defaults", ["+experiment=exp2"]),
    ("non_global_experiment", ["+experiment=not_global"]),
    ("experiment_list", ["+experiment=[exp1,exp2]"]),
    ("unknown_key_optional", ["optional=x"]),
])
_compose("defaults", "must_choose", [
    ("unset", []),
    ("set", ["scheduler=step"]),
    ("null_on_cli", ["scheduler=null"]),
])
_compose("defaults", "nulls", [
    ("default", []),
    ("set_one", ["optimizer=sgd"]),
    ("set_both", ["optimizer=sgd", "scheduler=cosine"]),
    ("append_over_null", ["+optimizer=sgd"]),
])
_compose("defaults", "override_primary", [
    ("default", []),
    ("cli_beats_primary_override", ["optimizer=adam"]),
    ("cli_beats_nested_override", ["trainer/dist=ddp"]),
])
_compose("defaults", "nested_demo", [
    ("default", []),
    ("relative_nested_group", ["nested/inner=b"]),
    ("parent_and_nested", ["nested=outer", "nested/inner=b"]),
    ("package_path_is_not_group", ["nested/opt=adam"]),
    ("absolute_nested_with_package", ["optimizer@nested.opt=adam"]),
])
_compose("defaults", "experiment_base", [
    ("exp1", ["+experiment=exp1"]),
    ("exp2", ["+experiment=exp2"]),
    ("exp1_cli_group_beats_experiment", ["+experiment=exp1", "optimizer=adam"]),
    ("exp1_cli_value", ["+experiment=exp1", "optimizer.lr=1"]),
])
_compose("defaults", "list_self", [
    ("default", []),
])

# ---- packages: @package headers, group@pkg, _global_ -----------------------------------------
_compose("packages", "config", [
    ("default", []),
    ("foo_bar_header_replaced", ["net=vit"]),
    ("global_header_replaced", ["server=apache"]),
    ("switch_to_global_option", ["db=sqlite"]),
    ("switch_packaged_default", ["db@backup=mysql"]),
    ("switch_group_dot_inner", ["layout=three"]),
    ("switch_slash_group", ["platform/cloud=gcp"]),
    ("append_with_package", ["+net@extra_net=vit"]),
    ("append_header_option_with_package", ["+net@extra_net=resnet"]),
    ("append_deep_package", ["+db@a.b.c=postgres"]),
    ("append_misc", ["+misc=deep"]),
    ("append_slash_value", ["+misc/deep=x"]),
])
_compose("packages", "pkg_override", [
    ("default", []),
    ("switch_with_package", ["net@model.backbone=vit"]),
    ("switch_without_package", ["net=vit"]),
    ("switch_global_without_package", ["db=postgres"]),
    ("switch_global_with_package", ["db@_global_=postgres"]),
])
_compose("packages", "wrapped", [
    ("default", []),
    ("global_wrapper", ["wrapper=global_box"]),
    ("nested_override_by_package", ["db@wrapper.store=mysql"]),
    ("nested_override_bad_group_path", ["wrapper/db@wrapper.store=mysql"]),
    ("nested_override_partial_package", ["net@wrapper=resnet"]),
    ("nested_override_no_package", ["net=resnet"]),
])
_compose("packages", "global_last", [
    ("default", []),
    ("non_global_option", ["server=apache"]),
])
_compose("packages", "group_pkg", [
    ("default", []),
    ("switch", ["platform/cloud@cloud=aws"]),
])

# ---- interp: interpolation, resolvers, merge semantics, YAML 1.1 scalars ---------------------
_compose("interp", "config", [
    ("env_unset", [], {HOME: None, NUM: None, UNSET: None}),
    ("env_set", [], {HOME: "/home/x", NUM: "7", UNSET: None}),
    ("env_decoded_list", [], {NUM: "[1,2]", HOME: None, UNSET: None}),
    ("env_empty", [], {HOME: "", NUM: None, UNSET: None}),
    ("override_feeds_interpolations", ["server.port=9090", "server.host=h"], {HOME: None, NUM: None, UNSET: None}),
    ("override_nested_key_selector", ["choice=a"], {HOME: None, NUM: None, UNSET: None}),
    ("override_to_interpolation", ["table.b=${top}"], {HOME: None, NUM: None, UNSET: None}),
    ("override_to_missing_interpolation", ["top=${nope}"], {HOME: None, NUM: None, UNSET: None}),
])
_compose("interp", "scalars", [("default", [])])
_compose("interp", "to_missing", [("default", []), ("filled", ["a=1"])])
_compose("interp", "bad_resolver", [("default", [])])
_compose("interp", "env_required", [
    ("unset", [], {REQUIRED: None}),
    ("set", [], {REQUIRED: "abc"}),
    ("set_number_stays_string", [], {REQUIRED: "123"}),
])
_compose("interp", "interp_missing_key", [("default", []), ("append_target", ["+does.not.exist=5"])])
_compose("interp", "self_ref", [("default", []), ("break_cycle", ["b=1"])])
_compose("interp", "bad_interp_syntax", [("default", [])])
_compose("interp", "dict_to_scalar", [("default", [])])
_compose("interp", "list_to_dict", [("default", [])])

# ---- sweep tree in compose mode: hydra.sweeper.params is ignored -----------------------------
_compose("sweep", "with_params", [("compose_ignores_params", [])])
_compose("sweep", "group_params", [("compose_ignores_params", [])])

# ---- broken trees ------------------------------------------------------------------------------
_compose("broken", "ok", [
    ("default", []),
    ("malformed_option", ["db=malformed"]),
    ("duplicate_key_option", ["db=dupkey"]),
    ("bad_header_option", ["db=bad_header"]),
    ("append_packaged_over_scalar", ["+db@x=good"]),
])
for _name in ["bad_yaml", "bad_yaml_indent", "dup_key", "dup_key_nested", "missing_option",
              "missing_group", "missing_plain", "interp_missing", "cycle", "self_cycle",
              "group_cycle", "override_absent", "dup_self", "dup_group", "list_primary",
              "scalar_primary", "bad_defaults_type", "bad_defaults_entry", "empty",
              "nonexistent_primary"]:
    _compose("broken", _name, [("load", [])])
_compose("broken", "empty", [("append", ["+a=1"])])

# ---- multirun ----------------------------------------------------------------------------------
_multirun("sweep", "config", [
    ("no_overrides", []),
    ("two_lists", ["lr=0.1,0.2", "batch=1,2"]),
    ("three_lists", ["lr=1,2", "batch=range(2)", "name=x,y"]),
    ("range_int", ["lr=range(1,4)"]),
    ("range_stop_only", ["lr=range(3)"]),
    ("range_float_step", ["lr=range(0,1,0.25)"]),
    ("range_negative_step", ["lr=range(5,0,-2)"]),
    ("range_float_bounds", ["lr=range(1.0,2.0,0.5)"]),
    ("range_float_accumulates", ["lr=range(0.1,0.4,0.1)"]),
    ("range_empty", ["lr=range(0)"]),
    ("range_empty_reversed", ["lr=range(3,1)"]),
    ("range_keywords", ["lr=range(start=1,stop=3)"]),
    ("choice_mixed", ["lr=choice(1,2.5,x)"]),
    ("choice_single", ["name=choice(a)"]),
    ("choice_empty", ["lr=choice()"]),
    ("tagged_choice", ["lr=tag(a,choice(1,2))"]),
    ("sort_args", ["lr=sort(3,1,2)"]),
    ("sort_reverse", ["lr=sort(3,1,2,reverse=true)"]),
    ("glob_all", ["model=glob(*)"]),
    ("glob_exclude", ["model=glob(*,exclude=big*)"]),
    ("glob_list", ["model=glob([a,b*])"]),
    ("glob_exclude_list", ["model=glob(*,exclude=[a,c])"]),
    ("glob_non_group", ["batch=glob(*)"]),
    ("quoted_comma", ["name='a,b',c"]),
    ("quoted_space_and_double", ["name='x y',\"z,w\""]),
    ("escaped_comma", ["name=a\\,b,c"]),
    ("group_sweeps", ["model=a,b", "opt=adam,rmsprop"]),
    ("group_list_values", ["model=[a,b],[c]"]),
    ("group_list_single", ["model=[a,b]"]),
    ("append_sweep", ["+new=a,b"]),
    ("append_group_sweep_with_package", ["+model@other=b,c"]),
    ("repeated_key_collapses", ["lr=1,2", "lr=3"]),
    ("repeated_key_keeps_first_position", ["lr=1", "batch=2", "lr=3,4"]),
    ("repeated_key_range_then_list", ["lr=range(1,3)", "lr=5,6"]),
    ("interval_unsupported", ["lr=interval(0,1)"]),
    ("list_values", ["lr=[1,2],[3]"]),
    ("hydra_override_not_in_task", ["lr=1,2", "hydra.job.name=x"]),
    ("delete_gets_null_value", ["~flag", "lr=1,2"]),
    ("delete_with_value", ["~lr=0.1"]),
    ("bool_strings", ["flag=true,false"]),
    ("number_normalisation", ["lr=1.0,1e-3,1_000"]),
    ("non_sweep_normalisation", ["name=null", "flag=TRUE", "lr=1e3", "batch=0x10"]),
    ("casts_reparsed", ["lr=str(1),int(2.5)"]),
    ("float_casts", ["lr=float(1),float(2)"]),
    ("escaped_space", ["name=hello world", "lr=1,2"]),
    ("backslash_space", ["name=a\\ b", "lr=-1"]),
    ("list_and_dict_values", ["name=[a, b]", "batch={x: 1, y: [1,2]}"]),
    ("quoted_interpolation", ["name='with ${x}'", "lr=1"]),
    ("interpolation_in_sweep", ["lr=${batch},1"]),
    ("interpolation_not_sweep", ["name=${lr}"]),
    ("empty_quoted", ['name=""']),
    ("empty_value", ["name=", "lr=1"]),
    ("force_add", ["++lr=1,2", "++z=3"]),
    ("path_value", ["name=path/to/x"]),
    ("unknown_key", ["nope=1,2"]),
    ("missing_group_option", ["model=nope,a"]),
    ("unknown_group_with_package", ["+db@pkg=x"]),
    ("tilde_parse_error", ['name=null,"null",~']),
])
_multirun("sweep", "with_params", [
    ("params_only", []),
    ("cli_replaces_param_in_place", ["batch=8"]),
    ("cli_new_keys_after_params", ["name=a,b", "lr=5"]),
    ("cli_mixed", ["name=x", "lr=1,2,3", "batch=7"]),
    ("cli_repeated_param_key", ["lr=7", "lr=8"]),
    ("cli_order_does_not_move_params", ["batch=1,2", "lr=3,4"]),
    ("cli_append_and_set", ["+new=1", "lr=3,4", "batch=16", "name=q"]),
    ("sweep_hydra_param_rejected", ["hydra.sweeper.params.lr=3,4"]),
    ("delete_param", ["~hydra.sweeper.params.lr"]),
])
_multirun("sweep", "group_params", [
    ("params_only", []),
    ("cli_group_replaces_param", ["model=c"]),
    ("cli_group_sweep_replaces_param", ["model=b,c"]),
    ("cli_plus_key_replaces_plus_param", ["lr=9", "+extra=5"]),
    ("force_add_is_a_different_key", ["++lr=3"]),
])
_multirun("sweep", "single_param", [
    ("params_only", []),
    ("cli_sweep", ["lr=1,2"]),
])
_multirun("basic", "config", [
    ("glob_groups", ["db=glob(*)", "model=small,large"]),
    ("append_glob_with_package", ["+db@backup=glob(*,exclude=mysql)"]),
    ("fill_missing_sweep", ["missing_value=1,2"]),
])
_multirun("defaults", "config", [
    ("slash_group_sweep", ["trainer/dist=ddp,fsdp"]),
])
_multirun("defaults", "experiment_base", [
    ("experiments", ["+experiment=exp1,exp2"]),
])
_multirun("defaults", "nested_demo", [
    ("package_and_nested", ["optimizer@nested.opt=adam,sgd", "nested/inner=a,b"]),
])
_multirun("defaults", "must_choose", [
    ("unset", []),
    ("glob", ["scheduler=glob(*)"]),
])
_multirun("broken", "interp_missing", [("job_fails", ["a=1,2"])])
_multirun("broken", "ok", [("second_option_malformed", ["db=good,malformed"])])
_multirun("interp", "config", [
    ("env", ["top=a,b"], {HOME: "/srv", NUM: None, UNSET: None}),
])

# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------


def normalize(text: str, tmp: Optional[str] = None) -> str:
    if tmp:
        text = text.replace(os.path.realpath(tmp), "<TMP>").replace(tmp, "<TMP>")
    text = text.replace(str(CONF), "<CONF>")
    return text


def error_record(ex: BaseException, tmp: Optional[str] = None) -> Dict[str, Any]:
    err: Dict[str, Any] = {"type": type(ex).__name__, "message": normalize(str(ex), tmp)}
    cause = ex.__cause__
    if cause is not None:
        err["cause"] = {"type": type(cause).__name__, "message": normalize(str(cause), tmp)}
    return err


def case_env(env: Dict[str, Optional[str]]) -> Dict[str, str]:
    """The environment a case runs under: ours minus every FLOTILLA_ORACLE_* and HYDRA_* variable,
    plus the case's own variables (None = left unset)."""
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(ENV_PREFIX) and not k.startswith("HYDRA_")}
    for k, v in env.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


@contextlib.contextmanager
def patched_environ(env: Dict[str, Optional[str]]) -> Iterator[None]:
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(case_env(env))
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_compose(c: Dict[str, Any]) -> Dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    out = dict(c)
    with patched_environ(c["env"]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with initialize_config_dir(config_dir=str(CONF / c["tree"]), version_base="1.3",
                                       job_name="oracle"):
                cfg = compose(config_name=c["config_name"], overrides=list(c["overrides"]),
                              return_hydra_config=False)
                result = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
            json.dumps(result, allow_nan=False)  # must be representable as strict JSON
            out["result"] = result
        except Exception as ex:  # noqa: BLE001 - every failure is an oracle answer
            out["error"] = error_record(ex)
    return out


def run_multirun(c: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(c)
    with tempfile.TemporaryDirectory(prefix="flotilla-oracle-") as tmp:
        jsonl = os.path.join(tmp, "jobs.jsonl")
        errfile = os.path.join(tmp, "error.json")
        env = case_env(c["env"])
        env["FLOTILLA_ORACLE_JSONL"] = jsonl
        env["FLOTILLA_ORACLE_ERROR"] = errfile
        env["HYDRA_FULL_ERROR"] = "1"
        env["PYTHONWARNINGS"] = "ignore"
        cmd = [
            sys.executable, str(APP),
            "--config-dir", str(CONF / c["tree"]),
            "--config-name", c["config_name"],
            "-m",
            f"hydra.sweep.dir={tmp}/sweep",
            "hydra/hydra_logging=disabled",
            "hydra/job_logging=disabled",
            *c["overrides"],
        ]
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            if os.path.exists(errfile):
                with open(errfile, encoding="utf-8") as f:
                    err = json.load(f)
                err["message"] = normalize(err["message"], tmp)
                if "cause" in err:
                    err["cause"]["message"] = normalize(err["cause"]["message"], tmp)
            else:
                tail = (proc.stderr.strip().splitlines() or ["<no stderr>"])[-1]
                err = {"type": "ProcessError", "message": normalize(tail, tmp)}
            out["error"] = err
            return out
        jobs = []
        if os.path.exists(jsonl):
            with open(jsonl, encoding="utf-8") as f:
                jobs = [json.loads(line) for line in f if line.strip()]
        jobs.sort(key=lambda j: j["num"])
        nums = [j["num"] for j in jobs]
        if nums != list(range(len(jobs))):
            raise RuntimeError(f"{c['name']}: unexpected job numbers {nums}")
        out["result"] = {"jobs": jobs}
    return out


def check_cases() -> None:
    for kind, cases in (("compose", COMPOSE_CASES), ("multirun", MULTIRUN_CASES)):
        seen = set()
        for c in cases:
            if c["name"] in seen:
                raise SystemExit(f"duplicate {kind} case name: {c['name']}")
            seen.add(c["name"])
            if not (CONF / c["tree"]).is_dir():
                raise SystemExit(f"{kind} case {c['name']}: no tree {c['tree']}")
            for k in c["env"]:
                if not k.startswith(ENV_PREFIX):
                    raise SystemExit(f"{kind} case {c['name']}: env var {k} lacks {ENV_PREFIX}")


def write_json(path: Path, cases: List[Dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"hydra_core": hydra_version(), "cases": cases}, indent=1,
                      ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def hydra_version() -> str:
    import hydra
    import omegaconf
    return f"hydra-core {hydra.__version__}, omegaconf {omegaconf.__version__}"


def record(out_dir: Path, jobs: int) -> None:
    check_cases()
    compose_results = [run_compose(c) for c in COMPOSE_CASES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        multirun_results = list(pool.map(run_multirun, MULTIRUN_CASES))
    write_json(out_dir / "compose.json", compose_results)
    write_json(out_dir / "multirun.json", multirun_results)
    n_err_c = sum("error" in r for r in compose_results)
    n_err_m = sum("error" in r for r in multirun_results)
    print(f"compose: {len(compose_results)} cases ({n_err_c} errors); "
          f"multirun: {len(multirun_results)} cases ({n_err_m} errors) -> {out_dir}")


def main(argv: List[str]) -> int:
    if argv and argv[0] in ("try", "try-m"):
        if len(argv) < 3:
            print("usage: record_hydra.py try|try-m TREE CONFIG [OVERRIDES...]", file=sys.stderr)
            return 2
        c = case("try", argv[1], argv[2], argv[3:],
                 {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)})
        r = run_compose(c) if argv[0] == "try" else run_multirun(c)
        print(json.dumps({k: r[k] for k in ("result", "error") if k in r}, indent=1,
                         ensure_ascii=False))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--out", type=Path, default=FIXTURES, help="output folder")
    ap.add_argument("--jobs", type=int, default=2, help="parallel multirun subprocesses")
    args = ap.parse_args(argv)
    record(args.out, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
