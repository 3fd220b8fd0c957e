//! Fuzzes the artifact loader: the input is a `config.json`, a NUL byte, then a
//! `model.safetensors`. Every input must end in a loaded module whose forward pass is finite and
//! matches the f64 reference, or in an artifact error (`Error::Artifact` or `Error::Io`); a
//! panic or a crash is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mlx_trellis::trellis::reference::{forward_f64, rel_err};
use mlx_trellis::trellis::{Artifact, ForwardPath};
use mlx_trellis::{ErrorKind, MlxArray};

fn refused_properly(e: &mlx_trellis::Error) {
    assert!(matches!(e.kind(), ErrorKind::Artifact | ErrorKind::Io), "wrong kind of error: {e:#}");
}

fuzz_target!(|data: &[u8]| {
    let (config, tensors) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let dir = std::env::temp_dir().join(format!("mlx-trellis-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), config).unwrap();
    std::fs::write(dir.join("model.safetensors"), tensors).unwrap();
    let art = match Artifact::open(&dir) {
        Ok(a) => a,
        Err(e) => return refused_properly(&e),
    };
    let modules = match art.trellis_modules() {
        Ok(m) => m,
        Err(e) => return refused_properly(&e),
    };
    for name in modules.iter().take(4) {
        let layer = match art.module(name) {
            Ok(l) => l,
            Err(e) => {
                refused_properly(&e);
                continue;
            }
        };
        // The file's size bounds the layer's, so a forward pass is cheap.
        let g = *layer.geometry();
        let x: Vec<f32> = (0..g.in_features()).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let y = layer.forward_with(&MlxArray::from_slice(&x, &[1, g.in_features()]).unwrap(), ForwardPath::Generic);
        let y = y.expect("a loaded layer runs");
        assert!(y.all_finite().unwrap(), "{name}: a loaded layer gave a non-finite output");
        let host = layer.to_host().unwrap();
        let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let want = forward_f64(&xr, 1, &host.codes, &host.scales, &g).unwrap();
        let got: Vec<f64> = y.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        assert!(rel_err(&got, &want).unwrap() < 1e-5, "{name}: the generic path disagrees with the reference");
    }
});
