//! A fake OpenAI-compatible embeddings API on loopback (real HTTP), for tests and benchmarks of
//! the vector engine without a model: `POST /v1/embeddings` with `{"model", "input": "…" |
//! ["…", …]}` answered as OpenAI documents it, `{"object": "list", "data": [{"object":
//! "embedding", "index": i, "embedding": [f32…]}], "model", "usage": {"prompt_tokens",
//! "total_tokens"}}`; errors as `{"error": {"message", "type", "param", "code"}}`.
//!
//! Vectors are deterministic ([`embed`]): word and character-trigram features hashed into
//! `dim` buckets (signed), L2-normalized, so texts that share words are close (cosine) and a
//! text always gets the same vector. A [`Mode`] switched at run time makes it misbehave (slow,
//! wrong dimension, NaN, values beyond `f32`, garbage body, HTTP 500, wrong count). It records
//! every text it embedded, so a test can assert that unchanged chunks are never embedded again,
//! and checks `Authorization: Bearer <key>` when started with a key.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The model name the fake reports when a request names none.
pub const MODEL: &str = "coffer-fake-embedding";

/// Placeholder for a NaN value while the body is built (see [`Mode::NaN`]).
const NAN_MARK: &str = "__coffer_fake_nan__";

/// How the fake answers, switchable at run time ([`FakeEmbeddings::set_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Correct answers.
    #[default]
    Ok,
    /// Correct answers after a delay of this many milliseconds.
    Slow(u64),
    /// Vectors of this many dimensions instead of the configured ones.
    WrongDimension(usize),
    /// Correct shape, every value the bare token `NaN` (not JSON, but what a Python server's
    /// `json.dumps` sends for a NaN): a strict parser rejects the body.
    NaN,
    /// Correct shape and valid JSON, every value `1e39`: beyond `f32`, so it parses to
    /// infinity (a client must reject non-finite vectors after parsing).
    Overflow,
    /// HTTP 200 with a body that is not JSON.
    Garbage,
    /// HTTP 500 with an OpenAI error body.
    Http500,
    /// One vector fewer than inputs (for a single input: two vectors).
    WrongCount,
}

#[derive(Default)]
struct Log {
    requests: usize,
    texts: Vec<String>,
}

struct Inner {
    dim: usize,
    key: Option<String>,
    mode: Mutex<Mode>,
    log: Mutex<Log>,
}

/// The fake API (ends when dropped).
pub struct FakeEmbeddings {
    /// Its OpenAI base URL, `http://127.0.0.1:<port>/v1` (requests go to `<url>/embeddings`):
    /// the value for the setting `retrieval.embeddings.url`.
    pub url: String,
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl FakeEmbeddings {
    /// Starts the fake on a free loopback port, answering `dim`-dimensional vectors; with
    /// `key`, requests without `Authorization: Bearer <key>` get 401.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(dim: usize, key: Option<&str>) -> anyhow::Result<Self> {
        let inner = Arc::new(Inner { dim, key: key.map(str::to_owned), mode: Mutex::default(), log: Mutex::default() });
        let app = Router::new()
            .route("/v1/embeddings", axum::routing::post(embeddings))
            .fallback(|| async { error(StatusCode::NOT_FOUND, "invalid_request_error", "no such endpoint") })
            .with_state(inner.clone());
        let (url, task) = crate::http::serve_on_loopback(app).await?;
        let url = format!("{url}/v1");
        Ok(Self { url, inner, task })
    }

    /// The configured dimension.
    pub fn dim(&self) -> usize {
        self.inner.dim
    }

    /// Changes how the next requests are answered.
    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.inner.mode) = mode;
    }

    /// How requests are answered now.
    pub fn mode(&self) -> Mode {
        *lock(&self.inner.mode)
    }

    /// Requests received on `/v1/embeddings` so far (any outcome, unauthorized included).
    pub fn requests(&self) -> usize {
        lock(&self.inner.log).requests
    }

    /// How many inputs were embedded so far (answered with vectors in [`Mode::Ok`] or
    /// [`Mode::Slow`]).
    pub fn embedded(&self) -> usize {
        lock(&self.inner.log).texts.len()
    }

    /// Every input embedded so far, in order.
    pub fn texts(&self) -> Vec<String> {
        lock(&self.inner.log).texts.clone()
    }

    /// Forgets the requests and texts recorded so far.
    pub fn reset(&self) {
        *lock(&self.inner.log) = Log::default();
    }
}

impl Drop for FakeEmbeddings {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    (status, axum::Json(json!({"error": {"message": message, "type": kind, "param": null, "code": null}})))
        .into_response()
}

/// FNV-1a, 64 bits (stable across runs and platforms, unlike `std`'s hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Whether `c` is a CJK ideograph, kana or hangul (written without spaces between words).
fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x3040..=0x30ff | 0x3400..=0x4dbf | 0x4e00..=0x9fff | 0xac00..=0xd7af | 0xf900..=0xfaff)
}

/// The fake's deterministic embedding of `text`: a unit vector of `dim` values. Features, each
/// hashed to a bucket with a hash-chosen sign: every lowercased word (alphanumeric run; each
/// CJK character is a word, and each pair of adjacent CJK characters a word too), weight 1;
/// every character trigram of ` word `, weight 0.5 (so `wing` and `wings` are close). A text
/// without features gets the first basis vector (never NaN).
pub fn embed(text: &str, dim: usize) -> Vec<f32> {
    let dim = dim.max(1);
    let mut v = vec![0f32; dim];
    let mut add = |feature: &str, weight: f32| {
        let h = fnv1a(feature.as_bytes());
        let bucket = (h % dim as u64) as usize;
        v[bucket] += if h >> 63 == 0 { weight } else { -weight };
    };
    let lower = text.to_lowercase();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut prev_cjk: Option<char> = None;
    for c in lower.chars() {
        if is_cjk(c) {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            words.push(c.to_string());
            if let Some(p) = prev_cjk {
                words.push(format!("{p}{c}"));
            }
            prev_cjk = Some(c);
        } else {
            prev_cjk = None;
            if c.is_alphanumeric() {
                word.push(c);
            } else if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    for w in &words {
        add(&format!("w:{w}"), 1.0);
        if w.chars().count() > 2 {
            let padded: Vec<char> = format!(" {w} ").chars().collect();
            for tri in padded.windows(3) {
                add(&format!("t:{}", tri.iter().collect::<String>()), 0.5);
            }
        }
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        v[0] = 1.0;
    } else {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

async fn embeddings(State(f): State<Arc<Inner>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    lock(&f.log).requests += 1;
    if let Some(key) = &f.key {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
        if auth != Some(&format!("Bearer {key}")) {
            return error(StatusCode::UNAUTHORIZED, "invalid_request_error", "Incorrect API key provided.");
        }
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "We could not parse the JSON body.");
    };
    let inputs: Vec<String> = match &body["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "'input' must be a string or a non-empty array of strings.",
            );
        }
    };
    if body.get("encoding_format").is_some_and(|e| e != "float") {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "Only encoding_format 'float' is supported.");
    }
    let mode = *lock(&f.mode);
    let mut dim = f.dim;
    let mut count = inputs.len();
    match mode {
        Mode::Ok => {}
        Mode::Slow(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        Mode::WrongDimension(d) => dim = d,
        Mode::NaN | Mode::Overflow => {}
        Mode::Garbage => {
            return ([("content-type", "application/json")], "{\"object\": \"list\", \"data\": [<<").into_response();
        }
        Mode::Http500 => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "The server had an error processing your request.",
            );
        }
        Mode::WrongCount => count = if count == 1 { 2 } else { count - 1 },
    }
    if matches!(mode, Mode::Ok | Mode::Slow(_)) {
        lock(&f.log).texts.extend(inputs.iter().cloned());
    }
    let data: Vec<Value> = (0..count)
        .map(|i| {
            let text = &inputs[i.min(inputs.len() - 1)];
            let embedding = match mode {
                Mode::NaN => json!(vec![NAN_MARK; dim]),
                Mode::Overflow => json!(vec![1e39f64; dim]),
                _ => json!(embed(text, dim)),
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let tokens: usize = inputs.iter().map(|s| s.split_whitespace().count().max(1)).sum();
    let model = body["model"].as_str().filter(|m| !m.is_empty()).unwrap_or(MODEL);
    let reply = json!({"object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}});
    // NaN cannot be built as JSON: a placeholder string, then replaced by the bare token.
    let text = reply.to_string().replace(&format!("\"{NAN_MARK}\""), "NaN");
    ([("content-type", "application/json")], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    async fn post(f: &FakeEmbeddings, body: Value, key: Option<&str>) -> (u16, String) {
        coffer_runtime::tls::ensure_provider();
        let mut req =
            reqwest::Client::builder().no_proxy().build().expect("client").post(format!("{}/embeddings", f.url));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.json(&body).send().await.expect("send");
        (r.status().as_u16(), r.text().await.expect("body"))
    }

    #[test]
    fn vectors_are_deterministic_unit_and_close_for_shared_words() {
        let a = embed("the lift of a wing in a propeller slipstream", 256);
        assert_eq!(a, embed("the lift of a wing in a propeller slipstream", 256));
        assert_eq!(a.len(), 256);
        assert!((cos(&a, &a) - 1.0).abs() < 1e-5);
        let near = embed("wings in the slipstream of a propeller", 256);
        let far = embed("heat conduction in composite slabs", 256);
        assert!(cos(&a, &near) > cos(&a, &far) + 0.2, "near {} far {}", cos(&a, &near), cos(&a, &far));
        // Chinese: a shared two-character word brings texts together.
        let zh = embed("今天讨论机器学习的方法", 256);
        assert!(cos(&zh, &embed("机器学习", 256)) > cos(&zh, &embed("天气很好", 256)));
        // No features: a unit vector, not NaN.
        assert_eq!(embed("  ...  ", 8), vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[tokio::test]
    async fn answers_as_openai_documents_and_records_texts() {
        let f = FakeEmbeddings::start(16, None).await.expect("start");
        let (status, body) = post(&f, json!({"model": "m1", "input": ["alpha beta", "gamma"]}), None).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "m1");
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["data"][0]["object"], "embedding");
        let got: Vec<f32> = serde_json::from_value(v["data"][1]["embedding"].clone()).expect("floats");
        assert_eq!(got, embed("gamma", 16));
        assert!(v["usage"]["total_tokens"].as_u64().expect("usage") >= 2);
        let (status, _) = post(&f, json!({"model": "m1", "input": "single"}), None).await;
        assert_eq!(status, 200);
        assert_eq!(f.texts(), ["alpha beta", "gamma", "single"]);
        assert_eq!((f.embedded(), f.requests()), (3, 2));
        let (status, body) = post(&f, json!({"model": "m1", "input": [1, 2]}), None).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("input"), "{body}");
        f.reset();
        assert_eq!((f.embedded(), f.requests()), (0, 0));
    }

    #[tokio::test]
    async fn modes_misbehave_as_named() {
        let f = FakeEmbeddings::start(8, None).await.expect("start");
        let two = json!({"model": "m", "input": ["a b", "c d"]});
        let data =
            |body: &str| serde_json::from_str::<Value>(body).expect("json")["data"].as_array().cloned().expect("data");

        f.set_mode(Mode::WrongDimension(5));
        let (_, body) = post(&f, two.clone(), None).await;
        assert_eq!(data(&body)[0]["embedding"].as_array().map(Vec::len), Some(5));

        f.set_mode(Mode::NaN);
        let (status, body) = post(&f, two.clone(), None).await;
        assert_eq!(status, 200);
        assert!(body.contains("[NaN,NaN,"), "{body}");
        assert!(serde_json::from_str::<Value>(&body).is_err());

        f.set_mode(Mode::Overflow);
        let (_, body) = post(&f, two.clone(), None).await;
        let v: Vec<f32> = serde_json::from_value(data(&body)[1]["embedding"].clone()).expect("floats");
        assert_eq!(v.len(), 8);
        assert!(v.iter().all(|x| x.is_infinite()), "{v:?}");

        f.set_mode(Mode::WrongCount);
        let (_, body) = post(&f, two.clone(), None).await;
        assert_eq!(data(&body).len(), 1);

        f.set_mode(Mode::Garbage);
        let (status, body) = post(&f, two.clone(), None).await;
        assert_eq!(status, 200);
        assert!(serde_json::from_str::<Value>(&body).is_err());

        f.set_mode(Mode::Http500);
        let (status, body) = post(&f, two.clone(), None).await;
        assert_eq!(status, 500);
        assert!(body.contains("server_error"), "{body}");

        f.set_mode(Mode::Slow(150));
        let t = std::time::Instant::now();
        let (status, _) = post(&f, two.clone(), None).await;
        assert_eq!(status, 200);
        assert!(t.elapsed() >= Duration::from_millis(150));
        // Only the answers with correct vectors count as embedded.
        assert_eq!((f.embedded(), f.requests()), (2, 7));
    }

    #[tokio::test]
    async fn checks_the_bearer_key_when_configured() {
        let f = FakeEmbeddings::start(4, Some("sk-test-1")).await.expect("start");
        let body = json!({"model": "m", "input": "x"});
        assert_eq!(post(&f, body.clone(), None).await.0, 401);
        assert_eq!(post(&f, body.clone(), Some("sk-wrong")).await.0, 401);
        assert_eq!(post(&f, body.clone(), Some("sk-test-1")).await.0, 200);
        assert_eq!(f.embedded(), 1);
    }
}
