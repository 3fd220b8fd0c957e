//! Whole-model quantization (`llama::quantize::quantize_model`) on SmolLM2-135M-Instruct's first
//! blocks: what the directory holds, that the runner loads it with the coded layers in place,
//! that every coded module's error is near the Gaussian optimum once rotated, that stale files
//! are replaced, and that greedy decoding still says " Paris".

mod common;

use anyhow::{ensure, Result};
use common::mlp_artifact::temp_dir;
use mlx_trellis::llama::quantize::{quantize_model, QuantizeSpec, BASE_GGUF};
use mlx_trellis::llama::{fetch_smollm2, generate, LlamaModel, LlamaTokenizer, Sampler, Sampling};
use mlx_trellis::trellis::Artifact;
use mlx_trellis::{Dtype, Gguf};

#[test]
fn two_blocks_quantized_load_and_still_say_paris() -> Result<()> {
    let gguf_path = fetch_smollm2()?;
    let dir = temp_dir("quantize-model");
    // A stale shard index would shadow the new single file; it must go.
    std::fs::write(dir.join("model.safetensors.index.json"), "{\"weight_map\": {}}")?;
    let spec = QuantizeSpec { bits: 4, layers: Some(2), attention: true, ..QuantizeSpec::default() };
    let mut seen = Vec::new();
    let report = quantize_model(&gguf_path, &spec, None, &dir, &mut |r| seen.push(r.module.clone()))?;
    ensure!(report.modules.len() == 14 && seen.len() == 14, "{} modules coded", report.modules.len());
    ensure!(!dir.join("model.safetensors.index.json").exists(), "the stale index is still there");
    ensure!(std::fs::metadata(dir.join(BASE_GGUF))?.len() == std::fs::metadata(&gguf_path)?.len());
    for r in &report.modules {
        println!("{} block {:?}: relative MSE {:.5}", r.module, r.rotation_block, r.relative_mse);
        // Rotated k 4 at L 12: the Gaussian optimum is about 0.0055, which every projection but
        // o_proj reaches. o_proj's rotation blocks of 64 (576 = 9 · 64) are its input's heads,
        // and it stays at 1.4-1.5x the optimum on these blocks (0.0083, 0.0076).
        ensure!(r.rotation_block.is_some(), "{} is not rotated", r.module);
        let bound = if r.module.contains(".mlp.") { 0.0065 } else { 0.0095 };
        ensure!(r.relative_mse < bound, "{}: relative MSE {}", r.module, r.relative_mse);
        let (axis, padded) = match r.module.rsplit('.').next() {
            Some("gate_proj" | "up_proj") => (0, false),
            Some("down_proj") => (1, false),
            _ => (1, true),
        };
        ensure!(r.axis == axis && (r.coded_len.0 != r.coded_len.1) == padded, "{}: {r:?}", r.module);
    }
    let art = Artifact::open(&dir)?;
    ensure!(art.trellis_modules()?.len() == 14);
    ensure!(art.config_file("base_gguf")? == std::fs::canonicalize(dir.join(BASE_GGUF))?);
    let q = art.module("model.layers.1.self_attn.k_proj")?;
    ensure!((q.in_features(), q.out_features(), q.geometry().cols) == (576, 192, 768));

    let model = LlamaModel::from_artifact(&dir, Dtype::Float32)?;
    // The attention's projections are replaced too, beside the wholly coded MLPs.
    ensure!(model.replaced_modules().len() == 14, "{:?} replaced", model.replaced_modules());
    let tokenizer = LlamaTokenizer::from_gguf(&Gguf::open(&gguf_path)?)?;
    let prompt = tokenizer.encode("The capital of France is")?;
    let out = generate(&model, &prompt, 2, &mut Sampler::new(Sampling::Greedy)?, &[], &mut |_| Ok(()))?;
    let text = tokenizer.decode(&out.tokens)?;
    ensure!(text.starts_with(" Paris"), "greedy continuation {text:?}");

    // Running again over the same directory replaces the files (the base model is kept).
    let again = QuantizeSpec { bits: 2, layers: Some(1), ..QuantizeSpec::default() };
    quantize_model(&gguf_path, &again, None, &dir, &mut |_| {})?;
    ensure!(Artifact::open(&dir)?.trellis_modules()?.len() == 3);
    let refused = QuantizeSpec { bits: 5, ..QuantizeSpec::default() };
    ensure!(quantize_model(&gguf_path, &refused, None, &dir, &mut |_| {}).is_err());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
