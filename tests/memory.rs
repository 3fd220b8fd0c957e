//! MLX's active memory after many create/drop cycles. Alone in its own test binary: the count is
//! process-wide, so tests running beside it in other threads would move it.

use mlx_trellis::{active_memory, MlxArray};

fn arr(v: &[f32], shape: &[usize]) -> MlxArray {
    MlxArray::from_slice(v, shape).unwrap()
}

#[test]
fn ten_thousand_create_drop_cycles_leave_memory_where_it_was() {
    let warm = arr(&[1.0; 256], &[256]).add(&arr(&[1.0], &[1])).unwrap();
    warm.eval().unwrap();
    drop(warm);
    let before = active_memory().unwrap();
    for i in 0..10_000 {
        let a = MlxArray::from_slice(&[i as f32; 64], &[64]).unwrap();
        let b = a.add(&a).unwrap();
        let c = b.clone();
        c.eval().unwrap();
    }
    assert_eq!(active_memory().unwrap(), before);
}
