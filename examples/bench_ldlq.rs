//! Times the Hessian-weighted encoder against the plain one and prints both proxy errors.
//!
//! The layers are seeded Gaussian weights; `H` is the second moment of seeded inputs with
//! correlated neighbouring features (AR(1), 0.95) and four directions of 30x the standard
//! deviation. Default shapes are SmolLM2-135M's MLP projections with the coded axis a whole
//! number of 256-weight blocks: `W [576, 1536]` coded on axis 1 (BlockLDLQ over 1536 inputs) and
//! `W [1536, 576]` on axis 0 (LDLQ over 576 stored rows).
//!
//! ```text
//! cargo run --release --example bench_ldlq -- --bits 2 --groups 1,8,64
//! ```
//!
//! `--help` lists every option.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use mlx_trellis::trellis::encoder::{
    encode_linear, encode_linear_ldlq, proxy_error, EncoderConfig, LdlqConfig, LdlqOutcome,
};
use mlx_trellis::trellis::synthetic::{gaussian, SplitMix64};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;

/// Times the Hessian-weighted encoder (LDLQ) against the plain one on seeded Gaussian weights,
/// and prints both proxy errors.
///
/// H is the second moment of seeded inputs with correlated neighbouring features (AR(1), 0.95)
/// and four directions of 30x the standard deviation. The default shapes are SmolLM2-135M's MLP
/// projections with the coded axis a whole number of 256-weight blocks: W [576, 1536] coded on
/// axis 1 (BlockLDLQ over 1536 inputs) and W [1536, 576] on axis 0 (LDLQ over 576 stored rows).
/// Exit status: 0 done, 2 an error.
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo run --release --example bench_ldlq -- --bits 2 --groups 1,8,64
  cargo run --release --example bench_ldlq -- --bits 3 --shape 1024x4096:1 --threads 8")]
struct Cli {
    /// Bits per weight of the codes
    #[arg(long, value_name = "K", value_parser = cli::bits, default_value = "2")]
    bits: u32,
    /// Trellis state bits
    #[arg(long = "L", value_name = "L", default_value_t = 12)]
    l: u32,
    #[command(flatten)]
    encoder: cli::EncoderArgs,
    /// Stored rows per LDLQ step for layers coded on axis 0, comma-separated
    #[arg(long, value_name = "G,...", value_delimiter = ',', value_parser = cli::positive, default_value = "1")]
    groups: Vec<usize>,
    /// Input rows behind H
    #[arg(long, value_name = "S", value_parser = cli::positive, default_value_t = 1024)]
    samples: usize,
    /// A layer W [OUT, IN] coded on AXIS (0 or 1), as OUTxIN:AXIS; repeatable, replaces the
    /// defaults (576x1536:1 and 1536x576:0)
    #[arg(long, value_name = "OUTxIN:AXIS", value_parser = shape)]
    shape: Vec<(usize, usize, u32)>,
}

/// `OUTxIN:AXIS`: a layer's shape and the axis it is coded along.
fn shape(v: &str) -> Result<(usize, usize, u32), String> {
    let bad = || format!("{v:?}: expected OUTxIN:AXIS, e.g. 576x1536:1");
    let (dims, axis) = v.split_once(':').ok_or_else(bad)?;
    let (out, inp) = dims.split_once('x').ok_or_else(bad)?;
    let out = cli::positive(out).map_err(|e| format!("{v:?}: OUT: {e}"))?;
    let inp = cli::positive(inp).map_err(|e| format!("{v:?}: IN: {e}"))?;
    let axis = match axis.trim() {
        "0" => 0,
        "1" => 1,
        other => return Err(format!("{v:?}: AXIS {other:?} is neither 0 nor 1")),
    };
    // W has OUT x IN weights and H IN x IN entries.
    if out.checked_mul(inp).is_none() || inp.checked_mul(inp).is_none() {
        return Err(format!("{v:?}: OUT x IN or IN x IN overflows this machine's sizes"));
    }
    Ok((out, inp, axis))
}

/// `H = Xᵀ X` of `samples` seeded inputs of `n` features (see the file's docs).
fn hessian(n: usize, samples: usize, seed: u64) -> Result<Vec<f64>> {
    let mut rng = SplitMix64::new(seed);
    let spikes: Vec<Vec<f64>> =
        (0..4).map(|_| (0..n).map(|_| rng.next_gaussian() / (n as f64).sqrt()).collect()).collect();
    let entries = n.checked_mul(n).context("H's size overflows")?;
    let mut h = Vec::new();
    h.try_reserve_exact(entries).with_context(|| format!("allocating H of {n} x {n}"))?;
    h.resize(entries, 0f64);
    let mut x = vec![0f64; n];
    for _ in 0..samples {
        let mut prev = 0.0;
        for v in x.iter_mut() {
            prev = 0.95 * prev + (1.0f64 - 0.95 * 0.95).sqrt() * rng.next_gaussian();
            *v = prev;
        }
        for s in &spikes {
            let a = 30.0 * rng.next_gaussian();
            x.iter_mut().zip(s).for_each(|(v, d)| *v += a * d);
        }
        for a in 0..n {
            let xa = x[a];
            h[a * n + a..(a + 1) * n].iter_mut().zip(&x[a..]).for_each(|(hv, &xb)| *hv += xa * xb);
        }
    }
    for a in 0..n {
        for b in 0..a {
            h[a * n + b] = h[b * n + a];
        }
    }
    Ok(h)
}

fn main() -> ExitCode {
    exit::finish(run(Cli::parse()).map(|()| true), "")
}

fn run(o: Cli) -> Result<()> {
    let shapes = if o.shape.is_empty() { vec![(576, 1536, 1), (1536, 576, 0)] } else { o.shape.clone() };
    let (threads, backend) = (o.encoder.threads, o.encoder.backend);
    // The options' errors before the table starts.
    EncoderConfig { threads, backend, ..EncoderConfig::new(o.bits, o.l) }.validate()?;
    println!("| W [out, in] | axis | k | group | plain s | LDLQ s | LDLQ / plain | proxy s | rel. proxy plain | rel. proxy LDLQ | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &(out, inp, axis) in &shapes {
        let w = gaussian(out * inp, 1).map_err(anyhow::Error::msg)?;
        let h = hessian(inp, o.samples, 2)?;
        let cfg = EncoderConfig { axis, threads, backend, ..EncoderConfig::new(o.bits, o.l) };
        let start = Instant::now();
        let plain = encode_linear(&w, out, inp, &cfg)?;
        let plain_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let plain_proxy = proxy_error(&w, &plain.reconstruction, out, inp, axis, &h, threads)?;
        let proxy_s = start.elapsed().as_secs_f64();
        let groups = if axis == 0 { o.groups.clone() } else { vec![256] };
        for group in groups {
            let ldlq = LdlqConfig { stored_row_group: group, ..LdlqConfig::default() };
            let start = Instant::now();
            let got = encode_linear_ldlq(&w, out, inp, Some(&h), &cfg, &ldlq)?;
            let ldlq_s = start.elapsed().as_secs_f64();
            if got.outcome == LdlqOutcome::Unweighted || !got.warnings.is_empty() {
                println!("warnings: {:?}", got.warnings);
            }
            let proxy = got.proxy.context("a proxy error")?;
            println!(
                "| [{out}, {inp}] | {axis} | {} | {group} | {plain_s:.2} | {ldlq_s:.2} | {:.2} | {proxy_s:.2} | {:.3e} | {:.3e} | {:.3} |",
                o.bits,
                ldlq_s / plain_s,
                plain_proxy.relative(),
                proxy.relative(),
                proxy.error / plain_proxy.error
            );
        }
    }
    Ok(())
}
