"""Records what hydra-core 1.3.8's override parser does with a fixed list of overrides.

Run with the project's virtual environment (it has hydra-core 1.3.8):

    .venv/bin/python tests/oracle/record_overrides.py

Writes tests/oracle/fixtures/overrides.json, which the unit tests of
src/config/overrides.rs replay against the Rust parser. Each record is either

    {"input", "error"}                      Hydra refuses the override, or
    {"input", "kind", "key_or_group", "package", "key_element", "value_type", "is_sweep",
     "is_discrete_sweep", "value_str", "value_str_error", "value", "sweep_strings",
     "sweep_error", "shuffled", "random"}

Values are encoded as JSON with the types kept apart: ints as JSON integers ({"bigint": "..."}
beyond 64 bits), floats as {"float": repr(x)}, QuotedString as {"quoted": text, "quote": q},
dicts as {"dict": [[key, value], ...]} (keys keep their Python type), and sweeps as
{"choice": ...}, {"range": ...}, {"interval": ...} or {"glob": ...}. Sweep strings are what
Hydra's BasicSweeper puts into job overrides (sweep_string_iterator); globs are filtered over
GLOB_OPTIONS. Shuffled sweeps are recorded sorted, with "shuffled": true; a value holding a
list shuffled while parsing (shuffle([1,2,3])) is flagged "random": true and compared by the
multiset of its characters.
"""
import json
import os
import re
import sys

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    Glob,
    IntervalSweep,
    QuotedString,
    Quote,
    RangeSweep,
)

GLOB_OPTIONS = sorted(["adam", "adamw", "sgd", "lion"])

CASES = [
    # ---- keys --------------------------------------------------------------------------------
    "a=1",
    "a.b.c=1",
    "a/b=x",
    "a/b/c=x",
    "a/b@c.d=x",
    "a/b/c@x=y",
    "db@pkg=mysql",
    "db@=mysql",
    "db@_global_=mysql",
    "db@_global_.x=mysql",
    "db@$pkg=mysql",
    "a-b=1",
    "a_b-c=1",
    "$a=1",
    "a$b=1",
    "a.b-c.$d=1",
    "1.2=3",
    "a.1=3",
    "a.0.b=3",
    "_a=1",
    "=5",
    "@pkg=1",
    "+=1",
    "hydra.run.dir=/tmp/x",
    "hydra/launcher=basic",
    # key errors
    "group@pkg1:pkg2=x",
    "/abs=1",
    "/abs/group=x",
    "1=2",
    "a b=1",
    "a..b=1",
    "a.=1",
    "a/=1",
    "a/b.c=1",
    "a/$b=1",
    "a@b@c=1",
    "a@b/c=1",
    "a",
    "a:b=1",
    "é=1",
    # ---- override kinds -----------------------------------------------------------------------
    "+a=1",
    "++a=1",
    "+a.b=[1,2]",
    "++db@pkg=x",
    "~a",
    "~a=1",
    "~a=",
    "~db@pkg",
    "~",
    "~=1",
    "+a",
    "+++a=1",
    "~+a",
    "+~a=1",
    "~~a",
    # ---- primitives ---------------------------------------------------------------------------
    "a=abc",
    "a=10",
    "a=-5",
    "a=+3",
    "a=0",
    "a=-0",
    "a=1_000",
    "a=1_000_000",
    "a=1__0",
    "a=0_1",
    "a=01",
    "a=99999999999999999999",
    "a=3.14",
    "a=-20.0",
    "a=1e-4",
    "a=1E5",
    "a=1e+5",
    "a=-1.5e-3",
    "a=.5",
    "a=5.",
    "a=-.5",
    "a=1.e5",
    "a=1_000.5",
    "a=1e1_0",
    "a=00.5",
    "a=inf",
    "a=-inf",
    "a=+Inf",
    "a=INF",
    "a=nan",
    "a=NaN",
    "a=-nan",
    "a=infinity",
    "a=nana",
    "a=1e",
    "a=1.2.3",
    "a=1e999",
    "a=true",
    "a=false",
    "a=True",
    "a=TRUE",
    "a=fAlSe",
    "a=trueish",
    "a=True-x",
    "a=null",
    "a=NULL",
    "a=Null",
    "a=None",
    "a=nullx",
    "a=/a/b/c",
    "a=./x.yaml",
    "a=a-b_c",
    "a=x%y*z@w?v|u",
    "a=1:2",
    "a=:",
    "a= : ",
    "a=x :",
    "a=http://x.com:80/p",
    "a=${x}",
    "a=${x.y}",
    "a=${oc.env:USER,me}",
    "a=${x}y${z}",
    "a=pre_${x}",
    "a=${a.${b}}",
    "a=${}",
    "a=${",
    "a=",
    "a= ",
    "a=  x  ",
    "a=x y",
    "a=  x  y  ",
    "a=x\ty",
    "a=1 2",
    "a=true false",
    "a=-",
    "a=+",
    "a=--x",
    "a=\\",
    "a=\\n",
    "a=\\\\",
    "a=\\,",
    "a=\\,\\,",
    "a=x\\,y",
    "a=x\\ ",
    "a=\\ x",
    "a=\\(\\)\\[\\]\\{\\}\\:\\=",
    "a=\\\t",
    "a=b=c",
    "a=b\\=c",
    "a=é",
    "a=x!",
    "a=#x",
    "a=x;y",
    "a=`x`",
    # ---- quoted strings -----------------------------------------------------------------------
    "a='abc'",
    'a="abc"',
    "a=''",
    'a=""',
    "a='a b'",
    "a='a,b'",
    "a='[1,2]'",
    "a='${x}'",
    "a='true'",
    "a='5'",
    "a='null'",
    "a='it\\'s'",
    "a=\"it's\"",
    "a='say \"hi\"'",
    'a="say \\"hi\\""',
    "a='x\\\\'",
    'a="x\\\\"',
    "a='\\\\'",
    "a='\\\\\\\\'",
    "a='a\\\\\\'b'",
    "a='a\\nb'",
    "a='a\\\\b'",
    "a=\"it\\'s\"",
    'a="${oc.env:USER,"me"}"',
    "a='${foo:\"bar\"}'",
    "a='x' ",
    "a= 'x'",
    "a='x'y",
    "a='x''y'",
    "a='abc",
    'a="abc"def"',
    "a='é'",
    "a='a\tb'",
    # ---- lists and dicts ----------------------------------------------------------------------
    "a=[]",
    "a=[1,2,3]",
    "a=[1, 2, 3]",
    "a=[ 1 , 2 ]",
    "a=[a,[b,c],{d:1}]",
    "a=[a,'b',\"c\"]",
    "a=[true,null,1.5,x]",
    "a=[[[]]]",
    "a=[a b,c]",
    "a=[${x},${y}]",
    "a=[1,2",
    "a=[1,,2]",
    "a=[,]",
    "a=[1,]",
    "a=[1] ",
    "a=[1]x",
    "a=]",
    "a={}",
    "a={a:1}",
    "a={a:1,b:[1,2],c:{d:e}}",
    "a={a: 1, b: 2}",
    "a={ a : 1 }",
    "a={a b:1, c-d:2, \\,:3}",
    "a={1:a,1.0:b}",
    "a={true:1}",
    "a={1:x,true:y}",
    "a={null:1}",
    "a={1.5:x,-3:y,NULL:z}",
    "a={1e-5:x,inf:y}",
    "a={a:1,a:2}",
    "a={a:'x'}",
    "a={/a/b:1}",
    "a={a.b:1}",
    "a={${x}:1}",
    "a={'a':1}",
    "a={a:}",
    "a={:1}",
    "a={a:1,}",
    "a={a}",
    "a={a:1",
    "a={a:1:2}",
    "a={a:b:c}",
    # ---- simple choice sweeps -----------------------------------------------------------------
    "a=1,2,3",
    "a=x,y",
    "a=x, y ,z",
    "a='a,b',c",
    "a='a b',c",
    "a=[1,2],[3]",
    "a={x:1},{y:2}",
    "a=null,true,1.5,s",
    "a=1,",
    "a=,1",
    "a=1,,2",
    "a=1.0,1e-5,inf",
    "a=x\\,y,z",
    # ---- choice -------------------------------------------------------------------------------
    "a=choice(1,2,3)",
    "a=choice(a,b)",
    "a=choice('a b',c)",
    "a=choice([1,2],[3])",
    "a=choice({a:1},x)",
    "a=choice(x)",
    "a=choice()",
    "a=choice (1,2)",
    "a=choice( 1 , 2 )",
    "a=choice(null,1)",
    "a=choice(choice(1,2))",
    "a=choice(int(1,2))",
    "a=choice(shuffle(a,b))",
    "a=choice(range(1,3))",
    "a=choice(a,b,x=1)",
    "a=choice(args=1)",
    "a=choice(1,2",
    "a=choice(1,2) ",
    "a=choice(1,2)x",
    "a=choice(1,2),3",
    "a=foo(1)",
    "a=extend_list(1,2)",
    "a=json_str(1)",
    "a=x(",
    "a=x y(1)",
    "a=true(1)",
    # ---- range --------------------------------------------------------------------------------
    "a=range(1,5)",
    "a=range(5)",
    "a=range(0)",
    "a=range(1,5,2)",
    "a=range(5,0,-1)",
    "a=range(5,0,-2)",
    "a=range(0,5,-1)",
    "a=range(start=1,stop=3)",
    "a=range(stop=3,start=1)",
    "a=range(1,step=2,stop=6)",
    "a=range(1,null)",
    "a=range(start=4)",
    "a=range(true,3)",
    "a=range(0,1,0.25)",
    "a=range(0,1,0.1)",
    "a=range(0,2,0.3)",
    "a=range(0.1,0.5,0.1)",
    "a=range(1.5,0,-0.3)",
    "a=range(1,2.5)",
    "a=range(2.5)",
    "a=range(-0.0,1,0.5)",
    "a=range(0,1e-3,1e-4)",
    "a=range(0,10,inf)",
    "a=range(1,5,0)",
    "a=range(0,1,0.0)",
    "a=range(0,1,nan)",
    "a=range()",
    "a=range(1,2,3,4)",
    "a=range(1,start=2)",
    "a=range(a)",
    "a=range('1',3)",
    "a=range(1,5,null)",
    "a=range(stop=3)",
    "a=range(1,x=2)",
    "a=range(start=1,3)",
    "a=range(1,3)a",
    # ---- interval -----------------------------------------------------------------------------
    "a=interval(0,1)",
    "a=interval(0.5,1.5)",
    "a=interval(-1e-3,1e3)",
    "a=interval(start=1,end=2)",
    "a=interval(1)",
    "a=interval(a,b)",
    "a=interval(1,2,3)",
    "a=interval(0,1),2",
    # ---- glob ---------------------------------------------------------------------------------
    "opt=glob(*)",
    "opt=glob(a*)",
    "opt=glob(*w)",
    "opt=glob(?gd)",
    "opt=glob([a*,s*])",
    "opt=glob([a*,s*],exclude=adamw)",
    "opt=glob(*,exclude=[a*,l*])",
    "opt=glob(include=*,exclude=*w)",
    "opt=glob(a*,exclude=[])",
    "opt=glob([])",
    "opt=glob(\\[a-l\\]*)",
    "opt=glob('[!a]*')",
    "opt=glob('[!a-l]*')",
    "opt=glob('[z-a]*')",
    "opt=glob('[]a]*')",
    "opt=glob('[a-]*')",
    "opt=glob('*[')",
    "opt=glob('a**m')",
    "opt=glob(nomatch)",
    "opt=glob(adam)",
    "opt=glob()",
    "opt=glob(1)",
    "opt=glob(a,b,c)",
    "opt=glob(['a*'])",
    "opt=glob([1])",
    # ---- sort / shuffle / tag -----------------------------------------------------------------
    "a=sort(3,1,2)",
    "a=sort(b,a,c)",
    "a=sort(3,1,2,reverse=true)",
    "a=sort(b,a,reverse=true)",
    "a=sort([3,1,2])",
    "a=sort([3,1,2],reverse=true)",
    "a=sort(list=[3,1,2])",
    "a=sort(list=[b,a],reverse=true)",
    "a=sort(choice(3,1,2))",
    "a=sort(choice(1,1.0,true,0))",
    "a=sort(choice(1,1.0,true,0),reverse=true)",
    "a=sort(sweep=choice(b,a))",
    "a=sort(range(5,0,-1))",
    "a=sort(range(0,5),reverse=true)",
    "a=sort(range(0,1,0.25),reverse=true)",
    "a=sort(range(1,5))",
    "a=sort(5)",
    "a=sort(x)",
    "a=sort({b:1})",
    "a=sort([[2,1],[1,2],[1]])",
    "a=sort(1.5,1,true)",
    "a=sort(1,a)",
    "a=sort(['b','a'])",
    "a=sort([1,[2]])",
    "a=sort([a,null])",
    "a=sort([{a:1},{b:2}])",
    "a=sort()",
    "a=sort(null)",
    "a=sort(1,2,reverse=1)",
    "a=sort(1,[2])",
    "a=sort(interval(0,1))",
    "a=shuffle(1,2,3)",
    "a=shuffle(a,b)",
    "a=shuffle(choice(a,b,c))",
    "a=shuffle(range(1,4))",
    "a=shuffle(sweep=choice(a,b))",
    "a=shuffle(5)",
    "a=shuffle(x)",
    "a=shuffle(list=[1])",
    "a=shuffle([7])",
    "a=shuffle([1,2,3])",
    "a=shuffle()",
    "a=shuffle(null)",
    "a=shuffle(interval(0,1))",
    "a=tag(log,interval(0,1))",
    "a=tag(b,a,choice(1,2))",
    "a=tag(x,x,range(1,3))",
    "a=tag(choice(1,2))",
    "a=tag(x,sweep=choice(1,2))",
    "a=tag(sweep=choice(1,2))",
    "a=tag(x)",
    "a=tag()",
    "a=tag(x,1,choice(1,2))",
    "a=tag(choice(1,2),choice(3,4))",
    "a=tag(x,glob(*))",
    "a=tag(y,tag(x,choice(1,2)))",
    "a=sort(tag(x,choice(b,a)))",
    "a=shuffle(tag(x,choice(b,a)))",
    # ---- casts --------------------------------------------------------------------------------
    "a=int(5)",
    "a=int(1.9)",
    "a=int(-1.9)",
    "a=int('5')",
    "a=int(' 7 ')",
    "a=int('1_000')",
    "a=int('+5')",
    "a=int(true)",
    "a=int(x)",
    "a=int('1.5')",
    "a=int(inf)",
    "a=int(nan)",
    "a=int(null)",
    "a=int(1,2)",
    "a=int(1.5,2.5)",
    "a=int(value=5)",
    "a=int(5,value=6)",
    "a=int(5,value=null)",
    "a=int(value=null)",
    "a=int()",
    "a=int(foo=1)",
    "a=int([1.5,'2',[3.7]])",
    "a=int({a:1.5,b:[2.5]})",
    "a=int(choice(1.5,2.5))",
    "a=int(range(1,3))",
    "a=int(range(0,1,0.5))",
    "a=int(interval(0.5,1.5))",
    "a=int(tag(x,choice(1.5,2)))",
    "a=int(shuffle(1.5,2.5))",
    "a=int(glob(*))",
    "a=int(1,choice(2,3))",
    "a=float(5)",
    "a=float('1e-3')",
    "a=float(' 1_0.5 ')",
    "a=float('inf')",
    "a=float('-Infinity')",
    "a=float('nan')",
    "a=float(x)",
    "a=float('1__0')",
    "a=float(true)",
    "a=float(1,2)",
    "a=float(range(1,3))",
    "a=float(interval(0,1))",
    "a=float([1,2])",
    "a=float(null)",
    "a=str(5)",
    "a=str(1.5)",
    "a=str(1e-5)",
    "a=str(true)",
    "a=str(x)",
    "a=str('a b')",
    "a=str([1,[true]])",
    "a=str({a:1})",
    "a=str(1,2)",
    "a=str(range(1,3))",
    "a=str(interval(0,1))",
    "a=str(null)",
    "a=bool(0)",
    "a=bool(1)",
    "a=bool(0.0)",
    "a=bool(nan)",
    "a=bool(true)",
    "a=bool('True')",
    "a=bool(FALSE)",
    "a=bool(Yes)",
    "a=bool(null)",
    "a=bool([0,1,'true'])",
    "a=bool(range(0,2))",
    "a=bool(interval(0,1))",
    "a=bool(0,1)",
    # ---- nested sweeps (Hydra accepts them, then fails when they are used) ---------------------
    "a=[choice(1,2)]",
    "a={x:range(1,3)}",
    "a=choice(1,choice(2,3))",
    "a=1,choice(2,3)",
    "a=range(1,3),4",
    # ---- globs nested in values (Hydra renders them as {include: [...], exclude: [...]}) ------
    "a=[glob(*)]",
    "a={x:glob([a*,b],exclude=c)}",
    "a=1,glob(*)",
    "a=[glob([1,true])]",
    "a=[glob(['x'])]",
    "a=sort([glob(*)])",
    "a=shuffle ([glob(*)])",
    "a=str([glob(*)])",
    "a=int({k:glob(*)})",
    "a=bool([glob(*),0])",
    # ---- misc ---------------------------------------------------------------------------------
    "a=int(5)x",
    "a=[1,2]x",
]


def enc(v):
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else {"bigint": str(v)}
    if isinstance(v, float):
        return {"float": repr(v)}
    if isinstance(v, str):
        return v
    if isinstance(v, QuotedString):
        return {"quoted": v.text, "quote": "'" if v.quote == Quote.single else '"'}
    if isinstance(v, list):
        return [enc(x) for x in v]
    if isinstance(v, dict):
        return {"dict": [[enc(k), enc(x)] for k, x in v.items()]}
    if isinstance(v, ChoiceSweep):
        return {
            "choice": [enc(x) for x in v.list],
            "simple_form": v.simple_form,
            "shuffle": v.shuffle,
            "tags": sorted(v.tags),
        }
    if isinstance(v, RangeSweep):
        return {
            "range": [enc(v.start), enc(v.stop), enc(v.step)],
            "shuffle": v.shuffle,
            "tags": sorted(v.tags),
        }
    if isinstance(v, IntervalSweep):
        return {"interval": [enc(v.start), enc(v.end)], "tags": sorted(v.tags)}
    if isinstance(v, Glob):
        return {"glob": {"include": [enc(x) for x in v.include], "exclude": [enc(x) for x in v.exclude]}}
    return {"unknown": repr(v)}


def record(parser, s):
    try:
        o = parser.parse_overrides([s])[0]
    except Exception as e:  # noqa: BLE001 - any failure is a refusal
        return {"input": s, "error": f"{type(e).__name__}: {e}"}
    rec = {
        "input": s,
        "kind": {"CHANGE": "change", "ADD": "add", "FORCE_ADD": "force_add", "DEL": "delete"}[o.type.name],
        "key_or_group": o.key_or_group,
        "package": o.package,
        "key_element": o.get_key_element(),
        "value_type": o.value_type.name if o.value_type is not None else None,
        "is_sweep": o.is_sweep_override(),
        "is_discrete_sweep": o.is_discrete_sweep(),
        "value_str": None,
        "value_str_error": None,
        "value": enc(o._value),
        "sweep_strings": None,
        "sweep_error": None,
        "shuffled": False,
        "random": False,
    }
    if re.search(r"shuffle\s*\(", s) and not getattr(o._value, "shuffle", False):
        # shuffle(list) shuffles while parsing: only the characters are reproducible.
        rec["random"] = True
    if not o.is_sweep_override():
        try:
            rec["value_str"] = o.get_value_element_as_str()
        except Exception as e:  # noqa: BLE001
            rec["value_str_error"] = f"{type(e).__name__}: {e}"
    if o.is_discrete_sweep():
        try:
            if isinstance(o._value, Glob):
                strings = o._value.filter(GLOB_OPTIONS)
            else:
                strings = list(o.sweep_string_iterator())
            if getattr(o._value, "shuffle", False):
                strings = sorted(strings)
                rec["shuffled"] = True
            rec["sweep_strings"] = strings
        except Exception as e:  # noqa: BLE001
            rec["sweep_error"] = f"{type(e).__name__}: {e}"
    return rec


def main():
    import hydra

    assert hydra.__version__ == "1.3.8", hydra.__version__
    assert len(CASES) == len(set(CASES)), "duplicate cases"
    parser = OverridesParser.create()
    records = [record(parser, s) for s in CASES]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "overrides.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(
            {"hydra_version": hydra.__version__, "glob_options": GLOB_OPTIONS, "cases": records},
            f,
            indent=1,
            ensure_ascii=False,
        )
        f.write("\n")
    n_err = sum(1 for r in records if "error" in r)
    print(f"wrote {len(records)} cases ({n_err} errors) to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
