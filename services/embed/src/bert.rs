//! The BERT encoder (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers")
//! as Hugging Face `transformers` names its weights (`BertModel`, `model_type: "bert"`), forward
//! pass only, float32 on the CPU, over `candle-nn` layers.
//!
//! It is written here rather than taken from `candle-transformers` because that crate compiles
//! every model it ships (a few hundred files) while Coffer needs this one encoder; the pieces it
//! is made of (`Linear`, `LayerNorm`, `Embedding`, softmax, erf GELU) are candle's.
use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, VarBuilder};
use serde::Deserialize;

/// The fields of a `config.json` the encoder reads (the rest are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    /// `"bert"` (or a BERT-shaped family that names its weights the same way).
    #[serde(default)]
    pub model_type: String,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of every hidden state.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (`hidden_size` is a multiple of it).
    pub num_attention_heads: usize,
    /// Width of each layer's feed-forward block.
    pub intermediate_size: usize,
    /// Longest input, tokens.
    pub max_position_embeddings: usize,
    /// Segment (token type) embeddings.
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    /// The LayerNorm epsilon.
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    /// The activation of the feed-forward block: `gelu` (erf), `gelu_new`/`gelu_pytorch_tanh`
    /// (tanh approximation) or `relu`.
    #[serde(default = "gelu")]
    pub hidden_act: String,
    /// Only `absolute` position embeddings are supported.
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn two() -> usize {
    2
}
fn eps() -> f64 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}
fn absolute() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Checks that the encoder can run this configuration.
    ///
    /// # Errors
    /// A sentence naming the unsupported field.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.model_type.as_str(), "" | "bert") {
            return Err(format!("model_type {:?} is not supported (only \"bert\")", self.model_type));
        }
        if self.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type {:?} is not supported (only \"absolute\")",
                self.position_embedding_type
            ));
        }
        if !matches!(self.hidden_act.as_str(), "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "relu") {
            return Err(format!("hidden_act {:?} is not supported", self.hidden_act));
        }
        if self.num_attention_heads == 0
            || self.hidden_size == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(format!(
                "hidden_size {} is not a positive multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.num_hidden_layers == 0 || self.num_hidden_layers > 128 || self.max_position_embeddings == 0 {
            return Err("num_hidden_layers or max_position_embeddings is out of range".into());
        }
        Ok(())
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

/// A loaded encoder.
pub struct Bert {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
    act: String,
}

fn linear(vb: &VarBuilder, name: &str, input: usize, output: usize) -> candle_core::Result<Linear> {
    candle_nn::linear(input, output, vb.pp(name))
}

fn norm(vb: &VarBuilder, name: &str, size: usize, eps: f64) -> candle_core::Result<LayerNorm> {
    let vb = vb.pp(name);
    // Old checkpoints name the LayerNorm parameters gamma/beta.
    let (w, b) = if vb.contains_tensor("weight") {
        (vb.get(size, "weight")?, vb.get(size, "bias")?)
    } else {
        (vb.get(size, "gamma")?, vb.get(size, "beta")?)
    };
    Ok(LayerNorm::new(w, b, eps))
}

impl Bert {
    /// Builds the encoder from `vb` (float32), whose names are `embeddings.…` and
    /// `encoder.layer.N.…`, with or without a `bert.` prefix.
    ///
    /// # Errors
    /// candle's error for a missing tensor or one of another shape.
    pub fn load(vb: VarBuilder, cfg: &BertConfig) -> candle_core::Result<Self> {
        let vb = if vb.contains_tensor("embeddings.word_embeddings.weight") { vb } else { vb.pp("bert") };
        let h = cfg.hidden_size;
        let e = vb.pp("embeddings");
        let word = candle_nn::embedding(cfg.vocab_size, h, e.pp("word_embeddings"))?;
        let position = candle_nn::embedding(cfg.max_position_embeddings, h, e.pp("position_embeddings"))?;
        let token_type = candle_nn::embedding(cfg.type_vocab_size, h, e.pp("token_type_embeddings"))?;
        let embeddings_norm = norm(&e, "LayerNorm", h, cfg.layer_norm_eps)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = vb.pp(format!("encoder.layer.{i}"));
            let a = l.pp("attention");
            layers.push(Layer {
                query: linear(&a, "self.query", h, h)?,
                key: linear(&a, "self.key", h, h)?,
                value: linear(&a, "self.value", h, h)?,
                attention_out: linear(&a, "output.dense", h, h)?,
                attention_norm: norm(&a.pp("output"), "LayerNorm", h, cfg.layer_norm_eps)?,
                intermediate: linear(&l, "intermediate.dense", h, cfg.intermediate_size)?,
                output: linear(&l, "output.dense", cfg.intermediate_size, h)?,
                output_norm: norm(&l.pp("output"), "LayerNorm", h, cfg.layer_norm_eps)?,
            });
        }
        Ok(Self {
            word,
            position,
            token_type,
            embeddings_norm,
            layers,
            heads: cfg.num_attention_heads,
            head_dim: h / cfg.num_attention_heads,
            act: cfg.hidden_act.clone(),
        })
    }

    /// The last hidden states, `(n, t, hidden)`, of `ids` `(n, t)` (u32 token ids) with
    /// `mask` `(n, t)` (f32: 1 for a token, 0 for padding). Every sequence is segment 0.
    ///
    /// # Errors
    /// candle's error (e.g. a token id outside the vocabulary).
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (n, t) = ids.dims2()?;
        let dev = ids.device();
        let positions = Tensor::arange(0u32, t as u32, dev)?;
        let types = Tensor::zeros((n, t), DType::U32, dev)?;
        let x = self
            .word
            .forward(ids)?
            .broadcast_add(&self.position.forward(&positions)?.unsqueeze(0)?)?
            .add(&self.token_type.forward(&types)?)?;
        let mut x = self.embeddings_norm.forward(&x)?;
        // Additive attention bias: 0 where a token is, a large negative number on padding.
        let bias = ((mask.ones_like()? - mask)? * -1e9f64)?.reshape((n, 1, 1, t))?;
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        for l in &self.layers {
            let split = |y: Tensor| -> candle_core::Result<Tensor> {
                y.reshape((n, t, self.heads, self.head_dim))?.transpose(1, 2)?.contiguous()
            };
            let q = split(l.query.forward(&x)?)?;
            let k = split(l.key.forward(&x)?)?;
            let v = split(l.value.forward(&x)?)?;
            let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&bias)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let ctx = probs.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((n, t, self.heads * self.head_dim))?;
            let a = l.attention_out.forward(&ctx)?;
            x = l.attention_norm.forward(&(a + &x)?)?;
            let hidden = l.intermediate.forward(&x)?;
            let hidden = match self.act.as_str() {
                "gelu" => hidden.gelu_erf()?,
                "relu" => hidden.relu()?,
                _ => hidden.gelu()?,
            };
            let o = l.output.forward(&hidden)?;
            x = l.output_norm.forward(&(o + &x)?)?;
        }
        Ok(x)
    }
}

/// Mean pooling over the tokens `mask` marks (sentence-transformers' `Pooling`, mode `mean`),
/// then L2 normalisation (its `Normalize`): `(n, t, h)` and `(n, t)` → `(n, h)` unit rows.
///
/// # Errors
/// candle's error.
pub fn mean_pool_normalized(hidden: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    let m = mask.unsqueeze(D::Minus1)?;
    let summed = hidden.broadcast_mul(&m)?.sum(1)?;
    let counts = m.sum(1)?.clamp(1e-9f64, f64::MAX)?;
    let pooled = summed.broadcast_div(&counts)?;
    let norms = pooled.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f64, f64::MAX)?;
    pooled.broadcast_div(&norms)
}

/// The CPU device (the engine never uses an accelerator).
pub fn device() -> Device {
    Device::Cpu
}
