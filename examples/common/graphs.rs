//! The CUDA-graph batching the timing examples run under, for their output's header: MLX's CUDA
//! back-end launches a graph once it holds `MLX_MAX_OPS_PER_BUFFER` operations, and coded
//! models run faster with fewer than its default (`mlx_trellis::trellis::cuda::MAX_OPS_PER_GRAPH`
//! says why). The examples do not change the environment; `scripts/gpu.sh` sets the variable
//! where it is unset.

use mlx_trellis::trellis::cuda::{MAX_OPS_PER_GRAPH, MAX_OPS_PER_GRAPH_VAR};

/// One line naming the graph batching in force, and the recommended one where it differs.
pub fn note() -> String {
    match std::env::var(MAX_OPS_PER_GRAPH_VAR) {
        Ok(v) if v.trim() == MAX_OPS_PER_GRAPH.to_string() => format!("CUDA graphs of at most {v} operations ({MAX_OPS_PER_GRAPH_VAR})"),
        Ok(v) => format!(
            "CUDA graphs of at most {v} operations ({MAX_OPS_PER_GRAPH_VAR}; coded models run faster with {MAX_OPS_PER_GRAPH})"
        ),
        Err(_) => format!(
            "CUDA graphs of MLX's default size (100 operations on sm_90; {MAX_OPS_PER_GRAPH_VAR} unset; coded models run faster with {MAX_OPS_PER_GRAPH})"
        ),
    }
}
