//! Coffer's built-in embedding engine: sentence-embedding models of the BERT family
//! (all-MiniLM-L6-v2, paraphrase-multilingual-MiniLM-L12-v2, …) run in pure Rust on the CPU with
//! candle, tokenized by the `tokenizers` crate (no C dependency), pooled and normalised as
//! sentence-transformers does ([`engine`]); models are read from a folder or fetched once from a
//! hub in Hugging Face's file layout ([`hub`]), named in a small catalogue ([`catalogue`]).
//!
//! Only the retrieval service links this crate (candle is a large build).
pub mod bert;
pub mod engine;

pub use engine::{Engine, EngineError};
pub mod catalogue;
pub mod hub;
pub mod testing;
