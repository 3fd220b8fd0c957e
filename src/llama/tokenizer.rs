//! The tokenizer a GGUF file carries in its metadata, built with the `tokenizers` crate.
//!
//! Served: `tokenizer.ggml.model = "gpt2"` (byte-level BPE over `tokenizer.ggml.tokens` and
//! `tokenizer.ggml.merges`). Tokens of type 3 (control) are special: matched whole in the text
//! and never split. The pre-tokenizer splits digits one by one (SmolLM's `smollm`
//! pre-tokenizer, as in its `tokenizer.json`), then applies GPT-2's byte-level split
//! (no prefix space); decoding maps bytes back. No BOS is added: callers add what their prompt
//! format needs.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

use crate::error::{Error, Result};
use crate::io::gguf::Gguf;

/// GGUF's token type of control (special) tokens.
const CONTROL: i32 = 3;

/// Pre-tokenizers whose splitting this module reproduces.
const SERVED_PRE: [&str; 1] = ["smollm"];

/// A byte-level BPE tokenizer with the special tokens of its GGUF file.
pub struct LlamaTokenizer {
    inner: Tokenizer,
    tokens: Vec<String>,
    bos: Option<u32>,
    eos: Option<u32>,
}

impl std::fmt::Debug for LlamaTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaTokenizer").field("vocab", &self.tokens.len()).field("eos", &self.eos).finish()
    }
}

impl LlamaTokenizer {
    /// Builds the tokenizer from `gguf`'s `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &Gguf) -> Result<LlamaTokenizer> {
        let bad = |key: &str, message: String| Error::artifact(gguf.path(), Some(key), message);
        let model = gguf.metadata_string("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(bad("tokenizer.ggml.model", format!("is {model:?}; only \"gpt2\" (byte-level BPE) is served")));
        }
        let pre = gguf.metadata_string("tokenizer.ggml.pre")?;
        if !SERVED_PRE.contains(&pre.as_str()) {
            return Err(bad("tokenizer.ggml.pre", format!("is {pre:?}; served: {SERVED_PRE:?}")));
        }
        let tokens = gguf.metadata_strings("tokenizer.ggml.tokens")?;
        let types = gguf.metadata_array("tokenizer.ggml.token_type")?;
        let types = types.astype(crate::Dtype::Int32)?.to_vec::<i32>()?;
        if types.len() != tokens.len() {
            let message = format!("has {} entries for {} tokens", types.len(), tokens.len());
            return Err(bad("tokenizer.ggml.token_type", message));
        }
        let merges_text = gguf.metadata_strings("tokenizer.ggml.merges")?;
        let mut merges = Vec::with_capacity(merges_text.len());
        for (i, m) in merges_text.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                return Err(bad(
                    "tokenizer.ggml.merges",
                    format!("entry {i} ({m:?}) is not two tokens separated by a space"),
                ));
            };
            merges.push((a.to_string(), b.to_string()));
        }
        let mut vocab = Vocab::default();
        for (id, t) in tokens.iter().enumerate() {
            let id = u32::try_from(id).map_err(|_| bad("tokenizer.ggml.tokens", "too many tokens".into()))?;
            if vocab.insert(t.clone(), id).is_some() {
                return Err(bad("tokenizer.ggml.tokens", format!("token {t:?} appears twice")));
            }
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| bad("tokenizer.ggml.merges", format!("the BPE model could not be built: {e}")))?;
        let mut inner = Tokenizer::new(bpe);
        let pre_tokenizer = Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ]);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == CONTROL)
            .map(|(s, _)| AddedToken::from(s.clone(), true))
            .collect();
        inner
            .add_special_tokens(special)
            .map_err(|e| bad("tokenizer.ggml.token_type", format!("the special tokens could not be added: {e}")))?;
        let id_key = |key: &str| -> Result<Option<u32>> {
            if !gguf.has_metadata(key) {
                return Ok(None);
            }
            let id = gguf.metadata_u64(key)?;
            match u32::try_from(id) {
                Ok(id) if (id as usize) < tokens.len() => Ok(Some(id)),
                _ => Err(bad(key, format!("is {id}, outside the {} tokens", tokens.len()))),
            }
        };
        let bos = id_key("tokenizer.ggml.bos_token_id")?;
        let eos = id_key("tokenizer.ggml.eos_token_id")?;
        Ok(LlamaTokenizer { inner, tokens, bos, eos })
    }

    /// The ids of `text` (special tokens written in it, such as `<|im_start|>`, are matched
    /// whole; nothing is added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| Error::invalid(format!("tokenizing failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.tokens.len()) {
            return Err(Error::invalid(format!("token id {bad} is outside the {} tokens", self.tokens.len())));
        }
        self.inner.decode(ids, false).map_err(|e| Error::invalid(format!("decoding failed: {e}")))
    }

    /// The id of the token spelled `token` in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == token).map(|i| i as u32)
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence id the file names, if any.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id the file names, if any.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
}
