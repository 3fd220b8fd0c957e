//! Issue 31, one test per class of defect found by feeding the CPU build malformed input: each
//! takes the example and checks it is now refused with a typed error (or, for the
//! non-finite class, reported as a failure), never a crash, a panic or a silent "ok".

use std::path::Path;

use mlx_trellis::trellis::encoder::{encode, stored_from_linear, EncoderConfig};
use mlx_trellis::trellis::format::codebook::lut1mad;
use mlx_trellis::trellis::reference::{expand, forward_f64, rel_err, weight_at};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{
    synthetic_layer, write_artifact, Artifact, CodeLayout, HostLayer, TrellisGeometry, TrellisLinear,
};
use mlx_trellis::{f16, Dtype, ErrorKind, MlxArray};
use serde_json::json;

mod common;
use common::mlp_artifact::poison_scale;
use common::{join_safetensors, split_safetensors};

const DOWN: &str = "model.layers.0.mlp.down_proj";

fn temp_dir(tag: &str) -> std::path::PathBuf {
    common::mlp_artifact::temp_dir(&format!("bad-{tag}"))
}

fn host() -> HostLayer {
    synthetic_layer(16, 512, 3, 12, 0, CodeLayout::RowMajor, 0.02, 5).unwrap()
}

/// A valid one-module artifact in `dir`; returns the safetensors bytes.
fn artifact(dir: &Path) -> Vec<u8> {
    let layer = TrellisLinear::from_host(DOWN, &host()).unwrap();
    write_artifact(dir, &[(DOWN, &layer)], &[]).unwrap();
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

fn load(dir: &Path) -> mlx_trellis::Result<TrellisLinear> {
    Artifact::open(dir)?.module(DOWN)
}

/// Rewrites the safetensors header of `bytes` into `dir` by `edit` on its JSON text (the data is
/// kept).
fn edit_header(dir: &Path, bytes: &[u8], edit: impl FnOnce(String) -> String) {
    let (header, data) = split_safetensors(bytes);
    let text = edit(serde_json::Value::Object(header).to_string());
    std::fs::write(dir.join("model.safetensors"), join_safetensors(&text, &data)).unwrap();
}

fn artifact_error(r: mlx_trellis::Result<TrellisLinear>, file: &str, want: &str) -> String {
    let e = r.expect_err("refused");
    let text = format!("{e:#}");
    assert_eq!(e.kind(), ErrorKind::Artifact, "{text}");
    match e.root() {
        mlx_trellis::Error::Artifact { file: f, .. } => assert!(f.ends_with(file), "{text}"),
        other => panic!("{other:?}"),
    }
    assert!(text.contains(want), "{text}");
    text
}

#[test]
fn shapes_whose_product_wraps_are_refused_before_mlx() {
    // 2^32 * 2^32 * 48 wraps u64 to 0, which an empty slice "fills".
    let e = MlxArray::from_slice::<u32>(&[], &[1 << 32, 1 << 32, 48]).unwrap_err();
    assert!(e.to_string().contains("more elements than can be addressed"), "{e}");
    let e = MlxArray::from_slice::<u32>(&[], &[2147483647, 2147483647, 2147483647, 4]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(MlxArray::zeros(&[1 << 40, 1 << 40], Dtype::Float32).is_err());
    let a = MlxArray::from_slice(&[1u32; 4], &[2, 2]).unwrap();
    assert!(a.reshape(&[1 << 33, 1 << 33, 0, 1 << 33]).is_err());
    // The reference decoder's size check: a hand-built geometry whose code count wraps.
    let mut g = TrellisGeometry::from_codes_shape("w", &[4, 48], 3, 256, 12, 0).unwrap().interleaved().unwrap();
    g.rows = 1 << 62;
    let e = forward_f64(&[], 0, &[], &[], &g).unwrap_err();
    assert!(e.to_string().contains("reference decoder"), "{e}");
}

#[test]
fn non_finite_scales_are_refused_and_non_finite_results_never_pass() {
    let h = host();
    let mut bad = h.scales.clone();
    bad[3] = f16::INFINITY;
    let codes = MlxArray::from_slice(&h.codes, &h.geometry.codes_shape()).unwrap();
    let e = TrellisLinear::new(DOWN, codes, MlxArray::from_slice(&bad, &[16]).unwrap(), 3, 256, 12, 0).unwrap_err();
    assert!(e.to_string().contains("the scale of stored row 3 is inf"), "{e}");
    // At load, naming the scales tensor.
    let dir = temp_dir("inf-scale");
    artifact(&dir);
    poison_scale(&dir, &format!("{DOWN}.scales"), 5);
    let text = artifact_error(load(&dir), "model.safetensors", "stored row 5 is NaN");
    assert!(text.contains(&format!("\"{DOWN}.scales\"")), "{text}");
    // inf - inf is NaN, which a max fold drops: rel_err must not report 0.
    assert_eq!(rel_err(&[f64::INFINITY; 3], &[f64::INFINITY; 3]).unwrap(), f64::INFINITY);
    assert_eq!(rel_err(&[f64::NAN], &[0.0]).unwrap(), f64::INFINITY);
    // The helper the examples gate on.
    let y = MlxArray::from_slice(&[1.0f32, f32::INFINITY], &[2]).unwrap();
    assert!(!y.all_finite().unwrap());
    assert!(MlxArray::from_slice(&[1.0f32, 2.0], &[2]).unwrap().all_finite().unwrap());
    assert!(!MlxArray::from_slice(&[f32::NAN], &[1]).unwrap().astype(Dtype::Bfloat16).unwrap().all_finite().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shard_paths_stay_inside_the_model_directory() {
    let base = temp_dir("shards");
    let (dir, outside) = (base.join("model"), base.join("outside"));
    std::fs::create_dir_all(&dir).unwrap();
    artifact(&outside);
    let bytes = artifact(&dir);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("shard.safetensors"), &bytes).unwrap();
    let index = |file: &str| {
        let map =
            json!({"weight_map": {format!("{DOWN}.weight"): file, format!("{DOWN}.scales"): "shard.safetensors"}});
        std::fs::write(dir.join("model.safetensors.index.json"), map.to_string()).unwrap();
    };
    index("shard.safetensors");
    load(&dir).unwrap();
    let abs = outside.join("model.safetensors").display().to_string();
    for (file, want) in [
        ("../outside/model.safetensors", "not a plain relative path"),
        (abs.as_str(), "is an absolute path"),
        ("/etc/passwd", "is an absolute path"),
    ] {
        index(file);
        let e = Artifact::open(&dir).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Artifact, "{e:#}");
        assert!(e.to_string().contains(want) && e.to_string().contains("model.safetensors.index.json"), "{e:#}");
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(outside.join("model.safetensors"), dir.join("link.safetensors")).unwrap();
        index("link.safetensors");
        artifact_error(load(&dir), "model.safetensors.index.json", "outside the model directory");
        // The single file may not be a way out either.
        std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
        std::os::unix::fs::symlink(outside.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        artifact_error(load(&dir), "model", "outside the model directory");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn malformed_safetensors_headers_are_refused_naming_the_tensor() {
    let dir = temp_dir("headers");
    let bytes = artifact(&dir);
    let (w, s) = (format!("{DOWN}.weight"), format!("{DOWN}.scales"));
    fn header(edit: impl Fn(&mut serde_json::Value)) -> impl FnOnce(String) -> String {
        move |text: String| {
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            edit(&mut v);
            v.to_string()
        }
    }
    // Overlapping data_offsets: the second tensor moved 8 bytes into the first.
    edit_header(
        &dir,
        &bytes,
        header(|v| {
            let start = |v: &serde_json::Value, name: &str| v[name]["data_offsets"][0].as_u64().unwrap();
            let second = if start(v, &w) > start(v, &s) { &w } else { &s };
            let (a, b) = (start(v, second), v[second]["data_offsets"][1].as_u64().unwrap());
            v[second]["data_offsets"] = json!([a - 8, b - 8]);
        }),
    );
    artifact_error(load(&dir), "model.safetensors", "overlaps tensor");
    // A shape value past 32 bits (MLX's loader truncates 4294967552 to 256), and a float.
    edit_header(&dir, &bytes, header(|v| v[&s]["shape"] = json!([4294967552u64])));
    let text = artifact_error(load(&dir), "model.safetensors", "exceeds MLX's limit");
    assert!(text.contains(&format!("{s:?}")), "{text}");
    edit_header(&dir, &bytes, header(|v| v[&s]["shape"] = json!([16.0])));
    artifact_error(load(&dir), "model.safetensors", "is not a tensor entry");
    // A duplicate key (MLX keeps one of the two).
    edit_header(&dir, &bytes, |text| {
        let entry = serde_json::from_str::<serde_json::Value>(&text).unwrap()[&s].clone();
        format!("{{{:?}:{entry},{}", s, &text[1..])
    });
    artifact_error(load(&dir), "model.safetensors", "duplicate key");
    std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
    load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn encoder_sizes_do_not_wrap() {
    // 2^32 x 2^32 wrapped to 0 and "matched" an empty weight.
    let e = stored_from_linear(&[], 1 << 32, 1 << 32, 0).unwrap_err();
    assert!(e.to_string().contains("expected [out 4294967296, in 4294967296]"), "{e}");
    let e = encode(&[], 1 << 32, 1 << 32, &EncoderConfig::new(3, 12)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // quantize_layer --rows 18446744073709551615 --cols 1 asked for usize::MAX values.
    let e = gaussian(usize::MAX, 0).unwrap_err();
    assert!(e.to_string().starts_with("cannot allocate"), "{e}");
}

#[test]
fn geometry_arithmetic_does_not_wrap() {
    // T*k in u32 wrapped: T = 2147483664 at k = 2 gave one word per block.
    let g = TrellisGeometry::from_codes_shape("w", &[1, 134_217_729], 2, 2_147_483_664, 12, 0).unwrap();
    assert_eq!(g.words_per_block(), 134_217_729);
    for shape in [&[usize::MAX / 8, 4][..], &[usize::MAX / 256, 1, 48], &[1 << 40, 1 << 30]] {
        let k = if shape.len() == 3 { 3 } else { 2 };
        assert!(TrellisGeometry::from_codes_shape("w", shape, k, 256, 12, 0).is_err(), "{shape:?}");
    }
    // try_shape reads a valid array's dimensions. (Its refusal of a negative MLX dimension is not
    // reachable here: dimensions past i32::MAX are refused before MLX sees them.)
    let a = MlxArray::from_slice(&[1u32; 4], &[2, 2]).unwrap();
    assert_eq!(a.try_shape().unwrap(), vec![2, 2]);
}

#[test]
fn config_json_is_parsed_strictly_and_capped() {
    let dir = temp_dir("config");
    artifact(&dir);
    let good = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let cases = [
        (good.replacen("\"bits\": 3", "\"bits\": 3, \"bits\": 2", 1), "duplicate key"),
        (good.replacen("\"bits\": 3", "\"bits\": 03", 1), "is not valid JSON"),
        (good.replacen("\"bits\": 3", "\"bits\": 3.", 1), "is not valid JSON"),
        (good.replacen("\"bits\": 3", "\"bits\": 1e99999", 1), "is not valid JSON"),
        (good.replacen("\"bits\": 3", "\"bits\": 3.0", 1), "expected an integer"),
        (format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)), "is not valid JSON"),
        (format!("{{\"pad\": \"{}\"}}", " ".repeat(5 << 20)), "is larger than"),
    ];
    for (text, want) in cases {
        std::fs::write(dir.join("config.json"), &text).unwrap();
        artifact_error(load(&dir), "config.json", want);
    }
    std::fs::write(dir.join("config.json"), &good).unwrap();
    load(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reference_outputs_of_impossible_sizes_are_errors() {
    let h = host();
    // [2^40, 512] activations and outputs: refused before anything is allocated.
    let e = forward_f64(&[], 1 << 40, &h.codes, &h.scales, &h.geometry).unwrap_err();
    assert!(e.to_string().contains("expected [1099511627776, 16]"), "{e}");
    // The thread split and its memory are checked in the reference module's own tests.
    let g = h.geometry;
    let m = usize::MAX / g.out_features() + 1;
    assert!(forward_f64(&[], m, &h.codes, &h.scales, &g).is_err());
}

#[test]
fn public_helpers_return_errors_on_bad_arguments() {
    assert!(lut1mad(25).unwrap_err().to_string().contains("at most 24"));
    assert!(rel_err(&[1.0], &[]).unwrap_err().to_string().contains("different lengths"));
    let h = host();
    assert!(weight_at(&h.codes, &h.scales, &h.geometry, 16, 0).is_err());
    assert!(weight_at(&h.codes, &h.scales, &h.geometry, 0, 512).is_err());
    assert!(expand(&h.codes[1..], &h.scales, &h.geometry).is_err());
    let mut g = h.geometry;
    g.t = 0;
    assert!(expand(&h.codes, &h.scales, &g).is_err());
}
