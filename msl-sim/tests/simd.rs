//! SIMD-group functions: shuffles, reductions, and the errors for undefined uses.

mod common;

use common::{f32_runtime_error, launch_1d, Rng};
use msl_sim::{run, HostTensor, KernelDesc, Launch, ScalarType};

fn f32_input(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.uniform(-4.0, 4.0)).collect()
}

#[test]
fn shuffle_by_arbitrary_lane_permutation() {
    let n = 128;
    let x = f32_input(n, 1);
    let mut rng = Rng::new(2);
    // A different permutation of the 32 lanes for each SIMD-group.
    let src: Vec<u32> = (0..n / 32).flat_map(|_| rng.permutation(32)).map(|v| v as u32).collect();
    let desc = KernelDesc::new(
        "shuffle_perm",
        &["x", "src"],
        &["out"],
        r#"
  uint i = thread_position_in_grid.x;
  out[i] = simd_shuffle(x[i], (ushort)src[i]);
"#,
    );
    let out = run(
        &desc,
        &[HostTensor::from_f32(&[n], &x), HostTensor::from_u32(&[n], &src)],
        &launch_1d(n, 64, ScalarType::F32),
    )
    .unwrap();
    let got = out[0].to_f32_vec();
    for i in 0..n {
        assert_eq!(got[i], x[(i / 32) * 32 + src[i] as usize], "thread {i}");
    }
}

#[test]
fn shuffle_down_up_xor_rotate_and_broadcast() {
    let n = 96;
    let x: Vec<u32> = (0..n as u32).map(|i| 1000 + i * 7).collect();
    let desc = KernelDesc::new(
        "shuffles",
        &["x"],
        &["down", "up", "xr", "rot", "bc"],
        r#"
  uint i = thread_position_in_grid.x;
  uint v = x[i];
  down[i] = simd_shuffle_down(v, 3);
  up[i] = metal::simd_shuffle_up(v, 5);
  xr[i] = simd_shuffle_xor(v, 13);
  rot[i] = simd_shuffle_rotate_down(v, 7);
  bc[i] = simd_broadcast(v, 30);
"#,
    );
    let outs = vec![(vec![n], ScalarType::U32); 5];
    let out = run(&desc, &[HostTensor::from_u32(&[n], &x)], &Launch::new(outs, [n, 1, 1], [96, 1, 1])).unwrap();
    let [down, up, xr, rot, bc] = [0, 1, 2, 3, 4].map(|k| out[k].to_u32_vec());
    for i in 0..n {
        let (base, lane) = ((i / 32) * 32, i % 32);
        // Metal: lanes whose source is past the end keep their own value.
        let want_down = if lane + 3 < 32 { x[i + 3] } else { x[i] };
        let want_up = if lane >= 5 { x[i - 5] } else { x[i] };
        assert_eq!(down[i], want_down, "shuffle_down lane {i}");
        assert_eq!(up[i], want_up, "shuffle_up lane {i}");
        assert_eq!(xr[i], x[base + (lane ^ 13)], "shuffle_xor lane {i}");
        assert_eq!(rot[i], x[base + (lane + 7) % 32], "rotate_down lane {i}");
        assert_eq!(bc[i], x[base + 30], "broadcast lane {i}");
    }
}

#[test]
fn reductions_and_prefix_sums() {
    let n = 64;
    let xf = f32_input(n, 3);
    let xu: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761u32) >> 20).collect();
    let desc = KernelDesc::new(
        "reduce",
        &["xf", "xu"],
        &["sum", "mx", "mn", "usum", "excl", "incl", "ballot"],
        r#"
  uint i = thread_position_in_grid.x;
  float v = xf[i];
  sum[i] = simd_sum(v);
  mx[i] = simd_max(v);
  mn[i] = metal::simd_min(v);
  usum[i] = simd_sum(xu[i]);
  excl[i] = simd_prefix_exclusive_sum(xu[i]);
  incl[i] = simd_prefix_inclusive_sum(xu[i]);
  ballot[i] = (uint)(ulong)simd_ballot(v > 0.0f);
"#,
    );
    let mut outs = vec![(vec![n], ScalarType::F32); 3];
    outs.extend(vec![(vec![n], ScalarType::U32); 4]);
    let out = run(
        &desc,
        &[HostTensor::from_f32(&[n], &xf), HostTensor::from_u32(&[n], &xu)],
        &Launch::new(outs, [n, 1, 1], [64, 1, 1]),
    )
    .unwrap();
    for sg in 0..2 {
        let lanes = sg * 32..sg * 32 + 32;
        // The simulator sums in lane order, so the float sum is bit-exact.
        let want_sum = xf[lanes.clone()].iter().fold(0.0f32, |a, &b| a + b);
        let want_max = xf[lanes.clone()].iter().cloned().fold(f32::MIN, f32::max);
        let want_min = xf[lanes.clone()].iter().cloned().fold(f32::MAX, f32::min);
        let want_usum: u32 = xu[lanes.clone()].iter().sum();
        let want_ballot = lanes.clone().filter(|&i| xf[i] > 0.0).fold(0u32, |m, i| m | 1 << (i % 32));
        for i in lanes.clone() {
            assert_eq!(out[0].to_f32_vec()[i], want_sum);
            assert_eq!(out[1].to_f32_vec()[i], want_max);
            assert_eq!(out[2].to_f32_vec()[i], want_min);
            assert_eq!(out[3].to_u32_vec()[i], want_usum);
            let before: u32 = xu[sg * 32..i].iter().sum();
            assert_eq!(out[4].to_u32_vec()[i], before, "exclusive prefix at {i}");
            assert_eq!(out[5].to_u32_vec()[i], before + xu[i], "inclusive prefix at {i}");
            assert_eq!(out[6].to_u32_vec()[i], want_ballot);
        }
    }
}

#[test]
fn reductions_cover_only_active_lanes() {
    // 40 threads: the second SIMD-group has 8 lanes. In the first one, lanes
    // 20..31 return before the reduction.
    let n = 40;
    let x: Vec<u32> = (0..n as u32).map(|i| i + 1).collect();
    let desc = KernelDesc::new(
        "partial",
        &["x"],
        &["out"],
        r#"
  uint i = thread_position_in_grid.x;
  out[i] = 0u;
  if (i < 32 && thread_index_in_simdgroup >= 20) return;
  out[i] = simd_sum(x[i]);
"#,
    );
    let out =
        run(&desc, &[HostTensor::from_u32(&[n], &x)], &launch_1d(n, 64, ScalarType::U32)).unwrap()[0].to_u32_vec();
    let first: u32 = (1..=20).sum();
    let second: u32 = (33..=40).sum();
    for (i, &got) in out.iter().enumerate() {
        let want = if i < 20 {
            first
        } else if i < 32 {
            0
        } else {
            second
        };
        assert_eq!(got, want, "thread {i}");
    }
}

#[test]
fn reading_an_inactive_lane_is_an_error() {
    // The second SIMD-group has lanes 0..7 only; lane ^ 16 does not exist.
    let desc = KernelDesc::new(
        "bad_xor",
        &["x"],
        &["out"],
        "uint i = thread_position_in_grid.x;\n  out[i] = simd_shuffle_xor(x[i], 16);",
    );
    let msg = f32_runtime_error(&desc, &[1.0; 40], 64);
    assert!(msg.contains("simd_shuffle_xor") && msg.contains("inactive"), "{msg}");
    assert!(msg.contains("kernel-body:2"), "the message names the body line: {msg}");
}

#[test]
fn reading_a_returned_lane_is_an_error() {
    let desc = KernelDesc::new(
        "bad_exit",
        &["x"],
        &["out"],
        r#"
  uint lane = thread_index_in_simdgroup;
  if (lane == 31) return;
  out[lane] = simd_shuffle_down(x[lane], 1);
"#,
    );
    let msg = f32_runtime_error(&desc, &[1.0; 32], 32);
    assert!(msg.contains("lane 30 reads lane 31"), "{msg}");
}

#[test]
fn divergent_collectives_are_an_error() {
    let desc = KernelDesc::new(
        "diverge",
        &["x"],
        &["out"],
        r#"
  uint i = thread_position_in_grid.x;
  float v = x[i];
  if (thread_index_in_simdgroup < 16) v = simd_sum(v);
  else v = simd_max(v);
  out[i] = v;
"#,
    );
    let msg = f32_runtime_error(&desc, &[1.0; 32], 32);
    assert!(msg.contains("divergence") && msg.contains("simd_sum") && msg.contains("simd_max"), "{msg}");
}

#[test]
fn non_uniform_shuffle_delta_is_an_error() {
    let desc = KernelDesc::new(
        "bad_delta",
        &["x"],
        &["out"],
        "uint i = thread_position_in_grid.x;\n  out[i] = simd_shuffle_down(x[i], (ushort)(i % 2));",
    );
    let msg = f32_runtime_error(&desc, &[1.0; 32], 32);
    assert!(msg.contains("must be the same on all lanes"), "{msg}");
}

#[test]
fn invalid_lane_id_yields_poison() {
    // Lane IDs outside 0..31 have an undefined result in MSL; the simulator
    // returns all-ones bits (NaN) so any use of the value shows in the output.
    let desc = KernelDesc::new(
        "lane40",
        &["x"],
        &["out"],
        "uint i = thread_position_in_grid.x;\n  out[i] = simd_shuffle(x[i], (ushort)(i < 16 ? i + 1 : 40));",
    );
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let out =
        run(&desc, &[HostTensor::from_f32(&[32], &x)], &launch_1d(32, 32, ScalarType::F32)).unwrap()[0].to_f32_vec();
    for (i, v) in out.iter().enumerate() {
        if i < 16 {
            assert_eq!(*v, (i + 1) as f32);
        } else {
            assert!(v.is_nan(), "lane {i}: {v}");
        }
    }
}
