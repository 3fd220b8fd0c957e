//! Helpers shared by the integration tests.
#![allow(dead_code)]

use msl_sim::{run, HostTensor, KernelDesc, Launch, ScalarType, SimError};

/// Small deterministic generator (SplitMix64), so tests need no dependencies.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    /// A random permutation of 0..n.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, (self.next_u64() % (i as u64 + 1)) as usize);
        }
        p
    }
}

/// The runtime error message, panicking if the result is not a runtime error.
pub fn runtime_message<T: std::fmt::Debug>(r: Result<T, SimError>) -> String {
    match r {
        Err(SimError::Runtime { message, .. }) => message,
        other => panic!("expected a runtime error, got {other:?}"),
    }
}

/// A launch of `n` threads along x in threadgroups of `tg`, with one output
/// of `n` elements of type `out`.
pub fn launch_1d(n: usize, tg: usize, out: ScalarType) -> Launch {
    Launch::new(vec![(vec![n], out)], [n, 1, 1], [tg, 1, 1])
}

/// The runtime error of `desc` run on the one `F32` input `x` with one thread
/// per element (threadgroups of `tg`) and an `F32` output of the same length.
pub fn f32_runtime_error(desc: &KernelDesc, x: &[f32], tg: usize) -> String {
    let n = x.len();
    runtime_message(run(desc, &[HostTensor::from_f32(&[n], x)], &launch_1d(n, tg, ScalarType::F32)))
}

/// The compiler diagnostics, panicking if the result is not a compile error.
pub fn compile_message<T: std::fmt::Debug>(r: Result<T, SimError>) -> String {
    match r {
        Err(e @ SimError::Compile { .. }) => e.to_string(),
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// Apple's simdgroup_matrix fragment layout: lane l holds (fm, fn) and (fm, fn + 1).
pub fn fragment(l: usize) -> (usize, usize) {
    let qid = l / 4;
    ((qid & 4) + (l / 2) % 4, (qid & 2) * 2 + (l % 2) * 2)
}
