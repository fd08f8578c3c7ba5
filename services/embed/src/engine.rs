//! A sentence-embedding model read from a folder in the Hugging Face / sentence-transformers
//! layout, and run: tokenize (the model's `tokenizer.json`), encode ([`crate::bert`]), mean-pool
//! over the real tokens and L2-normalise, as sentence-transformers does for
//! `Transformer → Pooling(mean) → Normalize` models such as all-MiniLM-L6-v2.
//!
//! The folder holds `config.json`, `tokenizer.json` and `model.safetensors`, and optionally
//! `sentence_bert_config.json` (its `max_seq_length` is the truncation length; without it,
//! `tokenizer_config.json`'s `model_max_length`, both capped by the position embeddings).
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams};

use crate::bert::{Bert, BertConfig, device, mean_pool_normalized};

/// The files a model folder must hold.
pub const REQUIRED_FILES: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];
/// Largest `config.json` / `tokenizer.json` read, bytes (a 250k-token vocabulary is ~17 MB).
const MAX_JSON_BYTES: u64 = 64 << 20;
/// Largest `model.safetensors` read, bytes.
const MAX_WEIGHTS_BYTES: u64 = 4 << 30;
/// Longest input kept before tokenization, bytes: far beyond what the truncation length keeps
/// (WordPiece words are at most 100 characters), so cutting here never changes a vector.
const MAX_INPUT_BYTES: usize = 1 << 20;

/// Why a model could not be loaded or run. Messages name the file and the problem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// A file of the model folder is missing or unreadable.
    #[error("model folder {dir}: {file} {problem}")]
    File { dir: String, file: String, problem: String },
    /// `config.json` or a sentence-transformers file is not usable.
    #[error("model folder {dir}: {problem}")]
    Config { dir: String, problem: String },
    /// The tokenizer failed (or `tokenizer.json` is not one).
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The forward pass failed (a weight missing or misshapen, a token id out of range, …).
    #[error("model: {0}")]
    Model(String),
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct TokenizerConfig {
    model_max_length: Option<f64>,
}

/// A loaded model, ready to embed. `Send + Sync`: one instance serves every caller (calls are
/// CPU-bound and synchronous; run them on a blocking thread).
pub struct Engine {
    bert: Bert,
    tokenizer: Tokenizer,
    dimension: usize,
    max_tokens: usize,
    dir: PathBuf,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.dir)
            .field("dimension", &self.dimension)
            .field("max_tokens", &self.max_tokens)
            .finish_non_exhaustive()
    }
}

fn read_bounded(dir: &Path, file: &str, max: u64) -> Result<Vec<u8>, EngineError> {
    let path = dir.join(file);
    let err = |problem: String| EngineError::File { dir: dir.display().to_string(), file: file.into(), problem };
    let meta = std::fs::metadata(&path).map_err(|e| {
        err(if e.kind() == std::io::ErrorKind::NotFound { "is missing".into() } else { format!("is unreadable ({e})") })
    })?;
    if !meta.is_file() {
        return Err(err("is not a file".into()));
    }
    if meta.len() > max {
        return Err(err(format!("is larger than {} MiB", max >> 20)));
    }
    std::fs::read(&path).map_err(|e| err(format!("is unreadable ({e})")))
}

fn optional_json<T: for<'de> Deserialize<'de>>(dir: &Path, file: &str) -> Result<Option<T>, EngineError> {
    if !dir.join(file).exists() {
        return Ok(None);
    }
    let bytes = read_bounded(dir, file, MAX_JSON_BYTES)?;
    serde_json::from_slice(&bytes).map(Some).map_err(|e| EngineError::Config {
        dir: dir.display().to_string(),
        problem: format!("{file} is not valid JSON of the expected shape ({e})"),
    })
}

impl Engine {
    /// Loads the model in `dir` (reads the weights into memory: ~90 MB for all-MiniLM-L6-v2).
    ///
    /// # Errors
    /// [`EngineError::File`] for a missing, oversized or unreadable file,
    /// [`EngineError::Config`] for an unsupported architecture, [`EngineError::Tokenizer`] for a
    /// `tokenizer.json` the tokenizers crate cannot read, [`EngineError::Model`] for weights
    /// that do not match the configuration.
    pub fn load(dir: &Path) -> Result<Self, EngineError> {
        let shown = dir.display().to_string();
        let config_bytes = read_bounded(dir, "config.json", MAX_JSON_BYTES)?;
        let cfg: BertConfig = serde_json::from_slice(&config_bytes).map_err(|e| EngineError::Config {
            dir: shown.clone(),
            problem: format!("config.json is not a BERT configuration ({e})"),
        })?;
        cfg.check().map_err(|problem| EngineError::Config { dir: shown.clone(), problem })?;
        let st: Option<SentenceBertConfig> = optional_json(dir, "sentence_bert_config.json")?;
        let tc: Option<TokenizerConfig> = optional_json(dir, "tokenizer_config.json")?;
        let wanted = st
            .and_then(|c| c.max_seq_length)
            .or_else(|| tc.and_then(|c| c.model_max_length).filter(|l| *l >= 1.0 && *l < 1e6).map(|l| l as usize))
            .unwrap_or(512);
        let max_tokens = wanted.clamp(2, cfg.max_position_embeddings);

        let tokenizer_bytes = read_bounded(dir, "tokenizer.json", MAX_JSON_BYTES)?;
        let mut tokenizer = Tokenizer::from_bytes(&tokenizer_bytes)
            .map_err(|e| EngineError::Tokenizer(format!("tokenizer.json: {e}")))?;
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_tokens, ..TruncationParams::default() }))
            .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        tokenizer.with_padding(None);

        let weights = read_bounded(dir, "model.safetensors", MAX_WEIGHTS_BYTES)?;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device())
            .map_err(|e| EngineError::Model(format!("model.safetensors: {e}")))?;
        let bert = Bert::load(vb, &cfg).map_err(|e| EngineError::Model(format!("model.safetensors: {e}")))?;
        Ok(Self { bert, tokenizer, dimension: cfg.hidden_size, max_tokens, dir: dir.to_owned() })
    }

    /// Vector length.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Truncation length, tokens (special tokens included).
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// One unit vector (`dimension()` floats) per input, in input order. Inputs are sorted by
    /// token count and run `batch` at a time (less padding); `batch` 0 is taken as 1. An empty
    /// input is embedded like any text (its special tokens only).
    ///
    /// # Errors
    /// [`EngineError::Tokenizer`] or [`EngineError::Model`]; no partial result.
    pub fn embed<S: AsRef<str>>(&self, inputs: &[S], batch: usize) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut encodings = Vec::with_capacity(inputs.len());
        for s in inputs {
            let s = s.as_ref();
            let s = clip(s, MAX_INPUT_BYTES);
            encodings.push(self.tokenizer.encode(s, true).map_err(|e| EngineError::Tokenizer(e.to_string()))?);
        }
        let mut order: Vec<usize> = (0..inputs.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let mut out = vec![Vec::new(); inputs.len()];
        let dev = device();
        for group in order.chunks(batch.max(1)) {
            let t = group.iter().map(|&i| encodings[i].get_ids().len()).max().unwrap_or(0).max(1);
            let mut ids = vec![0u32; group.len() * t];
            let mut mask = vec![0f32; group.len() * t];
            for (row, &i) in group.iter().enumerate() {
                for (col, &id) in encodings[i].get_ids().iter().enumerate() {
                    ids[row * t + col] = id;
                    mask[row * t + col] = 1.0;
                }
            }
            let model = |e: candle_core::Error| EngineError::Model(e.to_string());
            let ids = Tensor::from_vec(ids, (group.len(), t), &dev).map_err(model)?;
            let mask = Tensor::from_vec(mask, (group.len(), t), &dev).map_err(model)?;
            let hidden = self.bert.forward(&ids, &mask).map_err(model)?;
            let pooled = mean_pool_normalized(&hidden, &mask).map_err(model)?;
            for (row, v) in group.iter().zip(pooled.to_vec2::<f32>().map_err(model)?) {
                out[*row] = v;
            }
        }
        Ok(out)
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
