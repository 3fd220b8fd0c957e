//! Sets the run-time search path of this package's tests, examples and binaries to the folder
//! that holds the `libmlx` the `mlx-sys` crate linked (published by it as `DEP_MLX_LIB_DIR`).
//! Debian's linker writes it as DT_RUNPATH, so `LD_LIBRARY_PATH` can still swap in another build
//! of the same MLX version (for example MLX's CUDA build on a GPU machine).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
