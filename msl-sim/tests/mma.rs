//! 8x8 simdgroup_matrix multiply-accumulate against a naive matmul.

mod common;

use common::{fragment, Rng};
use msl_sim::{f16_bits_to_f32, run, HostTensor, KernelDesc, Launch, ScalarType};

/// D = A * B + C with the simulator's documented order: acc = C(m, n), then
/// acc = fma(A(m, k), B(k, n), acc) for k = 0..7.
fn reference(a: &[f32], b: &[f32], c: &[f32]) -> Vec<f32> {
    let mut d = vec![0.0f32; 64];
    for m in 0..8 {
        for n in 0..8 {
            let mut acc = c[m * 8 + n];
            for k in 0..8 {
                acc = a[m * 8 + k].mul_add(b[k * 8 + n], acc);
            }
            d[m * 8 + n] = acc;
        }
    }
    d
}

/// Fills fragments through thread_elements() with the layout formula; B's
/// matrix type is a template parameter.
const BODY: &str = r#"
  const uint l = thread_index_in_simdgroup;
  const uint qid = l / 4;
  const uint fm = (qid & 4) + ((l / 2) % 4);
  const uint fn = (qid & 2) * 2 + (l % 2) * 2;
  simdgroup_float8x8 ma;
  BMat mb;
  simdgroup_float8x8 mc;
  simdgroup_float8x8 md;
  ma.thread_elements()[0] = a[fm * 8 + fn];
  ma.thread_elements()[1] = a[fm * 8 + fn + 1];
  mb.thread_elements()[0] = b[fm * 8 + fn];
  mb.thread_elements()[1] = b[fm * 8 + fn + 1];
  mc.thread_elements()[0] = c[fm * 8 + fn];
  mc.thread_elements()[1] = c[fm * 8 + fn + 1];
  simdgroup_multiply_accumulate(md, ma, mb, mc);
  d[fm * 8 + fn] = md.thread_elements()[0];
  d[fm * 8 + fn + 1] = md.thread_elements()[1];
"#;

fn random(seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..64).map(|_| rng.uniform(-2.0, 2.0)).collect()
}

#[test]
fn layout_formula_covers_every_element_once() {
    let mut seen = [0u8; 64];
    for l in 0..32 {
        let (m, n) = fragment(l);
        seen[m * 8 + n] += 1;
        seen[m * 8 + n + 1] += 1;
    }
    assert!(seen.iter().all(|&s| s == 1));
}

#[test]
fn float_mma_matches_naive_matmul() {
    let (a, b, c) = (random(1), random(2), random(3));
    let desc =
        KernelDesc::new("mma_f32", &["a", "b", "c"], &["d"], BODY).with_header("typedef simdgroup_float8x8 BMat;");
    let out = run(
        &desc,
        &[HostTensor::from_f32(&[8, 8], &a), HostTensor::from_f32(&[8, 8], &b), HostTensor::from_f32(&[8, 8], &c)],
        &Launch::new(vec![(vec![8, 8], ScalarType::F32)], [32, 1, 1], [32, 1, 1]),
    )
    .unwrap();
    assert_eq!(out[0].to_f32_vec(), reference(&a, &b, &c));
}

#[test]
fn float_mma_with_half_b_matches_naive_matmul() {
    let (a, c) = (random(4), random(5));
    let b = HostTensor::from_f32_as(ScalarType::F16, &[8, 8], &random(6));
    let b_values: Vec<f32> = b.to_bits_u16_vec().into_iter().map(f16_bits_to_f32).collect();
    let desc =
        KernelDesc::new("mma_half_b", &["a", "b", "c"], &["d"], BODY).with_header("typedef simdgroup_half8x8 BMat;");
    let out = run(
        &desc,
        &[HostTensor::from_f32(&[8, 8], &a), b, HostTensor::from_f32(&[8, 8], &c)],
        &Launch::new(vec![(vec![8, 8], ScalarType::F32)], [32, 1, 1], [32, 1, 1]),
    )
    .unwrap();
    assert_eq!(out[0].to_f32_vec(), reference(&a, &b_values, &c));
    // The half operand really is rounded: using the unrounded values differs.
    assert_ne!(out[0].to_f32_vec(), reference(&a, &random(6), &c));
}

#[test]
fn simdgroup_load_store_and_multiply_per_simdgroup() {
    // Two SIMD-groups each multiply their own 8x8 tiles: D_s = A_s^T * B_s,
    // loading A transposed and storing through simdgroup_store.
    let a: Vec<f32> = random(7).into_iter().chain(random(8)).collect();
    let b: Vec<f32> = random(9).into_iter().chain(random(10)).collect();
    let desc = KernelDesc::new(
        "mma_load_store",
        &["a", "b"],
        &["d"],
        r#"
  const uint s = simdgroup_index_in_threadgroup;
  simdgroup_float8x8 ma, mb, md;
  simdgroup_load(ma, a + s * 64, 8, ulong2(0, 0), true);
  simdgroup_load(mb, b + s * 64);
  simdgroup_multiply(md, ma, mb);
  simdgroup_store(md, d + s * 64);
"#,
    );
    let out = run(
        &desc,
        &[HostTensor::from_f32(&[2, 8, 8], &a), HostTensor::from_f32(&[2, 8, 8], &b)],
        &Launch::new(vec![(vec![2, 8, 8], ScalarType::F32)], [64, 1, 1], [64, 1, 1]),
    )
    .unwrap()[0]
        .to_f32_vec();
    for s in 0..2 {
        let at: Vec<f32> = (0..64).map(|i| a[s * 64 + (i % 8) * 8 + i / 8]).collect();
        let want = reference(&at, &b[s * 64..s * 64 + 64], &[0.0; 64]);
        assert_eq!(&out[s * 64..s * 64 + 64], want.as_slice(), "SIMD-group {s}");
    }
}
