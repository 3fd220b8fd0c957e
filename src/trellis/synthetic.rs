//! Seeded synthetic coded layers and activations (any bit string is a valid block, so random
//! words are random codes).

use half::f16;

use crate::alloc::try_with_capacity;
use crate::error::Result;

use super::format::{row_major_to_interleaved, CodeLayout, HostLayer, TrellisGeometry};

/// A small, fast, seedable generator (SplitMix64), so synthetic data is the same on every
/// platform and release.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn next_gaussian(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A seeded random coded layer of `rows x cols` stored weights: uniform random code words and
/// scales spread log-normally (±30 %) around `scale` (real down projections of a 5120-wide
/// model have per-row scales around 0.01 to 0.02).
#[allow(clippy::too_many_arguments)] // the format's parameters, each a plain number
pub fn synthetic_layer(
    rows: usize,
    cols: usize,
    k: u32,
    l: u32,
    axis: u32,
    layout: CodeLayout,
    scale: f32,
    seed: u64,
) -> Result<HostLayer> {
    let host = synthetic_layer_in_blocks(rows, cols, k, l, 256, axis, scale, seed)?;
    match layout {
        CodeLayout::RowMajor => Ok(host),
        CodeLayout::K3Interleaved => Ok(HostLayer {
            geometry: host.geometry.interleaved()?,
            codes: row_major_to_interleaved(&host.codes, rows, cols)?,
            scales: host.scales,
        }),
    }
}

/// [`synthetic_layer`] in row-major codes of `t`-weight blocks (the format's `T`; 256 there):
/// the same words and scales from the same seed.
#[allow(clippy::too_many_arguments)] // the format's parameters, each a plain number
pub fn synthetic_layer_in_blocks(
    rows: usize,
    cols: usize,
    k: u32,
    l: u32,
    t: u32,
    axis: u32,
    scale: f32,
    seed: u64,
) -> Result<HostLayer> {
    let geometry = TrellisGeometry::row_major(rows, cols, k, t, l, axis)?;
    let mut rng = SplitMix64::new(seed);
    let words = geometry.code_words();
    let mut codes = try_with_capacity(words, || format!("the codes of a synthetic {geometry} layer"))?;
    codes.extend((0..words).map(|_| rng.next_u32()));
    let scales = (0..rows).map(|_| f16::from_f32(scale * (0.3 * rng.next_gaussian()).exp() as f32)).collect();
    Ok(HostLayer { codes, scales, geometry })
}

/// A seeded random coded MLP `hidden -> intermediate -> hidden` at `k` bits: gate and up stored
/// row-major `[intermediate, hidden]` (axis 1), down stored `[intermediate, hidden]` (axis 0) in
/// `down_layout`. Scales are `1/sqrt(fan-in)`, so standard-normal activations give outputs of
/// order one (as in a model, where the incoherence rotation makes weights near-Gaussian).
pub fn synthetic_mlp(
    hidden: usize,
    intermediate: usize,
    k: u32,
    down_layout: CodeLayout,
    seed: u64,
) -> Result<(HostLayer, HostLayer, HostLayer)> {
    synthetic_mlp_of(hidden, intermediate, k, 0, down_layout, seed)
}

/// [`synthetic_mlp`] with its down projection stored `[hidden, intermediate]` row-major on axis 1
/// (along its inputs, as gate and up are), so that all three run on the axis-1 kernels: the same
/// gate and up for the same seed, the down projection's own random codes.
pub fn synthetic_mlp_axis_one(
    hidden: usize,
    intermediate: usize,
    k: u32,
    seed: u64,
) -> Result<(HostLayer, HostLayer, HostLayer)> {
    synthetic_mlp_of(hidden, intermediate, k, 1, CodeLayout::RowMajor, seed)
}

/// The MLP of [`synthetic_mlp`], its down projection coded on `down_axis` in `down_layout`.
fn synthetic_mlp_of(
    hidden: usize,
    intermediate: usize,
    k: u32,
    down_axis: u32,
    down_layout: CodeLayout,
    seed: u64,
) -> Result<(HostLayer, HostLayer, HostLayer)> {
    let gate_scale = (1.0 / (hidden as f64).sqrt()) as f32;
    let down_scale = (1.0 / (intermediate as f64).sqrt()) as f32;
    let gate = synthetic_layer(intermediate, hidden, k, 12, 1, CodeLayout::RowMajor, gate_scale, seed)?;
    let up = synthetic_layer(intermediate, hidden, k, 12, 1, CodeLayout::RowMajor, gate_scale, seed ^ 0x75)?;
    // Stored [in, out] on axis 0, [out, in] on axis 1.
    let (rows, cols) = if down_axis == 0 { (intermediate, hidden) } else { (hidden, intermediate) };
    let down = synthetic_layer(rows, cols, k, 12, down_axis, down_layout, down_scale, seed ^ 0xd0)?;
    Ok((gate, up, down))
}

/// `n` seeded standard-normal values (an error where `n` values cannot be allocated).
pub fn gaussian(n: usize, seed: u64) -> Result<Vec<f32>> {
    let mut rng = SplitMix64::new(seed);
    let mut v = try_with_capacity(n, || format!("{n} Gaussian values"))?;
    v.extend((0..n).map(|_| rng.next_gaussian() as f32));
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_in_blocks_of_256_are_the_synthetic_layers() {
        let a = synthetic_layer(40, 512, 3, 12, 0, CodeLayout::RowMajor, 0.02, 5).unwrap();
        let b = synthetic_layer_in_blocks(40, 512, 3, 12, 256, 0, 0.02, 5).unwrap();
        assert_eq!((a.codes, a.scales, a.geometry), (b.codes, b.scales, b.geometry));
        // Shorter blocks: the same words, another geometry.
        let c = synthetic_layer_in_blocks(40, 576, 3, 12, 192, 0, 0.02, 5).unwrap();
        assert_eq!((c.geometry.t, c.geometry.blocks_per_row(), c.codes.len()), (192, 3, 40 * 576 * 3 / 32));
    }

    #[test]
    fn synthetic_layers_are_seeded_and_shaped() {
        let a = synthetic_layer(8, 512, 3, 12, 0, CodeLayout::K3Interleaved, 0.01, 1).unwrap();
        let b = synthetic_layer(8, 512, 3, 12, 0, CodeLayout::K3Interleaved, 0.01, 1).unwrap();
        assert_eq!(a.codes, b.codes);
        assert_eq!(a.codes.len(), 8 * 48);
        assert_eq!(a.geometry.codes_shape(), vec![1, 8, 48]);
        assert!(a.scales.iter().all(|s| (0.003..0.03).contains(&s.to_f32())));
        // All three projections on axis 1: the down projection stored [hidden, intermediate].
        let (g, u, d) = synthetic_mlp(512, 256, 2, CodeLayout::RowMajor, 9).unwrap();
        let (g1, u1, d1) = synthetic_mlp_axis_one(512, 256, 2, 9).unwrap();
        assert_eq!((g.codes, u.codes), (g1.codes, u1.codes));
        assert_eq!((d.geometry.axis, d.geometry.rows, d.geometry.cols), (0, 256, 512));
        assert_eq!((d1.geometry.axis, d1.geometry.rows, d1.geometry.cols), (1, 512, 256));
        assert_eq!((d1.geometry.in_features(), d1.geometry.out_features()), (256, 512));
        let g = gaussian(10_000, 3).unwrap();
        let mean = g.iter().sum::<f32>() / 1e4;
        let var = g.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 1e4;
        assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "{mean} {var}");
    }
}
