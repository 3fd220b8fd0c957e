//! Running one kernel test on the Metal simulator and, as an ignored twin, on real Metal.
#![allow(unused_macros)] // test binaries that include `common` without Metal tests

use mlx_trellis::trellis::ForwardPath;
use mlx_trellis::MetalSimScope;

/// Where the kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `msl-sim`, the CPU simulator of MLX's Metal wrapping.
    Sim,
    /// MLX's Metal back-end (a Mac).
    Metal,
}

impl Mode {
    /// The scope that routes kernels to the simulator (none on Metal).
    pub fn scope(self) -> Option<MetalSimScope> {
        (self == Mode::Sim).then(MetalSimScope::enter)
    }

    /// The forced path of `TrellisLinear` and `TrellisMlp` in this mode.
    pub fn path(self) -> ForwardPath {
        match self {
            Mode::Sim => ForwardPath::MetalSim,
            Mode::Metal => ForwardPath::Metal,
        }
    }
}

/// Each kernel test `body(mode)` as a simulator test and a real-Metal twin (ignored unless MLX's
/// back-end is Metal); `setup = f;` runs `f()` first in both.
macro_rules! on_sim_and_metal {
    (setup = $setup:expr; $($body:ident => $sim:ident, $metal:ident;)*) => {$(
        #[test]
        fn $sim() {
            ($setup)();
            $body(common::metal_mode::Mode::Sim);
        }

        #[test]
        #[ignore = "needs MLX's Metal back-end (a Mac)"]
        fn $metal() {
            ($setup)();
            assert_eq!(
                mlx_trellis::backend(),
                mlx_trellis::Backend::Metal,
                "this test needs MLX's Metal back-end; run it on a Mac"
            );
            $body(common::metal_mode::Mode::Metal);
        }
    )*};
    ($($body:ident => $sim:ident, $metal:ident;)*) => {
        on_sim_and_metal!(setup = || {}; $($body => $sim, $metal;)*);
    };
}
