//! Host-side tensors: element types, row-contiguous byte storage, and
//! conversions between `f32` and the 16-bit float formats.

use crate::SimError;

/// Element type of a kernel input or output (MLX's dtypes without complex and float64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarType {
    /// `bool` (one byte, 0 or 1).
    Bool,
    /// `uint8_t`.
    U8,
    /// `uint16_t`.
    U16,
    /// `uint32_t`.
    U32,
    /// `uint64_t`.
    U64,
    /// `int8_t`.
    I8,
    /// `int16_t`.
    I16,
    /// `int32_t`.
    I32,
    /// `int64_t`.
    I64,
    /// IEEE binary16, MSL `half` (MLX spells it `float16_t`).
    F16,
    /// bfloat16, MSL `bfloat` (MLX spells it `bfloat16_t`).
    BF16,
    /// `float`.
    F32,
}

impl ScalarType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            ScalarType::Bool | ScalarType::U8 | ScalarType::I8 => 1,
            ScalarType::U16 | ScalarType::I16 | ScalarType::F16 | ScalarType::BF16 => 2,
            ScalarType::U32 | ScalarType::I32 | ScalarType::F32 => 4,
            ScalarType::U64 | ScalarType::I64 => 8,
        }
    }

    /// The type name MLX writes into generated kernel signatures and template
    /// arguments (`float`, `float16_t`, `bfloat16_t`, `uint32_t`, ...).
    pub fn msl_name(self) -> &'static str {
        match self {
            ScalarType::Bool => "bool",
            ScalarType::U8 => "uint8_t",
            ScalarType::U16 => "uint16_t",
            ScalarType::U32 => "uint32_t",
            ScalarType::U64 => "uint64_t",
            ScalarType::I8 => "int8_t",
            ScalarType::I16 => "int16_t",
            ScalarType::I32 => "int32_t",
            ScalarType::I64 => "int64_t",
            ScalarType::F16 => "float16_t",
            ScalarType::BF16 => "bfloat16_t",
            ScalarType::F32 => "float",
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, ScalarType::F16 | ScalarType::BF16 | ScalarType::F32)
    }

    /// Bytes of one element of the "poison" value that fills outputs without
    /// an `init_value`: a quiet NaN for floating-point types, the low bytes of
    /// `0xDEADBEEF...` for integers and `0xEF` for `bool`. A kernel that
    /// leaves an element unwritten is caught by [`HostTensor::poison_indices`].
    pub fn poison_bytes(self) -> Vec<u8> {
        match self {
            ScalarType::F32 => 0x7FC0_DEADu32.to_le_bytes().to_vec(),
            ScalarType::F16 => 0x7EADu16.to_le_bytes().to_vec(),
            ScalarType::BF16 => 0x7FCDu16.to_le_bytes().to_vec(),
            ScalarType::Bool | ScalarType::U8 | ScalarType::I8 => vec![0xEF],
            ScalarType::U16 | ScalarType::I16 => 0xBEEFu16.to_le_bytes().to_vec(),
            ScalarType::U32 | ScalarType::I32 => 0xDEAD_BEEFu32.to_le_bytes().to_vec(),
            ScalarType::U64 | ScalarType::I64 => 0xDEAD_BEEF_DEAD_BEEFu64.to_le_bytes().to_vec(),
        }
    }

    /// Little-endian bytes of `v` converted to this type (used for `init_value`,
    /// which MLX also takes as a float). Integer conversion truncates toward
    /// zero and saturates, like Rust's `as`.
    pub(crate) fn bytes_from_f32(self, v: f32) -> Vec<u8> {
        match self {
            ScalarType::F32 => v.to_le_bytes().to_vec(),
            ScalarType::F16 => f32_to_f16_bits(v).to_le_bytes().to_vec(),
            ScalarType::BF16 => f32_to_bf16_bits(v).to_le_bytes().to_vec(),
            ScalarType::Bool => vec![u8::from(v != 0.0)],
            ScalarType::U8 => vec![v as u8],
            ScalarType::I8 => (v as i8).to_le_bytes().to_vec(),
            ScalarType::U16 => (v as u16).to_le_bytes().to_vec(),
            ScalarType::I16 => (v as i16).to_le_bytes().to_vec(),
            ScalarType::U32 => (v as u32).to_le_bytes().to_vec(),
            ScalarType::I32 => (v as i32).to_le_bytes().to_vec(),
            ScalarType::U64 => (v as u64).to_le_bytes().to_vec(),
            ScalarType::I64 => (v as i64).to_le_bytes().to_vec(),
        }
    }
}

/// A Rust value type that maps one-to-one to a [`ScalarType`].
pub trait Element: Copy {
    /// The matching element type.
    const DTYPE: ScalarType;
    /// Appends the little-endian bytes of `self`.
    fn put(self, out: &mut Vec<u8>);
    /// Reads a value from exactly `DTYPE.size_bytes()` little-endian bytes.
    fn get(bytes: &[u8]) -> Self;
}

macro_rules! impl_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: ScalarType = $d;
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn get(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("element width"))
            }
        }
    };
}
impl_element!(u8, ScalarType::U8);
impl_element!(u16, ScalarType::U16);
impl_element!(u32, ScalarType::U32);
impl_element!(u64, ScalarType::U64);
impl_element!(i8, ScalarType::I8);
impl_element!(i16, ScalarType::I16);
impl_element!(i32, ScalarType::I32);
impl_element!(i64, ScalarType::I64);
impl_element!(f32, ScalarType::F32);

impl Element for bool {
    const DTYPE: ScalarType = ScalarType::Bool;
    fn put(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn get(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

/// A row-contiguous array in host memory: `data` holds the elements in
/// row-major order as little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type.
    pub dtype: ScalarType,
    /// Shape; an empty shape is a 0-d (scalar) array with one element.
    pub shape: Vec<usize>,
    /// `numel() * dtype.size_bytes()` bytes.
    pub data: Vec<u8>,
}

impl HostTensor {
    /// Creates a tensor from raw bytes, checking that their length fits the shape.
    pub fn new(dtype: ScalarType, shape: &[usize], data: Vec<u8>) -> Result<Self, SimError> {
        let want = shape.iter().product::<usize>() * dtype.size_bytes();
        if data.len() != want {
            return Err(SimError::InvalidArgument(format!(
                "a {dtype:?} tensor of shape {shape:?} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(HostTensor { dtype, shape: shape.to_vec(), data })
    }

    /// Creates a tensor from values of a Rust element type.
    ///
    /// # Panics
    /// If `values.len()` is not the product of `shape`.
    pub fn from_slice<T: Element>(shape: &[usize], values: &[T]) -> Self {
        let n: usize = shape.iter().product();
        assert_eq!(values.len(), n, "HostTensor::from_slice: shape {shape:?} needs {n} values, got {}", values.len());
        let mut data = Vec::with_capacity(n * T::DTYPE.size_bytes());
        for &v in values {
            v.put(&mut data);
        }
        HostTensor { dtype: T::DTYPE, shape: shape.to_vec(), data }
    }

    /// An `F32` tensor. Panics if the length does not match the shape.
    pub fn from_f32(shape: &[usize], values: &[f32]) -> Self {
        Self::from_slice(shape, values)
    }

    /// A `U32` tensor. Panics if the length does not match the shape.
    pub fn from_u32(shape: &[usize], values: &[u32]) -> Self {
        Self::from_slice(shape, values)
    }

    /// An `I32` tensor. Panics if the length does not match the shape.
    pub fn from_i32(shape: &[usize], values: &[i32]) -> Self {
        Self::from_slice(shape, values)
    }

    /// A floating-point tensor of type `dtype` (`F32`, `F16` or `BF16`) from
    /// `f32` values, rounded to nearest even.
    ///
    /// # Panics
    /// If `dtype` is not a floating-point type or the length does not match.
    pub fn from_f32_as(dtype: ScalarType, shape: &[usize], values: &[f32]) -> Self {
        match dtype {
            ScalarType::F32 => Self::from_f32(shape, values),
            ScalarType::F16 => {
                let bits: Vec<u16> = values.iter().map(|&v| f32_to_f16_bits(v)).collect();
                Self::from_bits_u16(dtype, shape, &bits)
            }
            ScalarType::BF16 => {
                let bits: Vec<u16> = values.iter().map(|&v| f32_to_bf16_bits(v)).collect();
                Self::from_bits_u16(dtype, shape, &bits)
            }
            other => panic!("HostTensor::from_f32_as: {other:?} is not a floating-point type"),
        }
    }

    /// A 16-bit tensor (`F16`, `BF16` or `U16`) from raw bit patterns.
    ///
    /// # Panics
    /// If `dtype` is not 16 bits wide or the length does not match.
    pub fn from_bits_u16(dtype: ScalarType, shape: &[usize], bits: &[u16]) -> Self {
        assert_eq!(dtype.size_bytes(), 2, "HostTensor::from_bits_u16: {dtype:?} is not 16-bit");
        let mut t = Self::from_slice(shape, bits);
        t.dtype = dtype;
        t
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-contiguous strides in elements (what a kernel sees as `name_strides`).
    pub fn strides(&self) -> Vec<i64> {
        let mut strides = vec![0i64; self.shape.len()];
        let mut acc = 1i64;
        for (s, &d) in strides.iter_mut().zip(&self.shape).rev() {
            *s = acc;
            acc *= d as i64;
        }
        strides
    }

    /// The elements as a Rust type matching `dtype` exactly.
    ///
    /// # Panics
    /// If `T::DTYPE != self.dtype` (16-bit floats: use [`Self::to_bits_u16_vec`]).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        assert_eq!(T::DTYPE, self.dtype, "HostTensor::to_vec: tensor holds {:?}, asked for {:?}", self.dtype, T::DTYPE);
        self.data.chunks_exact(self.dtype.size_bytes()).map(T::get).collect()
    }

    /// Floating-point elements (`F32`, `F16` or `BF16`) widened to `f32`.
    ///
    /// # Panics
    /// If the tensor is not floating point.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.dtype {
            ScalarType::F32 => self.to_vec(),
            ScalarType::F16 => self.raw_u16().map(f16_bits_to_f32).collect(),
            ScalarType::BF16 => self.raw_u16().map(bf16_bits_to_f32).collect(),
            other => panic!("HostTensor::to_f32_vec: {other:?} is not a floating-point type"),
        }
    }

    /// `U32` elements. Panics for other types.
    pub fn to_u32_vec(&self) -> Vec<u32> {
        self.to_vec()
    }

    /// `I32` elements. Panics for other types.
    pub fn to_i32_vec(&self) -> Vec<i32> {
        self.to_vec()
    }

    /// Bit patterns of a 16-bit tensor (`F16`, `BF16`, `U16`, `I16`).
    ///
    /// # Panics
    /// If the element type is not 16 bits wide.
    pub fn to_bits_u16_vec(&self) -> Vec<u16> {
        assert_eq!(self.dtype.size_bytes(), 2, "to_bits_u16_vec: {:?} is not 16-bit", self.dtype);
        self.raw_u16().collect()
    }

    fn raw_u16(&self) -> impl Iterator<Item = u16> + '_ {
        self.data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    /// Indices of elements that still hold the poison pattern (see
    /// [`ScalarType::poison_bytes`]), i.e. that the kernel never wrote.
    pub fn poison_indices(&self) -> Vec<usize> {
        let poison = self.dtype.poison_bytes();
        self.data
            .chunks_exact(poison.len())
            .enumerate()
            .filter(|(_, e)| *e == poison.as_slice())
            .map(|(i, _)| i)
            .collect()
    }

    /// A tensor of `shape` filled with the poison pattern.
    pub(crate) fn poisoned(dtype: ScalarType, shape: &[usize]) -> Self {
        let n: usize = shape.iter().product();
        HostTensor { dtype, shape: shape.to_vec(), data: dtype.poison_bytes().repeat(n) }
    }

    /// A tensor of `shape` filled with `v` converted to `dtype`.
    pub(crate) fn filled(dtype: ScalarType, shape: &[usize], v: f32) -> Self {
        let n: usize = shape.iter().product();
        HostTensor { dtype, shape: shape.to_vec(), data: dtype.bytes_from_f32(v).repeat(n) }
    }
}

/// `f32` to IEEE binary16 bits, round to nearest even (overflow gives infinity,
/// NaN stays a quiet NaN).
pub fn f32_to_f16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    // Unbiased exponent of the value; binary16 normals cover -14..=15.
    let e = exp - 127;
    if e > 15 {
        return sign | 0x7c00;
    }
    // Significand with the implicit bit (zero and f32 subnormals have none; both
    // are far below the binary16 range and round to zero below).
    let sig = if exp == 0 { man } else { man | 0x80_0000 };
    // Number of low bits of the 24-bit significand to drop: 13 for normal
    // results, more for results in the binary16 subnormal range.
    let drop = if e >= -14 { 13 } else { 13 + (-14 - e) };
    if drop > 24 {
        return sign; // below half of the smallest subnormal
    }
    let kept = sig >> drop;
    let rest = sig & ((1u32 << drop) - 1);
    let half = 1u32 << (drop - 1);
    let mut r = kept + u32::from(rest > half || (rest == half && kept & 1 == 1));
    if e >= -14 {
        // Normal: combine the biased exponent with the 10 stored bits; a carry
        // out of the significand correctly bumps the exponent (up to infinity).
        r = (((e + 15) as u32) << 10) + (r - 0x400);
    }
    sign | r as u16
}

/// IEEE binary16 bits to `f32` (exact).
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let man = f32::from(h & 0x3ff);
    match exp {
        0 => sign * man * (2.0f32).powi(-24),
        31 if man == 0.0 => sign * f32::INFINITY,
        31 => f32::from_bits(0x7f80_0000 | (u32::from(h & 0x8000) << 16) | (u32::from(h & 0x3ff) << 13)),
        _ => sign * (1.0 + man / 1024.0) * (2.0f32).powi(exp - 15),
    }
}

/// `f32` to bfloat16 bits, round to nearest even (NaN stays a quiet NaN).
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    if v.is_nan() {
        return ((x >> 16) | 0x40) as u16;
    }
    let upper = x >> 16;
    let lower = x & 0xffff;
    let round_up = lower > 0x8000 || (lower == 0x8000 && upper & 1 == 1);
    (upper + u32::from(round_up)) as u16
}

/// bfloat16 bits to `f32` (exact).
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_edge_cases() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(-2.0), 0xc000);
        assert_eq!(f32_to_f16_bits(65504.0), 0x7bff);
        assert_eq!(f32_to_f16_bits(65519.99), 0x7bff);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00); // tie rounds to even = inf
        assert_eq!(f32_to_f16_bits(1.0 + 1.0 / 2048.0), 0x3c00); // tie to even (down)
        assert_eq!(f32_to_f16_bits(1.0 + 3.0 / 2048.0), 0x3c02); // tie to even (up)
        assert_eq!(f32_to_f16_bits(2.0f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16_bits(2.0f32.powi(-25)), 0x0000); // tie to even
        assert_eq!(f32_to_f16_bits(1.5 * 2.0f32.powi(-25)), 0x0001);
        assert_eq!(f32_to_f16_bits(2.0f32.powi(-14) * (1.0 - 2.0f32.powi(-11))), 0x0400);
        assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7c00);
        assert!(f16_bits_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
        for h in 0..=0xffffu16 {
            let f = f16_bits_to_f32(h);
            if !f.is_nan() {
                assert_eq!(f32_to_f16_bits(f), h, "round trip of {h:#06x}");
            }
        }
    }

    #[test]
    fn bf16_conversion_edge_cases() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80); // tie to even
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(bf16_bits_to_f32(0xc000), -2.0);
        assert!(bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn strides_are_row_major() {
        let t = HostTensor::from_f32(&[2, 3, 4], &[0.0; 24]);
        assert_eq!(t.strides(), vec![12, 4, 1]);
    }
}
