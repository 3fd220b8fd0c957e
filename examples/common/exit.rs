//! How the checking examples end: MLX's queued work is waited for and its cache freed before the
//! process exits, whatever happened (see `mlx_trellis::synchronize`), then status 0 when every
//! check passed, 1 when one failed (`failed` says which), 2 on an error.

use std::process::ExitCode;

/// The exit status of `result` (`Ok(true)`: every check passed), after `mlx_trellis::synchronize`.
pub fn finish(result: anyhow::Result<bool>, failed: &str) -> ExitCode {
    if let Err(e) = mlx_trellis::synchronize() {
        eprintln!("error: {e}");
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("{failed}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
