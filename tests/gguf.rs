//! The GGUF binding on small files written here byte by byte: plain and quantized tensors against
//! a host decode of their blocks, metadata of every kind, and the structural checks that keep a
//! malformed file away from MLX's reader (each an artifact error naming the file and the key).

use std::path::{Path, PathBuf};

use anyhow::Result;
use mlx_trellis::{f16, ErrorKind, GgmlType, Gguf, GgufTensor};

/// A GGUF file under construction (version 3, default alignment 32 unless a key sets it).
#[derive(Default)]
struct Writer {
    kv: Vec<u8>,
    kv_count: u64,
    infos: Vec<u8>,
    tensor_count: u64,
    data: Vec<u8>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    fn key(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
        string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.kv_count += 1;
        self
    }

    fn str_value(&mut self, key: &str, v: &str) -> &mut Self {
        let mut b = Vec::new();
        string(&mut b, v);
        self.key(key, 8, &b)
    }

    fn strings(&mut self, key: &str, vs: &[&str]) -> &mut Self {
        let mut b = 8u32.to_le_bytes().to_vec();
        b.extend((vs.len() as u64).to_le_bytes());
        vs.iter().for_each(|v| string(&mut b, v));
        self.key(key, 9, &b)
    }

    fn i32s(&mut self, key: &str, vs: &[i32]) -> &mut Self {
        let mut b = 5u32.to_le_bytes().to_vec();
        b.extend((vs.len() as u64).to_le_bytes());
        vs.iter().for_each(|v| b.extend(v.to_le_bytes()));
        self.key(key, 9, &b)
    }

    /// A tensor of GGML type `ty` with dimensions `ne` (innermost first) and raw `bytes`, placed
    /// at the next 32-byte boundary of the data section.
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, bytes: &[u8]) -> &mut Self {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        self.tensor_at(name, ne, ty, self.data.len() as u64, bytes)
    }

    fn tensor_at(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64, bytes: &[u8]) -> &mut Self {
        string(&mut self.infos, name);
        self.infos.extend((ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|d| self.infos.extend(d.to_le_bytes()));
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.data.extend(bytes);
        self.tensor_count += 1;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.tensor_count.to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }

    fn write(&self, name: &str) -> Result<PathBuf> {
        write_bytes(name, &self.bytes())
    }
}

fn write_bytes(name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("mlx-trellis-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    std::fs::write(&path, bytes)?;
    Ok(path)
}

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// One Q4_1 block: scale `d`, minimum `m`, nibbles `q[0..32]` (weight j = d·q[j] + m).
fn q4_1_block(d: f32, m: f32, q: &[u8; 32]) -> Vec<u8> {
    let mut b = [h(d), h(m)].concat();
    b.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
    b
}

/// One Q8_0 block: scale `d`, signed `q` (weight j = d·q[j]).
fn q8_0_block(d: f32, q: &[i8; 32]) -> Vec<u8> {
    let mut b = h(d).to_vec();
    b.extend(q.iter().map(|&v| v as u8));
    b
}

fn f16_value(v: f32) -> f64 {
    f64::from(f16::from_f32(v).to_f32())
}

/// The test file `name`: metadata of each kind; an F32 [2, 3] matrix, a Q4_1 [2, 64] matrix (4
/// blocks), a Q8_0 [1, 32] row and an F16 [4] vector. Returns the path and the host decode of
/// the Q4_1 and Q8_0 tensors.
fn good_file(name: &str) -> Result<(PathBuf, Vec<f64>, Vec<f64>)> {
    let mut w = Writer::default();
    w.str_value("general.architecture", "llama")
        .key("llama.block_count", 4, &7u32.to_le_bytes())
        .key("llama.rope.freq_base", 6, &100000f32.to_le_bytes())
        .key("llama.flag", 7, &[1])
        .strings("tokenizer.ggml.tokens", &["a", "Ġb", "<|im_end|>"])
        .i32s("tokenizer.ggml.token_type", &[1, 1, 3]);
    w.tensor(
        "dense.weight",
        &[3, 2],
        0,
        &[1.0f32, 2.0, 3.0, -4.0, 5.5, 0.25].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    );
    let mut q4 = Vec::new();
    let mut want4 = Vec::new();
    for b in 0..4 {
        let (d, m) = (0.01 * (b + 1) as f32, -0.05 * b as f32);
        let q: [u8; 32] = std::array::from_fn(|j| ((j * 7 + b * 3) % 16) as u8);
        q4.extend(q4_1_block(d, m, &q));
        want4.extend(q.iter().map(|&v| f16_value(d) * f64::from(v) + f16_value(m)));
    }
    w.tensor("blk.0.ffn_down.weight", &[64, 2], 3, &q4);
    let q8: [i8; 32] = std::array::from_fn(|j| (j as i8 - 16) * 7);
    let want8: Vec<f64> = q8.iter().map(|&v| f16_value(0.003) * f64::from(v)).collect();
    w.tensor("token_embd.weight", &[32, 1], 8, &q8_0_block(0.003, &q8));
    w.tensor("norm.weight", &[4], 1, &[1.0f32, -2.0, 0.5, 8.0].iter().flat_map(|&v| h(v)).collect::<Vec<_>>());
    Ok((w.write(name)?, want4, want8))
}

fn f64s(a: &mlx_trellis::MlxArray) -> Result<Vec<f64>> {
    Ok(a.to_vec::<f32>()?.into_iter().map(f64::from).collect())
}

#[test]
fn tensors_come_back_plain_or_as_affine_triplets_that_decode_like_the_blocks() -> Result<()> {
    let (path, want4, want8) = good_file("tensors.gguf")?;
    let g = Gguf::open(&path)?;
    assert_eq!(g.version(), 3);
    assert_eq!(g.tensor_names(), ["blk.0.ffn_down.weight", "dense.weight", "norm.weight", "token_embd.weight"]);
    assert_eq!(g.tensor_shape("blk.0.ffn_down.weight")?, [2, 64]);
    assert_eq!(g.tensor_type("token_embd.weight")?, GgmlType::Q8_0);
    match g.tensor("blk.0.ffn_down.weight")? {
        GgufTensor::Affine { weight, scales, biases, group_size, bits } => {
            assert_eq!((group_size, bits), (32, 4));
            assert_eq!((weight.shape(), scales.shape(), biases.shape()), (vec![2, 8], vec![2, 2], vec![2, 2]));
        }
        GgufTensor::Dense(_) => panic!("a Q4_1 tensor came back dense"),
    }
    // Each weight is scale · q + bias rounded once to f32: exact against the f64 decode to f32.
    let got4 = f64s(&g.dense_f32("blk.0.ffn_down.weight")?)?;
    let got8 = f64s(&g.dense_f32("token_embd.weight")?)?;
    for (got, want) in [(&got4, &want4), (&got8, &want8)] {
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(want.iter()) {
            assert!((a - b).abs() <= b.abs() * 2f64.powi(-23) + 1e-12, "{a} vs {b}");
        }
    }
    assert_eq!(g.dense_f32("dense.weight")?.to_vec::<f32>()?, [1.0, 2.0, 3.0, -4.0, 5.5, 0.25]);
    assert_eq!(g.dense_f32("dense.weight")?.shape(), [2, 3]);
    assert_eq!(g.dense_f32("norm.weight")?.to_vec::<f32>()?, [1.0, -2.0, 0.5, 8.0]);
    let missing = g.tensor("nope.weight").unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::Artifact);
    assert!(missing.to_string().contains("tensors.gguf") && missing.to_string().contains("nope.weight"), "{missing}");
    Ok(())
}

#[test]
fn metadata_getters_are_typed_and_name_the_key() -> Result<()> {
    let (path, ..) = good_file("metadata.gguf")?;
    let g = Gguf::open(&path)?;
    assert_eq!(g.metadata_string("general.architecture")?, "llama");
    assert_eq!(g.metadata_u64("llama.block_count")?, 7);
    assert_eq!(g.metadata_f64("llama.rope.freq_base")?, 100000.0);
    assert_eq!(g.metadata_strings("tokenizer.ggml.tokens")?, ["a", "Ġb", "<|im_end|>"]);
    assert_eq!(g.metadata_array("tokenizer.ggml.token_type")?.to_vec::<i32>()?, [1, 1, 3]);
    assert!(g.has_metadata("llama.flag") && !g.has_metadata("llama.nope"));
    for e in [
        g.metadata_string("llama.block_count").unwrap_err(),
        g.metadata_u64("general.architecture").unwrap_err(),
        g.metadata_strings("tokenizer.ggml.token_type").unwrap_err(),
        g.metadata_u64("llama.rope.freq_base").unwrap_err(),
        g.metadata_string("llama.nope").unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Artifact, "{e}");
        assert!(e.to_string().contains("metadata.gguf"), "{e}");
    }
    Ok(())
}

fn refused(name: &str, bytes: &[u8], says: &str) -> Result<()> {
    let path = write_bytes(name, bytes)?;
    let e = Gguf::open(&path).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Artifact, "{name}: {e}");
    let text = e.to_string();
    assert!(text.contains(name) && text.contains(says), "{name}: {text:?} should say {says:?}");
    Ok(())
}

#[test]
fn malformed_files_are_refused_before_mlx_reads_them() -> Result<()> {
    let (path, ..) = good_file("malformed-base.gguf")?;
    let good = std::fs::read(&path)?;
    let mut magic = good.clone();
    magic[0] = b'X';
    refused("magic.gguf", &magic, "GGUF magic")?;
    let mut version = good.clone();
    version[4] = 9;
    refused("version.gguf", &version, "version 9")?;
    refused("short.gguf", &good[..200], "past the end")?;
    refused("truncated-data.gguf", &good[..good.len() - 10], "past the end of the file")?;

    let mut w = Writer::default();
    w.key("huge.string", 8, &(1u64 << 40).to_le_bytes());
    refused("huge-string.gguf", &w.bytes(), "more than the")?;

    let mut w = Writer::default();
    w.tensor("blk.0.x.weight", &[32, 1], 6, &[0; 22]);
    refused("q5.gguf", &w.bytes(), "GGML type 6")?;

    let mut w = Writer::default();
    w.tensor("blk.0.ffn_up", &[32, 1], 8, &[0; 34]);
    refused("suffix.gguf", &w.bytes(), "does not end in \".weight\"")?;

    let mut w = Writer::default();
    w.tensor("a.weight", &[32, 1], 8, &[0; 34]).tensor("a.scales", &[1], 0, &[0; 4]);
    refused("derived.gguf", &w.bytes(), "collides")?;

    let mut w = Writer::default();
    w.tensor("a", &[8], 0, &[0; 32]).tensor_at("b", &[8], 0, 0, &[]);
    refused("overlap.gguf", &w.bytes(), "overlaps")?;

    let mut w = Writer::default();
    w.tensor("a", &[0, 3], 0, &[]);
    refused("zero-dim.gguf", &w.bytes(), "dimensions")?;

    let mut w = Writer::default();
    w.tensor("a", &[1 << 20, 1 << 20], 0, &[]);
    refused("too-many.gguf", &w.bytes(), "elements")?;

    let mut w = Writer::default();
    w.tensor("a", &[33, 1], 2, &[0; 18]);
    refused("partial-block.gguf", &w.bytes(), "not a multiple")?;

    let mut w = Writer::default();
    w.tensor_at("a", &[4], 0, 4, &[0; 20]);
    refused("misaligned.gguf", &w.bytes(), "alignment")?;

    let mut w = Writer::default();
    w.str_value("a", "x").str_value("a", "y");
    refused("duplicate.gguf", &w.bytes(), "twice")?;

    let mut w = Writer::default();
    w.str_value("cut", "a\0b");
    let path = w.write("nul.gguf")?;
    let e = Gguf::open(&path)?.metadata_string("cut").unwrap_err();
    assert!(e.to_string().contains("NUL"), "{e}");

    let dir = std::env::temp_dir();
    let e = Gguf::open(Path::new(&dir)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Artifact, "{e}");
    Ok(())
}
