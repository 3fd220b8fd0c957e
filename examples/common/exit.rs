//! How the checking examples end, whatever happened: status 0 when every check passed, 1 when
//! one failed (`failed` says which, or a [`GateMissed`] error), 2 on an error, through
//! `mlx_trellis::exit_process` (MLX's queued work waited for, the streams flushed, and no C++
//! static destructors: on CUDA those can abort the process at exit). Command-line mistakes never
//! get here: clap reports them and exits with status 2. A tensor-parallel rank is the same
//! program, so its exit paths end here too.

use std::fmt;

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

/// Ends the process with the exit status of `result` (`Ok(true)`: every check passed), through
/// `mlx_trellis::exit_process`. Everything `result`'s computation held has been dropped by now.
pub fn finish(result: anyhow::Result<bool>, failed: &str) -> ! {
    let code = match result {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("{failed}");
            1
        }
        Err(e) if e.downcast_ref::<GateMissed>().is_some() => {
            eprintln!("{e:#}");
            eprintln!("{failed}");
            1
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    };
    mlx_trellis::exit_process(code)
}
