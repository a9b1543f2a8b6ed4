//! Build script of the `flotilla` CLI. The CLI itself links no libtorch; its integration tests
//! drive the training crate in-process, so only the test executables get an rpath to the
//! libtorch shared libraries (from `LIBTORCH`, which .cargo/config.toml points at
//! .venv/libtorch).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=build.rs");
    if let Some(libtorch) = std::env::var_os("LIBTORCH") {
        let lib_dir = PathBuf::from(libtorch).join("lib");
        let lib_dir = lib_dir.canonicalize().unwrap_or(lib_dir);
        println!(
            "cargo:rustc-link-arg-tests=-Wl,-rpath,{}",
            lib_dir.display()
        );
    }
}
