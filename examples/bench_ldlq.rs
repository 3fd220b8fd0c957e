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
//! Options: `--bits K` (default 2), `--L L` (default 12), `--threads N` (default one per core),
//! `--backend auto|cpu|cuda` (default auto), `--groups G,..` stored rows per step on axis 0
//! (default 1), `--samples S` rows of the input behind `H` (default 1024), `--shape OUTxIN:AXIS`
//! (repeatable; replaces the defaults).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_trellis::trellis::encoder::{
    encode_linear, encode_linear_ldlq, proxy_error, EncoderBackend, EncoderConfig, LdlqConfig, LdlqOutcome,
};
use mlx_trellis::trellis::synthetic::{gaussian, SplitMix64};

struct Options {
    k: u32,
    l: u32,
    threads: Option<usize>,
    backend: EncoderBackend,
    groups: Vec<usize>,
    samples: usize,
    shapes: Vec<(usize, usize, u32)>,
}

fn parse_args() -> Result<Options> {
    let mut o = Options {
        k: 2,
        l: 12,
        threads: None,
        backend: EncoderBackend::Auto,
        groups: vec![1],
        samples: 1024,
        shapes: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--bits" => o.k = value()?.parse()?,
            "--L" => o.l = value()?.parse()?,
            "--threads" => o.threads = Some(value()?.parse()?),
            "--samples" => o.samples = value()?.parse()?,
            "--backend" => {
                o.backend = match value()?.as_str() {
                    "auto" => EncoderBackend::Auto,
                    "cpu" => EncoderBackend::Cpu,
                    "cuda" => EncoderBackend::Cuda,
                    other => bail!("--backend {other}: expected auto, cpu or cuda"),
                }
            }
            "--groups" => o.groups = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--shape" => {
                let v = value()?;
                let (dims, axis) = v.split_once(':').with_context(|| format!("--shape {v}: expected OUTxIN:AXIS"))?;
                let (out, inp) = dims.split_once('x').with_context(|| format!("--shape {v}: expected OUTxIN:AXIS"))?;
                o.shapes.push((out.parse()?, inp.parse()?, axis.parse()?));
            }
            other => bail!("unknown option {other}"),
        }
    }
    if o.shapes.is_empty() {
        o.shapes = vec![(576, 1536, 1), (1536, 576, 0)];
    }
    Ok(o)
}

/// `H = Xᵀ X` of `samples` seeded inputs of `n` features (see the file's docs).
fn hessian(n: usize, samples: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    let spikes: Vec<Vec<f64>> =
        (0..4).map(|_| (0..n).map(|_| rng.next_gaussian() / (n as f64).sqrt()).collect()).collect();
    let mut h = vec![0f64; n * n];
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
    h
}

fn main() -> Result<()> {
    let o = parse_args()?;
    println!("| W [out, in] | axis | k | group | plain s | LDLQ s | LDLQ / plain | proxy s | rel. proxy plain | rel. proxy LDLQ | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &(out, inp, axis) in &o.shapes {
        let w = gaussian(out * inp, 1).map_err(anyhow::Error::msg)?;
        let h = hessian(inp, o.samples, 2);
        let cfg = EncoderConfig { axis, threads: o.threads, backend: o.backend, ..EncoderConfig::new(o.k, o.l) };
        let start = Instant::now();
        let plain = encode_linear(&w, out, inp, &cfg)?;
        let plain_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let plain_proxy = proxy_error(&w, &plain.reconstruction, out, inp, axis, &h, o.threads)?;
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
                o.k,
                ldlq_s / plain_s,
                plain_proxy.relative(),
                proxy.relative(),
                proxy.error / plain_proxy.error
            );
        }
    }
    Ok(())
}
