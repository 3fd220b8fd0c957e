//! The command-line options the examples share, defined once (`#[command(flatten)]`), and the
//! value parsers behind them. Parsing failures are clap's own: one line naming the option and the
//! value, the usage, and exit status 2.
#![allow(dead_code)] // each example uses a subset

use clap::Args;
use mlx_trellis::trellis::encoder::EncoderBackend;
use mlx_trellis::trellis::{CodeLayout, ForwardPath};
use mlx_trellis::Dtype;

/// `--path`: which implementation runs the coded layers.
#[derive(Args, Debug, Clone)]
pub struct PathArg {
    /// Force an implementation: auto, generic, host, reference, metal, metal-sim or cuda (auto:
    /// the GPU kernels where the back-end has them and the geometry is served, else generic; on
    /// MLX's CPU back-end, host)
    #[arg(long, value_name = "PATH", default_value = "auto")]
    pub path: ForwardPath,
}

/// `--seed`: what seeds the synthetic weights and activations.
#[derive(Args, Debug, Clone)]
pub struct SeedArg {
    /// Seed of the synthetic codes, weights and activations
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
}

/// `--rows`: the activation row counts a benchmark times, each on its own.
#[derive(Args, Debug, Clone)]
pub struct BenchRows {
    /// Activation row counts (M), comma-separated
    #[arg(long, value_name = "M,...", value_delimiter = ',', value_parser = positive,
          default_value = "1,2,4,8,16,32,64,128")]
    pub rows: Vec<usize>,
}

/// `--backend`, `--threads`: where and on how many threads the encoder's block search runs.
#[derive(Args, Debug, Clone)]
pub struct EncoderArgs {
    /// Where the block search runs: auto (CUDA when the loaded MLX has it and L <= 15), cpu or
    /// cuda
    #[arg(long, value_name = "BACKEND", value_parser = encoder_backend, default_value = "auto")]
    pub backend: EncoderBackend,
    /// CPU threads of the block search [default: one per core]
    #[arg(long, value_name = "N", value_parser = positive)]
    pub threads: Option<usize>,
}

/// Comma-separated counts of at least 1, or none (an empty value).
#[derive(Clone, Debug, Default)]
pub struct CountList(pub Vec<usize>);

impl std::ops::Deref for CountList {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.0
    }
}

/// A [`CountList`]: `1,8,32`, or `""` for none.
pub fn count_list(s: &str) -> Result<CountList, String> {
    if s.trim().is_empty() {
        return Ok(CountList::default());
    }
    s.split(',').map(positive).collect::<Result<_, _>>().map(CountList)
}

/// A count of at least 1.
pub fn positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("counts start at 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a count")),
    }
}

/// A bit width the examples' synthetic layers are made at: 2, 3 or 4.
pub fn bits(s: &str) -> Result<u32, String> {
    match s.trim() {
        "2" => Ok(2),
        "3" => Ok(3),
        "4" => Ok(4),
        other => Err(format!("{other:?}: 2, 3 or 4")),
    }
}

/// `--layout row-major|interleaved`.
pub fn code_layout(s: &str) -> Result<CodeLayout, String> {
    match s {
        "row-major" => Ok(CodeLayout::RowMajor),
        "interleaved" => Ok(CodeLayout::K3Interleaved),
        other => Err(format!("{other:?} is neither row-major nor interleaved")),
    }
}

/// `--backend auto|cpu|cuda` of the encoder.
pub fn encoder_backend(s: &str) -> Result<EncoderBackend, String> {
    match s {
        "auto" => Ok(EncoderBackend::Auto),
        "cpu" => Ok(EncoderBackend::Cpu),
        "cuda" => Ok(EncoderBackend::Cuda),
        other => Err(format!("{other:?} is not auto, cpu or cuda")),
    }
}

/// `--dtype bf16|f16|f32`: an activation dtype.
pub fn float_dtype(s: &str) -> Result<Dtype, String> {
    match s {
        "bf16" => Ok(Dtype::Bfloat16),
        "f16" => Ok(Dtype::Float16),
        "f32" => Ok(Dtype::Float32),
        other => Err(format!("{other:?}: bf16, f16 or f32")),
    }
}
