//! Codes one dense linear weight into trellis codes and (optionally) writes it as a model artifact.
//! The coded axis is rotated by a seeded random-sign block Hadamard first (docs/format.md §10;
//! `--no-rotation` codes the weight as given, which on real layers loses its outlier weights).
//! Where the requested axis is not whole 256-weight blocks, the rule of docs/format.md §10 takes
//! the other axis or pads.
//!
//! The weight `W [out, in]` comes from a safetensors file or is seeded Gaussian (default: the
//! Qwen down projection, out 5120 x in 17408, about 2.5 minutes on two cores at k 3, L 12). The
//! encoder's output is decoded again by the reference decoder (from the written artifact when
//! `--out` is given), and the mean squared error of those decoded weights, whether they agree bit
//! for bit with the encoder's own reconstruction, and the encode rate are printed as a table.
//! Exit status 0 means the decode agreed and the relative error is within its bound
//! (`encoder::RELATIVE_MSE_BOUND` (1/2)), and `--check` passed; 1 means one of them did not; 2 is an
//! error.
//!
//! ```text
//! cargo run --release --example quantize_layer -- --rows 5120 --cols 1024 --bits 3 --L 12
//! cargo run --release --example quantize_layer -- --bits 3 --L 12 --layout interleaved --out /tmp/q --check
//! cargo run --release --example quantize_layer -- --input model.safetensors --tensor model.layers.0.mlp.down_proj.weight --out DIR
//! ```
//!
//! `--help` lists every option.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use mlx_trellis::trellis::encoder::{
    choose_axis, code_linear, encode_padded, stored_from_linear, EncoderBackend, EncoderConfig, RotationSpec,
};
use mlx_trellis::trellis::reference::{expand, rel_err};
use mlx_trellis::trellis::reference_coded::forward_coded_f64;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::Rotation;
use mlx_trellis::trellis::{check_artifact_dir, write_artifact, Artifact, CodeLayout, ForwardPath, HostLayer};
use mlx_trellis::{load_safetensors, MlxArray};

#[path = "common/check.rs"]
mod check;
#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;

const QWEN_OUT: usize = 5120;
const QWEN_IN: usize = 17408;
const CHECK_ROWS: usize = 4;

/// Codes one dense linear weight W [out, in] into trellis codes, decodes it again and prints the
/// error; optionally writes it as a model artifact.
///
/// W comes from a safetensors file (--input, --tensor) or is seeded Gaussian (default: the Qwen
/// down projection, 5120 x 17408, about 2.5 minutes on two cores at k 3, L 12). The coded axis is
/// rotated by a seeded random-sign block Hadamard first (--no-rotation codes W as given), and
/// padded to whole blocks where neither axis is (docs/format.md §10). The codes are
/// decoded again by the reference decoder (from the written artifact when --out is given); the
/// table shows the mean squared error, whether the decode agrees bit for bit with the encoder's
/// own reconstruction, and the encode rate. Exit status: 0 the decode agreed, the relative error
/// (mean squared error over mean squared weight) is below its bound (1/2) (and --check and
/// --compare-cpu passed), 1 one of them did not, 2 an error.
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo run --release --example quantize_layer -- --rows 5120 --cols 1024 --bits 3 --L 12
  cargo run --release --example quantize_layer -- --bits 3 --L 12 --layout interleaved --out DIR --check
  cargo run --release --example quantize_layer -- --input model.safetensors --tensor model.layers.0.mlp.down_proj.weight --out DIR
  cargo run --release --example quantize_layer -- --backend cuda --compare-cpu 512")]
struct Options {
    /// A safetensors file holding the dense weight (any float dtype); goes with --tensor
    #[arg(long, value_name = "FILE", requires = "tensor")]
    input: Option<String>,
    /// The 2-D tensor W [out, in] of --input to code
    #[arg(long, value_name = "NAME", requires = "input")]
    tensor: Option<String>,
    /// Output features (rows of W) of the seeded Gaussian weight
    #[arg(long = "rows", value_name = "OUT", default_value_t = QWEN_OUT)]
    out_features: usize,
    /// Input features (columns of W) of the seeded Gaussian weight
    #[arg(long = "cols", value_name = "IN", default_value_t = QWEN_IN)]
    in_features: usize,
    #[command(flatten)]
    seed: cli::SeedArg,
    /// Bits per weight (k)
    #[arg(long = "bits", value_name = "K", default_value_t = 3)]
    k: u32,
    /// Trellis state bits
    #[arg(long = "L", value_name = "L", default_value_t = 12)]
    l: u32,
    /// Block length T in weights: 256 (what every GPU kernel serves) or a shorter one whose T*k
    /// bits are whole 32-bit words (192 codes a 576-wide axis unpadded; the host and generic
    /// paths serve it, and on axis 0 the GPUs' down kernels where T is a multiple of 64)
    #[arg(long = "block-len", value_name = "T", default_value_t = 256)]
    t: u32,
    /// Stored axis: 0 stores the transpose [in, out] (down projections), 1 stores W [out, in];
    /// where that axis is not whole T-weight blocks, the rule of docs/format.md §10 takes the
    /// other axis or pads
    #[arg(long, value_name = "0|1", default_value_t = 0)]
    axis: u32,
    /// Code layout: row-major or interleaved (the 3-bit block interleave, axis 0, L 12)
    #[arg(long, value_name = "LAYOUT", value_parser = cli::code_layout, default_value = "row-major")]
    layout: CodeLayout,
    #[command(flatten)]
    encoder: cli::EncoderArgs,
    /// Code the weight unrotated (by default the coded axis is rotated first)
    #[arg(long)]
    no_rotation: bool,
    /// Seed of the rotation's signs
    #[arg(long, value_name = "S", default_value_t = 0)]
    rotation_seed: u64,
    /// Code the first ROWS stored rows (rotated as above) again on the CPU and require the same
    /// bytes (0: skip)
    #[arg(long = "compare-cpu", value_name = "ROWS", default_value_t = 0)]
    compare_cpu_rows: usize,
    /// Write DIR/model.safetensors and DIR/config.json with the coded module
    #[arg(long, value_name = "DIR")]
    out: Option<String>,
    /// The module's name in the artifact [default: model.layers.0.mlp.down_proj on axis 0,
    /// model.layers.0.mlp.up_proj on axis 1]
    #[arg(long, value_name = "NAME", requires = "out")]
    module: Option<String>,
    /// Load the module back, run four random rows through the generic path (rotation and padding
    /// applied) and gate the relErr against the f64 reference of the codes (1e-4; 2e-3 where MLX's CUDA back-end multiplies
    /// f32 in TF32); the relErr against the dense weights is printed as information
    #[arg(long)]
    check: bool,
}

fn parse_args() -> Result<Options> {
    Ok(Options::parse())
}

fn progress(msg: &str) {
    eprintln!("[quantize_layer] {msg}");
}

/// The dense weight `W [out, in]` as f32, with its shape and a description of where it came from.
fn load_weight(o: &Options) -> Result<(Vec<f32>, usize, usize, String)> {
    if let (Some(file), Some(name)) = (&o.input, &o.tensor) {
        let mut st = load_safetensors(file)?;
        let (w, out_features, in_features, dtype) = check::take_dense_weight(&mut st, file, name)?;
        return Ok((w, out_features, in_features, format!("{name} ({dtype})")));
    }
    let (out, inf) = (o.out_features, o.in_features);
    progress(&format!("making a seeded Gaussian W [{out}, {inf}] (seed {})", o.seed.seed));
    let n = out.checked_mul(inf).with_context(|| format!("W [{out}, {inf}] has more values than can be addressed"))?;
    Ok((gaussian(n, o.seed.seed)?, out, inf, format!("N(0,1) seed {}", o.seed.seed)))
}

fn main() -> ExitCode {
    exit::finish(run(), "[quantize_layer] a check failed (see the table)")
}

/// Where the block search of `cfg` runs.
fn search_on(cfg: &EncoderConfig) -> &'static str {
    if cfg.searches_on_cuda() {
        "cuda"
    } else {
        "cpu"
    }
}

fn run() -> Result<bool> {
    let o = parse_args()?;
    let cfg = EncoderConfig {
        axis: o.axis,
        layout: o.layout,
        threads: o.encoder.threads,
        backend: o.encoder.backend,
        rotation: (!o.no_rotation).then_some(RotationSpec { seed: o.rotation_seed }),
        t: o.t,
        ..EncoderConfig::new(o.k, o.l)
    };
    cfg.validate()?;
    if let Some(dir) = &o.out {
        // Refused now rather than after the encode.
        check_artifact_dir(dir).with_context(|| format!("--out {dir}"))?;
    }
    let (w, out_features, in_features, source) = load_weight(&o)?;
    let choice = choose_axis(out_features, in_features, o.axis, cfg.t as usize)?;
    let (axis, n) = (choice.axis, choice.logical);
    let rows = if axis == 0 { in_features } else { out_features };
    let threads = o.encoder.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rotation = if !o.no_rotation { format!("rotated (seed {})", o.rotation_seed) } else { "NOT rotated".into() };
    progress(&format!(
        "coding stored [{rows}, {n}] (axis {axis}{}), {rotation}, k = {}, L = {}, {:?}, search on {}, {threads} threads",
        if choice.stored != n { format!(", padded to {}", choice.stored) } else { String::new() },
        o.k,
        o.l,
        o.layout,
        search_on(&cfg)
    ));

    let start = Instant::now();
    let mut last_report = Instant::now();
    let coded = code_linear(&w, out_features, in_features, &cfg, &mut |done, total| {
        if last_report.elapsed().as_secs_f64() >= 3.0 && done < total {
            last_report = Instant::now();
            let secs = start.elapsed().as_secs_f64();
            let rate = (done * n) as f64 / secs;
            let eta = (total - done) as f64 * n as f64 / rate;
            progress(&format!("{done}/{total} rows, {rate:.3e} weights/s, ETA {eta:.0} s"));
        }
    })
    .with_context(|| format!("coding {source} (axis {axis})"))?;
    let encode_s = start.elapsed().as_secs_f64();
    let rate = (rows * n) as f64 / encode_s;
    progress(&format!("coded in {encode_s:.2} s ({rate:.3e} weights/s); encoder's mse {:.4e}", coded.mse));

    let module = o.module.clone().unwrap_or_else(|| {
        if axis == 0 { "model.layers.0.mlp.down_proj" } else { "model.layers.0.mlp.up_proj" }.to_string()
    });
    // The layer to decode: read back from disk when written, so the file is what is checked.
    let linear = match &o.out {
        Some(dir) => {
            write_artifact(dir, &[(module.as_str(), &coded.to_linear(&module)?)], &[])?;
            progress(&format!("wrote module {module:?} to {dir}"));
            Artifact::open(dir)?.module(&module)?
        }
        None => coded.to_linear(&module)?,
    };
    let host: HostLayer = linear.to_host()?;
    let coded_axis = linear.coded_axis();
    // The weights the codes stand for, from the reference decoder: the logical columns of the
    // decoded stored matrix, rotated back in f64. Their error must be the encoder's.
    let (stored, _, _) = stored_from_linear(&w, out_features, in_features, axis)?;
    drop(w);
    let decoded = expand(&host.codes, &host.scales, &host.geometry)?;
    let cols = host.geometry.cols;
    let mut sq = 0f64;
    let mut row = vec![0f64; n];
    for (dec, orig) in decoded.chunks_exact(cols).zip(stored.chunks_exact(n)) {
        row.iter_mut().zip(&dec[..n]).for_each(|(r, &d)| *r = f64::from(d));
        if let Some(r) = &coded_axis.rotation {
            r.inverse_f64(&mut row)?;
        }
        sq += row.iter().zip(orig).map(|(&d, &o)| (d - f64::from(o)).powi(2)).sum::<f64>();
    }
    let mse = sq / stored.len() as f64;
    let agrees = mse.to_bits() == coded.mse.to_bits() && coded_axis == coded.coded_axis;
    let q = coded.quality();

    println!("\nTrellis encoder: {source}, W [{out_features}, {in_features}]");
    println!("| stored | k | L | axis | rotation | layout | search | mse (reference decode) | mse / mean w² (gate) | encode s | weights/s | decode = encoder's |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| [{rows}, {cols}] | {} | {} | {axis} | {} | {} | {} | {mse:.4e} | {:.3e} ({} {:.1e}) | {encode_s:.2} | {rate:.3e} | {} |",
        o.k,
        o.l,
        coded_axis.rotation.as_ref().map_or("none".to_string(), |r| format!("block {}", r.block())),
        match o.layout {
            CodeLayout::RowMajor => "row-major",
            CodeLayout::K3Interleaved => "interleaved",
        },
        search_on(&cfg),
        q.relative_mse,
        if q.passes() { "ok" } else { "FAIL" },
        q.bound,
        if agrees { "yes" } else { "NO" }
    );
    if q.zero_rows + q.flushed_rows > 0 {
        println!(
            "\n{} stored rows are all zeros (coded exactly); {} are too small for an f16 scale (below 2^-14 · RMS(lut)) and decode to zeros",
            q.zero_rows, q.flushed_rows
        );
    }
    let mut ok = agrees && q.passes();

    if o.compare_cpu_rows > 0 {
        // The same stored rows (rotated as coded) through both searches, row-major, must give
        // the same bytes.
        let count = o.compare_cpu_rows.min(rows);
        let mut part = stored[..count * n].to_vec();
        if let Some(seed) = cfg.rotation.map(|r| r.seed) {
            Rotation::seeded(n, seed)?.rotate_rows(&mut part)?;
        }
        let row_major = EncoderConfig { layout: CodeLayout::RowMajor, axis, rotation: None, ..cfg };
        let start = Instant::now();
        let cpu_cfg = EncoderConfig { backend: EncoderBackend::Cpu, ..row_major };
        let cpu = encode_padded(&part, count, n, &cpu_cfg, &mut |_, _| {})?;
        let cpu_s = start.elapsed().as_secs_f64();
        let this = encode_padded(&part, count, n, &row_major, &mut |_, _| {})?;
        let same = cpu.layer.codes == this.layer.codes && cpu.layer.scales == this.layer.scales && cpu.mse == this.mse;
        ok &= same;
        println!(
            "\n| first {count} stored rows | CPU search | {} search | same bytes |\n|---|---|---|---|",
            search_on(&cfg)
        );
        println!("| weights/s | {:.3e} | (above) | {} |", (count * n) as f64 / cpu_s, if same { "yes" } else { "NO" });
    }

    if o.check {
        let (inf, outf) = (linear.in_features(), linear.out_features());
        let x = gaussian(CHECK_ROWS * inf, o.seed.seed ^ 0xC0FFEE)?;
        let xa = MlxArray::from_slice(&x, &[CHECK_ROWS, inf])?;
        let y_array = linear.forward_with(&xa, ForwardPath::Generic)?;
        let y = check::to_f64(&y_array)?;
        let xd: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let want_decoded = forward_coded_f64(&xd, CHECK_ROWS, &host, &coded_axis)?;
        let (srows, scols) = if axis == 0 { (inf, outf) } else { (outf, inf) };
        let want_dense = check::dense_f64(&xd, CHECK_ROWS, &stored, srows, scols, axis)?;
        let (e_decoded, e_dense) = (rel_err(&y, &want_decoded)?, rel_err(&y, &want_dense)?);
        let gate = check::f32_gate();
        let (passed, status) = check::verdict(&y_array, e_decoded, gate)?;
        ok &= passed;
        println!("\n| check ({CHECK_ROWS} rows, generic path) | relErr | gate |\n|---|---|---|");
        println!("| vs the f64 reference of the codes | {e_decoded:.2e} | {status} ({gate:.1e}) |");
        println!("| vs original dense weights (quantization error) | {e_dense:.2e} | information |");
    }
    Ok(ok)
}
