//! Raw FFI bindings to [mlx-c] 0.7.0, the C API of Apple's [MLX] 0.32.2.
//!
//! Everything here is `unsafe` and mirrors `mlx/c/mlx.h` one to one; the safe API lives in the
//! `mlx-trellis` crate. The build script finds MLX (see `build.rs` for the search order), compiles
//! mlx-c against it and links `libmlx`. Dependents read the library folder from the
//! `DEP_MLX_LIB_DIR` build-script variable (this crate declares `links = "mlx"`).
//!
//! [mlx-c]: https://github.com/ml-explore/mlx-c
//! [MLX]: https://github.com/ml-explore/mlx
#![no_std]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs)]
#![allow(clippy::all)]

include!("bindings.rs");
