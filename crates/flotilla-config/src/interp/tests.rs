//! Tests of interpolation: the OmegaConf oracle fixture, error messages, cycles, origins, the
//! resolvers, parsing, key splitting, depth limits, memoization and property tests.

use super::grammar::split_key;
use super::*;
use crate::node::{python_repr, Node, Value};
use chrono::TimeZone;
use std::collections::HashMap;
use std::sync::Arc;

/// Builds a node tree from the JSON the oracle recorder writes: integers stay `Int`,
/// other numbers are `Float`, `"???"` is `Missing`, `{"$float": "inf"}` is a non-finite
/// float.
fn from_json(j: &serde_json::Value) -> Node {
    use serde_json::Value as J;
    let value = match j {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) if !n.is_f64() => Value::Int(i),
            _ => Value::Float(n.as_f64().expect("finite number")),
        },
        J::String(s) if s == "???" => Value::Missing,
        J::String(s) => Value::Str(s.clone()),
        J::Array(items) => Value::List(items.iter().map(from_json).collect()),
        J::Object(map) => match map.get("$float").and_then(J::as_str) {
            Some(f) if map.len() == 1 => Value::Float(f.parse().expect("float")),
            _ => Value::Dict(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect()),
        },
    };
    Node::from(value)
}

/// Equality on values and types (floats bit-exact, NaN equal to NaN).
fn same(a: &Node, b: &Node) -> bool {
    match (&a.value, &b.value) {
        (Value::Float(x), Value::Float(y)) => {
            (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits()
        }
        (Value::List(x), Value::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Dict(x), Value::Dict(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kp, p), (kq, q))| kp == kq && same(p, q))
        }
        (x, y) => x == y,
    }
}

fn fixed_now() -> chrono::DateTime<chrono::Local> {
    chrono::Local
        .with_ymd_and_hms(2024, 3, 5, 7, 8, 9)
        .single()
        .expect("unambiguous local time")
        + chrono::Duration::microseconds(12_345)
}

fn ctx_with(env: &[(&str, &str)]) -> ResolveContext {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ResolveContext {
        now: fixed_now(),
        env: Arc::new(move |k| env.get(k).cloned()),
    }
}

fn s(text: &str) -> Node {
    Node::from(Value::Str(text.to_string()))
}

fn dict(entries: Vec<(&str, Node)>) -> Node {
    Node::from(Value::Dict(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    ))
}

fn fixture_path() -> String {
    match std::env::var("FLOTILLA_FIXTURES") {
        Ok(dir) => format!("{dir}/interp.json"),
        Err(_) => concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/oracle/fixtures/interp.json"
        )
        .to_string(),
    }
}

#[test]
fn matches_omegaconf_oracle() {
    let path = fixture_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let cases: Vec<serde_json::Value> = serde_json::from_str(&text).expect("fixture JSON");
    assert!(cases.len() >= 120, "only {} cases in {path}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap_or("?");
        let input = from_json(&case["input"]);
        let env: Vec<(String, String)> = case["env"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let env_refs: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let ctx = ctx_with(&env_refs);
        let got = resolve_tree(&input, &ctx);
        match (case.get("result"), got) {
            (Some(want), Ok(node)) => {
                let want = from_json(want);
                if !same(&want, &node) {
                    failures.push(format!(
                        "{name}: want {}\n      got  {}",
                        python_repr(&want.value),
                        python_repr(&node.value)
                    ));
                }
            }
            (Some(want), Err(e)) => failures.push(format!(
                "{name}: want {}\n      got error {e}",
                python_repr(&from_json(want).value)
            )),
            (None, Ok(node)) => failures.push(format!(
                "{name}: want error {}\n      got {}",
                case["error"],
                python_repr(&node.value)
            )),
            (None, Err(e)) => {
                if let Some(sub) = case.get("rust_contains").and_then(|v| v.as_str()) {
                    if !e.to_string().contains(sub) {
                        failures.push(format!("{name}: error lacks '{sub}': {e}"));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} oracle cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn error_message_names_key_text_origin_and_suggestion() {
    let mut lr = s("${trainer.lrr}");
    lr.origin = Origin::File {
        path: Arc::from("conf/model/base.yaml"),
        line: 3,
    };
    let root = dict(vec![
        ("trainer", dict(vec![("lr", Node::from(Value::Float(0.1)))])),
        ("model", dict(vec![("lr", lr)])),
    ]);
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot resolve ${trainer.lrr} at model.lr (from conf/model/base.yaml:3): \
         key 'trainer.lrr' not found (did you mean 'trainer.lr'?)"
    );
    let plain = dict(vec![
        ("trainer", dict(vec![("lr", Node::from(Value::Float(0.1)))])),
        ("model", dict(vec![("lr", s("${trainer.lrr}"))])),
    ]);
    assert_eq!(
        resolve_tree(&plain, &ctx_with(&[]))
            .unwrap_err()
            .to_string(),
        "cannot resolve ${trainer.lrr} at model.lr: key 'trainer.lrr' not found \
         (did you mean 'trainer.lr'?)"
    );
}

#[test]
fn error_inside_a_referenced_node_names_the_chain() {
    let root = dict(vec![
        ("a", s("${b}")),
        ("b", s("x${c.nope}")),
        ("c", dict(vec![("n", Node::from(Value::Int(1)))])),
    ]);
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
    assert_eq!(err.key, "b");
    assert_eq!(err.text, "${c.nope}");
    assert_eq!(err.via, vec!["a".to_string()]);
    assert!(err.to_string().ends_with("(while resolving a)"), "{err}");
}

#[test]
fn cycles_are_named() {
    let root = dict(vec![("a", s("${b}")), ("b", s("${c}")), ("c", s("${a}"))]);
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
    assert_eq!(
        *err.kind,
        InterpErrorKind::Cycle(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let root = dict(vec![
        ("a", Node::from(Value::List(vec![s("${b}")]))),
        ("b", dict(vec![("x", s("${a}"))])),
    ]);
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
    assert!(
        matches!(*err.kind, InterpErrorKind::SelfContaining { .. }),
        "{err}"
    );
}

#[test]
fn unknown_resolver_lists_known_ones() {
    let root = dict(vec![("a", s("${oc.evn:HOME}"))]);
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err().to_string();
    assert!(err.contains("unsupported interpolation type 'oc.evn' (did you mean 'oc.env'?)"));
    assert!(
        err.contains("known resolvers: oc.create, oc.decode"),
        "{err}"
    );
}

#[test]
fn origins_are_kept() {
    let file = |line| Origin::File {
        path: Arc::from("c.yaml"),
        line,
    };
    let mut x = Node::from(Value::Int(1));
    x.origin = file(2);
    let mut a = dict(vec![("x", x)]);
    a.origin = file(1);
    let mut b = s("${a}");
    b.origin = Origin::Override(Arc::from("b=${a}"));
    let mut c = s("v=${a.x}");
    c.origin = file(9);
    let mut m = Node::from(Value::Missing);
    m.origin = file(10);
    let root = dict(vec![("a", a), ("b", b), ("c", c), ("m", m)]);
    let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
    let get = |k: &str| out.select(k).unwrap();
    assert_eq!(get("a").origin, file(1));
    assert_eq!(get("a.x").origin, file(2));
    assert_eq!(get("b").origin, Origin::Override(Arc::from("b=${a}")));
    assert_eq!(get("b.x").origin, file(2));
    assert_eq!(get("c").origin, file(9));
    assert_eq!(get("c").value, Value::Str("v=1".into()));
    assert_eq!(get("m").value, Value::Missing);
    assert_eq!(get("m").origin, file(10));
}

#[test]
fn now_uses_the_context_instant_and_python_patterns() {
    let root = dict(vec![
        ("a", s("${now:%Y-%m-%d_%H-%M-%S}")),
        ("b", s("${now:%H:%M:%S.%f}")),
        ("c", s("run_${now:%Y%m%d}_x")),
        ("d", s("${now:%-d/%-m %j %a %b %p %z|%Z %% %Q %Ey}")),
        ("e", s("${now:'%Y, %m'}")),
    ]);
    let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
    let get = |k: &str| out.select(k).unwrap().value.clone();
    assert_eq!(get("a"), Value::Str("2024-03-05_07-08-09".into()));
    assert_eq!(get("b"), Value::Str("07:08:09.012345".into()));
    assert_eq!(get("c"), Value::Str("run_20240305_x".into()));
    assert_eq!(get("d"), Value::Str("5/3 065 Tue Mar AM | % %Q 24".into()));
    assert_eq!(get("e"), Value::Str("2024, 03".into()));
}

#[test]
fn env_comes_from_the_context() {
    let root = dict(vec![
        ("a", s("${oc.env:FLOTILLA_X}")),
        ("b", s("${oc.env:FLOTILLA_Y,7}")),
    ]);
    let out = resolve_tree(&root, &ctx_with(&[("FLOTILLA_X", "on")])).unwrap();
    assert_eq!(out.select("a").unwrap().value, Value::Str("on".into()));
    assert_eq!(out.select("b").unwrap().value, Value::Str("7".into()));
    let root = dict(vec![("a", s("${oc.env:FLOTILLA_Y}"))]);
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err().to_string();
    assert!(
        err.contains("Environment variable 'FLOTILLA_Y' not found"),
        "{err}"
    );
}

#[test]
fn resolve_at_resolves_one_node() {
    let root = dict(vec![
        ("a", dict(vec![("b", s("${c}")), ("bad", s("${nope}"))])),
        ("c", Node::from(Value::Int(4))),
    ]);
    let ctx = ctx_with(&[]);
    let got = resolve_at(&root, &["a".into(), "b".into()], &ctx).unwrap();
    assert_eq!(got.value, Value::Int(4));
    assert!(resolve_at(&root, &["a".into(), "bad".into()], &ctx).is_err());
    let err = resolve_at(&root, &["a".into(), "bb".into()], &ctx).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot resolve at a.bb: key 'a.bb' not found (did you mean 'a.b'?)"
    );
    let err = parse("${a").unwrap_err().to_string();
    assert!(err.starts_with("invalid interpolation ${a: "), "{err}");
}

#[test]
fn resolver_shares_work_across_calls() {
    let root = dict(vec![
        ("a", s("${b}")),
        ("b", s("${oc.env:FLOTILLA_X}")),
        ("c", dict(vec![("d", s("${b}-${a}"))])),
    ]);
    let ctx = ctx_with(&[("FLOTILLA_X", "v")]);
    let mut r = Resolver::new(&root, &ctx);
    assert_eq!(
        r.resolve_at(&["a".into()]).unwrap().value,
        Value::Str("v".into())
    );
    assert!(r.resolve_at(&["nope".into()]).is_err());
    let c = r.resolve_at(&["c".into()]).unwrap();
    assert_eq!(c.select("d").unwrap().value, Value::Str("v-v".into()));
    assert_eq!(
        r.resolve_tree().unwrap(),
        resolve_tree(&root, &ctx).unwrap()
    );
}

#[test]
fn hydra_resolver_needs_the_hydra_node() {
    let root = dict(vec![("a", s("${hydra:job.name}"))]);
    assert!(resolve_tree(&root, &ctx_with(&[])).is_err());
    let root = dict(vec![
        ("hydra", dict(vec![("job", dict(vec![("name", s("j"))]))])),
        ("a", s("${hydra:job.name}")),
        ("b", s("${flotilla:job}")),
        ("c", s("${hydra:..a}")),
    ]);
    let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
    assert_eq!(out.select("a").unwrap().value, Value::Str("j".into()));
    assert_eq!(out.select("b.name").unwrap().value, Value::Str("j".into()));
    assert_eq!(out.select("c").unwrap().value, Value::Str("j".into()));
}

#[test]
fn parse_gives_the_ast() {
    let t = parse("${a.b}").unwrap();
    assert!(t.is_single_interpolation());
    let Part::Interp(it) = &t.parts[0] else {
        panic!("interp")
    };
    assert_eq!(it.span, 0..6);
    let InterpKind::Node(kp) = &it.kind else {
        panic!("node")
    };
    assert_eq!(kp.text.as_deref(), Some("a.b"));
    let t = parse("x \\${y} ${oc.env:A,[1, 'b']}").unwrap();
    assert_eq!(t.parts[0], Part::Text("x ${y} ".into()));
    assert!(!t.is_single_interpolation());
    assert!(parse("no interpolation \\ here").unwrap().parts.len() == 1);
    for bad in [
        "${a",
        "${a..b}",
        "${}",
        "${a b}",
        "${f:'x}",
        "${oc.env:a=b}",
        "${a.}",
    ] {
        let e = parse(bad).unwrap_err();
        assert!(matches!(*e.kind, InterpErrorKind::Syntax(_)), "{bad}: {e}");
    }
}

#[test]
fn split_key_matches_omegaconf() {
    assert_eq!(split_key("a.b"), vec!["a", "b"]);
    assert_eq!(split_key("a[b]"), vec!["a", "b"]);
    assert_eq!(split_key(".a.b[c].d"), vec!["", "a", "b", "c", "d"]);
    assert_eq!(split_key("[a].b"), vec!["a", "b"]);
    assert_eq!(split_key("..[a]"), vec!["", "", "a"]);
    assert_eq!(split_key("a..b"), vec!["a", "", "b"]);
    assert_eq!(split_key("a[b"), vec!["a"]);
    assert_eq!(split_key(""), vec![""]);
}

#[test]
fn long_chains_and_deep_nesting_fail_cleanly() {
    let mut entries = vec![("a0".to_string(), Node::from(Value::Int(1)))];
    for i in 1..60 {
        entries.push((format!("a{i}"), s(&format!("${{a{}}}", i - 1))));
    }
    let root = Node::from(Value::Dict(entries.iter().cloned().rev().collect()));
    let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
    assert_eq!(out.select("a59").unwrap().value, Value::Int(1));
    for i in 60..400 {
        entries.push((format!("a{i}"), s(&format!("${{a{}}}", i - 1))));
    }
    // Memoization keeps a chain shallow when it is resolved from its start; resolved
    // from its end, it is 400 interpolations deep.
    let root = Node::from(Value::Dict(entries.into_iter().rev().collect()));
    let err = resolve_tree(&root, &ctx_with(&[])).unwrap_err();
    assert!(matches!(*err.kind, InterpErrorKind::TooDeep(_)), "{err}");
}

#[test]
fn deep_parse_nesting_fails_cleanly() {
    let deep = format!("${{oc.decode:'{}{}'}}", "[".repeat(5000), "]".repeat(5000));
    assert!(parse(&deep).is_ok());
    let root = dict(vec![("a", s(&deep))]);
    assert!(resolve_tree(&root, &ctx_with(&[])).is_err());
    let nested = format!("{}x{}", "${a.".repeat(3000), "}".repeat(3000));
    assert!(parse(&nested).is_err());
}

#[test]
fn deep_trees_fail_cleanly() {
    let mut node = Node::from(Value::Int(0));
    for _ in 0..2000 {
        node = Node::from(Value::List(vec![node]));
    }
    let root = dict(vec![("deep", node)]);
    assert!(resolve_tree(&root, &ctx_with(&[])).is_err());
    let mut node = s("${a}");
    for _ in 0..120 {
        node = Node::from(Value::List(vec![node]));
    }
    let root = dict(vec![("a", Node::from(Value::Int(3))), ("deep", node)]);
    let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
    let mut leaf = out.select("deep").unwrap();
    while let Value::List(items) = &leaf.value {
        leaf = &items[0];
    }
    assert_eq!(leaf.value, Value::Int(3));
}

#[test]
fn memoizes_repeated_references() {
    // Each level evaluates the previous one twice; without memoization this is 2^60
    // evaluations.
    let mut entries = vec![("a0".to_string(), s("x"))];
    for i in 1..60 {
        let p = i - 1;
        entries.push((
            format!("a{i}"),
            s(&format!("${{oc.select:a{p},${{a{p}}}}}")),
        ));
    }
    let root = Node::from(Value::Dict(entries.into_iter().collect()));
    let out = resolve_tree(&root, &ctx_with(&[])).unwrap();
    assert_eq!(out.select("a59").unwrap().value, Value::Str("x".into()));
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn tree_with(text: &str) -> Node {
        dict(vec![
            ("a", Node::from(Value::Int(1))),
            (
                "b",
                dict(vec![
                    ("c", s("x")),
                    ("d", Node::from(Value::List(vec![s("y"), s(text)]))),
                ]),
            ),
            ("e", Node::from(Value::Missing)),
            ("s", s(text)),
            ("t", dict(vec![("u", s(text))])),
            ("hydra", dict(vec![("job", dict(vec![("name", s(text))]))])),
        ])
    }

    fn check(text: &str) {
        let _ = parse(text);
        let ctx = ctx_with(&[("HOME", "/h")]);
        if let Ok(out) = resolve_tree(&tree_with(text), &ctx) {
            assert!(out.value.is_container());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_strings_never_panic(text in "\\PC{0,40}") {
            check(&text);
        }

        #[test]
        fn grammar_shaped_strings_never_panic(
            text in "([$]\\{|\\}|[.:,\\[\\]'\"\\\\ ]|oc\\.(env|select|decode|create|dict\\.keys)|now|hydra|[abcestu]|[0-9]|null|true|1e5|-)*"
        ) {
            check(&text);
        }

        #[test]
        fn wrapped_grammar_strings_never_panic(
            inner in "([$]\\{|\\}|[.:,\\[\\]'\"\\\\ ]|[abcdestu]|[0-9]|oc\\.select|oc\\.decode)*"
        ) {
            check(&format!("${{{inner}}}"));
            check(&format!("${{oc.decode:'{inner}'}}"));
            check(&format!("x${{b.{inner}}}y"));
        }
    }
}
