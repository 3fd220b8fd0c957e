//! Kernel wrapping and launch semantics: template arguments, grids,
//! init_value, shape parameters, 16-bit floats, unsupported features, and a
//! deliberately wrong kernel that the checks must reject.

mod common;

use common::{compile_message, f32_runtime_error, launch_1d, runtime_message, Rng};
use msl_sim::{
    bf16_bits_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits, run, HostTensor, KernelDesc, Launch,
    ScalarType, TemplateArg,
};

#[test]
fn template_ints_bools_and_dtypes() {
    let desc = KernelDesc::new(
        "scale",
        &["x"],
        &["out"],
        r#"
  const uint i = thread_position_in_grid.x;
  const float v = float(x[i]) * float(N);
  out[i] = T(NEG ? -v : v);
"#,
    );
    let values = [0.5f32, -1.25, 3.0, 100.0, 0.1];
    for dtype in [ScalarType::F32, ScalarType::F16, ScalarType::BF16] {
        for (n, neg) in [(3, false), (7, true)] {
            let x = HostTensor::from_f32_as(dtype, &[5], &values);
            let xs = x.to_f32_vec();
            let launch = Launch::new(vec![(vec![5], dtype)], [5, 1, 1], [5, 1, 1])
                .template("T", TemplateArg::Dtype(dtype))
                .template("N", TemplateArg::Int(n))
                .template("NEG", TemplateArg::Bool(neg));
            let out = run(&desc, &[x], &launch).unwrap();
            assert_eq!(out[0].dtype, dtype);
            let want: Vec<f32> = xs
                .iter()
                .map(|&v| {
                    let r = if neg { -(v * n as f32) } else { v * n as f32 };
                    HostTensor::from_f32_as(dtype, &[1], &[r]).to_f32_vec()[0]
                })
                .collect();
            assert_eq!(out[0].to_f32_vec(), want, "{dtype:?} N={n} NEG={neg}");
        }
    }
}

#[test]
fn grid_not_a_multiple_of_the_threadgroup() {
    let grid = [37usize, 5, 3];
    let n = grid.iter().product::<usize>();
    let desc = KernelDesc::new(
        "edges",
        &[],
        &["pos", "tgsize", "lane"],
        r#"
  const uint3 g = thread_position_in_grid;
  const uint i = (g.z * threads_per_grid.y + g.y) * threads_per_grid.x + g.x;
  pos[i] = g.x + 1000u * g.y + 1000000u * g.z;
  tgsize[i] = threads_per_threadgroup.x + 100u * threads_per_threadgroup.y + 10000u * threads_per_threadgroup.z;
  lane[i] = thread_index_in_threadgroup;
"#,
    );
    let launch = Launch::new(vec![(vec![n], ScalarType::U32); 3], grid, [8, 4, 2]);
    let out = run(&desc, &[], &launch).unwrap();
    for o in &out {
        assert!(o.poison_indices().is_empty(), "some grid threads never ran");
    }
    let (pos, tgsize, lane) = (out[0].to_u32_vec(), out[1].to_u32_vec(), out[2].to_u32_vec());
    for z in 0..3 {
        for y in 0..5 {
            for x in 0..37 {
                let i = (z * 5 + y) * 37 + x;
                assert_eq!(pos[i], (x + 1000 * y + 1_000_000 * z) as u32);
                // Partial threadgroups along x (37 = 4*8 + 5), y (5 = 4 + 1), z (3 = 2 + 1).
                let (sx, sy, sz) =
                    (if x >= 32 { 5 } else { 8 }, if y >= 4 { 1 } else { 4 }, if z >= 2 { 1 } else { 2 });
                assert_eq!(tgsize[i], (sx + 100 * sy + 10000 * sz) as u32, "({x}, {y}, {z})");
                assert_eq!(lane[i], ((z % 2) * sy * sx + (y % 4) * sx + x % 8) as u32);
            }
        }
    }

    // Each grid thread runs exactly once; a thread outside the grid would
    // index past the end of the buffer and fault.
    let mut desc = KernelDesc::new(
        "count",
        &[],
        &["hits"],
        r#"
  const uint3 g = thread_position_in_grid;
  atomic_fetch_add_explicit(&hits[(g.z * 5 + g.y) * 37 + g.x], 1u, memory_order_relaxed);
"#,
    );
    desc.atomic_outputs = true;
    let launch = Launch::new(vec![(vec![n], ScalarType::U32)], grid, [8, 4, 2]).init_value(0.0);
    let hits = run(&desc, &[], &launch).unwrap()[0].to_u32_vec();
    assert!(hits.iter().all(|&h| h == 1), "{hits:?}");
}

#[test]
fn out_of_bounds_write_is_reported() {
    let desc = KernelDesc::new("oob", &[], &["out"], "out[thread_position_in_grid.x + 1] = 1.0f;");
    let msg = runtime_message(run(&desc, &[], &launch_1d(64, 32, ScalarType::F32)));
    assert!(msg.contains("past the end of buffer 'out'"), "{msg}");
}

#[test]
fn init_value_and_poison() {
    let desc = KernelDesc::new(
        "evens",
        &[],
        &["out"],
        "const uint i = thread_position_in_grid.x;\n  if (i % 2 == 0) out[i] = float(i);",
    );
    let launch = launch_1d(16, 16, ScalarType::F32);
    let poisoned = run(&desc, &[], &launch).unwrap();
    assert_eq!(poisoned[0].poison_indices(), (1..16).step_by(2).collect::<Vec<_>>());
    assert!(poisoned[0].to_f32_vec()[1].is_nan());

    let filled = run(&desc, &[], &launch.clone().init_value(7.5)).unwrap()[0].to_f32_vec();
    for (i, v) in filled.iter().enumerate() {
        assert_eq!(*v, if i % 2 == 0 { i as f32 } else { 7.5 });
    }
}

#[test]
fn shape_strides_ndim_and_scalar_inputs() {
    let x = HostTensor::from_f32(&[2, 3, 4], &(0..24).map(|i| i as f32).collect::<Vec<_>>());
    let s = HostTensor::from_f32(&[], &[0.5]);
    let desc = KernelDesc::new(
        "meta",
        &["x", "s"],
        &["out"],
        r#"
  out[0] = float(x_ndim);
  for (int k = 0; k < x_ndim; ++k) {
    out[1 + k] = float(x_shape[k]);
    out[4 + k] = float(x_strides[k]);
  }
  // A 0-d input is bound by reference.
  out[7] = s * x[elem_to_loc(23u, x_shape, x_strides, x_ndim)];
"#,
    );
    let launch = Launch::new(vec![(vec![8], ScalarType::F32)], [1, 1, 1], [1, 1, 1]);
    let mut results = Vec::new();
    for contiguous in [true, false] {
        let mut d = desc.clone();
        d.ensure_row_contiguous = contiguous;
        results.push(run(&d, &[x.clone(), s.clone()], &launch).unwrap()[0].to_f32_vec());
    }
    assert_eq!(results[0], vec![3.0, 2.0, 3.0, 4.0, 12.0, 4.0, 1.0, 11.5]);
    // Host tensors are row contiguous, so ensure_row_contiguous changes nothing.
    assert_eq!(results[0], results[1]);
}

#[test]
fn half_and_bfloat_round_trip_and_arithmetic() {
    // Values around rounding ties, subnormals, overflow and specials.
    let mut values = vec![
        0.0f32,
        -0.0,
        1.0,
        -2.5,
        65504.0,
        65519.0,
        65520.0,
        1e6,
        -1e6,
        6.0e-8,
        3.0e-8,
        2.9e-8,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        0.1,
        1.0 / 3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        3.0e38,
        1e-40,
    ];
    let mut rng = Rng::new(9);
    values.extend((0..200).map(|_| rng.uniform(-70000.0, 70000.0) * rng.uniform(0.0, 1.0).powi(8)));
    let n = values.len();
    let desc = KernelDesc::new(
        "convert",
        &["x", "xb"],
        &["h", "b", "back", "hmath", "bmath"],
        r#"
  const uint i = thread_position_in_grid.x;
  const half hv = half(x[i]);
  h[i] = hv;
  b[i] = bfloat16_t(x[i]);
  back[i] = float(hv);
  // Each operation rounds to the 16-bit type.
  half a = hv;
  a = a * a + a;
  hmath[i] = a / half(3.0f);
  const bfloat16_t c = xb[i];
  bmath[i] = c * c - c;
"#,
    );
    let xb = HostTensor::from_f32_as(ScalarType::BF16, &[n], &values);
    let outs = vec![
        (vec![n], ScalarType::F16),
        (vec![n], ScalarType::BF16),
        (vec![n], ScalarType::F32),
        (vec![n], ScalarType::F16),
        (vec![n], ScalarType::BF16),
    ];
    let out = run(&desc, &[HostTensor::from_f32(&[n], &values), xb.clone()], &Launch::new(outs, [n, 1, 1], [64, 1, 1]))
        .unwrap();
    let (h, b, back) = (out[0].to_bits_u16_vec(), out[1].to_bits_u16_vec(), out[2].to_f32_vec());
    let (hmath, bmath) = (out[3].to_bits_u16_vec(), out[4].to_bits_u16_vec());
    let rh = |v: f32| f16_bits_to_f32(f32_to_f16_bits(v));
    let rb = |v: f32| bf16_bits_to_f32(f32_to_bf16_bits(v));
    let xbv = xb.to_f32_vec();
    for i in 0..n {
        let v = values[i];
        assert_eq!(h[i], f32_to_f16_bits(v), "half({v:e})");
        assert_eq!(b[i], f32_to_bf16_bits(v), "bfloat({v:e})");
        assert_eq!(back[i].to_bits(), f16_bits_to_f32(h[i]).to_bits(), "float(half({v:e}))");
        let a = rh(v);
        let want = rh(rh(rh(a * a) + a) / 3.0);
        let got = f16_bits_to_f32(hmath[i]);
        assert!(got == want || (got.is_nan() && want.is_nan()), "half math at {v:e}: {got} vs {want}");
        let c = xbv[i];
        let want = rb(rb(c * c) - c);
        let got = bf16_bits_to_f32(bmath[i]);
        assert!(got == want || (got.is_nan() && want.is_nan()), "bfloat math at {v:e}: {got} vs {want}");
    }
}

#[test]
fn unsupported_features_fail_to_compile_with_their_name() {
    let desc = KernelDesc::new(
        "unsupported",
        &["x"],
        &["out"],
        "const uint i = thread_position_in_grid.x;\n  out[i] = simd_prefix_inclusive_product(x[i]);",
    );
    let msg =
        compile_message(run(&desc, &[HostTensor::from_f32(&[32], &[1.0; 32])], &launch_1d(32, 32, ScalarType::F32)));
    assert!(msg.contains("msl-sim does not support simd_prefix_inclusive_product"), "{msg}");
    assert!(msg.contains("kernel-body:2"), "{msg}");

    let desc = KernelDesc::new("texture", &[], &["out"], "texture2d<float, access::read> t;\n  out[0] = 1.0f;");
    let launch = launch_1d(1, 1, ScalarType::F32);
    let msg = compile_message(run(&desc, &[], &launch));
    assert!(msg.contains("msl-sim does not support textures (texture2d)"), "{msg}");

    // A function that is not in the supported subset is simply undeclared.
    let desc = KernelDesc::new("erf", &[], &["out"], "out[0] = erf(1.0f);");
    let msg = compile_message(run(&desc, &[], &launch));
    assert!(msg.contains("erf") && msg.contains("was not declared"), "{msg}");
}

/// Each SIMD-group's 32 values are summed with a rotate-and-add all-reduce
/// built on simd_shuffle; `OFFSET` is 0 in the correct kernel.
const ALLREDUCE: &str = r#"
  const uint i = thread_position_in_grid.x;
  const uint lane = thread_index_in_simdgroup;
  float v = x[i];
  for (uint d = 16; d > 0; d /= 2)
    v += simd_shuffle(v, (ushort)((lane + d + OFFSET) % 32));
  out[i] = v;
"#;

/// The check a test would apply to the all-reduce: every lane holds its
/// SIMD-group's sum (inputs are small integers, so any order is exact).
fn check_allreduce(x: &[f32], out: &[f32]) -> Result<(), String> {
    for (i, &got) in out.iter().enumerate() {
        let sg = i / 32;
        let want: f32 = x[sg * 32..sg * 32 + 32].iter().sum();
        if got != want {
            return Err(format!("thread {i}: got {got}, want {want}"));
        }
    }
    Ok(())
}

#[test]
fn deliberately_wrong_kernel_is_caught() {
    let n = 256;
    let mut rng = Rng::new(21);
    let x: Vec<f32> = (0..n).map(|_| (rng.next_u32() % 100) as f32).collect();
    let desc = KernelDesc::new("allreduce", &["x"], &["out"], ALLREDUCE);
    let result = |offset: i32| {
        let launch = launch_1d(n, 128, ScalarType::F32).template("OFFSET", TemplateArg::Int(offset));
        run(&desc, &[HostTensor::from_f32(&[n], &x)], &launch).unwrap()[0].to_f32_vec()
    };
    assert_eq!(check_allreduce(&x, &result(0)), Ok(()));
    // Off by one lane in the shuffle source: the same check must fail.
    let wrong = check_allreduce(&x, &result(1));
    assert!(wrong.is_err(), "the off-by-one kernel passed the check");
}

#[test]
fn invalid_arguments_are_rejected() {
    let desc = KernelDesc::new("k", &["x"], &["out"], "out[0] = x[0];");
    let launch = launch_1d(1, 1, ScalarType::F32);
    let err = run(&desc, &[], &launch).unwrap_err().to_string();
    assert!(err.contains("1 input names but 0 inputs"), "{err}");
    let big = Launch::new(vec![(vec![1], ScalarType::F32)], [2048, 1, 1], [2048, 1, 1]);
    let err = run(&desc, &[HostTensor::from_f32(&[1], &[1.0])], &big).unwrap_err().to_string();
    assert!(err.contains("exceeds the maximum of 1024"), "{err}");
}

#[test]
fn fiber_stack_overflow_is_reported() {
    let desc = KernelDesc::new(
        "deep",
        &["x"],
        &["out"],
        r#"
  float big[65536];
  const uint i = thread_position_in_grid.x;
  for (uint k = 0; k < 65536; ++k) big[k] = x[(i + k) % 64] + float(k);
  out[i] = big[x[i] > 0.0f ? 65535 - i : i];
"#,
    );
    let msg = f32_runtime_error(&desc, &[1.0; 64], 64);
    assert!(msg.contains("overflowed its fiber stack") && msg.contains("MSL_SIM_STACK_KB"), "{msg}");
}
