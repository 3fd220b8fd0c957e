//! A coded MLP on the host, `down(silu(gate(x)) ⊙ up(x))`, in f32 with no rounding between its
//! projections.

use super::HostOperands;
use crate::error::{invalid, Result};

/// `silu(gate(x)) ⊙ up(x)` for `x` of `m` rows: gate and up side by side on rayon's threads.
pub(super) fn swiglu(gate: &HostOperands, up: &HostOperands, x: &[f32], m: usize) -> Result<Vec<f32>> {
    if (gate.in_features(), gate.out_features()) != (up.in_features(), up.out_features()) {
        invalid!(
            "host path: gate maps {} -> {} but up maps {} -> {}",
            gate.in_features(),
            gate.out_features(),
            up.in_features(),
            up.out_features()
        );
    }
    let (g, u) = rayon::join(|| gate.product(x, m), || up.product(x, m));
    let (mut h, u) = (g?, u?);
    for (hv, uv) in h.iter_mut().zip(&u) {
        *hv = *hv / (1.0 + (-*hv).exp()) * uv;
    }
    Ok(h)
}

/// `down(silu(gate(x)) ⊙ up(x))` for `x` of `m` rows.
pub(super) fn mlp(
    gate: &HostOperands,
    up: &HostOperands,
    down: &HostOperands,
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    if down.in_features() != gate.out_features() {
        invalid!("host path: gate and up give {} features but down takes {}", gate.out_features(), down.in_features());
    }
    down.product(&swiglu(gate, up, x, m)?, m)
}
