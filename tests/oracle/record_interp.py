#!/usr/bin/env python
"""Record how the real OmegaConf 2.3 resolves interpolations, for src/config/interp.rs.

Run with the project's virtual environment:

    .venv/bin/python tests/oracle/record_interp.py

Writes tests/oracle/fixtures/interp.json: one entry per case with the YAML document, the
environment variables set while resolving, the YAML-loaded *unresolved* container
(`input`, built by `OmegaConf.to_container(cfg, resolve=False)`), and either the resolved
container (`result`, `OmegaConf.to_container(cfg, resolve=True)`) or the error OmegaConf
raised (`error`: type name and first line of the message). `rust_contains`, when present,
is a substring the Rust error message must contain.

Encoding: dictionary keys that are not strings become `str(key)`; non-finite floats become
{"$float": "inf" | "-inf" | "nan"}; OmegaConf's `???` stays the string "???".

Hydra's `hydra` resolver (and flotilla's alias `flotilla`) are registered here as Hydra
registers `hydra`: `OmegaConf.select(<hydra node>, key)`. `now` is not recorded (it depends
on the clock); the Rust tests cover it with a fixed instant.
"""

import json
import math
import os
import sys
import textwrap
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_yaml_loader

HERE = Path(__file__).resolve().parent
OUT = HERE / "fixtures" / "interp.json"

OmegaConf.register_new_resolver(
    "hydra", lambda path, *, _root_: OmegaConf.select(_root_.hydra, path), replace=True
)
OmegaConf.register_new_resolver(
    "flotilla", lambda path, *, _root_: OmegaConf.select(_root_.hydra, path), replace=True
)


def case(name, doc, env=None, contains=None):
    return {
        "name": name,
        "yaml": textwrap.dedent(doc).lstrip("\n"),
        "env": env or {},
        "contains": contains,
    }


CASES = [
    # ---- node interpolation: absolute keys and types
    case("abs_int", "a: 1\nb: ${a}\n"),
    case("abs_float", "a: 0.001\nb: ${a}\n"),
    case("abs_float_exp", "a: 1e-5\nb: ${a}\n"),
    case("abs_bool", "a: true\nb: ${a}\n"),
    case("abs_null", "a: null\nb: ${a}\n"),
    case("abs_str", "a: hello\nb: ${a}\n"),
    case("abs_nested", "a: {b: {c: 7}}\nd: ${a.b.c}\n"),
    case("abs_dict", "a: {x: 1, y: [1, 2]}\nb: ${a}\n"),
    case("abs_list", "a: [1, two, 3.5]\nb: ${a}\n"),
    case("abs_dict_inner_interp", "a: {x: '${c}'}\nc: 5\nb: ${a}\n"),
    case("abs_dict_inner_relative", "a: {x: '${.y}', y: 3}\nb: ${a}\n"),
    case("abs_chain", "a: 1\nb: ${a}\nc: ${b}\nd: ${c}\n"),
    case("abs_chain_string", "a: x\nb: pre-${a}\nc: ${b}-post\n"),
    case("abs_to_escaped", "a: '\\${x}'\nb: ${a}\nx: 1\n"),
    case("abs_through_interp_container", "a: ${b}\nb: {x: {y: 2}}\nc: ${a.x.y}\n"),
    case("abs_whitespace_inside", "a: 1\nb: '${ a }'\nc: '${a }'\nd: '${  a}'\n"),
    case("abs_deep_list_of_dicts", "l: [{a: 1}, {a: 2}]\nb: ${l[1].a}\nc: ${l.0.a}\n"),
    case("abs_missing_key", "trainer: {lr: 0.1}\nmodel: {lr: '${trainer.lrr}'}\n",
         contains="did you mean 'trainer.lr'"),
    case("abs_missing_top", "a: ${nope}\n", contains="key 'nope' not found"),
    case("abs_missing_mid", "a: {b: 1}\nc: ${a.x.y}\n"),
    case("abs_to_missing_value", "a: ???\nb: ${a}\n", contains="missing mandatory value"),
    case("abs_through_missing", "a: ???\nb: ${a.c}\n"),
    case("abs_not_container", "a: 5\nb: ${a.c}\n", contains="not a container"),
    case("abs_through_null", "a: null\nb: ${a.c}\n"),
    case("missing_leaf_stays", "a: ???\nb: {c: '???'}\nd: 1\n"),
    case("missing_in_referenced_dict", "a: {x: '???', y: 1}\nb: ${a}\n"),
    case("key_with_dash", "a-b: 1\nc: ${a-b}\n"),
    case("key_with_dollar", "$x: 1\nc: ${$x}\n"),
    case("key_with_at_slash", "'a@b/c': 2\nd: ${a@b/c}\n"),
    case("key_unicode", "é: 3\nd: ${é}\n"),
    case("key_digits", "a: {1b: 4, '2': 5}\nd: ${a.1b}\ne: ${a.2}\nf: ${a[2]}\n"),
    case("key_with_space_error", "'a b': 1\nc: ${a b}\n"),
    case("key_bracket_first", "a: {b: 1}\nc: '${[a].b}'\nd: '${[a][b]}'\n"),
    # ---- list items
    case("list_bracket", "l: [a, b, c]\nx: ${l[1]}\n"),
    case("list_dot", "l: [a, b, c]\nx: ${l.2}\n"),
    case("list_nested", "m: [[1, 2], [3, 4]]\nx: ${m[1][0]}\ny: ${m.0.1}\n"),
    case("list_out_of_range", "l: [a]\nx: ${l[3]}\n"),
    case("list_negative", "l: [a, b]\nx: ${l.-1}\n"),
    case("list_plus_index", "l: [a, b]\nx: ${l[+1]}\n"),
    case("list_underscore_index", "l: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\nx: ${l.1_0}\n"),
    case("list_bad_index", "l: [a]\nx: ${l.foo}\n"),
    case("list_item_interp", "a: 3\nl: ['${a}', 'x-${a}']\n"),
    case("list_item_relative", "l: ['${.1}', 9]\n"),
    case("list_root_relative", "x: 7\nl: ['${..x}']\n"),
    # ---- relative
    case("rel_sibling", "a: {x: 1, y: '${.x}'}\n"),
    case("rel_parent", "x: 2\na: {y: '${..x}'}\n"),
    case("rel_grandparent", "x: 3\na: {b: {y: '${...x}'}}\n"),
    case("rel_above_root", "a: {y: '${...x}'}\n"),
    case("rel_nested_path", "a: {b: {c: 1}, d: '${.b.c}'}\n"),
    case("rel_parent_sibling_path", "a: {b: {y: '${..c.z}'}, c: {z: 4}}\n"),
    case("rel_empty_parent_error", "a: {b: '${..}'}\n"),
    case("rel_to_parent_container", "a: {b: '${..a}'}\n"),
    case("rel_dot_bracket", "a: {b: [5, 6], c: '${.b[1]}'}\n"),
    # ---- nested interpolations
    case("nested_key", "k: b\na: {b: 9}\nx: ${a.${k}}\n"),
    case("nested_whole_key", "k: a.b\na: {b: 8}\nx: ${${k}}\n"),
    case("nested_relative_key", "a: {k: .v, v: 1, x: '${${.k}}'}\n"),
    case("nested_bracket_key", "i: '1'\nl: [a, b]\nx: ${l[${i}]}\n"),
    case("nested_int_key_error", "i: 1\nl: [a, b]\nx: ${l[${i}]}\n"),
    case("nested_empty_key_error", "k: ''\nx: ${${k}}\n"),
    case("nested_select", "k: a\na: 3\nx: ${oc.select:${k}}\n"),
    case("nested_resolver_name", "r: oc\nx: ${${r}.select:a}\na: 4\n"),
    case("nested_resolver_name_int", "r: 5\nx: ${${r}:a}\n"),
    case("nested_two_levels", "a: b\nb: c\nc: {d: 2}\nx: ${${${a}}.d}\n"),
    # ---- string interpolation rendering
    case("str_types",
         "i: 1\nf: 0.001\ng: 1e-05\nh: 1e+16\nj: 1.0\nt: true\nn: null\ns: x\n"
         "out: '${i} ${f} ${g} ${h} ${j} ${t} ${n} ${s}'\n"),
    case("str_neg_zero", "f: -0.0\nout: 'v=${f}'\n"),
    case("str_large_float", "f: 123456789012345678.0\nout: 'v=${f}'\n"),
    case("str_dict", "d: {a: 1, b: [x, true, null]}\nout: 'd=${d}'\n"),
    case("str_dict_raw_interp", "d: {a: '${c}', m: '???'}\nc: 1\nout: 'd=${d}'\n"),
    case("str_list", "l: [1, 'it''s', 2.5]\nout: 'l=${l}'\n"),
    case("str_list_quotes", "l: ['a\"b', \"c'd\", 'e\\f']\nout: 'l=${l}'\n"),
    case("str_dict_via_interp", "d: ${e}\ne: {k: v}\nout: 'd=${d}'\n"),
    case("str_multiple", "a: 1\nb: 2\nout: ${a}${b}\n"),
    case("str_leading_space", "a: 1\nout: ' ${a}'\n"),
    case("str_url", "host: localhost\nport: 8080\nurl: http://${host}:${port}/path\n"),
    case("str_unicode", "a: ünï\nout: 'x-${a}-ÿ'\n"),
    case("str_dollar_brace_text", "a: 1\nout: '$ {a} $a ${a} }{'\n"),
    # ---- escapes
    case("esc_simple", "x: 1\na: '\\${x}'\n"),
    case("esc_backslash_interp", "x: 1\na: '\\\\${x}'\n"),
    case("esc_three", "x: 1\na: '\\\\\\${x}'\n"),
    case("esc_four", "x: 1\na: '\\\\\\\\${x}'\n"),
    case("esc_five", "x: 1\na: '\\\\\\\\\\${x}'\n"),
    case("esc_untouched_no_interp", "a: 'c:\\path\\to'\nb: 'x\\\\y'\n"),
    case("esc_untouched_with_interp", "x: 1\na: 'c:\\dir\\\\sub ${x} \\\\'\n"),
    case("esc_trailing_backslash", "x: 1\na: '${x}\\'\nb: '${x}\\\\'\n"),
    case("esc_only_escaped", "a: 'price \\${5}'\n"),
    case("esc_mixed", "x: X\na: '\\${x} ${x} \\\\${x}'\n"),
    case("esc_in_referenced", "a: '\\${b}'\nc: 'v=${a}'\n"),
    case("esc_dollar_no_brace", "x: 1\na: '\\$x ${x}'\n"),
    # ---- oc.env
    case("env_set", "a: ${oc.env:FLOTILLA_T_A}\n", env={"FLOTILLA_T_A": "hello"}),
    case("env_set_empty", "a: ${oc.env:FLOTILLA_T_A}\n", env={"FLOTILLA_T_A": ""}),
    case("env_set_number_stays_str", "a: ${oc.env:FLOTILLA_T_A}\n", env={"FLOTILLA_T_A": "42"}),
    case("env_value_with_interp_not_resolved", "a: ${oc.env:FLOTILLA_T_A}\nb: 1\n",
         env={"FLOTILLA_T_A": "${b}"}),
    case("env_missing_error", "a: ${oc.env:FLOTILLA_T_NOPE}\n",
         contains="Environment variable 'FLOTILLA_T_NOPE' not found"),
    case("env_default_str", "a: ${oc.env:FLOTILLA_T_NOPE,fallback}\n"),
    case("env_default_int", "a: ${oc.env:FLOTILLA_T_NOPE,5}\n"),
    case("env_default_float", "a: ${oc.env:FLOTILLA_T_NOPE,1e-3}\n"),
    case("env_default_bool", "a: ${oc.env:FLOTILLA_T_NOPE,true}\n"),
    case("env_default_null", "a: ${oc.env:FLOTILLA_T_NOPE,null}\n"),
    case("env_default_list", "a: '${oc.env:FLOTILLA_T_NOPE,[1, a]}'\n"),
    case("env_default_dict", "a: '${oc.env:FLOTILLA_T_NOPE,{k: 1}}'\n"),
    case("env_default_quoted", "a: \"${oc.env:FLOTILLA_T_NOPE,'a, b'}\"\n"),
    case("env_default_empty", "a: '${oc.env:FLOTILLA_T_NOPE,}'\n"),
    case("env_default_spaces", "a: '${oc.env:FLOTILLA_T_NOPE, a b }'\n"),
    case("env_default_interp", "x: 3\na: '${oc.env:FLOTILLA_T_NOPE,${x}}'\n"),
    case("env_default_dict_interp", "d: {k: '${x}'}\nx: 1\na: '${oc.env:FLOTILLA_T_NOPE,${d}}'\n"),
    case("env_set_ignores_default", "a: ${oc.env:FLOTILLA_T_A,zzz}\n", env={"FLOTILLA_T_A": "v"}),
    case("env_in_string", "a: 'home=${oc.env:FLOTILLA_T_A}/x'\n", env={"FLOTILLA_T_A": "/h"}),
    case("env_too_many_args", "a: ${oc.env:FLOTILLA_T_A,1,2}\n", env={"FLOTILLA_T_A": "v"}),
    case("env_no_args", "a: '${oc.env:}'\n"),
    case("env_int_key", "a: ${oc.env:123}\n"),
    case("env_whitespace", "a: '${oc.env: FLOTILLA_T_A }'\n", env={"FLOTILLA_T_A": "w"}),
    case("env_key_from_interp", "k: FLOTILLA_T_A\na: ${oc.env:${k}}\n", env={"FLOTILLA_T_A": "z"}),
    # ---- oc.select
    case("select_found", "a: {b: 1}\nx: ${oc.select:a.b}\n"),
    case("select_missing_null", "x: ${oc.select:nope}\n"),
    case("select_missing_default", "x: ${oc.select:nope,7}\n"),
    case("select_default_str", "x: ${oc.select:nope,abc}\n"),
    case("select_in_string", "x: 'v=${oc.select:nope}'\n"),
    case("select_relative", "a: {b: 2, x: '${oc.select:.b}'}\n"),
    case("select_relative_parent", "b: 4\na: {b: 3, x: '${oc.select:..b}'}\n"),
    case("select_absolute_from_nested", "b: 4\na: {b: 3, x: '${oc.select:b}'}\n"),
    case("select_mandatory_missing", "a: ???\nx: ${oc.select:a,1}\n"),
    case("select_mandatory_missing_null", "a: ???\nx: ${oc.select:a}\n"),
    case("select_through_missing", "a: ???\nx: ${oc.select:a.b,1}\n"),
    case("select_not_container", "a: 5\nx: ${oc.select:a.b,1}\n"),
    case("select_bad_index_error", "l: [1]\nx: ${oc.select:l.foo,1}\n"),
    case("select_index_out_of_range", "l: [1]\nx: ${oc.select:l.5,1}\n"),
    case("select_dict", "a: {b: {c: 1}}\nx: ${oc.select:a.b}\n"),
    case("select_default_interp_dict", "d: {z: 1}\nx: ${oc.select:nope,${d}}\n"),
    case("select_interp_target", "a: ${b}\nb: 5\nx: ${oc.select:a}\n"),
    case("select_cycle_error", "a: ${oc.select:a}\n"),
    case("select_null_value", "a: null\nx: ${oc.select:a,5}\n"),
    case("select_non_str_key", "x: ${oc.select:1}\n"),
    # ---- oc.decode
    case("decode_int", "x: ${oc.decode:'123'}\n"),
    case("decode_neg_int", "x: ${oc.decode:'-5'}\n"),
    case("decode_underscore_int", "x: ${oc.decode:'1_000'}\n"),
    case("decode_float", "x: ${oc.decode:'3.5'}\ny: ${oc.decode:'1e3'}\nz: ${oc.decode:'.5'}\nw: ${oc.decode:'1.'}\n"),
    case("decode_inf", "x: ${oc.decode:'inf'}\ny: ${oc.decode:'-Inf'}\n"),
    case("decode_bool", "x: ${oc.decode:'true'}\ny: ${oc.decode:'FALSE'}\n"),
    case("decode_null", "x: ${oc.decode:'null'}\ny: ${oc.decode:null}\n"),
    case("decode_str", "x: ${oc.decode:'abc'}\ny: ${oc.decode:'a b'}\n"),
    case("decode_trailing_space", "x: ${oc.decode:'1 '}\n"),
    case("decode_only_space_error", "x: ${oc.decode:' '}\n"),
    case("decode_list", "x: ${oc.decode:'[1, 2, three]'}\n"),
    case("decode_list_empty_items", "x: ${oc.decode:'[1,,2]'}\ny: ${oc.decode:'[,]'}\nz: ${oc.decode:'[1,]'}\n"),
    case("decode_empty_list", "x: ${oc.decode:'[]'}\ny: ${oc.decode:'[ ]'}\n"),
    case("decode_dict", "x: \"${oc.decode:'{a: 1, b: [2, 3], c: {d: x}}'}\"\n"),
    case("decode_dict_typed_keys", "x: \"${oc.decode:'{1: a, null: b, false: c, 1.5: d, 1_0: e}'}\"\n"),
    case("decode_dict_dup_keys", "x: \"${oc.decode:'{a: 1, b: 2, a: 3}'}\"\n"),
    case("decode_empty_dict", "x: ${oc.decode:'{}'}\n"),
    case("decode_colon_in_value", "x: \"${oc.decode:'{a: b: c}'}\"\n"),
    case("decode_interp", "a: 5\nx: ${oc.decode:'${a}'}\n"),
    case("decode_interp_list", "a: 5\nx: \"${oc.decode:'[${a}, x${a}]'}\"\n"),
    case("decode_from_node", "s: '[1, 2]'\nx: ${oc.decode:${s}}\n"),
    case("decode_from_env", "x: ${oc.decode:${oc.env:FLOTILLA_T_A}}\n", env={"FLOTILLA_T_A": "{a: 1}"}),
    case("decode_quoted", "x: ${oc.decode:'\"a,b\"'}\n"),
    case("decode_escapes", "x: ${oc.decode:'a\\,b\\ c\\:d'}\n"),
    case("decode_esc_backslash", "x: ${oc.decode:'a\\\\\\\\b'}\n"),
    case("decode_unquoted_chars", "x: ${oc.decode:'/a-b+c.d$e%f*g@h?i|j'}\n"),
    case("decode_nested_quotes", "x: ${oc.decode:'[\"a\", ''b'']'}\n"),
    case("decode_invalid_error", "x: ${oc.decode:'[1, 2'}\n"),
    case("decode_brace_error", "x: ${oc.decode:'}'}\n"),
    case("decode_int_arg_error", "x: ${oc.decode:5}\n"),
    case("decode_bad_char_error", "x: ${oc.decode:'a=b'}\n"),
    case("decode_leading_zero", "x: ${oc.decode:'0123'}\ny: ${oc.decode:'00.5'}\n"),
    case("decode_id_dash", "x: ${oc.decode:'a-1'}\ny: ${oc.decode:'-a'}\n"),
    case("decode_keywordish", "x: ${oc.decode:'trueish'}\ny: ${oc.decode:'nullx'}\nz: ${oc.decode:'infinity'}\n"),
    case("decode_exponent_forms", "x: ${oc.decode:'1e5'}\ny: ${oc.decode:'1.e5'}\nz: ${oc.decode:'1e'}\nw: ${oc.decode:'2E-3'}\n"),
    case("decode_empty_error", "x: ${oc.decode:''}\n"),
    case("decode_then_select_error", "a: \"${oc.decode:'{x: 1}'}\"\nb: ${a.x}\n"),
    # ---- resolver argument grammar (through oc.create / oc.decode / oc.select defaults)
    case("args_list_typed", "x: '${oc.create:[1, 1.5, true, null, abc, \"q\"]}'\n"),
    case("args_dict", "x: '${oc.create:{a: 1, b: {c: [2]}}}'\n"),
    case("args_whitespace", "x: '${oc.create:[ 1 , 2 ,3 ]}'\n"),
    case("args_multiword", "x: '${oc.select:nope, hello world }'\n"),
    case("args_colon_value", "x: '${oc.select:nope,a:b}'\n"),
    case("args_quoted_escape", "x: \"${oc.select:nope,'it\\\\'s'}\"\n"),
    case("args_quoted_double_escape", "x: '${oc.select:nope,\"say \\\"hi\\\"\"}'\n"),
    case("args_quoted_double_backslash_error", "x: '${oc.select:nope,\"say \\\\\"hi\\\\\"\"}'\n"),
    case("args_quoted_single_in_double", "x: '${oc.select:nope,\"it''s\"}'\n"),
    case("args_quoted_dollar", "x: '${oc.select:nope,\"$5 and $\"}'\n"),
    case("args_quoted_empty", "x: \"${oc.select:nope,''}\"\n"),
    case("args_nested_list_dict", "x: '${oc.create:[[1, [2]], {a: [3, {b: 4}]}]}'\n"),
    case("args_bool_null_case", "x: '${oc.create:[TRUE, False, NULL, Null]}'\n"),
    case("args_dict_key_spaces", "x: '${oc.create:{a b: 1, c\\ d: 2}}'\n"),
    case("mixed_relative_in_referenced_list", "a: {v: 5, l: ['${..v}', '${.0}']}\nb: ${a.l}\n"),
    case("str_interp_of_list_with_missing", "l: [1, '???']\nout: 'l=${l}'\n"),
    case("str_nested_containers", "d: {a: {b: [1, {c: null}]}}\nout: 'd=${d}'\n"),
    case("float_special_values", "a: .inf\nb: -.inf\nout: '${a} ${b}'\n"),
    case("float_yaml_forms", "a: 1e3\nb: 1.5E-7\nc: 10.0\nout: '${a} ${b} ${c}'\n"),
    case("args_quoted_interp", "a: 1\nx: \"${oc.select:nope,'v=${a}'}\"\n"),
    case("args_quoted_single_interp_str", "a: 1\nx: \"${oc.select:nope,'${a}'}\"\n"),
    case("args_quoted_escaped_interp", "x: \"${oc.select:nope,'\\\\${a}'}\"\n"),
    case("args_quoted_trailing_backslashes", "x: \"${oc.select:nope,'a\\\\\\\\'}\"\n"),
    case("args_quoted_concat_error", "x: \"${oc.select:nope,'a'b}\"\n"),
    case("args_primitive_interp_concat", "a: 1\nx: '${oc.select:nope,v${a}w}'\n"),
    case("args_unknown_char_error", "x: '${oc.select:nope,a#b}'\n"),
    case("args_esc_sequences", "x: '${oc.select:nope,a\\,b\\(c\\)\\[d\\]\\{e\\}\\=f}'\n"),
    case("args_float_key_dict", "x: '${oc.create:{1.5: a}}'\n"),
    # ---- oc.create, oc.dict, oc.deprecated
    case("create_dict", "x: '${oc.create:{a: 1}}'\n"),
    case("create_list_interp", "b: {c: 1}\nx: '${oc.create:[1, ${b}]}'\n"),
    case("create_null", "x: ${oc.create:null}\n"),
    case("create_int_error", "x: ${oc.create:5}\n"),
    case("create_then_select", "a: '${oc.create:{x: 1}}'\nb: ${a.x}\n"),
    case("dict_keys", "x: {p: 1, q: 2}\nk: ${oc.dict.keys:x}\n"),
    case("dict_values", "x: {p: 1, q: '${y}'}\ny: 7\nv: ${oc.dict.values:x}\n"),
    case("dict_values_in_string", "x: {p: 1, q: '???'}\nv: 'vals=${oc.dict.values:x}'\n"),
    case("dict_values_missing_error", "x: {p: 1, q: '???'}\nv: ${oc.dict.values:x}\n"),
    case("dict_values_relative", "a: {x: {p: 1}, v: '${oc.dict.values:.x}', s: 's=${oc.dict.values:.x}'}\n"),
    case("dict_values_select_item", "x: {p: 1, q: '${y}'}\ny: 7\nv: ${oc.dict.values:x}\nw: ${v.1}\n"),
    case("dict_values_self_cycle", "t: ${oc.dict.values:w}\nw: {v: '${oc.dict.values:w}'}\n"),
    case("dict_keys_in_string", "x: {p: 1, q: 2}\nk: 'keys=${oc.dict.keys:x}'\n"),
    case("select_bracket_only_key_error", "x: '${oc.select:[,1}'\n"),
    case("select_key_is_bracket_error", "k: '['\nx: '${oc.select:${k},1}'\n"),
    case("node_key_is_bracket_error", "k: '['\nx: '${${k}}'\n"),
    case("dict_keys_not_dict_error", "x: [1]\nk: ${oc.dict.keys:x}\n"),
    case("dict_keys_missing_error", "k: ${oc.dict.keys:nope}\n"),
    case("deprecated_redirect", "x: 5\nold: ${oc.deprecated:x}\n"),
    case("deprecated_missing_error", "old: ${oc.deprecated:nope}\n"),
    # ---- hydra / flotilla
    case("hydra_select", "hydra: {job: {name: train}}\nname: ${hydra:job.name}\n"),
    case("hydra_in_string", "hydra: {run: {dir: out}}\np: '${hydra:run.dir}/ckpt'\n"),
    case("hydra_missing_null", "hydra: {job: {}}\nname: ${hydra:job.nope}\n"),
    case("hydra_node_interp", "hydra: {job: {name: '${task}'}}\ntask: t1\nname: ${hydra:job.name}\n"),
    case("hydra_dict", "hydra: {job: {a: 1, b: 2}}\nj: ${hydra:job}\n"),
    case("flotilla_select", "hydra: {job: {name: train}}\nname: ${flotilla:job.name}\n"),
    case("hydra_direct_ref", "hydra: {job: {name: run1}}\nname: ${hydra.job.name}\n"),
    # ---- errors: cycles, parents, unknown resolvers, syntax
    case("cycle_self", "a: ${a}\n"),
    case("cycle_two", "a: ${b}\nb: ${a}\n", contains="recursive interpolation"),
    case("cycle_three_string", "a: x${b}\nb: y${c}\nc: z${a}\n"),
    case("cycle_nested_key", "a: ${b.${a}}\nb: {}\n"),
    case("parent_ref", "a: {b: '${a}'}\n"),
    case("parent_ref_root_list", "l: ['${l}']\n"),
    case("container_cycle", "a: ['${b}']\nb: {x: '${a}'}\n"),
    case("unknown_resolver", "a: ${oc.evn:HOME}\n", contains="did you mean 'oc.env'"),
    case("unknown_resolver_plain", "a: ${foo:1}\n"),
    case("syntax_unclosed", "a: ${foo\nb: 1\n"),
    case("syntax_double_dot", "a: ${a..b}\n"),
    case("syntax_trailing_dot", "a: ${a.}\n"),
    case("syntax_only_dot", "a: ${.}\n"),
    case("syntax_empty", "a: ${}\n"),
    case("syntax_space_in_key", "x: 1\na: ${x .y}\n"),
    case("syntax_adjacent_keys", "a: ${a${b}}\n"),
    case("syntax_resolver_bad_name", "a: ${a[0]:x}\n"),
    case("syntax_resolver_unclosed", "a: ${oc.env:X\n"),
    case("syntax_paren_in_key", "a: ${f(x)}\n"),
    case("syntax_nested_unclosed", "a: ${a.${b}\n"),
    case("syntax_in_list_item", "l: [1, '${x']\n"),
    case("resolver_no_args_colon_space", "a: '${oc.select: }'\n"),
    # ---- mixed trees
    case("mixed_tree",
         """
         trainer:
           lr: 0.001
           epochs: 3
           name: run-${trainer.epochs}
         model:
           lr: ${trainer.lr}
           layers: ['${trainer.epochs}', 4, '${..lr}']
           tag: '${model.layers}'
           opt: {lr: '${..lr}', eps: 1e-8}
         data: ???
         out: '${oc.select:data,none}/${trainer.name}'
         """),
    case("interp_into_list_of_interps", "a: ['${b}', '${c}']\nb: 1\nc: two\nd: ${a}\ne: 'a=${a}'\n"),
    case("dict_of_interps_referenced_twice", "a: {x: '${y}'}\ny: 2\nb: ${a}\nc: ${a}\n"),
    case("deep_chain_ok", "".join(f"a{i}: ${{a{i - 1}}}\n" if i else "a0: 1\n" for i in range(30))),
]


def encode(value):
    """JSON-safe copy of a to_container result."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else str(k)): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    return value


def first_line(exc):
    return str(exc).split("\n")[0]


def run_case(c):
    saved = {k: os.environ.get(k) for k in c["env"]}
    os.environ.update(c["env"])
    try:
        out = {"name": c["name"], "yaml": c["yaml"], "env": c["env"]}
        try:
            cfg = OmegaConf.create(c["yaml"])
        except Exception as exc:  # grammar errors are raised when the config is created
            out["input"] = encode(yaml.load(c["yaml"], Loader=get_yaml_loader()))
            out["error"] = f"{type(exc).__name__}: {first_line(exc)}"
        else:
            out["input"] = encode(OmegaConf.to_container(cfg, resolve=False))
            try:
                out["result"] = encode(OmegaConf.to_container(cfg, resolve=True))
            except Exception as exc:
                out["error"] = f"{type(exc).__name__}: {first_line(exc)}"
        if c["contains"]:
            out["rust_contains"] = c["contains"]
        return out
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    names = [c["name"] for c in CASES]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        sys.exit(f"duplicate case names: {sorted(dupes)}")
    for c in CASES:
        for k in c["env"]:
            if not k.startswith("FLOTILLA_T_"):
                sys.exit(f"{c['name']}: env var names must start with FLOTILLA_T_")
    bad = []
    for c in CASES:
        try:
            yaml.load(c["yaml"], Loader=get_yaml_loader())
        except yaml.YAMLError as exc:
            bad.append(f"{c['name']}: {first_line(exc)} {str(exc).splitlines()[-2:]}")
    if bad:
        sys.exit("cases that are not valid YAML:\n" + "\n".join(bad))
    for k in list(os.environ):
        if k.startswith("FLOTILLA_T_"):
            del os.environ[k]
    records = [run_case(c) for c in CASES]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")
    errors = sum("error" in r for r in records)
    print(f"wrote {len(records)} cases ({errors} errors) to {OUT}")


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    main()
