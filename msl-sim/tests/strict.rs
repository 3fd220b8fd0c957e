//! MSL_SIM_STRICT=1 turns tolerated undefined results into errors. This file
//! holds a single test because it changes the process environment.

mod common;

use common::f32_runtime_error;
use msl_sim::KernelDesc;

#[test]
fn strict_mode_rejects_invalid_lane_ids() {
    std::env::set_var("MSL_SIM_STRICT", "1");
    let desc = KernelDesc::new(
        "lane40_strict",
        &["x"],
        &["out"],
        "uint i = thread_position_in_grid.x;\n  out[i] = simd_shuffle(x[i], (ushort)(i + 8));",
    );
    let msg = f32_runtime_error(&desc, &[1.0; 32], 32);
    std::env::remove_var("MSL_SIM_STRICT");
    assert!(msg.contains("lane 24 asks for lane 32, which is not a valid SIMD lane"), "{msg}");
}
