//! The run-time search path of the fuzz binary: the folder of the `libmlx` that `mlx-sys` linked
//! (as the main crate's build.rs does for its own tests and examples).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
