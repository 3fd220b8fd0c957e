//! Tensor-parallel shards of a coded MLP in one process: the shards' outputs sum to the MLP's,
//! shards loaded from an artifact read only their rows and equal the shards cut in memory, and
//! shard counts that break the row rule are refused.

mod common;

use common::mlp_artifact::{mlp_case, poison_scale, temp_dir, write_mlps, F32_REASSOCIATION};
use common::to_f64;
use mlx_trellis::trellis::reference::{mlp_forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::gaussian;
use mlx_trellis::trellis::{Artifact, CodeLayout, ForwardPath, RowShard, TrellisMlp};
use mlx_trellis::{Dtype, Error, ErrorKind, MlxArray};

const PREFIX: &str = "model.layers.0.mlp";
const HIDDEN: usize = 512;
const INTER: usize = 768;

fn x(m: usize, dtype: Dtype) -> MlxArray {
    MlxArray::from_slice(&gaussian(m * HIDDEN, 77 + m as u64).unwrap(), &[m, HIDDEN]).unwrap().astype(dtype).unwrap()
}

fn layouts() -> [(u32, CodeLayout); 3] {
    [(3, CodeLayout::K3Interleaved), (2, CodeLayout::RowMajor), (4, CodeLayout::RowMajor)]
}

#[test]
fn the_shards_sum_to_the_mlp() {
    let mut worst: f64 = 0.0;
    for (k, layout) in layouts() {
        let c = mlp_case(PREFIX, HIDDEN, INTER, k, layout, 40 + k as u64);
        let x = x(5, Dtype::Float32);
        let whole = to_f64(&c.mlp.forward_with(&x, ForwardPath::Generic).unwrap());
        let want = mlp_forward_f64(&to_f64(&x), 5, &c.host.0, &c.host.1, &c.host.2).unwrap();
        for n in [1, 2, 3, 4, 6] {
            let mut sum = vec![0f64; whole.len()];
            for r in 0..n {
                let shard = c.mlp.shard(r, n).unwrap();
                assert_eq!((shard.hidden(), shard.intermediate()), (HIDDEN, INTER / n));
                let y = to_f64(&shard.forward_with(&x, ForwardPath::Generic).unwrap());
                sum.iter_mut().zip(&y).for_each(|(s, v)| *s += v);
            }
            let err = rel_err(&sum, &whole).unwrap();
            worst = worst.max(err);
            assert!(err < F32_REASSOCIATION, "k {k} {layout:?} {n} shards: relErr {err:.2e} against the whole MLP");
            // And the reference's gate for the generic path (two f32 matmuls).
            assert!(rel_err(&sum, &want).unwrap() < 2e-5, "k {k} {n} shards against the f64 reference");
        }
        // One shard is the whole MLP, bit for bit.
        let one = to_f64(&c.mlp.shard(0, 1).unwrap().forward_with(&x, ForwardPath::Generic).unwrap());
        assert_eq!(one, whole);
    }
    println!("shards summed against the whole MLP (f32, generic path): worst relErr {worst:.2e}");
}

#[test]
fn shards_load_from_an_artifact_by_their_rows_alone() {
    for (k, layout) in layouts() {
        let c = mlp_case(PREFIX, HIDDEN, INTER, k, layout, 50 + k as u64);
        let dir = temp_dir(&format!("shard-load-k{k}"));
        write_mlps(&dir, &[(PREFIX, &c.mlp)]);
        let art = Artifact::open(&dir).unwrap();
        for n in [1, 2, 3] {
            for r in 0..n {
                let want = c.mlp.shard(r, n).unwrap();
                let got = TrellisMlp::from_artifact_shard(&art, PREFIX, r, n).unwrap();
                for (a, b) in [(got.gate(), want.gate()), (got.up(), want.up()), (got.down(), want.down())] {
                    assert_eq!(a.geometry(), b.geometry(), "k {k} rank {r} of {n}");
                    assert_eq!(a.codes().to_vec::<u32>().unwrap(), b.codes().to_vec::<u32>().unwrap(), "{}", a.name());
                    assert_eq!(to_f64(a.scales()), to_f64(b.scales()), "{}", a.name());
                }
            }
        }
        // A NaN scale in rank 1's rows of down: ranks 0 and 2 of 3 never read it; rank 1 and the
        // whole-layer load refuse it, naming the file, the tensor and the row.
        let scales = format!("{PREFIX}.down_proj.scales");
        poison_scale(&dir, &scales, 300);
        let art = Artifact::open(&dir).unwrap();
        art.mlp_shard(PREFIX, 0, 3).unwrap();
        art.mlp_shard(PREFIX, 2, 3).unwrap();
        for e in [art.mlp_shard(PREFIX, 1, 3).unwrap_err(), art.module(&format!("{PREFIX}.down_proj")).unwrap_err()] {
            assert_eq!(e.kind(), ErrorKind::Artifact, "{e}");
            let Error::Artifact { file, key, .. } = e.root() else { unreachable!() };
            assert!(file.ends_with("model.safetensors") && key.as_deref() == Some(scales.as_str()), "{e}");
            assert!(e.to_string().contains("stored row 300 is NaN"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn shard_counts_that_break_the_row_rule_are_refused() {
    let c = mlp_case(PREFIX, HIDDEN, INTER, 2, CodeLayout::RowMajor, 9);
    let dir = temp_dir("shard-rule");
    write_mlps(&dir, &[(PREFIX, &c.mlp)]);
    let art = Artifact::open(&dir).unwrap();
    for (r, n, want) in [
        (0, 5, "768 stored rows do not split into 5 equal shards"),
        (0, 32, "24 rows each, not a multiple of 16"),
        (0, 0, "at least one shard"),
        (2, 2, "rank 2 is not below the shard count 2"),
    ] {
        for e in [c.mlp.shard(r, n).unwrap_err(), art.mlp_shard(PREFIX, r, n).unwrap_err()] {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains(want), "{r} of {n}: {e}");
        }
    }
    // The artifact's refusal names the module.
    let e = art.mlp_shard(PREFIX, 0, 5).unwrap_err().to_string();
    assert!(e.contains("model.layers.0.mlp.gate_proj"), "{e}");
    // A slice of stored rows must be a non-empty range inside the layer.
    assert!(c.mlp.down().row_slice(700..800).unwrap_err().to_string().contains("700..800"));
    assert_eq!(c.mlp.down().row_slice(16..48).unwrap().geometry().rows, 32);
    assert_eq!(RowShard::new(1, 3).unwrap().rows(768, "w").unwrap(), 256..512);
    std::fs::remove_dir_all(&dir).unwrap();
}
