//! Seeded coded MLPs written as model artifacts, and edits of their files, for the sharding and
//! tensor-parallel tests.

use std::path::{Path, PathBuf};

use mlx_trellis::trellis::{synthetic_mlp, write_artifact, CodeLayout, HostLayer, TrellisLinear, TrellisMlp};

/// The relErr gate of an MLP's shards summed (in one process, or by an all-reduce) against the
/// whole MLP by the same path, in f32. What sharding reorders is the down projection's sum over
/// its input rows (each shard's own matmul, then the shards' sum), whose rounding grows like
/// sqrt(rows) · 2^-24 of the largest output (about 1.7e-6 for 768 rows); the gate is twice
/// that. The tests print the worst they see.
pub const F32_REASSOCIATION: f64 = 4e-6;

/// A seeded MLP on the host and on MLX.
pub struct MlpCase {
    pub host: (HostLayer, HostLayer, HostLayer),
    pub mlp: TrellisMlp,
}

/// The MLP `hidden -> inter -> hidden` at `k` bits with its down projection in `layout`, named
/// as the projections of `prefix`.
pub fn mlp_case(prefix: &str, hidden: usize, inter: usize, k: u32, layout: CodeLayout, seed: u64) -> MlpCase {
    let host = synthetic_mlp(hidden, inter, k, layout, seed).unwrap();
    let lin = |name: &str, h: &HostLayer| TrellisLinear::from_host(&format!("{prefix}.{name}.weight"), h).unwrap();
    let mlp = TrellisMlp::new(lin("gate_proj", &host.0), lin("up_proj", &host.1), lin("down_proj", &host.2)).unwrap();
    MlpCase { host, mlp }
}

/// A fresh, empty directory for `tag` under the system's temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlx-trellis-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes the MLPs `(prefix, mlp)` to `dir` as one artifact (with the model's widths in
/// `config.json`).
pub fn write_mlps(dir: &Path, mlps: &[(&str, &TrellisMlp)]) {
    let names: Vec<[String; 3]> = mlps
        .iter()
        .map(|(p, _)| [format!("{p}.gate_proj"), format!("{p}.up_proj"), format!("{p}.down_proj")])
        .collect();
    let mut modules = Vec::new();
    for ((_, m), n) in mlps.iter().zip(&names) {
        modules.extend([(n[0].as_str(), m.gate()), (n[1].as_str(), m.up()), (n[2].as_str(), m.down())]);
    }
    let (hidden, inter) = (mlps[0].1.hidden(), mlps[0].1.intermediate());
    let extra = [("hidden_size", serde_json::json!(hidden)), ("intermediate_size", serde_json::json!(inter))];
    write_artifact(dir, &modules, &extra).unwrap();
}

/// Writes the f16 NaN bit pattern over stored row `row`'s scale of `tensor` in `dir`'s
/// `model.safetensors`.
pub fn poison_scale(dir: &Path, tensor: &str, row: usize) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[tensor]["dtype"], "F16", "{tensor}");
    let at = 8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize + 2 * row;
    bytes[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
}
