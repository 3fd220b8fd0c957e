//! The encoder's CUDA block search gives the CPU search's bytes. The GPU tests are ignored with
//! the reason "needs MLX's CUDA back-end" (`--include-ignored` runs them; off CUDA they then
//! fail); the error paths run everywhere.

use mlx_trellis::trellis::cuda::viterbi::{self, MAX_L};
use mlx_trellis::trellis::encoder::{encode, Encoded, EncoderBackend, EncoderConfig};
use mlx_trellis::trellis::reference::expand;
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::CodeLayout;
use mlx_trellis::{backend, Backend};
mod common;
use common::require_cuda;

fn on(cfg: EncoderConfig, backend: EncoderBackend) -> EncoderConfig {
    EncoderConfig { backend, ..cfg }
}

/// Same codes, scales and reconstruction (bit for bit) and the same mse; the codes decode to
/// the reconstruction.
fn assert_same(cpu: &Encoded, gpu: &Encoded, what: &str) {
    assert_eq!(cpu.layer.geometry, gpu.layer.geometry, "{what}");
    assert_eq!(cpu.layer.scales, gpu.layer.scales, "{what}: scales");
    if let Some(i) = cpu.layer.codes.iter().zip(&gpu.layer.codes).position(|(a, b)| a != b) {
        panic!("{what}: code word {i} differs: CPU {:#010x}, CUDA {:#010x}", cpu.layer.codes[i], gpu.layer.codes[i]);
    }
    assert_eq!(cpu.layer.codes.len(), gpu.layer.codes.len(), "{what}");
    let same_rec = cpu.reconstruction.iter().zip(&gpu.reconstruction).all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same_rec, "{what}: reconstruction");
    assert_eq!(cpu.mse, gpu.mse, "{what}: mse");
    let decoded = expand(&gpu.layer.codes, &gpu.layer.scales, &gpu.layer.geometry).unwrap();
    assert!(decoded.iter().zip(&gpu.reconstruction).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: decode");
}

/// Gaussian rows with an all-zero row and a row of large values, so the scales differ widely.
fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut w = gaussian(rows * cols, seed).unwrap();
    w[cols..2 * cols].fill(0.0);
    for v in &mut w[2 * cols..3 * cols] {
        *v *= 1000.0;
    }
    w
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_cuda_search_gives_the_cpu_bytes() {
    require_cuda();
    // Every k at the largest L the kernel serves (1024 threads, values read from memory) and at
    // L = 9 (the smallest L with k = 8), and the shipped widths at every L in between (threads
    // per block from 64 up, values in registers up to L = 13).
    let mut shapes: Vec<(u32, u32)> = (1..=8).flat_map(|k| [(k, MAX_L), (k, 9)]).collect();
    shapes.extend([2u32, 3, 4].iter().flat_map(|&k| [8u32, 10, 11, 12, 13, 14].map(|l| (k, l))));
    for (k, l) in shapes {
        let (rows, cols) = (5, 768);
        let w = matrix(rows, cols, 7 * k as u64 + l as u64);
        let cfg = EncoderConfig::new(k, l);
        let cpu = encode(&w, rows, cols, &on(cfg, EncoderBackend::Cpu)).unwrap();
        let gpu = encode(&w, rows, cols, &on(cfg, EncoderBackend::Cuda)).unwrap();
        assert_same(&cpu, &gpu, &format!("k {k} L {l}"));
        println!("k {k} L {l}: same bytes, mse {:.4e}", gpu.mse);
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_cuda_search_serves_both_layouts_and_axes() {
    require_cuda();
    let (rows, cols) = (4, 1024);
    let w = matrix(rows, cols, 99);
    for (axis, layout) in [(0, CodeLayout::RowMajor), (1, CodeLayout::RowMajor), (0, CodeLayout::K3Interleaved)] {
        let cfg = EncoderConfig { axis, layout, ..EncoderConfig::new(3, 12) };
        let cpu = encode(&w, rows, cols, &on(cfg, EncoderBackend::Cpu)).unwrap();
        let gpu = encode(&w, rows, cols, &on(cfg, EncoderBackend::Cuda)).unwrap();
        assert_same(&cpu, &gpu, &format!("axis {axis} {layout:?}"));
    }
}

#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn the_cuda_search_spans_several_launches() {
    require_cuda();
    // 70,000 blocks: more than one launch (65,536 blocks each) and more blocks than thread
    // blocks, so every thread block walks over many.
    let (rows, cols) = (280, 64_000);
    let w = gaussian(rows * cols, 5).unwrap();
    let cfg = EncoderConfig::new(2, 8);
    let cpu = encode(&w, rows, cols, &on(cfg, EncoderBackend::Cpu)).unwrap();
    let gpu = encode(&w, rows, cols, &on(cfg, EncoderBackend::Cuda)).unwrap();
    assert_same(&cpu, &gpu, "70,000 blocks");
}

#[test]
fn auto_searches_on_cuda_only_where_it_can() {
    let cuda_here = backend() == Backend::Cuda;
    assert_eq!(EncoderConfig::new(3, 12).searches_on_cuda(), cuda_here);
    assert_eq!(EncoderConfig::new(3, MAX_L).searches_on_cuda(), cuda_here);
    assert!(!EncoderConfig::new(3, 16).searches_on_cuda(), "L = 16 does not fit the kernel");
    assert!(!on(EncoderConfig::new(3, 12), EncoderBackend::Cpu).searches_on_cuda());
    assert!(viterbi::supports(3, 12) && !viterbi::supports(3, 16));
}

#[test]
fn an_impossible_cuda_search_is_an_error_that_says_why() {
    let w = gaussian(2 * 256, 1).unwrap();
    let err = encode(&w, 2, 256, &on(EncoderConfig::new(3, 16), EncoderBackend::Cuda)).unwrap_err();
    assert!(format!("{err:#}").contains("L <= 15"), "{err:#}");
    if backend() != Backend::Cuda {
        let err = encode(&w, 2, 256, &on(EncoderConfig::new(3, 10), EncoderBackend::Cuda)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("CUDA search") && msg.contains("no CUDA back-end"), "{msg}");
        // Auto falls back to the CPU search and gives its bytes.
        let auto = encode(&w, 2, 256, &EncoderConfig::new(3, 10)).unwrap();
        let cpu = encode(&w, 2, 256, &on(EncoderConfig::new(3, 10), EncoderBackend::Cpu)).unwrap();
        assert_eq!(auto.layer.codes, cpu.layer.codes);
    }
}
