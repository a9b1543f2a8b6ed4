#!/usr/bin/env python3
"""Records how OmegaConf.to_yaml writes values (quoting, folding, floats, nesting) into
tests/oracle/fixtures/yaml_emit.json; flotilla's YAML writer is checked against it."""
import json
import os

from omegaconf import OmegaConf

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = "very long string " * 6 + "end"
STRINGS = [
    "plain", "line1\nline2\n", "a\nb", "trailing ", " lead", "x: y", "a #b", "#c", "multi\n\nblank",
    "tab\there", "é", "- a", "-a", "?", ":x", "a:b", "[x", "x]", "{", "null", "~", "", "@x", "%x",
    "!x", "*x", "&x", "|x", ">x", "a,b", '"q"', "it's", "back\\slash", LONG, LONG + " ", "1.0", "inf",
    "NaN", "1_000", "0x1F", "010", " 5", "y", "n", "Off", "yes", "TRUE", "2024-01-15", "2024-01-15T10:00:00",
    "12:30", "1:30", "---", "...", "a\x07b", "=", "<<", "${a.b}", "${oc.env:HOME}", "\\${x}", "???",
    "1e5", "1e-4", ".5", "5.", "+1", "-3", "0", "a: b: c", "key:", "http://x.y/z", "%d-%m",
    "word " * 30, "a  b", "x\ty", "'single'", "mixed 'q' \"d\"", "tail\n", "\nlead", "a\n b",
    "ünïcödé " * 12, "a" * 100, "true story", "on the fly", "2001:db8::1", "v1.2.3", "1.2.3",
    "-", "--", "- ", "[]", "{}", "a]b", "a}b", "a,", "@", "`x", "x`", "1_2_3", "_1", "1__2",
]
DOCS = [
    {"k": 1, "f": 1e-5, "big": 1e16, "neg": -0.5, "inf": float("inf"), "ninf": float("-inf"),
     "b": True, "n": None, "e": [], "d": {}},
    {"n": {"deep": {"x": LONG}}, "l": [LONG, [LONG]], "q": LONG + " ", "m": "a\nb c"},
    {"list": [1, [2, 3], {"a": 1, "b": [4, 5]}, [], {}, [[6]]], "y": {"n": "y"}},
    {"key " + LONG: 1, "2024-01-01": "date key", "1": "one", "true": "t"},
    {"nested": [{"a": {"b": [1, 2]}, "c": 3}, {"d": [{"e": 1}]}]},
]


def main():
    cases = [{"doc": {"k": s}, "yaml": OmegaConf.to_yaml({"k": s})} for s in STRINGS]
    cases += [{"doc": {"s": s, "n": {"inner": s}, "l": [s]}, "yaml": OmegaConf.to_yaml({"s": s, "n": {"inner": s}, "l": [s]})} for s in STRINGS]
    for d in DOCS:
        cases.append({"doc": d, "yaml": OmegaConf.to_yaml(d)})
    def enc(o):
        if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
            return {"__float__": repr(o)}
        if isinstance(o, dict):
            return {k: enc(v) for k, v in o.items()}
        if isinstance(o, list):
            return [enc(v) for v in o]
        return o
    out = [{"doc": enc(c["doc"]), "yaml": c["yaml"]} for c in cases]
    with open(os.path.join(HERE, "fixtures", "yaml_emit.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(out)} cases")


if __name__ == "__main__":
    main()
