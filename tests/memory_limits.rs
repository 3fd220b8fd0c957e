//! Allocations sized from input that MLX cannot get are refused with an error before MLX is
//! asked (MLX 0.32's CPU allocator hands back a null buffer when `malloc` fails, and the
//! process then dies of a segmentation fault). Alone in its test binary: before the check
//! existed, each case crashed the process.

use mlx_trellis::trellis::{synthetic_layer, CodeLayout, ForwardPath, TrellisLinear};
use mlx_trellis::{available_memory, Dtype, MlxArray};

/// The memory MLX can get here: known on every Linux machine (`MemAvailable` at least).
fn left() -> u64 {
    available_memory().expect("the memory MLX can get is known on Linux")
}

#[test]
fn arrays_larger_than_the_memory_mlx_can_get_are_refused() {
    // The 40 GB of zeros of the report, or a square larger than what is left here.
    let side = 100_000usize.max(((left() / 4) as f64).sqrt() as usize + 1);
    let e = MlxArray::zeros(&[side, side], Dtype::Float32).unwrap_err().to_string();
    assert!(e.contains(&format!("an array of shape [{side}, {side}]")) && e.contains("MLX can get at most"), "{e}");
    let e = MlxArray::full(&[side, side], 1.0, Dtype::Float32).unwrap_err().to_string();
    assert!(e.contains("MLX can get at most"), "{e}");
    // Arrays that fit are made as before.
    let small = MlxArray::zeros(&[1000, 1000], Dtype::Float32).unwrap();
    small.eval().unwrap();
}

#[test]
fn a_layer_product_larger_than_the_memory_mlx_can_get_is_refused_before_it_runs() {
    let host = synthetic_layer(256, 8192, 2, 12, 0, CodeLayout::RowMajor, 0.02, 3).unwrap();
    let layer = TrellisLinear::from_host("down_proj", &host).unwrap();
    // 3e6 rows: the activations fit (3 GB, lazily), the product's output (98 GB) does not.
    let rows = 3_000_000usize;
    let x = MlxArray::zeros(&[rows, 256], Dtype::Float32).unwrap();
    for path in [ForwardPath::Auto, ForwardPath::Generic] {
        let e = layer.forward_with(&x, path).unwrap_err().to_string();
        assert!(e.contains(&format!("on {rows} activation rows")) && e.contains("MLX can get at most"), "{e}");
    }
    // An ordinary product still runs.
    let y = layer.forward(&MlxArray::zeros(&[4, 256], Dtype::Float32).unwrap()).unwrap();
    assert_eq!(y.shape(), [4, 8192]);
}
