//! The CUDA-graph batching the timing examples run under. MLX's CUDA back-end launches a graph
//! once it holds `MLX_MAX_OPS_PER_BUFFER` operations, and coded models run faster with fewer than
//! its default (`mlx_trellis::trellis::cuda::MAX_OPS_PER_GRAPH` says why). The examples follow
//! that advice where the environment says nothing, and name the setting in their output.

use std::sync::atomic::{AtomicBool, Ordering};

use mlx_trellis::trellis::cuda::{MAX_OPS_PER_GRAPH, MAX_OPS_PER_GRAPH_VAR};
use mlx_trellis::Backend;

/// Whether [`start`] set the variable.
static SET_HERE: AtomicBool = AtomicBool::new(false);

/// Sets `MLX_MAX_OPS_PER_BUFFER` to the recommended graph size where the environment leaves it
/// unset, except on macOS (MLX's GPU back-end there is Metal, which reads the same variable for
/// its command buffers). Call first in `main`, before any thread starts and before MLX runs:
/// MLX reads the variable once, when it first uses the GPU.
pub fn start() {
    if !cfg!(target_os = "macos") && std::env::var_os(MAX_OPS_PER_GRAPH_VAR).is_none() {
        std::env::set_var(MAX_OPS_PER_GRAPH_VAR, MAX_OPS_PER_GRAPH.to_string());
        SET_HERE.store(true, Ordering::Relaxed);
    }
}

/// One line naming the graph batching in force, and the recommended one where it differs; on
/// MLX's CPU and Metal back-ends, which build no CUDA graphs, the back-end instead.
pub fn note() -> String {
    match mlx_trellis::backend() {
        Backend::Cuda => {}
        other => return format!("MLX's {other} back-end"),
    }
    let recommended = MAX_OPS_PER_GRAPH.to_string();
    match std::env::var(MAX_OPS_PER_GRAPH_VAR) {
        Ok(v) if SET_HERE.load(Ordering::Relaxed) => {
            format!("CUDA graphs of at most {v} operations ({MAX_OPS_PER_GRAPH_VAR}, set by this program where unset)")
        }
        Ok(v) if v.trim() == recommended => format!("CUDA graphs of at most {v} operations ({MAX_OPS_PER_GRAPH_VAR})"),
        Ok(v) => format!(
            "CUDA graphs of at most {v} operations ({MAX_OPS_PER_GRAPH_VAR}; coded models run faster with {recommended})"
        ),
        Err(_) => format!("MLX's default batching ({MAX_OPS_PER_GRAPH_VAR} unset)"),
    }
}
