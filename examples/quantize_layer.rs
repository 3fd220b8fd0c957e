//! Codes one dense linear weight into trellis codes and (optionally) writes it as a model artifact.
//! The coded axis is rotated by a seeded random-sign block Hadamard first (format §10;
//! `--no-rotation` codes the weight as given, which on real layers loses its outlier weights).
//!
//! The weight `W [out, in]` comes from a safetensors file or is seeded Gaussian (default: the
//! Qwen down projection, out 5120 x in 17408, about 2.5 minutes on two cores at k 3, L 12). The
//! encoder's output is decoded again by the reference decoder (from the written artifact when
//! `--out` is given), and the mean squared error of those decoded weights, whether they agree bit
//! for bit with the encoder's own reconstruction, and the encode rate are printed as a table.
//! Exit status 0 means the decode agreed (and `--check` passed); 1 means it did not; 2 is an
//! error.
//!
//! ```text
//! cargo run --release --example quantize_layer -- --rows 5120 --cols 1024 --bits 3 --L 12
//! cargo run --release --example quantize_layer -- --bits 3 --L 12 --layout interleaved --out /tmp/q --check
//! cargo run --release --example quantize_layer -- --input model.safetensors --tensor model.layers.0.mlp.down_proj.weight --out DIR
//! ```
//!
//! Options:
//! - `--input FILE --tensor NAME`: a 2-D float tensor `W [out, in]` (any float dtype);
//! - `--rows OUT --cols IN`: shape of the seeded Gaussian `W [out, in]` (default 5120 x 17408);
//!   `--seed S` its seed (default 0);
//! - `--bits K` (default 3), `--L L` (default 12), `--axis 0|1` (default 0: stored `Wᵀ [in, out]`,
//!   for down projections; 1: stored `W [out, in]`; where that axis is not whole 256-weight
//!   blocks, the rule of format §10 takes the other axis or pads), `--layout row-major|interleaved`
//!   (default row-major), `--threads N` (default one per core);
//! - `--no-rotation`: code the weight unrotated; `--rotation-seed S` (default 0);
//! - `--backend auto|cpu|cuda`: where the block search runs (default auto: CUDA when the loaded
//!   MLX has it and L <= 15); `--compare-cpu ROWS`: code the first ROWS stored rows (rotated as
//!   above) again on the CPU and require the same bytes (exit status 1 otherwise);
//! - `--out DIR --module NAME`: write `DIR/model.safetensors` and `DIR/config.json` with the coded
//!   module (default name `model.layers.0.mlp.down_proj` for axis 0, `...up_proj` for axis 1);
//! - `--check`: load the module back (from `--out`, else from memory), run one forward of four
//!   random rows through `TrellisLinear` (generic MLX path, rotation and padding applied) and
//!   print its relErr against the f64 reference of the codes (gated at 1e-4, or 2e-3 where MLX's CUDA back-end multiplies f32
//!   in TF32) and against the original dense weights (information).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use mlx_trellis::trellis::encoder::{
    choose_axis, code_linear, encode_padded, stored_from_linear, EncoderBackend, EncoderConfig, RotationSpec,
};
use mlx_trellis::trellis::reference::{expand, rel_err};
use mlx_trellis::trellis::reference_coded::forward_coded_f64;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::Rotation;
use mlx_trellis::trellis::{write_artifact, Artifact, CodeLayout, ForwardPath, HostLayer};
use mlx_trellis::{load_safetensors, MlxArray};

#[path = "common/check.rs"]
mod check;
#[path = "common/exit.rs"]
mod exit;

const QWEN_OUT: usize = 5120;
const QWEN_IN: usize = 17408;
const CHECK_ROWS: usize = 4;

struct Options {
    input: Option<String>,
    tensor: Option<String>,
    out_features: usize,
    in_features: usize,
    seed: u64,
    k: u32,
    l: u32,
    axis: u32,
    layout: CodeLayout,
    threads: Option<usize>,
    backend: EncoderBackend,
    compare_cpu_rows: usize,
    out: Option<String>,
    module: Option<String>,
    check: bool,
    rotation: bool,
    rotation_seed: u64,
}

fn parse_args() -> Result<Options> {
    let mut o = Options {
        input: None,
        tensor: None,
        out_features: QWEN_OUT,
        in_features: QWEN_IN,
        seed: 0,
        k: 3,
        l: 12,
        axis: 0,
        layout: CodeLayout::RowMajor,
        threads: None,
        backend: EncoderBackend::Auto,
        compare_cpu_rows: 0,
        out: None,
        module: None,
        check: false,
        rotation: true,
        rotation_seed: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--input" => o.input = Some(value()?),
            "--tensor" => o.tensor = Some(value()?),
            "--rows" => o.out_features = value()?.parse().context("--rows takes a count (output features)")?,
            "--cols" => o.in_features = value()?.parse().context("--cols takes a count (input features)")?,
            "--seed" => o.seed = value()?.parse().context("--seed takes an integer")?,
            "--bits" => o.k = value()?.parse().context("--bits takes an integer")?,
            "--L" => o.l = value()?.parse().context("--L takes an integer")?,
            "--axis" => o.axis = value()?.parse().context("--axis takes 0 or 1")?,
            "--layout" => {
                o.layout = match value()?.as_str() {
                    "row-major" => CodeLayout::RowMajor,
                    "interleaved" => CodeLayout::K3Interleaved,
                    other => bail!("--layout: {other:?} is neither row-major nor interleaved"),
                }
            }
            "--threads" => o.threads = Some(value()?.parse().context("--threads takes a positive integer")?),
            "--backend" => {
                o.backend = match value()?.as_str() {
                    "auto" => EncoderBackend::Auto,
                    "cpu" => EncoderBackend::Cpu,
                    "cuda" => EncoderBackend::Cuda,
                    other => bail!("--backend: {other:?} is not auto, cpu or cuda"),
                }
            }
            "--compare-cpu" => o.compare_cpu_rows = value()?.parse().context("--compare-cpu takes a row count")?,
            "--out" => o.out = Some(value()?),
            "--module" => o.module = Some(value()?),
            "--check" => o.check = true,
            "--no-rotation" => o.rotation = false,
            "--rotation-seed" => o.rotation_seed = value()?.parse().context("--rotation-seed takes an integer")?,
            "-h" | "--help" => {
                let doc = include_str!("quantize_layer.rs").lines().take_while(|l| l.starts_with("//!"));
                println!("{}", doc.map(|l| l.trim_start_matches("//!").trim_start()).collect::<Vec<_>>().join("\n"));
                std::process::exit(0);
            }
            other => bail!("unknown option {other:?} (see --help)"),
        }
    }
    if o.input.is_some() != o.tensor.is_some() {
        bail!("--input and --tensor go together");
    }
    if o.module.is_some() && o.out.is_none() {
        bail!("--module needs --out");
    }
    Ok(o)
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
    progress(&format!("making a seeded Gaussian W [{out}, {inf}] (seed {})", o.seed));
    let n = out.checked_mul(inf).with_context(|| format!("W [{out}, {inf}] has more values than can be addressed"))?;
    Ok((gaussian(n, o.seed)?, out, inf, format!("N(0,1) seed {}", o.seed)))
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
        threads: o.threads,
        backend: o.backend,
        rotation: o.rotation.then_some(RotationSpec { seed: o.rotation_seed }),
        ..EncoderConfig::new(o.k, o.l)
    };
    cfg.validate()?;
    let (w, out_features, in_features, source) = load_weight(&o)?;
    let choice = choose_axis(out_features, in_features, o.axis, cfg.t as usize)?;
    let (axis, n) = (choice.axis, choice.logical);
    let rows = if axis == 0 { in_features } else { out_features };
    let threads = o.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let rotation = if o.rotation { format!("rotated (seed {})", o.rotation_seed) } else { "NOT rotated".into() };
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

    println!("\nTrellis encoder: {source}, W [{out_features}, {in_features}]");
    println!("| stored | k | L | axis | rotation | layout | search | mse (reference decode) | mse / mean w² | encode s | weights/s | decode = encoder's |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| [{rows}, {cols}] | {} | {} | {axis} | {} | {} | {} | {mse:.4e} | {:.5} | {encode_s:.2} | {rate:.3e} | {} |",
        o.k,
        o.l,
        coded_axis.rotation.as_ref().map_or("none".to_string(), |r| format!("block {}", r.block())),
        match o.layout {
            CodeLayout::RowMajor => "row-major",
            CodeLayout::K3Interleaved => "interleaved",
        },
        search_on(&cfg),
        if coded.mean_square > 0.0 { mse / coded.mean_square } else { 0.0 },
        if agrees { "yes" } else { "NO" }
    );
    let mut ok = agrees;

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
        let x = gaussian(CHECK_ROWS * inf, o.seed ^ 0xC0FFEE)?;
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
