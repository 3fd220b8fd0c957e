//! A large launch (256K threads, eight shuffles each), checked exactly, with
//! compile and run times printed (`cargo test --test perf -- --nocapture`).

use msl_sim::{run_with_report, HostTensor, KernelDesc, Launch, ScalarType};

#[test]
fn shuffle_loop_over_256k_threads() {
    let grid = [128usize, 16, 128];
    let n: usize = grid.iter().product();
    let x: Vec<f32> = (0..1024).map(|i| ((i * 37) % 101) as f32).collect();
    let desc = KernelDesc::new(
        "perf_shuffle",
        &["x"],
        &["out"],
        r#"
  const uint3 g = thread_position_in_grid;
  const uint i = g.x + 128u * (g.y + 16u * g.z);
  const uint lane = thread_index_in_simdgroup;
  const float v = x[i % 1024u];
  float acc = 0.0f;
  for (uint k = 0; k < 8; ++k)
    acc += simd_shuffle(v, (ushort)((lane + k) % 32u)) * float(k + 1);
  out[i] = acc;
"#,
    );
    let launch = Launch::new(vec![(vec![n], ScalarType::F32)], grid, [128, 1, 1]);
    let report = run_with_report(&desc, &[HostTensor::from_f32(&[1024], &x)], &launch).unwrap();
    eprintln!(
        "256K-thread shuffle loop: compile {:.2} s{}, run {:.3} s",
        report.compile_seconds,
        if report.cached { " (cached)" } else { "" },
        report.run_seconds
    );
    let out = report.outputs[0].to_f32_vec();
    for (i, &got) in out.iter().enumerate() {
        let (base, lane) = (i - i % 32, i % 32);
        let mut want = 0.0f32;
        for k in 0..8 {
            want += x[(base + (lane + k) % 32) % 1024] * (k + 1) as f32;
        }
        assert_eq!(got, want, "thread {i}");
    }
}
