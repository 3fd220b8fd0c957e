//! Codes a dense SwiGLU MLP (gate, up, down) into a trellis model artifact that `TrellisMlp`
//! and `qwen_down --mlp` load.
//!
//! The dense weights `PREFIX.{gate,up,down}_proj.weight` come from a safetensors file (as a
//! Hugging Face checkpoint stores them: gate and up `[intermediate, hidden]`, down
//! `[hidden, intermediate]`) or are seeded Gaussian. Each projection's coded axis is rotated by a
//! seeded random-sign block Hadamard (docs/format.md §10; `--no-rotation` codes the weights as
//! given, which on real layers loses their outlier weights). Gate and up are coded on axis 1
//! (stored `[out, in]`), down on axis 0 (stored `[in, out]`), where those dimensions are whole
//! 256-weight blocks; otherwise by the rule of docs/format.md §10 (the other axis where it is
//! whole blocks, else padded). An axis-0 projection at k 3, L 12 with a multiple of 512 stored
//! columns uses the 3-bit block interleave, every other one row-major. The artifact is then read
//! back, one forward of four rows by the generic path is checked against the f64 reference of
//! the read-back codes, and the quantization error against the dense MLP is printed with each
//! projection's relative error, gated at `encoder::RELATIVE_MSE_BOUND` (1/2). Exit status 0 means the
//! check and the bounds passed; 1 means one did not; 2 is an error.
//!
//! ```text
//! cargo run --release --example quantize_mlp -- --out /tmp/mlp
//! cargo run --release --example quantize_mlp -- --input model.safetensors --prefix model.layers.0.mlp --out DIR
//! cargo run --release --example qwen_down -- --weights /tmp/mlp --mlp model.layers.0.mlp
//! ```
//!
//! `--help` lists every option.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mlx_trellis::trellis::encoder::{choose_axis, code_linear, EncoderConfig, RotationSpec};
use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::trellis::reference_coded::mlp_coded_f64;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{
    check_artifact_dir, write_artifact, Artifact, CodeLayout, ForwardPath, TrellisLinear, TrellisMlp,
};
use mlx_trellis::{load_safetensors, MlxArray};

#[path = "common/check.rs"]
mod check;
#[path = "common/cli.rs"]
mod cli;
#[path = "common/exit.rs"]
mod exit;

const CHECK_ROWS: usize = 4;

/// Codes a dense SwiGLU MLP (gate, up, down) into a trellis model artifact that `TrellisMlp` and
/// `qwen_down --mlp` load.
///
/// The dense weights PREFIX.{gate,up,down}_proj.weight come from a safetensors file (as a Hugging
/// Face checkpoint stores them: gate and up [intermediate, hidden], down [hidden, intermediate])
/// or are seeded Gaussian. Each projection's coded axis is rotated by a seeded random-sign block
/// Hadamard (--no-rotation codes the weights as given). Gate and up are coded on axis 1 (stored
/// [out, in]), down on axis 0 (stored [in, out]), where those dimensions are whole 256-weight
/// blocks, otherwise by the rule of docs/format.md §10 (the other axis, else padded). An axis-0
/// projection at k 3, L 12 with a multiple of 512 stored columns uses the 3-bit block
/// interleave, every other one row-major. The artifact is read
/// back, one forward of four rows by the generic path is checked against the f64 reference of the
/// read-back codes, and the quantization error against the dense MLP is printed with each
/// projection's relative error (mean squared error over mean squared weight, gated at its bound
/// 1/2). Exit status: 0 the check and every bound passed, 1 one did not, 2 an error.
#[derive(Parser)]
#[command(after_help = "Examples:
  cargo run --release --example quantize_mlp -- --out /tmp/mlp
  cargo run --release --example quantize_mlp -- --input model.safetensors --prefix model.layers.0.mlp --out DIR
  cargo run --release --example qwen_down -- --weights /tmp/mlp --mlp model.layers.0.mlp")]
struct Options {
    /// The dense checkpoint (safetensors, any float dtype) [default: a seeded Gaussian MLP]
    #[arg(long, value_name = "FILE")]
    input: Option<String>,
    /// The MLP's name in the checkpoint and in the artifact
    #[arg(long, value_name = "P", default_value = "model.layers.0.mlp")]
    prefix: String,
    /// Hidden width of the seeded Gaussian MLP (Qwen3-14B: 5120)
    #[arg(long, value_name = "H", default_value_t = 512)]
    hidden: usize,
    /// Intermediate width of the seeded Gaussian MLP (Qwen3-14B: 17408)
    #[arg(long, value_name = "I", default_value_t = 1024)]
    inter: usize,
    #[command(flatten)]
    seed: cli::SeedArg,
    /// Bits per weight of gate and up
    #[arg(long, value_name = "K", default_value_t = 3)]
    bits: u32,
    /// Bits per weight of down
    #[arg(long = "down-bits", value_name = "K", default_value_t = 3)]
    down_bits: u32,
    /// Trellis state bits
    #[arg(long = "L", value_name = "L", default_value_t = 12)]
    l: u32,
    #[command(flatten)]
    encoder: cli::EncoderArgs,
    /// Code the weights unrotated (by default each coded axis is rotated first)
    #[arg(long)]
    no_rotation: bool,
    /// Seed of the rotations' signs (gate and up share one rotation where both are coded along
    /// their inputs, so the input is rotated once)
    #[arg(long, value_name = "S", default_value_t = 0)]
    rotation_seed: u64,
    /// Where model.safetensors and config.json go
    #[arg(long, value_name = "DIR")]
    out: String,
}

fn parse_args() -> Result<Options> {
    Ok(Options::parse())
}

fn progress(msg: &str) {
    eprintln!("[quantize_mlp] {msg}");
}

/// A dense linear weight `W [out, in]` as f32.
struct Dense {
    w: Vec<f32>,
    out_features: usize,
    in_features: usize,
}

/// The three dense weights (gate, up, down) from the checkpoint or seeded Gaussian ones, scaled
/// by `1/sqrt(in)` so the MLP's activations stay of order one.
fn dense_mlp(o: &Options) -> Result<[Dense; 3]> {
    let names = ["gate_proj", "up_proj", "down_proj"];
    if let Some(file) = &o.input {
        let mut st = load_safetensors(file)?;
        let mut take = |name: &str| -> Result<Dense> {
            let key = format!("{}.{name}.weight", o.prefix);
            let (w, out_features, in_features, _) = check::take_dense_weight(&mut st, file, &key)?;
            Ok(Dense { w, out_features, in_features })
        };
        let [gate, up, down] = names.map(&mut take);
        let (gate, up, down) = (gate?, up?, down?);
        let (h, i) = (gate.in_features, gate.out_features);
        if (up.out_features, up.in_features) != (i, h) || (down.out_features, down.in_features) != (h, i) {
            bail!(
                "{file}: {}'s weights do not form an MLP: gate [{i}, {h}], up [{}, {}], down [{}, {}] \
                 (expected up [{i}, {h}] and down [{h}, {i}])",
                o.prefix,
                up.out_features,
                up.in_features,
                down.out_features,
                down.in_features
            );
        }
        return Ok([gate, up, down]);
    }
    let (h, i) = (o.hidden, o.inter);
    progress(&format!("making a seeded Gaussian MLP {h} -> {i} -> {h} (seed {})", o.seed.seed));
    let make = |out_features: usize, in_features: usize, seed: u64| -> Result<Dense> {
        let n = out_features.checked_mul(in_features).context("the MLP's size overflows")?;
        let scale = 1.0 / (in_features as f32).sqrt();
        let w = gaussian(n, seed)?.into_iter().map(|v| v * scale).collect();
        Ok(Dense { w, out_features, in_features })
    };
    Ok([make(i, h, o.seed.seed)?, make(i, h, o.seed.seed.wrapping_add(1))?, make(h, i, o.seed.seed.wrapping_add(2))?])
}

fn main() -> ExitCode {
    exit::finish(run(), "[quantize_mlp] the check failed (see the table)")
}

/// `down(silu(gate(x)) ⊙ up(x))` in f64 from dense `W [out, in]` weights.
fn dense_mlp_f64(x: &[f32], m: usize, [gate, up, down]: &[Dense; 3]) -> Result<Vec<f64>> {
    let linear = |x: &[f64], d: &Dense| check::dense_f64(x, m, &d.w, d.out_features, d.in_features, 1);
    let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let (g, u) = (linear(&x, gate)?, linear(&x, up)?);
    let h: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
    linear(&h, down)
}

fn run() -> Result<bool> {
    let o = parse_args()?;
    // Refused now rather than after the encode.
    check_artifact_dir(&o.out).with_context(|| format!("--out {}", o.out))?;
    let dense = dense_mlp(&o)?;
    let names = ["gate_proj", "up_proj", "down_proj"];
    let mut coded = Vec::with_capacity(3);
    let mut qualities = Vec::with_capacity(3);
    for (i, (name, d)) in names.iter().zip(&dense).enumerate() {
        let (k, conventional) = if *name == "down_proj" { (o.down_bits, 0) } else { (o.bits, 1) };
        let choice = choose_axis(d.out_features, d.in_features, conventional, 256)?;
        // The interleave (k 3, L 12 only) groups 512 stored columns.
        let interleave = choice.axis == 0 && k == 3 && o.l == 12 && choice.stored % 512 == 0;
        let layout = if interleave { CodeLayout::K3Interleaved } else { CodeLayout::RowMajor };
        // Gate and up coded along their inputs share one rotation of x; the rest get their own.
        let shares_input = choice.axis == 1 && *name != "down_proj";
        let seed = if shares_input { o.rotation_seed } else { o.rotation_seed.wrapping_add(1 + i as u64) };
        let cfg = EncoderConfig {
            axis: conventional,
            layout,
            threads: o.encoder.threads,
            backend: o.encoder.backend,
            rotation: (!o.no_rotation).then_some(RotationSpec { seed }),
            ..EncoderConfig::new(k, o.l)
        };
        let module = format!("{}.{name}", o.prefix);
        let padding = if choice.stored != choice.logical {
            format!(" (padded {} -> {})", choice.logical, choice.stored)
        } else {
            String::new()
        };
        progress(&format!(
            "coding {module} W [{}, {}], k = {k}, L = {}, axis {}{padding}, {layout:?}, {}",
            d.out_features,
            d.in_features,
            o.l,
            choice.axis,
            if o.no_rotation { "NOT rotated" } else { "rotated" }
        ));
        let start = Instant::now();
        let c = code_linear(&d.w, d.out_features, d.in_features, &cfg, &mut |_, _| {})
            .with_context(|| format!("coding {module}"))?;
        progress(&format!(
            "{module}: {:.2} s, mse {:.4e} (relative {:.5})",
            start.elapsed().as_secs_f64(),
            c.mse,
            c.relative_mse()
        ));
        qualities.push((module.clone(), c.quality()));
        coded.push((module.clone(), c.to_linear(&module)?));
    }
    let modules: Vec<(&str, &TrellisLinear)> = coded.iter().map(|(n, l)| (n.as_str(), l)).collect();
    let (hidden, inter) = (dense[0].in_features, dense[0].out_features);
    let extra = [("hidden_size", serde_json::json!(hidden)), ("intermediate_size", serde_json::json!(inter))];
    write_artifact(&o.out, &modules, &extra)?;
    progress(&format!("wrote {} to {}", o.prefix, o.out));

    // The check runs on what was written.
    let mlp = TrellisMlp::from_artifact(&Artifact::open(&o.out)?, &o.prefix)?;
    let x = gaussian(CHECK_ROWS * hidden, o.seed.seed ^ 0xC0FFEE)?;
    let y = mlp.forward_with(&MlxArray::from_slice(&x, &[CHECK_ROWS, hidden])?, ForwardPath::Generic)?;
    let got = check::to_f64(&y)?;
    let xd: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let (gate, up, down) = (mlp.gate().to_host()?, mlp.up().to_host()?, mlp.down().to_host()?);
    let axes = [mlp.gate().coded_axis(), mlp.up().coded_axis(), mlp.down().coded_axis()];
    let want = mlp_coded_f64(&xd, CHECK_ROWS, [(&gate, &axes[0]), (&up, &axes[1]), (&down, &axes[2])])?;
    let err = rel_err(&got, &want)?;
    let quantization = rel_err(&got, &dense_mlp_f64(&x, CHECK_ROWS, &dense)?)?;
    let gate = check::f32_gate();
    let (passed, status) = check::verdict(&y, err, gate)?;
    println!("\nTrellis MLP {}: {hidden} -> {inter} -> {hidden}, written to {}", o.prefix, o.out);
    println!("| check ({CHECK_ROWS} rows, f32, generic path) | relErr | gate |\n|---|---|---|");
    println!("| vs the f64 reference of the written codes | {err:.2e} | {status} ({gate:.1e}) |");
    println!("| vs the dense MLP (quantization error) | {quantization:.2e} | information |");
    println!(
        "\n| module | mse / mean w² | gate | rows all zero | rows too small, decoded as zeros |\n|---|---|---|---|---|"
    );
    let mut coded_ok = true;
    for (module, q) in &qualities {
        coded_ok &= q.passes();
        let status = if q.passes() { "ok" } else { "FAIL" };
        println!(
            "| {module} | {:.3e} | {status} ({:.1e}) | {} | {} |",
            q.relative_mse, q.bound, q.zero_rows, q.flushed_rows
        );
    }
    Ok(passed && coded_ok)
}
