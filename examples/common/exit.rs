//! How the checking examples end: MLX's queued work is waited for and its cache freed before the
//! process exits, whatever happened (see `mlx_trellis::synchronize`), then status 0 when every
//! check passed, 1 when one failed (`failed` says which, or a [`GateMissed`] error), 2 on an
//! error. Command-line mistakes never get here: clap reports them and exits with status 2.

use std::fmt;
use std::process::ExitCode;

/// A check that missed its gate, for an example that stops at the first one: it ends in exit
/// status 1 like a failed check, not 2 like an error.
#[derive(Debug)]
#[allow(dead_code)] // constructed only by the examples that stop at their first missed gate
pub struct GateMissed(pub String);

impl fmt::Display for GateMissed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GateMissed {}

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
        Err(e) if e.downcast_ref::<GateMissed>().is_some() => {
            eprintln!("{e:#}");
            eprintln!("{failed}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
