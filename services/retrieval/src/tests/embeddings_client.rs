//! Unit tests of the embeddings client against a real HTTP server on loopback (axum), one
//! route per behaviour of a remote endpoint: ok, down, slow, wrong dimension, NaN, garbage,
//! 500, wrong count.
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::*;

const KEY: &str = "sk-test-secret-key-1234";

/// What the server saw: (path, authorization header, body).
type Seen = Arc<Mutex<Vec<(String, String, Value)>>>;

/// A vector for input `i` of `text`: deterministic, not normalized.
fn vector(i: usize, dim: usize) -> Vec<f32> {
    (0..dim).map(|d| ((i + 1) * (d + 1)) as f32).collect()
}

async fn record(seen: &Seen, path: &str, headers: &HeaderMap, body: &Value) {
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    seen.lock().expect("seen").push((path.to_owned(), auth, body.clone()));
}

fn inputs(body: &Value) -> Vec<String> {
    body["input"].as_array().expect("input").iter().map(|v| v.as_str().expect("str").to_owned()).collect()
}

/// Answers with `data` in reverse order (so the client must sort by index).
async fn ok(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    record(&seen, "ok", &headers, &body).await;
    let n = inputs(&body).len();
    let data: Vec<Value> =
        (0..n).rev().map(|i| json!({"object": "embedding", "index": i, "embedding": vector(i, 4)})).collect();
    Json(json!({"object": "list", "data": data, "model": body["model"]})).into_response()
}

async fn slow(State(seen): State<Seen>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    record(&seen, "slow", &headers, &body).await;
    // Never answers: the client's timeout must end the request.
    std::future::pending::<()>().await;
    StatusCode::OK.into_response()
}

async fn wrong_dim(Json(body): Json<Value>) -> Response {
    let n = inputs(&body).len();
    Json(json!({"data": (0..n).map(|i| json!({"index": i, "embedding": vector(i, 3)})).collect::<Vec<_>>()}))
        .into_response()
}

async fn nan(Json(body): Json<Value>) -> Response {
    let n = inputs(&body).len();
    // As Python's json.dumps writes float('nan'): not JSON, but it happens.
    let items: Vec<String> = (0..n)
        .map(|i| {
            if i == 1 {
                format!("{{\"index\": {i}, \"embedding\": [0.1, NaN, 0.3, 0.4]}}")
            } else {
                format!("{{\"index\": {i}, \"embedding\": [0.1, 0.2, 0.3, 0.4]}}")
            }
        })
        .collect();
    ([("content-type", "application/json")], format!("{{\"data\": [{}]}}", items.join(","))).into_response()
}

async fn overflow(Json(_body): Json<Value>) -> Response {
    ([("content-type", "application/json")], "{\"data\": [{\"index\": 0, \"embedding\": [1e39, 0.2]}]}").into_response()
}

async fn garbage() -> Response {
    ([("content-type", "application/json")], "{\"data\": [{\"index\": 0, \"embedding\": [0.1,").into_response()
}

async fn html() -> Response {
    ([("content-type", "text/html")], "<html>not an API</html>").into_response()
}

async fn boom(headers: HeaderMap) -> Response {
    // A server that quotes the credential back in its error must not leak it through us.
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": {"message": format!("model crashed; you sent {auth}"), "type": "server_error"}})),
    )
        .into_response()
}

async fn wrong_count(Json(body): Json<Value>) -> Response {
    let n = inputs(&body).len();
    Json(json!({"data": (0..n.saturating_sub(1)).map(|i| json!({"index": i, "embedding": vector(i, 4)})).collect::<Vec<_>>()})).into_response()
}

async fn zeros(Json(_body): Json<Value>) -> Response {
    Json(json!({"data": [{"index": 0, "embedding": [0.0, 0.0]}]})).into_response()
}

async fn dup_index(Json(_body): Json<Value>) -> Response {
    Json(json!({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]})).into_response()
}

async fn huge() -> Response {
    let body =
        format!("{{\"data\": [{{\"index\": 0, \"embedding\": [{}0.1]}}]}}", "0.1,".repeat((MAX_ANSWER_BYTES / 4) + 10));
    ([("content-type", "application/json")], body).into_response()
}

/// Serves every route on 127.0.0.1 (free port); returns the base address and what it saw.
async fn server() -> (String, Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/ok/v1/embeddings", post(ok))
        .route("/slow/v1/embeddings", post(slow))
        .route("/dim/v1/embeddings", post(wrong_dim))
        .route("/nan/v1/embeddings", post(nan))
        .route("/overflow/v1/embeddings", post(overflow))
        .route("/garbage/v1/embeddings", post(garbage))
        .route("/html/v1/embeddings", post(html))
        .route("/boom/v1/embeddings", post(boom))
        .route("/count/v1/embeddings", post(wrong_count))
        .route("/zeros/v1/embeddings", post(zeros))
        .route("/dup/v1/embeddings", post(dup_index))
        .route("/huge/v1/embeddings", post(huge))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    (format!("http://{addr}"), seen, task)
}

fn cfg(base: &str, route: &str) -> EmbedConfig {
    EmbedConfig {
        base_url: format!("{base}/{route}/v1"),
        model: "fake-model".into(),
        api_key: Some(SecretString::from(KEY)),
        dimensions: None,
        batch_size: 2,
        timeout: Duration::from_secs(5),
    }
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("text {i}")).collect()
}

async fn embed_err(c: EmbedConfig, n: usize) -> EmbedError {
    let e = Embedder::new(c).expect("embedder").embed(&texts(n)).await.expect_err("must fail");
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(KEY) && !shown.contains("secret-key"), "key leaked: {shown}");
    e
}

#[tokio::test]
async fn ok_batches_sorts_by_index_and_normalizes() {
    let (base, seen, task) = server().await;
    let mut c = cfg(&base, "ok");
    c.dimensions = Some(4);
    let e = Embedder::new(c).expect("embedder");
    let out = e.embed(&texts(5)).await.expect("embed");
    assert_eq!(out.len(), 5);
    for (i, v) in out.iter().enumerate() {
        let raw = vector(i, 4);
        let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
        for (a, b) in v.iter().zip(&raw) {
            assert!((a - b / norm).abs() < 1e-6, "vector {i}: {v:?}");
        }
        assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
    }
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 3, "5 inputs in batches of 2");
    for (_, auth, body) in &seen {
        assert_eq!(auth, &format!("Bearer {KEY}"));
        assert_eq!(body["model"], "fake-model");
        assert_eq!(body["dimensions"], 4);
        assert_eq!(body["encoding_format"], "float");
    }
    assert_eq!(inputs(&seen[2].2), vec!["text 4"]);
    assert!(e.embed(&[]).await.expect("empty").is_empty());
    assert_eq!(e.config().model, "fake-model");
    task.abort();
}

#[tokio::test]
async fn no_key_sends_no_authorization() {
    let (base, seen, task) = server().await;
    let mut c = cfg(&base, "ok");
    c.api_key = None;
    Embedder::new(c).expect("embedder").embed(&texts(1)).await.expect("embed");
    assert_eq!(seen.lock().expect("seen")[0].1, "");
    task.abort();
}

#[tokio::test]
async fn down_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let mut c = cfg(&format!("http://{addr}"), "ok");
    c.base_url = format!("http://user:{KEY}@{addr}/v1?api-key={KEY}");
    let e = embed_err(c, 1).await;
    assert!(matches!(&e, EmbedError::Unreachable(m) if m.contains(&addr.to_string())), "{e:?}");
}

#[tokio::test]
async fn slow_is_a_timeout() {
    let (base, seen, task) = server().await;
    let mut c = cfg(&base, "slow");
    c.timeout = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let e = embed_err(c, 1).await;
    assert_eq!(e, EmbedError::Timeout(Duration::from_millis(300)));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(seen.lock().expect("seen").len(), 1, "the request did reach the server");
    task.abort();
}

#[tokio::test]
async fn wrong_dimension_nan_and_overflow() {
    let (base, _seen, task) = server().await;
    let mut c = cfg(&base, "dim");
    c.dimensions = Some(4);
    assert_eq!(embed_err(c, 2).await, EmbedError::WrongDimension { expected: 4, got: 3 });
    // Without a configured dimension, the first batch sets it for the later ones.
    assert_eq!(embed_err(cfg(&base, "nan"), 2).await, EmbedError::NotFinite { index: 1 });
    assert_eq!(embed_err(cfg(&base, "overflow"), 1).await, EmbedError::NotFinite { index: 0 });
    task.abort();
}

#[tokio::test]
async fn garbage_html_zeros_duplicates_and_huge_are_malformed() {
    let (base, _seen, task) = server().await;
    for route in ["garbage", "html", "zeros", "dup", "huge"] {
        let n = if route == "dup" { 2 } else { 1 };
        let e = embed_err(cfg(&base, route), n).await;
        assert!(matches!(e, EmbedError::Malformed(_)), "{route}: {e:?}");
    }
    task.abort();
}

#[tokio::test]
async fn server_error_is_a_status_with_the_key_scrubbed() {
    let (base, _seen, task) = server().await;
    let e = embed_err(cfg(&base, "boom"), 1).await;
    match &e {
        EmbedError::Status { status: 500, message } => {
            assert!(message.contains("model crashed") && message.contains("[redacted]"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let e = embed_err(cfg(&base, "missing-route"), 1).await;
    assert!(matches!(e, EmbedError::Status { status: 404, .. }), "{e:?}");
    task.abort();
}

#[tokio::test]
async fn wrong_count_is_reported() {
    let (base, _seen, task) = server().await;
    assert_eq!(embed_err(cfg(&base, "count"), 2).await, EmbedError::CountMismatch { sent: 2, got: 1 });
    task.abort();
}

#[test]
fn bad_configurations_are_refused_without_the_key() {
    let base = cfg("http://127.0.0.1:9", "ok");
    let cases: Vec<(EmbedConfig, &str)> = vec![
        (EmbedConfig { base_url: "not a url".into(), ..base.clone() }, "URL"),
        (EmbedConfig { base_url: "ftp://host/v1".into(), ..base.clone() }, "http"),
        (EmbedConfig { model: " ".into(), ..base.clone() }, "model"),
        (EmbedConfig { batch_size: 0, ..base.clone() }, "batch"),
        (EmbedConfig { timeout: Duration::ZERO, ..base.clone() }, "timeout"),
        (EmbedConfig { dimensions: Some(0), ..base.clone() }, "dimensions"),
        (EmbedConfig { api_key: Some(SecretString::from("bad\nkey")), ..base.clone() }, "API key"),
    ];
    for (c, word) in cases {
        match Embedder::new(c) {
            Err(EmbedError::Config(m)) => {
                assert!(m.contains(word), "{m}");
                assert!(!m.contains("bad\nkey"));
            }
            other => panic!("{word}: {other:?}"),
        }
    }
    let shown = format!("{base:?}");
    assert!(!shown.contains(KEY), "{shown}");
}

#[test]
fn non_finite_tokens_outside_strings_only() {
    assert_eq!(
        non_finite_to_null(r#"{"a": [NaN, -Infinity, Infinity], "s": "NaN \" Infinity"}"#),
        r#"{"a": [null, null, null], "s": "NaN \" Infinity"}"#
    );
    assert_eq!(non_finite_to_null("[1, 2]"), "[1, 2]");
}
