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
    // libtorch_cuda is only reached through registration at load time; keep it linked so that
    // CUDA is available to the binary whenever the wheel has it.
    if lib_dir.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
