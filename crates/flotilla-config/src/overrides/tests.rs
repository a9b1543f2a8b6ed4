//! Tests of the override grammar: the Hydra oracle fixture, targeted cases (errors, keys,
//! primitive typing, containers, sweeps, nesting limits, quoting) and property tests.

use super::parser::MAX_DEPTH;
use super::types::is_escapable;
use super::*;
use crate::node::{python_float_repr, Dict, Node, Value};
use proptest::prelude::*;
use serde_json::{json, Value as J};

fn parse(text: &str) -> Override {
    parse_override_seeded(text, 7).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn elem(text: &str) -> Element {
    match parse(text).value {
        Some(OverrideValue::Element(e)) => e,
        other => panic!("{text}: not an element: {other:?}"),
    }
}

fn strings(text: &str) -> Vec<String> {
    let options: Vec<String> = ["adam", "adamw", "lion", "sgd"].map(String::from).to_vec();
    parse(text)
        .sweep_value_strings_seeded(&options, 1)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
}

// ---- the JSON encoding used by tests/oracle/record_overrides.py -------------------------

fn enc_float(f: f64) -> J {
    json!({ "float": python_float_repr(f) })
}

fn enc_number(n: Number) -> J {
    match n {
        Number::Int(i) => J::from(i),
        Number::Float(f) => enc_float(f),
    }
}

fn enc_element(e: &Element) -> J {
    match e {
        Element::Null => J::Null,
        Element::Bool(b) => J::Bool(*b),
        Element::Int(i) => J::from(*i),
        Element::Float(f) => enc_float(*f),
        Element::Str(s) => J::String(s.clone()),
        Element::Quoted { text, quote } => {
            json!({ "quoted": text, "quote": quote.to_string() })
        }
        Element::List(items) => J::Array(items.iter().map(enc_element).collect()),
        Element::Dict(pairs) => json!({
            "dict": pairs.iter().map(|(k, v)| json!([k, enc_element(v)])).collect::<Vec<_>>()
        }),
    }
}

fn enc_value(v: &Option<OverrideValue>) -> J {
    match v {
        None => J::Null,
        Some(OverrideValue::Element(e)) => enc_element(e),
        Some(OverrideValue::Sweep(s)) => match s {
            Sweep::Choice {
                items,
                simple_form,
                shuffle,
                tags,
            } => json!({
                "choice": items.iter().map(enc_element).collect::<Vec<_>>(),
                "simple_form": simple_form, "shuffle": shuffle, "tags": tags
            }),
            Sweep::Range {
                start,
                stop,
                step,
                shuffle,
                tags,
            } => json!({
                "range": [enc_number(*start), enc_number(*stop), enc_number(*step)],
                "shuffle": shuffle, "tags": tags
            }),
            Sweep::Interval { start, end, tags } => {
                json!({ "interval": [enc_float(*start), enc_float(*end)], "tags": tags })
            }
            Sweep::Glob { include, exclude } => {
                json!({ "glob": { "include": include, "exclude": exclude } })
            }
        },
    }
}

/// Maps Hydra's encoding onto this module's documented representation: typed dict keys
/// become the strings Hydra prints for them, `True` in a range is the int 1, interval
/// bounds are floats, and a glob nested in a value is the dict OmegaConf makes of it.
fn normalize_oracle(v: &J) -> J {
    normalize_at(v, false)
}

fn normalize_at(v: &J, nested: bool) -> J {
    let py_str = |x: &J| -> J {
        match x {
            J::Bool(true) => J::from("True"),
            J::Bool(false) => J::from("False"),
            J::Number(n) => J::from(n.to_string()),
            J::Object(f) if f.contains_key("float") => f["float"].clone(),
            other => other.clone(),
        }
    };
    match v {
        J::Array(items) => J::Array(items.iter().map(|x| normalize_at(x, true)).collect()),
        J::Object(o) if o.contains_key("glob") && nested => {
            let part = |k: &str| {
                J::Array(
                    o["glob"][k]
                        .as_array()
                        .expect("patterns")
                        .iter()
                        .map(py_str)
                        .collect(),
                )
            };
            json!({ "dict": [["include", part("include")], ["exclude", part("exclude")]] })
        }
        J::Object(o) if o.contains_key("dict") => {
            let pairs = o["dict"].as_array().expect("dict pairs");
            let pairs: Vec<J> = pairs
                .iter()
                .map(|p| {
                    let key = match &p[0] {
                        J::Null => J::from("null"),
                        other => py_str(other),
                    };
                    json!([key, normalize_at(&p[1], true)])
                })
                .collect();
            json!({ "dict": pairs })
        }
        J::Object(o) if o.contains_key("range") => {
            let mut o = o.clone();
            let r: Vec<J> = o["range"]
                .as_array()
                .expect("range")
                .iter()
                .map(|x| match x {
                    J::Bool(b) => J::from(i64::from(*b)),
                    other => other.clone(),
                })
                .collect();
            o.insert("range".into(), J::Array(r));
            J::Object(o)
        }
        J::Object(o) if o.contains_key("interval") => {
            let mut o = o.clone();
            let r: Vec<J> = o["interval"]
                .as_array()
                .expect("interval")
                .iter()
                .map(|x| match x {
                    J::Number(n) => enc_float(n.as_f64().expect("number")),
                    J::Bool(b) => enc_float(f64::from(u8::from(*b))),
                    other => other.clone(),
                })
                .collect();
            o.insert("interval".into(), J::Array(r));
            J::Object(o)
        }
        J::Object(o) => J::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), normalize_at(v, nested)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The characters of `s`, sorted: what survives shuffling lists anywhere in a value.
fn sorted_chars(s: &str) -> String {
    let mut c: Vec<char> = s.chars().collect();
    c.sort_unstable();
    c.into_iter().collect()
}

fn value_type_name(o: &Override) -> J {
    J::from(match &o.value {
        None => return J::Null,
        Some(OverrideValue::Element(_)) => "ELEMENT",
        Some(OverrideValue::Sweep(Sweep::Choice {
            simple_form: true, ..
        })) => "SIMPLE_CHOICE_SWEEP",
        Some(OverrideValue::Sweep(Sweep::Choice { .. })) => "CHOICE_SWEEP",
        Some(OverrideValue::Sweep(Sweep::Range { .. })) => "RANGE_SWEEP",
        Some(OverrideValue::Sweep(Sweep::Interval { .. })) => "INTERVAL_SWEEP",
        Some(OverrideValue::Sweep(Sweep::Glob { .. })) => "GLOB_CHOICE_SWEEP",
    })
}

/// Whether refusing an override that Hydra parses is one of the documented divergences:
/// Hydra itself fails on it later (rendering or expanding it), or it holds an integer
/// beyond 64 bits.
fn documented_divergence(case: &J) -> bool {
    !case["sweep_error"].is_null()
        || !case["value_str_error"].is_null()
        || case["value"].to_string().contains("\"bigint\"")
}

#[test]
fn matches_hydra_oracle_fixture() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/oracle/fixtures/overrides.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fixture: J = serde_json::from_str(&text).expect("fixture JSON");
    let options: Vec<String> = fixture["glob_options"]
        .as_array()
        .expect("glob options")
        .iter()
        .map(|x| x.as_str().expect("option").to_string())
        .collect();
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 150, "only {} cases", cases.len());
    let mut failures = Vec::new();
    let mut diverged = Vec::new();
    for case in cases {
        let input = case["input"].as_str().expect("input");
        let ours = parse_override_seeded(input, 42);
        if let Some(err) = case.get("error") {
            if let Ok(o) = ours {
                failures.push(format!("{input:?}: Hydra refuses ({err}) but parsed {o:?}"));
            }
            continue;
        }
        let o = match ours {
            Ok(o) => o,
            Err(e) => {
                if documented_divergence(case) {
                    diverged.push(input.to_string());
                } else {
                    failures.push(format!("{input:?}: Hydra parses it but we fail: {e}"));
                }
                continue;
            }
        };
        let mut check = |what: &str, ours: J, theirs: &J| {
            if &ours != theirs {
                failures.push(format!("{input:?}: {what}: ours {ours} vs Hydra {theirs}"));
            }
        };
        let kind = match o.kind {
            OverrideKind::Change => "change",
            OverrideKind::Add => "add",
            OverrideKind::ForceAdd => "force_add",
            OverrideKind::Delete => "delete",
        };
        check("kind", J::from(kind), &case["kind"]);
        check(
            "key_or_group",
            J::from(o.key_or_group.clone()),
            &case["key_or_group"],
        );
        check("package", json!(o.package), &case["package"]);
        check(
            "key_element",
            J::from(o.key_element()),
            &case["key_element"],
        );
        check("value_type", value_type_name(&o), &case["value_type"]);
        check("is_sweep", J::from(o.is_sweep()), &case["is_sweep"]);
        check(
            "is_discrete_sweep",
            J::from(o.is_discrete_sweep()),
            &case["is_discrete_sweep"],
        );
        let shuffled = case["shuffled"].as_bool().unwrap_or(false);
        let random = case["random"].as_bool().unwrap_or(false);
        let theirs = normalize_oracle(&case["value"]);
        if random {
            if let Some(vs) = case["value_str"].as_str() {
                let ours = sorted_chars(&o.value_element_as_str());
                check(
                    "value_str characters",
                    J::from(ours),
                    &J::from(sorted_chars(vs)),
                );
            }
        } else {
            check("value", enc_value(&o.value), &theirs);
            if !case["value_str"].is_null() {
                check(
                    "value_str",
                    J::from(o.value_element_as_str()),
                    &case["value_str"],
                );
            }
        }
        if o.is_discrete_sweep() {
            match o.sweep_value_strings_seeded(&options, 3) {
                Ok(mut s) => {
                    if shuffled {
                        s.sort();
                    }
                    if random {
                        let theirs: Vec<String> = case["sweep_strings"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(|x| x.as_str())
                                    .map(String::from)
                                    .collect()
                            })
                            .unwrap_or_default();
                        check(
                            "sweep_strings characters",
                            J::from(sorted_chars(&s.concat())),
                            &J::from(sorted_chars(&theirs.concat())),
                        );
                    } else {
                        check("sweep_strings", json!(s), &case["sweep_strings"]);
                    }
                }
                Err(e) => {
                    if case["sweep_error"].is_null() {
                        failures.push(format!("{input:?}: sweep fails here only: {e}"));
                    }
                }
            }
        } else if !o.is_sweep() && o.sweep_value_strings(&options).is_ok() {
            failures.push(format!("{input:?}: enumerated a non-sweep"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The fixture holds 11 such cases on purpose; more would mean a regression.
    assert_eq!(diverged.len(), 11, "documented divergences: {diverged:?}");
}

// ---- targeted tests ----------------------------------------------------------------------

#[test]
fn error_messages_name_override_and_column() {
    let e = parse_override("a=[1,2").unwrap_err();
    assert_eq!(
        e.to_string(),
        "Error parsing override 'a=[1,2': missing ']' at column 6"
    );
    assert_eq!(e.column(), Some(6));
    assert_eq!(e.input(), "a=[1,2");
    let e = parse_override("a b=1").unwrap_err();
    assert_eq!(
        e.to_string(),
        "Error parsing override 'a b=1': unexpected character ' ' at column 1"
    );
    let e = parse_override("a=range(1,x)").unwrap_err();
    assert!(
        e.to_string().starts_with(
            "Error parsing override 'a=range(1,x)': TypeError while evaluating 'range(1,x)': \
         mismatch type argument stop: str"
        ),
        "{e}"
    );
    let e = parse_override("a=foo(1)").unwrap_err();
    assert!(e.message().contains("Unknown function 'foo'"), "{e}");
    let e = parse_override("group@pkg1:pkg2=x").unwrap_err();
    assert_eq!(e.column(), Some(10), "{e}");
    let e = parse_override("~+a").unwrap_err();
    assert!(
        e.message().contains("'~' cannot be combined with '+'"),
        "{e}"
    );
    let e = parse_override("a=range(start=1,3)").unwrap_err();
    assert!(
        e.message()
            .contains("positional argument follows keyword argument"),
        "{e}"
    );
    let e = parse(" a=range(1,5,0)".trim())
        .sweep_value_strings(&[])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "Error expanding sweep 'a=range(1,5,0)': range() arg 3 must not be zero"
    );
    let many = vec!["a=1".to_string(), "b=[".to_string()];
    assert_eq!(parse_overrides(&many).unwrap_err().input(), "b=[");
}

#[test]
fn keys_and_kinds() {
    let o = parse("++trainer/dist@_global_=ddp");
    assert_eq!(o.kind, OverrideKind::ForceAdd);
    assert_eq!(o.key_or_group, "trainer/dist");
    assert_eq!(o.package.as_deref(), Some("_global_"));
    assert_eq!(o.key_element(), "++trainer/dist@_global_");
    assert!(o.is_force_add() && !o.is_add() && !o.is_delete());
    let o = parse("~db");
    assert!(o.is_delete() && o.value.is_none() && o.value().is_none());
    assert_eq!(o.value_element_as_str(), "null");
    let o = parse("db@=x");
    assert_eq!(o.package.as_deref(), Some(""));
    assert_eq!(o.key_element(), "db@");
    assert!(parse("hydra.run.dir=x").is_hydra_override());
    assert_eq!(parse("a.b-c.$d=1").key_or_group, "a.b-c.$d");
    for bad in [
        "/abs=1", "1=2", "a..b=1", "a/b.c=1", "a=b=c", "+~a=1", "+++a=1",
    ] {
        assert!(parse_override(bad).is_err(), "{bad}");
    }
}

#[test]
fn primitive_typing() {
    assert_eq!(elem("a=1_000"), Element::Int(1000));
    assert_eq!(elem("a=+3"), Element::Int(3));
    assert_eq!(elem("a=-5"), Element::Int(-5));
    assert_eq!(elem("a=1e-4"), Element::Float(1e-4));
    assert_eq!(elem("a=.5"), Element::Float(0.5));
    assert_eq!(elem("a=5."), Element::Float(5.0));
    assert_eq!(elem("a=1_000.5"), Element::Float(1000.5));
    assert_eq!(elem("a=-Inf"), Element::Float(f64::NEG_INFINITY));
    assert!(matches!(elem("a=NaN"), Element::Float(f) if f.is_nan()));
    assert_eq!(elem("a=TRUE"), Element::Bool(true));
    assert_eq!(elem("a=NULL"), Element::Null);
    for s in [
        "1.2.3", "abc", "1e", "/a/b", "01", "0_1", "infinity", "1:2", "${x}",
    ] {
        assert_eq!(elem(&format!("a={s}")), Element::Str(s.to_string()), "{s}");
    }
    assert_eq!(elem("a=  x  y  "), Element::Str("x  y".into()));
    assert_eq!(elem("a="), Element::Str(String::new()));
    assert_eq!(elem("a=\\,\\ x\\\\"), Element::Str(", x\\".into()));
    assert_eq!(elem("a=x :"), Element::Str("x :".into()));
    assert_eq!(
        elem("a='it\\'s'"),
        Element::Quoted {
            text: "it's".into(),
            quote: '\''
        }
    );
    assert_eq!(elem("a='x\\\\'").as_override_str(), "'x\\\\'");
    assert_eq!(elem("a=x\\ ").as_override_str(), "x\\ ");
}

#[test]
fn containers_and_values() {
    let e = elem("a=[a,[b,c],{d:1}]");
    assert_eq!(e.as_override_str(), "[a,[b,c],{d:1}]");
    assert_eq!(elem("a={1:a,1.0:b,true:c}").as_override_str(), "{1:c}");
    assert_eq!(
        elem("a={null:1,1e-5:2}").as_override_str(),
        "{null:1,1e-05:2}"
    );
    assert_eq!(elem("a={a b:1}").as_override_str(), "{a\\ b:1}");
    assert_eq!(elem("a=[]"), Element::List(vec![]));
    assert_eq!(elem("a={}"), Element::Dict(vec![]));
    let v = parse("a=['x',1,{k:null}]").value().expect("a value");
    let mut d = Dict::new();
    d.insert("k".into(), Node::from(Value::Null));
    assert_eq!(
        v,
        Value::List(vec![
            Node::from(Value::Str("x".into())),
            Node::from(Value::Int(1)),
            Node::from(Value::Dict(d)),
        ])
    );
}

#[test]
fn sweeps_expand_like_the_basic_sweeper() {
    assert_eq!(strings("a='a,b',c"), ["'a,b'", "c"]);
    assert_eq!(strings("a=choice('a b',c)"), ["a\\ b", "c"]);
    assert_eq!(strings("a=true,1.0,[1,2]"), ["True", "1.0", "[1,2]"]);
    assert_eq!(strings("a=range(5)"), ["0", "1", "2", "3", "4"]);
    assert_eq!(strings("a=range(5,0,-2)"), ["5", "3", "1"]);
    assert_eq!(
        strings("a=range(0,1,0.1)"),
        [
            "0.0",
            "0.1",
            "0.2",
            "0.3",
            "0.4",
            "0.5",
            "0.6",
            "0.7000000000000001",
            "0.8",
            "0.9"
        ]
    );
    assert_eq!(
        strings("a=range(1.5,0,-0.3)"),
        [
            "1.5",
            "1.2",
            "0.9",
            "0.6",
            "0.30000000000000004",
            "5.5511151231151565e-17"
        ]
    );
    assert_eq!(strings("a=sort(range(5,0,-1))"), ["1", "2", "3", "4", "5"]);
    assert_eq!(strings("a=sort(b,c,a,reverse=true)"), ["c", "b", "a"]);
    assert_eq!(
        strings("a=sort(choice(1,1.0,true,0))"),
        ["0", "1", "1.0", "True"]
    );
    assert_eq!(strings("o=glob([a*,s*],exclude=adamw)"), ["adam", "sgd"]);
    assert_eq!(strings("o=glob('[!a-l]*')"), ["sgd"]);
    assert_eq!(strings("a=int(range(1,3))"), ["1", "2"]);
    assert_eq!(strings("a=float(1,2)"), ["1.0", "2.0"]);
    let o = parse("a=tag(log,b,interval(0,1))");
    assert!(o.is_interval_sweep() && !o.is_discrete_sweep());
    assert_eq!(o.sweep().expect("sweep").tags(), ["b", "log"]);
    assert!(o.sweep_value_strings(&[]).is_err());
    assert_eq!(o.value_element_as_str(), "tag(log,b,interval(0,1))");
    // Shuffles are reproducible for a given seed and keep the multiset.
    let o = parse("a=shuffle(range(10))");
    let options: Vec<String> = Vec::new();
    let first = o.sweep_value_strings_seeded(&options, 5).expect("values");
    assert_eq!(
        first,
        o.sweep_value_strings_seeded(&options, 5).expect("values")
    );
    let mut sorted = first.clone();
    sorted.sort_by_key(|s| s.parse::<i64>().expect("int"));
    assert_eq!(sorted, (0..10).map(|i| i.to_string()).collect::<Vec<_>>());
    // Python would hang on these; they are refused instead.
    assert!(parse("a=range(0,1e300,1e-300)")
        .sweep_value_strings(&[])
        .is_err());
    assert!(parse("a=range(-inf,0,1)").sweep_value_strings(&[]).is_err());
    assert!(parse("a=range(0,10000000000)")
        .sweep_value_strings(&[])
        .is_err());
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let ok = format!("a={}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse_override(&ok).is_ok());
    let deep = format!("a={}{}", "[".repeat(5000), "]".repeat(5000));
    assert!(parse_override(&deep).is_err());
    let calls = format!("a={}1{}", "int(".repeat(5000), ")".repeat(5000));
    assert!(parse_override(&calls).is_err());
    // Just inside the limit, evaluation, rendering and conversion still fit the 2 MiB
    // stack of a test thread in a debug build.
    let n = MAX_DEPTH - 1;
    for text in [
        format!("a={}1.5{}", "str(int(".repeat(n / 2), "))".repeat(n / 2)),
        format!("a={}1{}", "{k:".repeat(n), "}".repeat(n)),
        format!(
            "a={}[1]{}",
            "sort(shuffle(".repeat(n / 2),
            "))".repeat(n / 2)
        ),
        format!("a={}glob(*){}", "[".repeat(n - 3), "]".repeat(n - 3)),
    ] {
        let o = parse_override(&text).unwrap_or_else(|e| panic!("{e}"));
        let rendered = o.value_element_as_str();
        assert!(parse_override(&format!("a={rendered}")).is_ok());
        assert!(o.value().is_some());
    }
}

#[test]
fn quoting_round_trips_any_text() {
    for text in [
        "",
        "\\",
        "\\\\",
        "a'b",
        "a\\'b",
        "'",
        "\"",
        "x\\",
        "é ${x} \\n",
        "\\'\\",
    ] {
        for quote in ['\'', '"'] {
            let q = quote_string(text, quote);
            let back = elem(&format!("a={q}"));
            assert_eq!(
                back,
                Element::Quoted {
                    text: text.to_string(),
                    quote
                },
                "{q}"
            );
        }
    }
}

// ---- property tests ----------------------------------------------------------------------

/// Element equality where NaN equals NaN and -0.0 differs from 0.0.
fn same(a: &Element, b: &Element) -> bool {
    match (a, b) {
        (Element::Float(x), Element::Float(y)) => {
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        }
        (Element::List(x), Element::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Element::Dict(x), Element::Dict(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((k1, v1), (k2, v2))| k1 == k2 && same(v1, v2))
        }
        _ => a == b,
    }
}

fn is_keyword(s: &str) -> bool {
    ["true", "false", "null", "inf", "nan"]
        .iter()
        .any(|k| s.eq_ignore_ascii_case(k))
}

fn arb_element() -> impl Strategy<Value = Element> {
    let leaf = prop_oneof![
        Just(Element::Null),
        any::<bool>().prop_map(Element::Bool),
        any::<i64>().prop_map(Element::Int),
        any::<f64>().prop_map(Element::Float),
        prop_oneof![
            Just(f64::INFINITY),
            Just(f64::NAN),
            Just(-0.0),
            Just(1e16),
            Just(5e-324)
        ]
        .prop_map(Element::Float),
        "[a-zA-Z_][a-zA-Z0-9_ ,:=()\\[\\]{}$%*@?|/.+\\\\-]{0,8}"
            .prop_filter("keyword", |s| !is_keyword(s))
            .prop_map(Element::Str),
        (any::<String>(), prop_oneof![Just('\''), Just('"')])
            .prop_map(|(text, quote)| Element::Quoted { text, quote }),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Element::List),
            prop::collection::vec(("[a-z_][a-z0-9_ ,-]{0,5}", inner), 0..4).prop_map(|pairs| {
                let mut out: Vec<(String, Element)> = Vec::new();
                for (k, v) in pairs {
                    if !is_keyword(&k) && !out.iter().any(|(k2, _)| *k2 == k) {
                        out.push((k, v));
                    }
                }
                Element::Dict(out)
            }),
        ]
    })
}

/// Grammar-shaped value text: primitives, quotes, escapes, containers and function calls.
fn arb_value_text() -> impl Strategy<Value = String> {
    arb_value_text_with(true)
}

fn arb_value_text_with(functions: bool) -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        "[a-zA-Z_][a-zA-Z0-9_-]{0,5}",
        "[+-]?[0-9_]{1,4}(\\.[0-9_]{0,3})?([eE][+-]?[0-9]{1,3})?",
        prop_oneof![
            Just("true"),
            Just("FALSE"),
            Just("null"),
            Just("inf"),
            Just("-nan"),
            Just("${x.y}"),
            Just("${"),
            Just("\\,"),
            Just("\\ "),
            Just("\\\\"),
            Just(":"),
            Just("*"),
            Just("/a/b"),
            Just("'q'"),
            Just("\"d\\\"q\""),
            Just(" "),
            Just(""),
            Just("'a,b'"),
            Just("\\"),
            Just("="),
            Just("'")
        ]
        .prop_map(String::from),
    ];
    atom.prop_recursive(4, 48, 5, move |inner| {
        let func = prop_oneof![
            Just("choice"),
            Just("range"),
            Just("interval"),
            Just("glob"),
            Just("sort"),
            Just("shuffle"),
            Just("tag"),
            Just("int"),
            Just("float"),
            Just("str"),
            Just("bool"),
            Just("nope")
        ];
        let arg_name = prop_oneof![
            Just(""),
            Just(""),
            Just("value="),
            Just("reverse="),
            Just("sweep="),
            Just("list="),
            Just("start="),
            Just("stop="),
            Just("step="),
            Just("exclude=")
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec(("[a-z0-9]{1,3}", inner.clone()), 0..4).prop_map(|v| {
                let items: Vec<String> = v.into_iter().map(|(k, x)| format!("{k}:{x}")).collect();
                format!("{{{}}}", items.join(", "))
            }),
            (func, prop::collection::vec((arg_name, inner.clone()), 0..4)).prop_map(
                move |(f, args)| {
                    let items: Vec<String> =
                        args.into_iter().map(|(n, x)| format!("{n}{x}")).collect();
                    if functions {
                        format!("{f}({})", items.join(","))
                    } else {
                        format!("[{}]", items.join(","))
                    }
                }
            ),
            prop::collection::vec(inner, 2..4).prop_map(|v| v.join(",")),
        ]
    })
}

fn arb_override_text() -> impl Strategy<Value = String> {
    let prefix = prop_oneof![Just(""), Just("+"), Just("++"), Just("~"), Just("+~")];
    let key = prop_oneof![
        Just("a"),
        Just("a.b"),
        Just("g/h"),
        Just("db@pkg"),
        Just("x@"),
        Just(""),
        Just("1.2"),
        Just("$k")
    ];
    (
        prefix,
        key,
        prop_oneof![Just("="), Just(""), Just("= ")],
        arb_value_text(),
    )
        .prop_map(|(p, k, eq, v)| format!("{p}{k}{eq}{v}"))
}

/// Whether every unquoted string in `e` consists of characters the value lexer accepts
/// outside quotes (Hydra cannot render other strings back into override syntax either,
/// e.g. an interpolation token holding a quote: `${a:'x'}`).
fn renderable(e: &Element) -> bool {
    match e {
        Element::Str(s) => s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-/\\+.$%*@?|".contains(c) || is_escapable(c)),
        Element::List(items) => items.iter().all(renderable),
        Element::Dict(pairs) => pairs
            .iter()
            .all(|(k, v)| renderable(&Element::Str(k.clone())) && renderable(v)),
        _ => true,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_panics_on_arbitrary_text(s in any::<String>()) {
        let _ = parse_override_seeded(&s, 1);
        let _ = parse_override_seeded(&format!("a={s}"), 1);
    }

    #[test]
    fn never_panics_on_grammar_alphabet(s in "[a-z0-9=+~@/:.,()\\[\\]{}'\" \t\\\\$_*?!-]{0,40}") {
        let _ = parse_override_seeded(&s, 1);
        let _ = parse_override_seeded(&format!("a={s}"), 1);
    }

    #[test]
    fn never_panics_on_grammar_shaped_text(s in arb_override_text()) {
        if let Ok(o) = parse_override_seeded(&s, 1) {
            let _ = o.value_element_as_str();
            let _ = o.value();
            let _ = o.sweep_value_strings_seeded(&["adam".to_string(), "sgd".to_string()], 2);
        }
    }

    #[test]
    fn rendering_round_trips_generated_elements(e in arb_element()) {
        let text = format!("k={}", e.as_override_str());
        let back = parse_override_seeded(&text, 1).map_err(|err| TestCaseError::fail(err.to_string()))?;
        match back.value {
            Some(OverrideValue::Element(b)) => prop_assert!(same(&e, &b), "{text}: {e:?} vs {b:?}"),
            other => prop_assert!(false, "{text}: not an element: {other:?}"),
        }
    }

    #[test]
    fn rendering_round_trips_parsed_elements(v in arb_value_text_with(false)) {
        // Without function calls: their results may legitimately not round-trip
        // (str(5) renders as 5, which parses as an int, in Hydra too).
        if let Ok(Override { value: Some(OverrideValue::Element(e)), .. }) =
            parse_override_seeded(&format!("k={v}"), 1)
        {
            if !renderable(&e) {
                return Ok(());
            }
            let text = format!("k={}", e.as_override_str());
            let back = parse_override_seeded(&text, 1).map_err(|err| TestCaseError::fail(err.to_string()))?;
            match back.value {
                Some(OverrideValue::Element(b)) => prop_assert!(same(&e, &b), "{v} -> {text}: {e:?} vs {b:?}"),
                other => prop_assert!(false, "{text}: not an element: {other:?}"),
            }
        }
    }
}
