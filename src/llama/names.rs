//! Module names: the Hugging Face names a quantized artifact and a calibration use, and the GGUF
//! tensor names they come from.

use crate::error::{invalid, Result};

/// The seven linear layers of one Llama block, in the order the block runs them.
pub const LINEARS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// The Hugging Face name of linear `linear` (one of [`LINEARS`]) of block `layer`:
/// `model.layers.{layer}.{linear}`.
pub fn hf_module(layer: usize, linear: &str) -> String {
    format!("model.layers.{layer}.{linear}")
}

/// Whether `linear` (one of [`LINEARS`]) belongs to the MLP.
pub fn is_mlp(linear: &str) -> bool {
    linear.starts_with("mlp.")
}

/// The block and the linear of a Hugging Face module name `model.layers.{layer}.{linear}`
/// (the linear not checked against [`LINEARS`]); `None` for any other shape.
pub fn split_module(hf_module: &str) -> Option<(usize, &str)> {
    let (n, linear) = hf_module.strip_prefix("model.layers.")?.split_once('.')?;
    Some((n.parse().ok()?, linear))
}

/// The GGUF tensor of a Hugging Face module name: `model.layers.N.mlp.{gate,up,down}_proj` →
/// `blk.N.ffn_{gate,up,down}.weight`, `model.layers.N.self_attn.{q,k,v,o}_proj` →
/// `blk.N.attn_{q,k,v,output}.weight`.
pub fn gguf_tensor_name(hf_module: &str) -> Result<String> {
    let Some((layer, linear)) = split_module(hf_module) else {
        invalid!("{hf_module:?} is not a Llama linear layer name (model.layers.N.self_attn.q_proj, ...)");
    };
    let gguf = match linear {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => invalid!("{hf_module:?} is not a Llama linear layer name (model.layers.N.self_attn.q_proj, ...)"),
    };
    Ok(format!("blk.{layer}.{gguf}.weight"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_linear_maps_to_its_gguf_tensor() {
        let want = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];
        for (linear, gguf) in LINEARS.iter().zip(want) {
            assert_eq!(gguf_tensor_name(&hf_module(17, linear)).unwrap(), format!("blk.17.{gguf}.weight"));
        }
        for bad in ["model.layers.x.mlp.up_proj", "model.layers.3.mlp.fc1", "layers.3.mlp.up_proj", ""] {
            assert!(gguf_tensor_name(bad).is_err(), "{bad}");
        }
    }
}
