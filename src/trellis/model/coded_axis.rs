//! A module's coded axis on disk (docs/format.md §10): the optional keys `rotation` and `logical_cols`
//! of its `trellis` config object and the optional tensor `<module>.rotation_signs`. Modules
//! without them are plain (nothing applied at run time), as every artifact written before these
//! keys existed.
//!
//! ```json
//! "trellis": {"L": 12, "code": "1mad", "axis": 1,
//!             "rotation": {"kind": "hadamard", "block": 64, "seed": 7}, "logical_cols": 576}
//! ```

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::array::MlxArray;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::trellis::format::TrellisGeometry;
use crate::trellis::linear::TrellisLinear;
use crate::trellis::rotation::{CodedAxis, Rotation};

use super::artifact::Artifact;

/// The tensor of a module's rotation signs.
pub(super) fn signs_name(module: &str) -> String {
    format!("{module}.rotation_signs")
}

/// The `trellis` keys that describe `layer`'s coded axis (none for a plain layer).
pub(super) fn entry_keys(layer: &TrellisLinear) -> Vec<(&'static str, Value)> {
    let axis = layer.coded_axis();
    let mut keys = Vec::new();
    if let Some(r) = &axis.rotation {
        keys.push(("rotation", serde_json::json!({"kind": "hadamard", "block": r.block(), "seed": r.seed()})));
    }
    if axis.logical != layer.geometry().cols {
        keys.push(("logical_cols", Value::from(axis.logical)));
    }
    keys
}

/// The signs tensor of `layer` (float16 `±1` `[n]`), if it is rotated.
pub(super) fn signs_tensor(layer: &TrellisLinear) -> Result<Option<MlxArray>> {
    layer.rotation().map(|r| MlxArray::from_slice(r.signs(), &[r.len()])?.astype(Dtype::Float16)).transpose()
}

impl Artifact {
    /// The coded axis of `module` (stored geometry `g`), read from its config entry and, for a
    /// rotation, its signs tensor; everything checked.
    pub(super) fn coded_axis(&self, module: &str, g: &TrellisGeometry) -> Result<CodedAxis> {
        let (at, trellis) = self.trellis_object(module)?;
        let key_error = |key: &str, message: String| self.config_error(&format!("{at}/{key}"), message);
        let logical = match trellis.get("logical_cols") {
            None => g.cols,
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n >= 1 && n <= g.cols && g.cols - n < g.t as usize => n,
                _ => {
                    let message = format!(
                        "\"logical_cols\" of module {module:?} is {v}; expected an integer in {}..={} (the {} stored columns less padding shorter than one block of {})",
                        (g.cols + 1).saturating_sub(g.t as usize).max(1),
                        g.cols,
                        g.cols,
                        g.t
                    );
                    return Err(key_error("logical_cols", message));
                }
            },
        };
        let sname = signs_name(module);
        let rotation = match trellis.get("rotation") {
            None => {
                if self.has_tensor(&sname)? {
                    let message = format!("tensor {sname:?} is present but module {module:?} has no \"rotation\" key");
                    return Err(key_error("rotation", message));
                }
                None
            }
            Some(v) => {
                let (block, seed) =
                    rotation_keys(v).map_err(|m| key_error("rotation", format!("module {module:?}: {m}")))?;
                let (file, signs) = self.tensor(&mut BTreeMap::new(), &sname)?;
                let refuse = |m: String| Error::artifact(&file, Some(&sname), m);
                if !matches!(signs.dtype(), Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Int8) {
                    return Err(refuse(format!(
                        "rotation signs are {}, expected float16, bfloat16, float32 or int8",
                        signs.dtype()
                    )));
                }
                if signs.try_shape()? != [logical] {
                    let message = format!(
                        "rotation signs have shape {:?}, expected [{logical}] (one per logical column of the coded axis)",
                        signs.shape()
                    );
                    return Err(refuse(message));
                }
                let values = signs.astype(Dtype::Float32)?.to_vec::<f32>()?;
                Some(Rotation::new(values, block, seed).map_err(|e| refuse(e.message()))?)
            }
        };
        Ok(CodedAxis { rotation, logical })
    }

    /// `layer` (loaded from `module`) with its coded axis.
    pub(super) fn attach_coded_axis(&self, module: &str, layer: TrellisLinear) -> Result<TrellisLinear> {
        let axis = self.coded_axis(module, layer.geometry())?;
        let at = || format!("quantization/{module}/trellis");
        layer.with_coded_axis(axis).map_err(|e| self.config_error(&at(), e.message()))
    }
}

/// `(block, seed)` of a `rotation` object, or what is wrong with it.
fn rotation_keys(v: &Value) -> std::result::Result<(usize, u64), String> {
    let Some(obj) = v.as_object() else {
        return Err(format!("\"rotation\" is {v}, expected an object"));
    };
    check_known(obj)?;
    match obj.get("kind").and_then(Value::as_str) {
        Some("hadamard") => {}
        other => return Err(format!("rotation kind {other:?} is not supported (only \"hadamard\")")),
    }
    let block = obj.get("block").and_then(Value::as_u64).and_then(|b| usize::try_from(b).ok());
    let Some(block) = block.filter(|b| b.is_power_of_two() && *b <= crate::trellis::rotation::MAX_ROTATION_BLOCK)
    else {
        return Err(format!("rotation block {:?} is not a power of two in 1..=256", obj.get("block")));
    };
    let Some(seed) = obj.get("seed").and_then(Value::as_u64) else {
        return Err(format!("rotation seed {:?} is not an integer in 0..=2^64-1", obj.get("seed")));
    };
    Ok((block, seed))
}

/// Refuses keys of a rotation object this reader does not know (a newer writer's rotation must
/// not be applied as if it were this one).
fn check_known(obj: &Map<String, Value>) -> std::result::Result<(), String> {
    match obj.keys().find(|k| !matches!(k.as_str(), "kind" | "block" | "seed")) {
        Some(k) => Err(format!("rotation key {k:?} is not known (expected kind, block, seed)")),
        None => Ok(()),
    }
}
