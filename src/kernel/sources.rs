//! Every kernel file under `kernels/`, compiled into the library in one place: a constant per
//! file, and [`ALL`], the table of every file by its path under `kernels/`. The kernel families
//! (`trellis/cuda/`, `trellis/metal/`, the codebook headers) take their text from here.

/// Declares a constant per kernel file (its text) and [`ALL`] (every file by its path).
macro_rules! kernel_files {
    ($($(#[$attr:meta])* $name:ident = $path:literal;)*) => {
        $(
            $(#[$attr])*
            pub(crate) const $name: &str = include_str!(concat!("../../kernels/", $path));
        )*

        /// Every kernel file: its path under `kernels/` and its text (what the tests walk to
        /// check each file's compaction and that the table lists every file).
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) const ALL: &[(&str, &str)] = &[$(($path, $name)),*];
    };
}

kernel_files! {
    /// The 1MAD code on CUDA: `TRELLIS_RCP` and `trellis_y_f32(state)`.
    CUDA_CODEBOOK = "cuda/codebook.cuh";
    /// The MMA and code-pair helpers shared by the down and axis-1 kernels.
    CUDA_FRAGMENT = "cuda/fragment.cuh";
    /// The down projection's kernel.
    CUDA_DOWN_MMA = "cuda/down_mma.cu";
    /// The down projection's configuration-dependent helpers.
    CUDA_DOWN_MMA_HEADER = "cuda/down_mma.cuh";
    /// The down projection's pre-pass (activations times row scales, zeroed fold counters).
    CUDA_PRESCALE = "cuda/prescale.cu";
    /// The axis-1 projections and the fused gate·up·SwiGLU.
    CUDA_GATE_UP = "cuda/gate_up.cu";
    /// What the axis-1 kernels share: the code words a lane reads and their A fragments.
    CUDA_AXIS_ONE = "cuda/axis_one.cuh";
    /// The same with up to 8 rows of activations as two int8 terms, on u8 x s8 MMAs.
    CUDA_GATE_UP_INT8 = "cuda/gate_up_int8.cu";
    /// The int8 kernel's helpers.
    CUDA_GATE_UP_INT8_HEADER = "cuda/gate_up_int8.cuh";
    /// The decode-once GEMM of the same projections for many rows (activations staged in shared
    /// memory).
    CUDA_GATE_UP_GEMM = "cuda/gate_up_gemm.cu";
    /// Hopper's warpgroup MMA (wgmma) with A in registers and B in shared memory.
    CUDA_WGMMA = "cuda/wgmma.cuh";
    /// The decode-once GEMM on the warpgroup MMA (sm_90a).
    CUDA_GATE_UP_WGMMA = "cuda/gate_up_wgmma.cu";
    /// The warp-specialized decode-once GEMM (sm_90a): producer warps decode into shared memory,
    /// a consumer warpgroup multiplies.
    CUDA_GATE_UP_WS = "cuda/gate_up_ws.cu";
    /// The down projection as the same warp-specialized GEMM (sm_90a), the weights transposed.
    CUDA_DOWN_WS = "cuda/down_ws.cu";
    /// The warp-specialized GEMMs' stream-K split and the fold of the tiles it splits.
    CUDA_STREAM_K = "cuda/stream_k.cuh";
    /// The decode of a stored matrix to dense weights.
    CUDA_EXPAND = "cuda/expand.cu";
    /// The block Hadamard transform's butterflies, shared by the two rotating kernels.
    CUDA_HADAMARD = "cuda/hadamard.cuh";
    /// The coded axis's rotation (signs and block Hadamard) with its padding or slice.
    CUDA_ROTATE = "cuda/rotate.cu";
    /// The SwiGLU between an MLP's projections with the coded axes' rotations around it.
    CUDA_SWIGLU_ROTATE = "cuda/swiglu_rotate.cu";
    /// The encoder's block search.
    CUDA_VITERBI = "cuda/viterbi.cu";
    /// The 1MAD code on Metal: `TRELLIS_RCP` and `trellis_y_f32(state)`.
    METAL_CODEBOOK = "metal/codebook.h";
    /// The factored down kernels (row and rows).
    METAL_DOWN_FACTORED = "metal/down_factored.metal";
    /// The factored down kernels of the 3-bit block interleave.
    METAL_DOWN_K3_INTERLEAVED_FACTORED = "metal/down_k3_interleaved_factored.metal";
    /// The MMA down kernel.
    METAL_DOWN_MMA = "metal/down_mma.metal";
    /// The MMA down kernel's decode state.
    METAL_DOWN_MMA_STATE = "metal/down_mma_state.h";
    /// The wide MMA down kernel.
    METAL_DOWN_MMA_WIDE = "metal/down_mma_wide.metal";
    /// The wide MMA down kernel's decode state.
    METAL_DOWN_MMA_WIDE_STATE = "metal/down_mma_wide_state.h";
    /// What the gate/up families share.
    METAL_GATE_UP_HEADER = "metal/gate_up.h";
    /// The factored gate/up kernels (row and rows, each also fused with the SwiGLU).
    METAL_GATE_UP_FACTORED = "metal/gate_up_factored.metal";
    /// The MMA gate/up kernel (also fused with the SwiGLU).
    METAL_GATE_UP_MMA = "metal/gate_up_mma.metal";
    /// The baseline: decoded f32 weights times activations.
    METAL_TRELLIS_SCATTER = "metal/trellis_scatter.metal";
}

#[cfg(test)]
mod tests {
    use super::ALL;

    #[test]
    fn the_table_lists_every_kernel_file_with_its_bytes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut on_disk = Vec::new();
        for family in std::fs::read_dir(&root).unwrap() {
            let family = family.unwrap().path();
            for file in std::fs::read_dir(&family).unwrap() {
                let file = file.unwrap().path();
                let name = format!(
                    "{}/{}",
                    family.file_name().unwrap().to_str().unwrap(),
                    file.file_name().unwrap().to_str().unwrap()
                );
                on_disk.push((name, std::fs::read_to_string(&file).unwrap()));
            }
        }
        on_disk.sort();
        let mut table: Vec<(String, String)> = ALL.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
        table.sort();
        assert_eq!(table.iter().map(|t| &t.0).collect::<Vec<_>>(), on_disk.iter().map(|t| &t.0).collect::<Vec<_>>());
        assert!(table == on_disk, "a table entry differs from its file");
    }
}
