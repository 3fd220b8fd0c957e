//! MSL_SIM_STRICT=1 turns tolerated undefined results into errors. This file
//! holds a single test because it changes the process environment.

mod common;

use common::runtime_message;
use msl_sim::{run, HostTensor, KernelDesc, Launch, ScalarType};

#[test]
fn strict_mode_rejects_invalid_lane_ids() {
    std::env::set_var("MSL_SIM_STRICT", "1");
    let desc = KernelDesc::new(
        "lane40_strict",
        &["x"],
        &["out"],
        "uint i = thread_position_in_grid.x;\n  out[i] = simd_shuffle(x[i], (ushort)(i + 8));",
    );
    let r = run(
        &desc,
        &[HostTensor::from_f32(&[32], &[1.0; 32])],
        &Launch::new(vec![(vec![32], ScalarType::F32)], [32, 1, 1], [32, 1, 1]),
    );
    std::env::remove_var("MSL_SIM_STRICT");
    let msg = runtime_message(r);
    assert!(msg.contains("lane 24 asks for lane 32, which is not a valid SIMD lane"), "{msg}");
}
