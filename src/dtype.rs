//! Element types: the [`Dtype`] enum and the host types that map onto it ([`Element`]).

use std::fmt;

use half::{bf16, f16};
use mlx_sys as sys;

/// An MLX element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// `bool`
    Bool,
    /// `uint8`
    Uint8,
    /// `uint16`
    Uint16,
    /// `uint32`
    Uint32,
    /// `uint64`
    Uint64,
    /// `int8`
    Int8,
    /// `int16`
    Int16,
    /// `int32`
    Int32,
    /// `int64`
    Int64,
    /// `float16` (IEEE binary16)
    Float16,
    /// `bfloat16`
    Bfloat16,
    /// `float32`
    Float32,
    /// `float64` (CPU only in MLX)
    Float64,
    /// `complex64`
    Complex64,
}

impl Dtype {
    pub(crate) fn to_raw(self) -> sys::mlx_dtype {
        (match self {
            Dtype::Bool => sys::MLX_BOOL,
            Dtype::Uint8 => sys::MLX_UINT8,
            Dtype::Uint16 => sys::MLX_UINT16,
            Dtype::Uint32 => sys::MLX_UINT32,
            Dtype::Uint64 => sys::MLX_UINT64,
            Dtype::Int8 => sys::MLX_INT8,
            Dtype::Int16 => sys::MLX_INT16,
            Dtype::Int32 => sys::MLX_INT32,
            Dtype::Int64 => sys::MLX_INT64,
            Dtype::Float16 => sys::MLX_FLOAT16,
            Dtype::Bfloat16 => sys::MLX_BFLOAT16,
            Dtype::Float32 => sys::MLX_FLOAT32,
            Dtype::Float64 => sys::MLX_FLOAT64,
            Dtype::Complex64 => sys::MLX_COMPLEX64,
        }) as sys::mlx_dtype
    }

    pub(crate) fn from_raw(raw: sys::mlx_dtype) -> Dtype {
        match raw as sys::mlx_dtype_ {
            sys::MLX_BOOL => Dtype::Bool,
            sys::MLX_UINT8 => Dtype::Uint8,
            sys::MLX_UINT16 => Dtype::Uint16,
            sys::MLX_UINT32 => Dtype::Uint32,
            sys::MLX_UINT64 => Dtype::Uint64,
            sys::MLX_INT8 => Dtype::Int8,
            sys::MLX_INT16 => Dtype::Int16,
            sys::MLX_INT32 => Dtype::Int32,
            sys::MLX_INT64 => Dtype::Int64,
            sys::MLX_FLOAT16 => Dtype::Float16,
            sys::MLX_BFLOAT16 => Dtype::Bfloat16,
            sys::MLX_FLOAT32 => Dtype::Float32,
            sys::MLX_FLOAT64 => Dtype::Float64,
            sys::MLX_COMPLEX64 => Dtype::Complex64,
            other => unreachable!("mlx-c 0.7.0 has no dtype {other}"),
        }
    }

    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
            Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
        }
    }

    /// True for the floating-point types (not complex).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64)
    }

    /// MLX's name for the type (`"bfloat16"`, `"uint32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Uint8 => "uint8",
            Dtype::Uint16 => "uint16",
            Dtype::Uint32 => "uint32",
            Dtype::Uint64 => "uint64",
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::Float16 => "float16",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Complex64 => "complex64",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A host type that is the element of an MLX array: `bool`, `u8`, `u16`, `u32`, `u64`, `i8`,
/// `i16`, `i32`, `i64`, [`f16`](struct@half::f16), [`bf16`](struct@half::bf16), `f32`, `f64`.
pub trait Element: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    /// The MLX type of this host type.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

element! {
    bool => Bool, u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    f16 => Float16, bf16 => Bfloat16, f32 => Float32, f64 => Float64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_round_trip() {
        for d in [
            Dtype::Bool,
            Dtype::Uint8,
            Dtype::Uint16,
            Dtype::Uint32,
            Dtype::Uint64,
            Dtype::Int8,
            Dtype::Int16,
            Dtype::Int32,
            Dtype::Int64,
            Dtype::Float16,
            Dtype::Bfloat16,
            Dtype::Float32,
            Dtype::Float64,
            Dtype::Complex64,
        ] {
            assert_eq!(Dtype::from_raw(d.to_raw()), d);
        }
        assert_eq!(<half::bf16 as Element>::DTYPE.size_of(), 2);
    }
}
