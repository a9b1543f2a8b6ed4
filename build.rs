//! Build script: embeds an rpath to the libtorch shared libraries so the `flotilla` binary and
//! the test executables find them without `LD_LIBRARY_PATH`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    let Some(libtorch) = std::env::var_os("LIBTORCH") else {
        println!("cargo:warning=LIBTORCH is not set; run scripts/setup.sh (the binary will need LD_LIBRARY_PATH)");
        return;
    };
    let lib_dir = PathBuf::from(libtorch).join("lib");
    let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // libtorch_cuda is deliberately not forced into the link: composing and planning on a login
    // node must not pay for loading the CUDA libraries. The trainer loads it at run time when a
    // GPU is asked for.
}
