//! The coded MLP (`TrellisMlp`) on every back-end: the generic path against the f64 reference,
//! the reference path, loading from an artifact, and refused inputs.

mod common;

use common::mlp_artifact::{mlp_case, temp_dir, MlpCase};
use common::{f32_matmul_gate, gate, to_f64};
use mlx_trellis::trellis::reference::{mlp_forward_f64, rel_err, swiglu_f64};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{write_artifact, Artifact, CodeLayout, ForwardPath, TrellisMlp};
use mlx_trellis::{Dtype, ErrorKind, MlxArray};

fn mlp(hidden: usize, inter: usize, k: u32, down_layout: CodeLayout) -> MlpCase {
    mlp_case("mlp", hidden, inter, k, down_layout, (hidden + inter) as u64 + k as u64)
}

fn x(m: usize, hidden: usize, dtype: Dtype) -> (MlxArray, Vec<f64>) {
    let x = MlxArray::from_slice(&gaussian(m * hidden, 31 * m as u64 + hidden as u64).unwrap(), &[m, hidden])
        .unwrap()
        .astype(dtype)
        .unwrap();
    let xr = to_f64(&x);
    (x, xr)
}

#[test]
fn the_generic_and_host_paths_match_the_f64_reference() {
    for (k, down_layout) in [(2, CodeLayout::RowMajor), (3, CodeLayout::K3Interleaved), (4, CodeLayout::RowMajor)] {
        let c = mlp(512, 1024, k, down_layout);
        for (path, f32_gate) in [(ForwardPath::Generic, f32_matmul_gate()), (ForwardPath::Host, 1e-5)] {
            for dtype in [Dtype::Float32, Dtype::Bfloat16] {
                for m in [1, 3, 8, 17] {
                    let (x, xr) = x(m, 512, dtype);
                    let want = mlp_forward_f64(&xr, m, &c.host.0, &c.host.1, &c.host.2).unwrap();
                    let y = c.mlp.forward_with(&x, path).unwrap();
                    assert_eq!((y.shape(), y.dtype()), (vec![m, 512], dtype));
                    let err = rel_err(&to_f64(&y), &want).unwrap();
                    // f32: two f32 products in a row; bf16: the output's and h's roundings.
                    let bound = if dtype == Dtype::Float32 { 2.0 * f32_gate } else { gate(dtype) };
                    assert!(err < bound, "{path} k {k} {dtype} M {m}: relErr {err:.3e}");
                    let h = c.mlp.swiglu_with(&x, path).unwrap();
                    let h_want = swiglu_f64(&xr, m, &c.host.0, &c.host.1).unwrap();
                    let err = rel_err(&to_f64(&h), &h_want).unwrap();
                    assert!(err < bound, "{path} SwiGLU k {k} {dtype} M {m}: relErr {err:.3e}");
                }
            }
        }
    }
}

#[test]
fn the_reference_path_is_the_f64_mlp_and_keeps_leading_dimensions() {
    let c = mlp(512, 768, 3, CodeLayout::K3Interleaved);
    let (x, xr) = x(6, 512, Dtype::Float32);
    let want = mlp_forward_f64(&xr, 6, &c.host.0, &c.host.1, &c.host.2).unwrap();
    let y = c.mlp.forward_with(&x.reshape(&[2, 3, 512]).unwrap(), ForwardPath::Reference).unwrap();
    assert_eq!(y.shape(), vec![2, 3, 512]);
    let got = to_f64(&y);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(*g as f32, *w as f32);
    }
    // No rows: an empty result of the right shape by every path.
    let empty = MlxArray::zeros(&[0, 512], Dtype::Float32).unwrap();
    for path in [ForwardPath::Auto, ForwardPath::Generic, ForwardPath::Host, ForwardPath::Reference] {
        assert_eq!(c.mlp.forward_with(&empty, path).unwrap().shape(), vec![0, 512], "{path}");
    }
}

#[test]
fn an_mlp_loads_from_an_artifact() {
    let c = mlp(256, 512, 2, CodeLayout::RowMajor);
    let dir = temp_dir("mlp-artifact");
    let prefix = "model.layers.3.mlp";
    let (g, u, d) = (c.mlp.gate(), c.mlp.up(), c.mlp.down());
    let names = [format!("{prefix}.gate_proj"), format!("{prefix}.up_proj"), format!("{prefix}.down_proj")];
    write_artifact(&dir, &[(&names[0], g), (&names[1], u), (&names[2], d)], &[]).unwrap();
    let art = Artifact::open(&dir).unwrap();
    let loaded = TrellisMlp::from_artifact(&art, prefix).unwrap();
    assert_eq!((loaded.hidden(), loaded.intermediate()), (256, 512));
    let (x, _) = x(2, 256, Dtype::Float32);
    let a = to_f64(&c.mlp.forward_with(&x, ForwardPath::Generic).unwrap());
    let b = to_f64(&loaded.forward_with(&x, ForwardPath::Generic).unwrap());
    assert_eq!(a, b);
    let err = TrellisMlp::from_artifact(&art, "model.layers.4.mlp").unwrap_err();
    assert!(err.to_string().contains("model.layers.4.mlp"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mismatched_projections_and_activations_are_refused() {
    let c = mlp(256, 512, 2, CodeLayout::RowMajor);
    let other = mlp(256, 768, 2, CodeLayout::RowMajor);
    let err = TrellisMlp::new(c.mlp.gate().clone(), other.mlp.up().clone(), c.mlp.down().clone()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("up"), "{err}");
    let err = TrellisMlp::new(c.mlp.gate().clone(), c.mlp.up().clone(), other.mlp.down().clone()).unwrap_err();
    assert!(err.to_string().contains("expected 512 -> 256"), "{err}");
    let (wrong, _) = x(2, 128, Dtype::Float32);
    let err = c.mlp.forward(&wrong).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("128 features"), "{err}");
    let ints = MlxArray::zeros(&[2, 256], Dtype::Int32).unwrap();
    assert_eq!(c.mlp.forward(&ints).unwrap_err().kind(), ErrorKind::InvalidArgument);
}
