//! Finding the training task binary (`flotilla-train`): the `train_binary` setting, else beside
//! the running executable, else on `PATH`.

use crate::{settings, LaunchError};
use std::path::{Path, PathBuf};

/// The file name of the training task binary.
pub const TRAIN_BINARY_NAME: &str = "flotilla-train";

/// Finds the training task binary: the `train_binary` setting (a settings file or
/// `FLOTILLA_TRAIN_BINARY`) when set, else `flotilla-train` beside the running executable, else
/// `flotilla-train` on `PATH`. The error says where it looked and how to provide it.
pub fn locate_train_binary(settings: &settings::Settings) -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe().ok();
    let path = std::env::var_os("PATH");
    locate_train_binary_in(
        settings.train_binary.clone(),
        exe.as_deref().and_then(Path::parent),
        path.as_deref(),
    )
}

/// [`locate_train_binary`] over explicit inputs: an explicit path, the directory of the
/// running executable, and a `PATH` value.
pub fn locate_train_binary_in(
    explicit: Option<PathBuf>,
    beside: Option<&Path>,
    search_path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, LaunchError> {
    if let Some(explicit) = explicit {
        return if is_executable_file(&explicit) {
            Ok(explicit)
        } else {
            Err(LaunchError::TaskBinary(format!(
                "the train_binary setting {} is not an executable file; point it (in a settings \
                 file or FLOTILLA_TRAIN_BINARY) at the `{TRAIN_BINARY_NAME}` binary, built by \
                 `cargo build --release -p flotilla-train`",
                explicit.display()
            )))
        };
    }
    let mut looked = Vec::new();
    if let Some(dir) = beside {
        let candidate = dir.join(TRAIN_BINARY_NAME);
        if is_executable_file(&candidate) {
            return Ok(candidate);
        }
        looked.push(dir.display().to_string());
    }
    if let Some(search_path) = search_path {
        for dir in std::env::split_paths(search_path) {
            let candidate = dir.join(TRAIN_BINARY_NAME);
            if is_executable_file(&candidate) {
                return Ok(candidate);
            }
        }
        looked.push("PATH".to_string());
    }
    Err(LaunchError::TaskBinary(format!(
        "the training task `{TRAIN_BINARY_NAME}` was not found (looked in {}); install it into \
         this environment with `pip install flotilla-train` (the wheel that \
         scripts/build-wheels.sh builds; it needs torch 2.11.0), or build it with \
         `cargo build --release -p flotilla-train` (it goes beside `flotilla`), or set \
         `train_binary` in a settings file or FLOTILLA_TRAIN_BINARY to its path",
        looked.join(" and ")
    )))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
