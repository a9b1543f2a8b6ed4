//! Whole safetensors files read and written in one call through tch (optimizer state, small
//! checkpoint files), with errors that name the file.

use crate::error::TrainError;

/// Writes named tensors to a safetensors file; errors name the file.
pub fn write_safetensors(
    path: &std::path::Path,
    tensors: &[(String, tch::Tensor)],
) -> Result<(), TrainError> {
    tch::Tensor::write_safetensors(tensors, path).map_err(|source| TrainError::File {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads every tensor of a safetensors file; errors name the file.
pub fn read_safetensors(path: &std::path::Path) -> Result<Vec<(String, tch::Tensor)>, TrainError> {
    tch::Tensor::read_safetensors(path).map_err(|source| TrainError::File {
        path: path.to_path_buf(),
        source,
    })
}
