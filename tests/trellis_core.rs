//! Trellis core: layouts, axes, the MLX expansion against the reference, forward paths and
//! artifacts.

use mlx_trellis::trellis::format::codebook::value_f64;
use mlx_trellis::trellis::format::interleaved_to_row_major;
use mlx_trellis::trellis::generic::expand_dense;
use mlx_trellis::trellis::reference::{expand, forward_f64, rel_err, state_at};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{
    synthetic_layer, write_artifact, Artifact, CodeLayout, ForwardPath, HostLayer, TrellisLinear,
};
use mlx_trellis::{save_safetensors, Dtype, MlxArray};
use std::collections::BTreeMap;

mod common;
use common::f32_matmul_gate;
use common::mlp_artifact::temp_dir;

fn layer(rows: usize, cols: usize, k: u32, l: u32, axis: u32, layout: CodeLayout, seed: u64) -> HostLayer {
    synthetic_layer(rows, cols, k, l, axis, layout, 0.02, seed).unwrap()
}

#[test]
fn interleaved_and_row_major_codes_decode_identically() {
    let inter = layer(24, 1024, 3, 12, 0, CodeLayout::K3Interleaved, 11);
    let rm_codes = interleaved_to_row_major(&inter.codes, 24, 1024).unwrap();
    let rm =
        HostLayer { codes: rm_codes, scales: inter.scales.clone(), geometry: inter.geometry.row_major_equivalent() };
    assert_eq!(
        expand(&inter.codes, &inter.scales, &inter.geometry).unwrap(),
        expand(&rm.codes, &rm.scales, &rm.geometry).unwrap()
    );
    // And on MLX.
    let a = TrellisLinear::from_host("inter", &inter).unwrap();
    let b = TrellisLinear::from_host("rm", &rm).unwrap();
    let da = expand_dense(a.codes(), a.scales(), a.geometry()).unwrap().to_vec::<f32>().unwrap();
    let db = expand_dense(b.codes(), b.scales(), b.geometry()).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(da, db);
}

#[test]
fn mlx_expansion_equals_the_reference_bit_for_bit() {
    for (k, l, layout) in [
        (2, 12, CodeLayout::RowMajor),
        (3, 12, CodeLayout::RowMajor),
        (4, 12, CodeLayout::RowMajor),
        (3, 12, CodeLayout::K3Interleaved),
        (2, 9, CodeLayout::RowMajor),
        (4, 16, CodeLayout::RowMajor),
    ] {
        let h = layer(37, 512, k, l, 0, layout, k as u64 * 100 + l as u64);
        let lin = TrellisLinear::from_host("w", &h).unwrap();
        let got = expand_dense(lin.codes(), lin.scales(), lin.geometry()).unwrap().to_vec::<f32>().unwrap();
        let want = expand(&h.codes, &h.scales, &h.geometry).unwrap();
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "k {k} L {l} {layout:?}");
    }
}

#[test]
fn axis_zero_equals_the_transpose_coded_with_axis_one() {
    // The same codes read as axis 0 (stored [in, out]) and axis 1 (stored [out, in]) are
    // transposes of one another as linear maps.
    let h0 = layer(64, 256, 3, 12, 0, CodeLayout::RowMajor, 5);
    let mut h1 = h0.clone();
    h1.geometry.axis = 1;
    let (in0, out0) = (h0.geometry.in_features(), h0.geometry.out_features());
    assert_eq!((h1.geometry.in_features(), h1.geometry.out_features()), (out0, in0));
    // The stored matrix [64, 256] in f64, straight from the definition.
    let w = |r: usize, c: usize| value_f64(state_at(&h0.codes, &h0.geometry, r, c).unwrap()) * h0.scales[r].to_f64();
    // e_i through axis 0 gives row i of the stored matrix; e_j through axis 1 gives column j.
    let eye = |n: usize, i: usize| -> Vec<f64> { (0..n).map(|j| (i == j) as u8 as f64).collect() };
    for i in [0usize, 17, 63] {
        let y = forward_f64(&eye(64, i), 1, &h0.codes, &h0.scales, &h0.geometry).unwrap();
        assert!(y.iter().enumerate().all(|(c, &v)| v == w(i, c)));
    }
    for j in [0usize, 100, 255] {
        let y = forward_f64(&eye(256, j), 1, &h1.codes, &h1.scales, &h1.geometry).unwrap();
        assert!(y.iter().enumerate().all(|(r, &v)| v == w(r, j)));
    }
    // The MLX paths agree with the reference for both axes.
    for h in [&h0, &h1] {
        let lin = TrellisLinear::from_host("w", h).unwrap();
        check_forward(&lin, h, 3, Dtype::Float32, ForwardPath::Generic, f32_matmul_gate());
        check_forward(&lin, h, 3, Dtype::Float32, ForwardPath::Host, 1e-5);
    }
}

fn check_forward(lin: &TrellisLinear, h: &HostLayer, m: usize, dtype: Dtype, path: ForwardPath, gate: f64) {
    let g = lin.geometry();
    let xs = gaussian(m * g.in_features(), 1000 + m as u64).unwrap();
    let x = MlxArray::from_slice(&xs, &[m, g.in_features()]).unwrap().astype(dtype).unwrap();
    // The reference sees exactly the activations the layer sees (after rounding to `dtype`).
    let xr: Vec<f64> = x.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
    let want = forward_f64(&xr, m, &h.codes, &h.scales, &h.geometry).unwrap();
    let y = lin.forward_with(&x, path).unwrap();
    assert_eq!(y.shape(), vec![m, g.out_features()]);
    assert_eq!(y.dtype(), dtype);
    let got: Vec<f64> = y.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
    let err = rel_err(&got, &want).unwrap();
    println!("{g} M {m} {dtype} {path}: relErr {err:.2e} (gate {gate:.0e})");
    assert!(err < gate, "{g} M {m} {dtype} {path}: relErr {err:.3e} >= {gate:.0e}");
}

#[test]
fn forward_matches_the_f64_reference() {
    for (k, layout, axis) in [
        (2, CodeLayout::RowMajor, 0),
        (3, CodeLayout::RowMajor, 0),
        (4, CodeLayout::RowMajor, 1),
        (3, CodeLayout::K3Interleaved, 0),
    ] {
        let h = layer(136, 512, k, 12, axis, layout, 7 * k as u64);
        let lin = TrellisLinear::from_host("w", &h).unwrap();
        for m in [1, 2, 5, 8] {
            check_forward(&lin, &h, m, Dtype::Float32, ForwardPath::Generic, f32_matmul_gate());
            check_forward(&lin, &h, m, Dtype::Bfloat16, ForwardPath::Generic, 1e-2);
        }
        // The host path in passes of 16 rows: one pass, a full one, and a partial second.
        for m in [1, 3, 16, 37] {
            check_forward(&lin, &h, m, Dtype::Float32, ForwardPath::Host, 1e-5);
            check_forward(&lin, &h, m, Dtype::Bfloat16, ForwardPath::Host, 1e-2);
            check_forward(&lin, &h, m, Dtype::Float16, ForwardPath::Host, 1e-2);
        }
        check_forward(&lin, &h, 3, Dtype::Float16, ForwardPath::Auto, 1e-2);
        check_forward(&lin, &h, 2, Dtype::Float32, ForwardPath::Reference, 1e-6);
    }
}

#[test]
fn layers_of_one_input_match_the_reference_and_their_own_calls() {
    // Both axes, three widths; leading dimensions kept; 1 to 37 rows (passes of 16).
    let hs = [
        layer(96, 512, 3, 12, 1, CodeLayout::RowMajor, 41),
        layer(512, 256, 2, 12, 0, CodeLayout::RowMajor, 42),
        layer(40, 512, 4, 16, 1, CodeLayout::RowMajor, 43),
    ];
    let lins: Vec<TrellisLinear> = hs.iter().map(|h| TrellisLinear::from_host("w", h).unwrap()).collect();
    let refs: Vec<&TrellisLinear> = lins.iter().collect();
    for (m, dtype, gate) in [(1, Dtype::Float32, 1e-5), (18, Dtype::Float32, 1e-5), (37, Dtype::Bfloat16, 1e-2)] {
        let x = MlxArray::from_slice(&gaussian(m * 512, 50 + m as u64).unwrap(), &[1, m, 512]).unwrap();
        let x = x.astype(dtype).unwrap();
        let xr: Vec<f64> =
            x.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        let ys = TrellisLinear::forward_shared_input(&refs, &x).unwrap();
        assert_eq!(ys.len(), hs.len());
        for ((y, h), lin) in ys.iter().zip(&hs).zip(&lins) {
            let g = h.geometry;
            assert_eq!(y.shape(), vec![1, m, g.out_features()]);
            assert_eq!(y.dtype(), dtype);
            let got: Vec<f64> =
                y.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
            let want = forward_f64(&xr, m, &h.codes, &h.scales, &g).unwrap();
            let err = rel_err(&got, &want).unwrap();
            assert!(err < gate, "{g} M {m} {dtype}: relErr {err:.3e} >= {gate:.0e}");
            // The same products as the layer's own call.
            let own = lin.forward(&x).unwrap().astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
            assert!(own.iter().zip(&got).all(|(&a, &b)| f64::from(a) == b), "{g} M {m} {dtype}");
        }
    }
    let err = TrellisLinear::forward_shared_input(
        &[&lins[0], &lins[1], &lins[2]],
        &MlxArray::zeros(&[2, 256], Dtype::Float32).unwrap(),
    );
    assert!(err.unwrap_err().to_string().contains("have 256 features"));
    let other = TrellisLinear::from_host("narrow", &layer(8, 256, 2, 12, 1, CodeLayout::RowMajor, 44)).unwrap();
    let err =
        TrellisLinear::forward_shared_input(&[&lins[0], &other], &MlxArray::zeros(&[2, 512], Dtype::Float32).unwrap());
    assert!(err.unwrap_err().to_string().contains("must share their input"));
    let none =
        TrellisLinear::forward_shared_input(&refs, &MlxArray::zeros(&[0, 512], Dtype::Float32).unwrap()).unwrap();
    assert_eq!(none.iter().map(|y| y.shape()).collect::<Vec<_>>(), vec![vec![0, 96], vec![0, 256], vec![0, 40]]);
}

#[test]
fn forward_keeps_leading_dimensions_and_refuses_bad_activations() {
    let h = layer(64, 256, 2, 12, 0, CodeLayout::RowMajor, 3);
    let lin = TrellisLinear::from_host("down", &h).unwrap();
    let x = MlxArray::from_slice(&gaussian(2 * 3 * 64, 1).unwrap(), &[2, 3, 64]).unwrap();
    assert_eq!(lin.forward(&x).unwrap().shape(), vec![2, 3, 256]);
    let err = lin.forward(&MlxArray::zeros(&[2, 63], Dtype::Float32).unwrap()).unwrap_err();
    assert!(err.to_string().contains("have 63 features, the layer takes 64"), "{err}");
    let err = lin.forward(&MlxArray::zeros(&[2, 64], Dtype::Int32).unwrap()).unwrap_err();
    assert!(err.to_string().contains("activations are int32"), "{err}");
    assert!("warp".parse::<ForwardPath>().unwrap_err().to_string().contains("unknown path \"warp\""));
}

const DOWN: &str = "model.layers.0.mlp.down_proj";

fn dims() -> Vec<(&'static str, serde_json::Value)> {
    vec![("hidden_size", serde_json::json!(512)), ("intermediate_size", serde_json::json!(72))]
}

#[test]
fn artifacts_round_trip() {
    let dir = temp_dir("artifact");
    let h = layer(72, 512, 3, 12, 0, CodeLayout::K3Interleaved, 2);
    let up = layer(72, 512, 2, 12, 1, CodeLayout::RowMajor, 3);
    let down = TrellisLinear::from_host(DOWN, &h).unwrap();
    let upl = TrellisLinear::from_host("model.layers.0.mlp.up_proj", &up).unwrap();
    write_artifact(&dir, &[(DOWN, &down), ("model.layers.0.mlp.up_proj", &upl)], &dims()).unwrap();
    let art = Artifact::open(&dir).unwrap();
    assert_eq!(art.trellis_modules().unwrap(), vec![DOWN.to_string(), "model.layers.0.mlp.up_proj".to_string()]);
    let back = art.module(DOWN).unwrap();
    assert_eq!(back.geometry(), down.geometry());
    let hb = back.to_host().unwrap();
    assert_eq!((hb.codes, hb.scales), (h.codes.clone(), h.scales.clone()));
    let u = art.module("model.layers.0.mlp.up_proj").unwrap();
    assert_eq!((u.geometry().axis, u.geometry().k), (1, 2));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn write_config(dir: &std::path::Path, entry: &str) {
    let cfg = format!(r#"{{"hidden_size": 512, "intermediate_size": 72, "quantization": {{"{DOWN}": {entry}}}}}"#);
    std::fs::write(dir.join("config.json"), cfg).unwrap();
}

const GOOD_ENTRY: &str = r#"{"bits": 3, "group_size": 256, "mode": "trellis", "trellis": {"L": 12, "axis": 0}}"#;

fn write_tensors(dir: &std::path::Path, file: &str, tensors: &[(&str, &MlxArray)]) {
    save_safetensors(dir.join(file), tensors.iter().map(|(n, a)| (*n, *a)), &BTreeMap::new()).unwrap();
}

fn load_err(dir: &std::path::Path) -> String {
    let e = Artifact::open(dir).and_then(|a| a.module(DOWN)).expect_err("a bad artifact is refused");
    format!("{e:#}")
}

#[test]
fn bad_artifacts_give_clear_errors() {
    let dir = temp_dir("bad-artifact");
    let h = layer(72, 512, 3, 12, 0, CodeLayout::RowMajor, 4);
    let codes = MlxArray::from_slice(&h.codes, &h.geometry.codes_shape()).unwrap();
    let scales = MlxArray::from_slice(&h.scales, &[72]).unwrap();
    let w = format!("{DOWN}.weight");
    let s = format!("{DOWN}.scales");

    assert!(load_err(&dir).contains("has no config.json"));

    // A config with a missing code (implied 1mad) and a good single file loads.
    write_config(&dir, GOOD_ENTRY);
    write_tensors(&dir, "model.safetensors", &[(&w, &codes), (&s, &scales)]);
    Artifact::open(&dir).unwrap().module(DOWN).unwrap();

    // Missing scales.
    write_tensors(&dir, "model.safetensors", &[(&w, &codes)]);
    let e = load_err(&dir);
    assert!(e.contains("tensor \"model.layers.0.mlp.down_proj.scales\" is missing"), "{e}");

    // Wrong dtype of the scales, then of the codes.
    let s32 = scales.astype(Dtype::Float32).unwrap();
    write_tensors(&dir, "model.safetensors", &[(&w, &codes), (&s, &s32)]);
    let e = load_err(&dir);
    assert!(e.contains("are float32, expected float16"), "{e}");
    let ci = codes.astype(Dtype::Int32).unwrap();
    write_tensors(&dir, "model.safetensors", &[(&w, &ci), (&s, &scales)]);
    assert!(load_err(&dir).contains("are int32, expected uint32"));

    // Shapes that disagree with the config: bits 2 read from 3-bit codes gives the wrong width.
    write_tensors(&dir, "model.safetensors", &[(&w, &codes), (&s, &scales)]);
    write_config(&dir, r#"{"bits": 2, "group_size": 256, "mode": "trellis", "trellis": {"L": 12, "axis": 0}}"#);
    let e = load_err(&dir);
    assert!(e.contains("hidden_size 512 and intermediate_size 72 say 72 -> 512"), "{e}");
    write_config(&dir, r#"{"bits": 3, "group_size": 100, "mode": "trellis", "trellis": {"L": 12, "axis": 0}}"#);
    assert!(load_err(&dir).contains("T*k % 32 != 0"));
    // Scales of the wrong length.
    write_config(&dir, GOOD_ENTRY);
    let short = MlxArray::from_slice(&h.scales[..71], &[71]).unwrap();
    write_tensors(&dir, "model.safetensors", &[(&w, &codes), (&s, &short)]);
    assert!(load_err(&dir).contains("have shape [71], expected [72]"));

    // An unknown code, another mode, a missing entry, a missing key.
    write_tensors(&dir, "model.safetensors", &[(&w, &codes), (&s, &scales)]);
    write_config(
        &dir,
        r#"{"bits": 3, "group_size": 256, "mode": "trellis", "trellis": {"L": 12, "code": "3inst", "axis": 0}}"#,
    );
    assert!(load_err(&dir).contains("uses trellis code String(\"3inst\"); only \"1mad\" is supported"));
    write_config(&dir, r#"{"bits": 4, "group_size": 64, "mode": "affine"}"#);
    assert!(load_err(&dir).contains("expected \"trellis\""));
    write_config(&dir, r#"{"bits": 3, "mode": "trellis", "trellis": {"L": 12, "axis": 0}}"#);
    assert!(load_err(&dir).contains("has no \"group_size\""));
    std::fs::write(dir.join("config.json"), r#"{"quantization": {}}"#).unwrap();
    assert!(load_err(&dir).contains("has no entry in \"quantization\""));
    std::fs::write(dir.join("config.json"), r#"{"quantization": {"#).unwrap();
    assert!(load_err(&dir).contains("is not valid JSON"));

    // A truncated file.
    write_config(&dir, GOOD_ENTRY);
    let full = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &full[..full.len() / 2]).unwrap();
    let e = load_err(&dir);
    assert!(e.contains("model.safetensors"), "{e}");

    // Shards listed in an index; a tensor the index does not list.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    write_tensors(&dir, "model-00001-of-00002.safetensors", &[(&w, &codes)]);
    write_tensors(&dir, "model-00002-of-00002.safetensors", &[(&s, &scales)]);
    let index = format!(
        r#"{{"metadata": {{}}, "weight_map": {{"{w}": "model-00001-of-00002.safetensors", "{s}": "model-00002-of-00002.safetensors"}}}}"#
    );
    std::fs::write(dir.join("model.safetensors.index.json"), &index).unwrap();
    let back = Artifact::open(&dir).unwrap().module(DOWN).unwrap();
    assert_eq!(back.to_host().unwrap().codes, h.codes);
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        format!(r#"{{"weight_map": {{"{w}": "model-00001-of-00002.safetensors"}}}}"#),
    )
    .unwrap();
    assert!(load_err(&dir).contains("is not listed in model.safetensors.index.json"));
    std::fs::remove_dir_all(&dir).unwrap();
}
