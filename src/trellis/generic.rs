//! The generic path: decode codes to dense f32 weights with MLX operations on whatever device
//! runs them (the CPU included), then MLX's matmul. Slower than the custom kernels, but it runs
//! on every back-end and its dense weights equal the reference's bit for bit.

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{invalid, Result};
use crate::ops::concatenate;

use super::format::codebook::lut1mad;
use super::format::{CodeLayout, TrellisGeometry};

/// Stored rows decoded per step: bounds the temporaries (a few `[rows, cols]` u32 arrays) to
/// about `EXPAND_CHUNK_ELEMS` elements each, whatever the layer's size.
const EXPAND_CHUNK_ELEMS: usize = 1 << 24;

/// Per-position tables of one geometry. Position `t` of every block reads its window from the
/// 64-bit pair (word `wi`, next word of the block) at bit offset `off`, with `wi` and `off` the
/// same in every block, so a block's states are one gather from its `wpb` pairs, one shift and
/// one mask: five passes over the weights in all (with the table lookup and the scale).
struct PositionTables {
    /// `[T]`: the pair holding position `t`'s window.
    pair_index: MlxArray,
    /// `[T]`: the window's bit offset inside that pair.
    offset: MlxArray,
    state_mask: MlxArray,
    lut: MlxArray,
}

impl PositionTables {
    fn new(g: &TrellisGeometry) -> Result<PositionTables> {
        let (t, k) = (g.t as usize, g.k as usize);
        let (mut index, mut offset) = (Vec::with_capacity(t), Vec::with_capacity(t));
        for pos in 0..t {
            let p = (t - 1 - pos) * k;
            index.push((p >> 5) as u32);
            offset.push((p & 31) as u64);
        }
        Ok(PositionTables {
            pair_index: MlxArray::from_slice(&index, &[t])?,
            offset: MlxArray::from_slice(&offset, &[t])?,
            state_mask: MlxArray::scalar((1u64 << g.l) - 1)?,
            lut: MlxArray::from_slice(&lut1mad(g.l)?, &[1 << g.l])?,
        })
    }

    /// Decodes row-major codes `[rows, words]` with per-row f32 scales `[rows, 1]` to f32
    /// `[rows, cols]`: `lut[state] * scale`, the reference's f32 weights exactly.
    fn decode(&self, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
        let rows = codes.shape()[0];
        let (nb, wpb) = (g.blocks_per_row(), g.words_per_block());
        let words = codes.reshape(&[rows, nb, wpb])?;
        let (r, n, w) = (rows as i32, nb as i32, wpb as i32);
        // The next word of each block, cyclically: words 1.., then word 0.
        let next = concatenate(
            &[&words.slice(&[0, 0, 1], &[r, n, w], &[1, 1, 1])?, &words.slice(&[0, 0, 0], &[r, n, 1], &[1, 1, 1])?],
            2,
        )?;
        let shift = MlxArray::scalar(32u64)?;
        let pairs = words.astype(Dtype::Uint64)?.bitwise_or(&next.astype(Dtype::Uint64)?.left_shift(&shift)?)?;
        let states = pairs.take(&self.pair_index, 2)?.right_shift(&self.offset)?.bitwise_and(&self.state_mask)?;
        self.lut.take(&states, 0)?.reshape(&[rows, g.cols])?.multiply(scales)
    }
}

fn check_inputs(codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<()> {
    g.validate()?;
    if codes.dtype() != Dtype::Uint32 || codes.shape() != g.codes_shape() {
        invalid!("codes are {} {:?}, geometry {g} needs uint32 {:?}", codes.dtype(), codes.shape(), g.codes_shape());
    }
    if scales.shape() != [g.rows] {
        invalid!("scales have shape {:?}, geometry {g} needs [{}]", scales.shape(), g.rows);
    }
    Ok(())
}

/// Stored rows `[r0, r1)` of the codes, in row-major layout `[r1 - r0, cols * k / 32]`.
fn row_major_rows(codes: &MlxArray, g: &TrellisGeometry, r0: usize, r1: usize) -> Result<MlxArray> {
    let (r0i, r1i) = (r0 as i32, r1 as i32);
    match g.layout() {
        CodeLayout::RowMajor => {
            let words = g.codes_shape()[1] as i32;
            codes.slice(&[r0i, 0], &[r1i, words], &[1, 1])
        }
        CodeLayout::K3Interleaved => {
            // [G, R, 48] -> rows [G, r, 48] -> [r, G, 48] -> [r, G*48] (docs/format.md §4, inverted).
            let groups = g.cols / 512;
            let part = codes.slice(&[0, r0i, 0], &[groups as i32, r1i, 48], &[1, 1, 1])?;
            part.transpose(&[1, 0, 2])?.reshape(&[r1 - r0, groups * 48])
        }
    }
}

fn row_chunks(g: &TrellisGeometry) -> impl Iterator<Item = (usize, usize)> {
    let step = (EXPAND_CHUNK_ELEMS / g.cols).max(1);
    let rows = g.rows;
    (0..rows).step_by(step).map(move |r0| (r0, (r0 + step).min(rows)))
}

/// The stored matrix `[rows, cols]` as f32 weights, decoded with MLX operations. Equal bit for
/// bit to [`reference::expand`](crate::trellis::reference::expand).
pub fn expand_dense(codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    check_inputs(codes, scales, g)?;
    let tables = PositionTables::new(g)?;
    let scales = scales.astype(Dtype::Float32)?.reshape(&[g.rows, 1])?;
    let parts = row_chunks(g)
        .map(|(r0, r1)| {
            let s = scales.slice(&[r0 as i32, 0], &[r1 as i32, 1], &[1, 1])?;
            tables.decode(&row_major_rows(codes, g, r0, r1)?, &s, g)
        })
        .collect::<Result<Vec<_>>>()?;
    concatenate(&parts.iter().collect::<Vec<_>>(), 0)
}

/// `x [m, in] · W -> [m, out]` in f32 by decoding a chunk of stored rows at a time and
/// multiplying with MLX's matmul. The caller casts to the activation dtype.
pub fn generic_forward_f32(x: &MlxArray, codes: &MlxArray, scales: &MlxArray, g: &TrellisGeometry) -> Result<MlxArray> {
    check_inputs(codes, scales, g)?;
    let shape = x.shape();
    if shape.len() != 2 || shape[1] != g.in_features() {
        invalid!("generic forward: activations {shape:?} must be [M, {}] for {g}", g.in_features());
    }
    let tables = PositionTables::new(g)?;
    let xf = x.astype(Dtype::Float32)?;
    let m = xf.shape()[0] as i32;
    let scales = scales.astype(Dtype::Float32)?.reshape(&[g.rows, 1])?;
    let mut acc: Option<MlxArray> = None;
    let mut columns = Vec::new();
    for (r0, r1) in row_chunks(g) {
        let s = scales.slice(&[r0 as i32, 0], &[r1 as i32, 1], &[1, 1])?;
        let w = tables.decode(&row_major_rows(codes, g, r0, r1)?, &s, g)?;
        if g.axis == 0 {
            // Stored [in, out]: these rows are inputs r0..r1.
            let xs = xf.slice(&[0, r0 as i32], &[m, r1 as i32], &[1, 1])?;
            let part = xs.matmul(&w)?;
            acc = Some(match acc {
                None => part,
                Some(a) => a.add(&part)?,
            });
        } else {
            // Stored [out, in]: these rows are outputs r0..r1.
            columns.push(xf.matmul(&w.t()?)?);
        }
    }
    match acc {
        Some(y) => Ok(y),
        None => concatenate(&columns.iter().collect::<Vec<_>>(), 1),
    }
}
