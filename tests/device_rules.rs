//! Source rules that keep the GPU path correct before it first runs, checked on the CPU by
//! reading the code (syn), since the CPU communicator and a CPU-only libtorch cannot show what
//! they guard against:
//!
//! - a tensor built on the host (`Tensor::from_slice`, `Tensor::from`, ...) is never handed
//!   straight to a collective: NCCL refuses tensors that are not on its device, so host
//!   values go through `TensorCollectives::all_reduce_host`, which moves them there;
//! - nothing asks libtorch about CUDA (`tch::Cuda::*`, `Device::cuda_if_available`) but
//!   `flotilla-train/src/cuda.rs`, which loads libtorch's CUDA library first (libtorch caches
//!   "no CUDA" from a query made before it is loaded).
//!
//! Each rule is also run on a planted violation, so the check itself can fail.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The collectives over tch tensors (`parallel/tensor_comm.rs`).
const COLLECTIVES: [&str; 4] = [
    "all_reduce_tensor",
    "reduce_scatter_tensor",
    "all_gather_tensor",
    "broadcast_tensor",
];

/// Constructors that build a tensor from host values, on the CPU.
const HOST_BUILT: [&str; 5] = [
    "from_slice",
    "f_from_slice",
    "from",
    "from_slice2",
    "of_slice",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `src` file of every crate, with its path relative to the repository.
fn sources() -> Vec<(String, String)> {
    let mut dirs = vec![repo().join("src")];
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        dirs.push(entry.unwrap().path().join("src"));
    }
    let mut files = vec![];
    for d in dirs.iter().filter(|d| d.is_dir()) {
        rust_files(d, &mut files);
    }
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(repo()).unwrap().display().to_string();
            (rel, std::fs::read_to_string(&f).unwrap())
        })
        .collect()
}

/// Whether `expr` is a call `Tensor::<constructor>(...)` of a host constructor.
fn host_built(expr: &syn::Expr) -> bool {
    let syn::Expr::Call(call) = expr else {
        return false;
    };
    let syn::Expr::Path(p) = call.func.as_ref() else {
        return false;
    };
    let segs: Vec<String> = p
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    segs.len() >= 2
        && segs[segs.len() - 2] == "Tensor"
        && HOST_BUILT.contains(&segs[segs.len() - 1].as_str())
}

/// The local `ident` an argument names (`x` or `&x`).
fn named_local(expr: &syn::Expr) -> Option<String> {
    match expr {
        syn::Expr::Reference(r) => named_local(&r.expr),
        syn::Expr::Path(p) if p.path.segments.len() == 1 => {
            Some(p.path.segments[0].ident.to_string())
        }
        _ => None,
    }
}

/// Per function: the locals bound to a host-built tensor, and every collective whose tensor
/// argument is one of them (or is built in place).
#[derive(Default)]
struct HostIntoCollective {
    host_locals: BTreeSet<String>,
    found: Vec<(String, usize)>,
}

impl<'ast> Visit<'ast> for HostIntoCollective {
    fn visit_local(&mut self, local: &'ast syn::Local) {
        if let (syn::Pat::Ident(name), Some(init)) = (&local.pat, &local.init) {
            if host_built(&init.expr) {
                self.host_locals.insert(name.ident.to_string());
            }
        }
        syn::visit::visit_local(self, local);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let method = call.method.to_string();
        if COLLECTIVES.contains(&method.as_str()) {
            for arg in &call.args {
                let inner = match arg {
                    syn::Expr::Reference(r) => r.expr.as_ref(),
                    e => e,
                };
                let bad = host_built(inner)
                    || named_local(arg).is_some_and(|n| self.host_locals.contains(&n));
                if bad {
                    self.found
                        .push((method.clone(), call.method.span().start().line));
                }
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }
}

/// `file:line: method` for each host-built tensor handed to a collective in `source`.
fn host_tensors_into_collectives(file: &str, source: &str) -> Vec<String> {
    let parsed = syn::parse_file(source).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut out = vec![];
    // Function by function, so that a local's name does not leak into another function.
    struct Fns<'a>(&'a mut Vec<String>, &'a str);
    impl<'ast> Visit<'ast> for Fns<'_> {
        fn visit_block(&mut self, block: &'ast syn::Block) {
            let mut v = HostIntoCollective::default();
            v.visit_block(block);
            for (m, line) in v.found {
                let entry = format!("{}:{line}: {m}", self.1);
                if !self.0.contains(&entry) {
                    self.0.push(entry);
                }
            }
        }
    }
    Fns(&mut out, file).visit_file(&parsed);
    out
}

/// `file:line` of each CUDA query outside the one module that may make them.
fn cuda_queries(file: &str, source: &str) -> Vec<String> {
    if file.ends_with("flotilla-train/src/cuda.rs") {
        return vec![];
    }
    source
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.split("//").next().unwrap_or("");
            code.contains("tch::Cuda::") || code.contains("cuda_if_available")
        })
        .map(|(i, _)| format!("{file}:{}", i + 1))
        .collect()
}

#[test]
fn no_host_built_tensor_reaches_a_collective() {
    let mut found = vec![];
    for (file, source) in sources() {
        if file.ends_with("parallel/tensor_comm.rs") {
            continue; // `all_reduce_host` moves host values to the device first.
        }
        found.extend(host_tensors_into_collectives(&file, &source));
    }
    assert!(
        found.is_empty(),
        "host-built tensors handed to a collective (NCCL refuses them; use all_reduce_host):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_finds_a_planted_host_tensor() {
    let planted = r#"
        fn f(comm: &C, loss: f32) {
            let t = Tensor::from_slice(&[loss]);
            comm.all_reduce_tensor(&t, ReduceOp::Sum).unwrap();
            comm.broadcast_tensor(&Tensor::from(1i64), 0).unwrap();
        }
        fn g(comm: &C, w: &Tensor) {
            let t = w.to_device(dev);
            comm.all_reduce_tensor(&t, ReduceOp::Sum).unwrap();
        }
    "#;
    let found = host_tensors_into_collectives("x.rs", planted);
    assert_eq!(
        found,
        ["x.rs:4: all_reduce_tensor", "x.rs:5: broadcast_tensor"]
    );
}

#[test]
fn cuda_is_asked_about_in_one_place() {
    let mut found = vec![];
    for (file, source) in sources() {
        found.extend(cuda_queries(&file, &source));
    }
    assert!(
        found.is_empty(),
        "CUDA queried outside flotilla-train/src/cuda.rs (libtorch's CUDA library may not be \
         loaded yet):\n{}",
        found.join("\n")
    );
    let planted = "let d = Device::cuda_if_available();\n// tch::Cuda::is_available()\n";
    assert_eq!(cuda_queries("y.rs", planted), ["y.rs:1"]);
}
