//! Build script: embeds an rpath to the libtorch shared libraries so the `flotilla-train`
//! binary, this crate's examples and its test executables (tests/, which drive the trainer
//! in-process) find them without `LD_LIBRARY_PATH`, and compiles the small C++ shim
//! (`csrc/storage.cpp`, freeing and re-allocating a tensor's storage in place for FSDP;
//! `csrc/vjp.cpp`, a seeded backward; `csrc/optim.cpp`, the fused AdamW and foreach-norm kernels;
//! `csrc/precision.cpp`, the TF32 switches; `csrc/attention.cpp`, flash attention over packed
//! rows by sequence bounds; `csrc/pinned.cpp`, host tensors in pinned memory) against the same
//! libtorch headers.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/storage.cpp");
    println!("cargo:rerun-if-changed=csrc/vjp.cpp");
    println!("cargo:rerun-if-changed=csrc/optim.cpp");
    println!("cargo:rerun-if-changed=csrc/precision.cpp");
    println!("cargo:rerun-if-changed=csrc/attention.cpp");
    println!("cargo:rerun-if-changed=csrc/pinned.cpp");
    let Some(libtorch) = std::env::var_os("LIBTORCH") else {
        panic!("LIBTORCH is not set; run scripts/setup.sh (it links .venv/libtorch, which .cargo/config.toml names)");
    };
    let libtorch = PathBuf::from(libtorch);
    let libtorch = libtorch.canonicalize().unwrap_or(libtorch);
    cc::Build::new()
        .cpp(true)
        .file("csrc/storage.cpp")
        .file("csrc/vjp.cpp")
        .file("csrc/optim.cpp")
        .file("csrc/precision.cpp")
        .file("csrc/attention.cpp")
        .file("csrc/pinned.cpp")
        .include(libtorch.join("include"))
        .include(libtorch.join("include/torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .warnings(false)
        .compile("flotilla_shim");
    let lib_dir = libtorch.join("lib");
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    // `rustc-link-arg` reaches every linked target of this package: binaries, examples, tests
    // and benches.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // libtorch_cuda is deliberately not forced into the link: composing and planning on a login
    // node must not pay for loading the CUDA libraries. The trainer loads it at run time when a
    // GPU is asked for.
}
