//! Threadgroup memory, barriers and atomics.

mod common;

use common::{f32_runtime_error, launch_1d, Rng};
use msl_sim::{run, HostTensor, KernelDesc, Launch, ScalarType, TemplateArg};

#[test]
fn threadgroup_memory_written_by_one_simdgroup_is_read_by_others() {
    // SIMD-group 0 fills the whole buffer; after the barrier every thread
    // reads an element written by another SIMD-group's thread. Eight
    // threadgroups on a pool of workers also exercise reuse of the storage.
    let n = 1024;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let desc = KernelDesc::new(
        "tg_share",
        &["x"],
        &["out"],
        r#"
  threadgroup float buf[128];
  const uint tid = thread_index_in_threadgroup;
  const uint base = threadgroup_position_in_grid.x * 128;
  if (simdgroup_index_in_threadgroup == 0) {
    for (uint j = 0; j < 4; ++j) {
      const uint k = thread_index_in_simdgroup * 4 + j;
      buf[k] = 2.0f * x[base + k];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[base + tid] = buf[127 - tid];
"#,
    );
    let out =
        run(&desc, &[HostTensor::from_f32(&[n], &x)], &launch_1d(n, 128, ScalarType::F32)).unwrap()[0].to_f32_vec();
    for i in 0..n {
        let base = (i / 128) * 128;
        assert_eq!(out[i], 2.0 * x[base + 127 - (i - base)], "thread {i}");
    }
}

#[test]
fn threadgroup_half_codebook_with_template_size() {
    // A codebook of 1 << L halves built cooperatively, then looked up.
    let l = 9;
    let n = 512;
    let mut rng = Rng::new(11);
    let idx: Vec<u32> = (0..n).map(|_| rng.next_u32() % (1 << l)).collect();
    let desc = KernelDesc::new(
        "codebook",
        &["idx"],
        &["out"],
        r#"
  threadgroup half codebook[1 << L];
  for (uint j = thread_index_in_threadgroup; j < (1u << L); j += threads_per_threadgroup.x)
    codebook[j] = half(float(j) * 0.25f - 10.0f);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const uint i = thread_position_in_grid.x;
  out[i] = float(codebook[idx[i]]);
"#,
    );
    let launch = launch_1d(n, 256, ScalarType::F32).template("L", TemplateArg::Int(l));
    let out = run(&desc, &[HostTensor::from_u32(&[n], &idx)], &launch).unwrap()[0].to_f32_vec();
    for i in 0..n {
        // j * 0.25 - 10 is exact in half for j < 512.
        assert_eq!(out[i], idx[i] as f32 * 0.25 - 10.0, "thread {i}");
    }
}

#[test]
fn barrier_skipped_by_returned_threads_is_an_error() {
    let desc = KernelDesc::new(
        "bad_barrier",
        &["x"],
        &["out"],
        r#"
  const uint i = thread_position_in_grid.x;
  if (i >= 100) return;
  threadgroup_barrier(mem_flags::mem_none);
  out[i] = x[i];
"#,
    );
    let msg = f32_runtime_error(&desc, &[0.0; 128], 128);
    assert!(msg.contains("threadgroup_barrier") && msg.contains("100 of the 128 threads"), "{msg}");
}

#[test]
fn atomic_outputs_histogram_and_float_sum() {
    // Many threadgroups (run on several workers) update the same counters.
    let n = 8192;
    let mut rng = Rng::new(5);
    let x: Vec<u32> = (0..n).map(|_| rng.next_u32() % 1000).collect();
    let mut desc = KernelDesc::new(
        "histogram",
        &["x"],
        &["hist", "total"],
        r#"
  const uint i = thread_position_in_grid.x;
  atomic_fetch_add_explicit(&hist[x[i] % 16], 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(&total[0], x[i], memory_order_relaxed);
"#,
    );
    desc.atomic_outputs = true;
    let launch = Launch::new(vec![(vec![16], ScalarType::U32), (vec![1], ScalarType::U32)], [n, 1, 1], [256, 1, 1])
        .init_value(0.0);
    let out = run(&desc, &[HostTensor::from_u32(&[n], &x)], &launch).unwrap();
    let mut want = vec![0u32; 16];
    for &v in &x {
        want[(v % 16) as usize] += 1;
    }
    assert_eq!(out[0].to_u32_vec(), want);
    assert_eq!(out[1].to_u32_vec()[0], x.iter().sum::<u32>());

    // Float atomics: integers below 2^24 add exactly in any order.
    let mut desc = KernelDesc::new(
        "fsum",
        &["x"],
        &["total"],
        "atomic_fetch_add_explicit(total, float(x[thread_position_in_grid.x]), memory_order_relaxed);",
    );
    desc.atomic_outputs = true;
    let launch = Launch::new(vec![(vec![1], ScalarType::F32)], [n, 1, 1], [128, 1, 1]).init_value(0.0);
    let out = run(&desc, &[HostTensor::from_u32(&[n], &x)], &launch).unwrap();
    assert_eq!(out[0].to_f32_vec()[0], x.iter().sum::<u32>() as f32);
}
