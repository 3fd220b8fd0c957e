//! The 1MAD code (QTIP's "computed" code): an L-bit state's value, its reference table, and the
//! kernel headers that define it on the GPU.

use crate::error::{invalid, Result};
use crate::kernel::sources;

/// The standard deviation of the byte sum that `y` centres: value = `y / TRELLIS_SCALE`.
pub const TRELLIS_SCALE: f64 = 147.800537109375;

/// `1 / 147.800537109375` in f32, the factor kernels fold into the activations.
pub const TRELLIS_RCP: f32 = (1.0 / TRELLIS_SCALE) as f32;

/// The Metal header shared by the trellis kernels: `TRELLIS_RCP` and `trellis_y_f32(state)`.
pub const METAL_HEADER: &str = sources::METAL_CODEBOOK;

/// The CUDA header shared by the trellis kernels: `TRELLIS_RCP` and `trellis_y_f32(state)`.
pub const CUDA_HEADER: &str = sources::CUDA_CODEBOOK;

/// The integer code value of `state`: the byte sum of `state * 34038481 + 76625530` (wrapping
/// u32) minus 510, in `[-510, 510]`.
#[inline]
pub fn y(state: u32) -> i32 {
    let x = state.wrapping_mul(34_038_481).wrapping_add(76_625_530);
    let bytes = x.to_le_bytes();
    bytes.iter().map(|&b| b as i32).sum::<i32>() - 510
}

/// The value of `state` in f64: `y(state) / 147.800537109375`.
#[inline]
pub fn value_f64(state: u32) -> f64 {
    y(state) as f64 / TRELLIS_SCALE
}

/// The value of `state` rounded to f32 (an entry of [`lut1mad`]).
#[inline]
pub fn value(state: u32) -> f32 {
    value_f64(state) as f32
}

/// The reference table of all `2^l` state values (f64 division, rounded to f32); `l` at most 24.
pub fn lut1mad(l: u32) -> Result<Vec<f32>> {
    if l > 24 {
        invalid!("a 1MAD table of 2^{l} entries is not a sensible size (L must be at most 24)");
    }
    Ok((0..1u32 << l).map(value).collect())
}

/// 32-bit words per coded block of `t` weights at `k` bits (`t * k / 32`, without overflow: at
/// most `(2^32 - 1) * 2^32 / 32`, which truncates only for `k > 32`).
pub const fn words_per_block(t: u32, k: u32) -> u32 {
    (t as u64 * k as u64 / 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y_by_hand() {
        // state 0: x = 76625530 = 0x0491_367A; bytes 0x7A + 0x36 + 0x91 + 0x04 = 122 + 54 + 145 + 4.
        assert_eq!(y(0), 122 + 54 + 145 + 4 - 510);
        assert_eq!(y(0), -185);
        // state 1: x = 110664011 = 0x0698_994B; bytes 0x4B + 0x99 + 0x98 + 0x06.
        assert_eq!(y(1), 75 + 153 + 152 + 6 - 510);
    }

    #[test]
    fn the_l12_table_has_the_documented_statistics() {
        let lut = lut1mad(12).unwrap();
        assert!(lut1mad(25).is_err());
        let distinct: std::collections::BTreeSet<i32> = (0..4096).map(y).collect();
        assert_eq!(distinct.len(), 713);
        let rms = (lut.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 4096.0).sqrt();
        assert!((rms - 1.0041).abs() < 5e-4, "rms {rms}");
        assert!((0..1u32 << 20).all(|s| (-510..=510).contains(&y(s))));
    }

    #[test]
    #[allow(clippy::excessive_precision)] // 147.800537109375 is exact in f32; that is the point
    fn f32_division_equals_the_rounded_f64_value_for_every_y() {
        // The GPU-side paths compute float(y) / 147.800537109375f or table lookups; both must give
        // the reference's f32 value. 147.800537109375 is exact in f32, and IEEE division is
        // correctly rounded, so this holds iff no double rounding bites, checked for all 1021 y.
        assert_eq!(147.800537109375f32 as f64, TRELLIS_SCALE);
        for y in -510..=510 {
            assert_eq!((y as f32) / 147.800537109375f32, (y as f64 / TRELLIS_SCALE) as f32, "y = {y}");
        }
    }

    #[test]
    fn words_per_block_of_the_shipped_widths() {
        assert_eq!([2, 3, 4].map(|k| words_per_block(256, k)), [16, 24, 32]);
        // T*k past 32 bits does not wrap (it did: 2147483664 * 2 wrapped to 32, one word).
        assert_eq!(words_per_block(2_147_483_664, 2), 134_217_729);
    }

    #[test]
    fn headers_define_the_same_constants() {
        for h in [METAL_HEADER, CUDA_HEADER] {
            assert!(h.contains("34038481u") && h.contains("76625530u") && h.contains("8389118.0f"));
            assert!(h.contains("1.0f / 147.800537109375f"));
        }
    }
}
