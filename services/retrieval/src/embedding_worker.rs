//! The embedding worker: keeps every chunk's vector current for the configured model, in the
//! background, never in the way of keyword indexing.
//!
//! It reads `retrieval.embeddings.*` ([`crate::config`]), resolves the credential through the
//! store's `Credentials.ResolveCredentials`, learns the dimension (the setting, or the first
//! answer's length), tells the store (`ConfigureVectors`: a new model or dimension drops every
//! vector, a clean re-embed), then loops: `PendingEmbeddings` →
//! [`embeddings_client::Embedder::embed`] (batches of `batch_size`, `concurrency` requests at
//! once) → `PutEmbeddings`. A vector of the
//! wrong length or with NaN is refused before it reaches the store. An endpoint that is down or
//! answers garbage is retried with exponential backoff and reported by [`Embeddings::engine`];
//! a settings change starts over.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::retrieval::EngineConfig;
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::{
    ConfigureVectorsRequest, Embedding, PendingEmbeddingsRequest, PutEmbeddingsRequest, ResolveCredentialsRequest,
};
use coffer_runtime::grpc::AuthChannel;
use futures_util::StreamExt;
use secrecy::SecretString;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigRx, EmbeddingsSettings};
use crate::embeddings_client;
use crate::sources::Index;

/// Idle re-check of pending chunks when nothing woke the worker.
const IDLE: Duration = Duration::from_secs(5);
/// Backoff bounds after a failure.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A configured, working endpoint: what the vector engine queries with.
pub struct Ready {
    /// The client.
    pub embedder: embeddings_client::Embedder,
    /// Model name.
    pub model: String,
    /// Vector length.
    pub dimension: u32,
    /// Base URL (shown in status).
    pub url: String,
}

/// Checks one vector: `dimension` long, every component finite.
///
/// # Errors
/// A message naming the problem (never the vector).
pub fn check_vector(v: &[f32], dimension: u32) -> Result<(), String> {
    if v.len() != dimension as usize {
        return Err(format!("the endpoint answered a vector of {} dimensions; expected {dimension}", v.len()));
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err("the endpoint answered a vector with NaN or infinite components".into());
    }
    Ok(())
}

/// What keeps the vector engine off, if anything: it needs both the endpoint's URL and the
/// model (half a configuration never embeds; the message names what is missing).
pub fn missing(settings: &EmbeddingsSettings) -> Option<String> {
    let (url, model) = (settings.url.trim(), settings.model.trim());
    match (url.is_empty(), model.is_empty()) {
        (true, true) => Some("retrieval.embeddings.url is not set (the vector engine is opt-in)".into()),
        (false, true) => Some(
            "retrieval.embeddings.model is not set (retrieval.embeddings.url is): set both to turn the vector engine on"
                .into(),
        ),
        (true, false) => Some(
            "retrieval.embeddings.url is not set (retrieval.embeddings.model is): set both to turn the vector engine on"
                .into(),
        ),
        (false, false) => None,
    }
}

#[derive(Debug, Clone)]
enum State {
    Off(String),
    Starting,
    Ready,
    Failing(String),
}

/// The worker's shared face: whether vectors can be queried, and what status shows.
pub struct Embeddings {
    state: Mutex<State>,
    ready: Mutex<Option<Arc<Ready>>>,
    /// Woken when chunks were added (the indexer) or settings changed.
    pub wake: Arc<Notify>,
}

impl Embeddings {
    /// Off until [`Embeddings::run`] configures it.
    pub fn new(wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(State::Off("not configured yet".into())), ready: Mutex::new(None), wake })
    }

    /// The working endpoint, if any.
    pub fn ready(&self) -> Option<Arc<Ready>> {
        self.ready.lock().expect("embeddings").clone()
    }

    /// Why the vector engine is not usable, if it is not.
    pub fn unavailable(&self) -> Option<String> {
        match &*self.state.lock().expect("embeddings") {
            State::Ready => None,
            State::Off(why) => Some(why.clone()),
            State::Starting => Some("the embeddings endpoint is being configured".into()),
            State::Failing(why) => Some(why.clone()),
        }
    }

    /// The vector engine's row of `Status`.
    pub fn engine(&self) -> EngineConfig {
        let state = self.state.lock().expect("embeddings").clone();
        let ready = self.ready();
        let (enabled, detail) = match (state, ready) {
            (State::Off(why), _) => (false, format!("off: {why}")),
            (State::Starting, _) => (false, "starting".into()),
            (State::Ready, Some(r)) => {
                (true, format!("{} ({}) at {}", r.model, r.dimension, crate::embeddings_client::shown_url_str(&r.url)))
            }
            (State::Ready, None) => (false, "starting".into()),
            (State::Failing(why), Some(r)) => (
                true,
                format!(
                    "{} ({}) at {}; failing: {why}",
                    r.model,
                    r.dimension,
                    crate::embeddings_client::shown_url_str(&r.url)
                ),
            ),
            (State::Failing(why), None) => (false, format!("failing: {why}")),
        };
        EngineConfig { name: "vector".into(), enabled, detail }
    }

    fn set(&self, s: State) {
        *self.state.lock().expect("embeddings") = s;
    }

    /// Runs until `shutdown`: configures from the settings and embeds pending chunks.
    pub async fn run(
        self: Arc<Self>,
        mut config: ConfigRx,
        index: Index,
        credentials: CredentialsClient<AuthChannel>,
        shutdown: CancellationToken,
    ) {
        let mut backoff = coffer_runtime::Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        // Logged when embeddings start failing, when the error changes, every 10 minutes while
        // it lasts and on recovery; not on every retry.
        let mut failing = coffer_runtime::logging::FailureLog::new(Duration::from_secs(600));
        loop {
            let settings = config.borrow_and_update().embeddings.clone();
            let outcome = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = config.changed() => Err(None),
                r = self.serve(&settings, index.clone(), credentials.clone()) => r.map_err(Some),
            };
            match outcome {
                Ok(()) => {
                    backoff.reset();
                    if let Some(failures) = failing.succeeded() {
                        tracing::info!(failures, "Embeddings recovered.");
                    }
                }
                // Settings changed: start over at once.
                Err(None) => {
                    backoff.reset();
                    continue;
                }
                Err(Some(why)) => {
                    let delay = backoff.next_delay();
                    match failing.failed(&why) {
                        coffer_runtime::logging::Failing::Started => {
                            tracing::warn!(error = %coffer_runtime::logging::clip(&why), retry_ms = delay.as_millis() as u64, "Embeddings failing.");
                        }
                        coffer_runtime::logging::Failing::Still { failures } => {
                            tracing::warn!(error = %coffer_runtime::logging::clip(&why), failures, "Embeddings still failing.");
                        }
                        coffer_runtime::logging::Failing::Quiet => {}
                    }
                    self.set(State::Failing(why));
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = config.changed() => {}
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Configures for `settings` and embeds until an error (returned) — or forever, when off.
    async fn serve(
        &self,
        settings: &EmbeddingsSettings,
        mut index: Index,
        mut credentials: CredentialsClient<AuthChannel>,
    ) -> Result<(), String> {
        if let Some(why) = missing(settings) {
            *self.ready.lock().expect("embeddings") = None;
            self.set(State::Off(why));
            return std::future::pending().await;
        }
        let keep_ready = self.ready().is_some_and(|r| r.url == settings.url && r.model == settings.model);
        if !keep_ready {
            self.set(State::Starting);
        }
        let api_key = if settings.credential.is_empty() {
            None
        } else {
            let name = settings.credential.clone();
            let reply = credentials
                .resolve_credentials(ResolveCredentialsRequest { names: vec![name.clone()] })
                .await
                .map_err(|e| format!("cannot resolve credential {name:?}: {}", e.message()))?;
            let value = reply.into_inner().values.remove(&name).ok_or(format!("credential {name:?} is not set"))?;
            Some(SecretString::from(value))
        };
        let embedder = embeddings_client::Embedder::new(embeddings_client::EmbedConfig {
            base_url: settings.url.clone(),
            model: settings.model.clone(),
            api_key,
            dimensions: (settings.dimensions > 0).then_some(settings.dimensions),
            batch_size: settings.batch_size,
            timeout: settings.timeout,
        })
        .map_err(|e| format!("the embeddings endpoint is not usable: {e}"))?;
        let dimension = if settings.dimensions > 0 {
            settings.dimensions
        } else {
            let probe = embedder.embed(&["dimension probe".to_owned()]).await.map_err(|e| e.to_string())?;
            let first = probe.first().ok_or("the embeddings endpoint answered no vector")?;
            if first.is_empty() {
                return Err("the embeddings endpoint answered an empty vector".into());
            }
            first.len() as u32
        };
        let reply = index
            .configure_vectors(ConfigureVectorsRequest { model: settings.model.clone(), dimension })
            .await
            .map_err(|e| format!("the store refused the vector configuration: {}", e.message()))?
            .into_inner();
        if reply.reset {
            tracing::info!(model = %settings.model, dimension, dropped = reply.dropped, "Vectors reset: re-embedding every chunk.");
        }
        let ready = Arc::new(Ready { embedder, model: settings.model.clone(), dimension, url: settings.url.clone() });
        *self.ready.lock().expect("embeddings") = Some(ready.clone());
        self.set(State::Ready);
        loop {
            let limit = (settings.batch_size * settings.concurrency).min(4096) as u32;
            let pending = index
                .pending_embeddings(PendingEmbeddingsRequest { limit })
                .await
                .map_err(|e| format!("the store is unavailable: {}", e.message()))?
                .into_inner()
                .hits;
            if pending.is_empty() {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(IDLE) => {}
                }
                continue;
            }
            let batches: Vec<Vec<(i64, String)>> = pending
                .into_iter()
                .filter_map(|h| h.chunk.map(|c| (c.id, embed_text(&c.path, &c.title, &c.heading_path, &c.text))))
                .collect::<Vec<_>>()
                .chunks(settings.batch_size.max(1))
                .map(<[_]>::to_vec)
                .collect();
            let results: Vec<Result<Vec<Embedding>, String>> = futures_util::stream::iter(batches)
                .map(|batch| {
                    let ready = ready.clone();
                    async move {
                        let texts: Vec<String> = batch.iter().map(|(_, t)| t.clone()).collect();
                        let vectors = ready.embedder.embed(&texts).await.map_err(|e| e.to_string())?;
                        if vectors.len() != batch.len() {
                            return Err(format!(
                                "the endpoint answered {} vectors for {} inputs",
                                vectors.len(),
                                batch.len()
                            ));
                        }
                        batch
                            .iter()
                            .zip(vectors)
                            .map(|((id, _), v)| {
                                check_vector(&v, ready.dimension).map(|()| Embedding { chunk_id: *id, vector: v })
                            })
                            .collect()
                    }
                })
                .buffer_unordered(settings.concurrency.max(1))
                .collect()
                .await;
            let mut first_error = None;
            for r in results {
                match r {
                    Ok(embeddings) => {
                        index
                            .put_embeddings(PutEmbeddingsRequest {
                                model: ready.model.clone(),
                                dimension: ready.dimension,
                                embeddings,
                            })
                            .await
                            .map_err(|e| format!("the store refused vectors: {}", e.message()))?;
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
            self.set(State::Ready);
        }
    }
}

/// What is embedded for a chunk (of the document at `path`, relative to its KB): its text, after
/// the context a reader would see above it — the document's title and the chunk's heading path
/// (`A > B`) — but only what is real and not already there:
///
/// - the title only when it is a real one (front matter or `#` heading): a title equal to the
///   file's stem is the fallback the parser made up (`D3-1`, or a memory fact's ULID), and
///   embedding it lowers the similarity of relevant chunks;
/// - the title not again when it is the first heading of the path;
/// - the chunk's own heading not again when the chunk's text starts with it (`# A` …).
pub fn embed_text(path: &str, title: &str, heading_path: &[String], text: &str) -> String {
    let stem = std::path::Path::new(path).file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let real_title =
        !title.trim().is_empty() && title != stem && heading_path.first().map(String::as_str) != Some(title);
    let mut headings: &[String] = heading_path;
    if let Some((last, rest)) = headings.split_last() {
        let first_line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        let own = first_line.trim_start_matches('#');
        if own.len() < first_line.len() && own.trim() == last.trim() {
            headings = rest;
        }
    }
    let mut out = String::new();
    if real_title {
        out.push_str(title);
        out.push('\n');
    }
    if !headings.is_empty() {
        out.push_str(&headings.join(" > "));
        out.push('\n');
    }
    out.push_str(text);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_a_configuration_keeps_the_engine_off_and_says_what_is_missing() {
        let with = |url: &str, model: &str| EmbeddingsSettings {
            url: url.into(),
            model: model.into(),
            credential: String::new(),
            dimensions: 0,
            batch_size: 1,
            concurrency: 1,
            timeout: Duration::from_secs(1),
        };
        let off = missing(&with("", "")).unwrap();
        assert!(off.contains("url is not set"), "{off}");
        let no_model = missing(&with("http://127.0.0.1:9/v1", "")).unwrap();
        assert!(
            no_model.starts_with("retrieval.embeddings.model is not set") && no_model.contains("set both"),
            "{no_model}"
        );
        let no_url = missing(&with("", "bge-small")).unwrap();
        assert!(no_url.starts_with("retrieval.embeddings.url is not set") && no_url.contains("set both"), "{no_url}");
        assert!(missing(&with("http://127.0.0.1:9/v1", "  ")).is_some(), "a blank model is no model");
        assert_eq!(missing(&with("http://127.0.0.1:9/v1", "bge-small")), None);
    }

    #[test]
    fn vectors_are_checked_for_length_and_finiteness() {
        assert_eq!(check_vector(&[0.1, 0.2], 2), Ok(()));
        assert!(check_vector(&[0.1], 2).unwrap_err().contains("1 dimensions; expected 2"));
        assert!(check_vector(&[0.1, f32::NAN], 2).unwrap_err().contains("NaN"));
        assert!(check_vector(&[f32::INFINITY, 0.0], 2).is_err());
    }

    #[test]
    fn status_says_why_vectors_are_off() {
        let e = Embeddings::new(Arc::new(Notify::new()));
        assert!(!e.engine().enabled);
        e.set(State::Off("retrieval.embeddings.url is not set".into()));
        assert_eq!(e.engine().detail, "off: retrieval.embeddings.url is not set");
        assert_eq!(e.unavailable().as_deref(), Some("retrieval.embeddings.url is not set"));
        e.set(State::Failing("embeddings endpoint: connection refused".into()));
        assert!(e.engine().detail.contains("connection refused"));
    }

    #[test]
    fn embedded_text_carries_its_context() {
        let h = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(embed_text("n/doc.md", "Doc", &h(&["A", "B"]), "body"), "Doc\nA > B\nbody");
        assert_eq!(embed_text("doc.md", "", &[], "body"), "body");
        // A made-up title (the file's stem, or a memory fact's ULID) is not embedded.
        assert_eq!(embed_text("notes/D3-1.md", "D3-1", &[], "body"), "body");
        assert_eq!(embed_text("01JABCDEF0123456789ABCDEFG.md", "01JABCDEF0123456789ABCDEFG", &[], "a fact"), "a fact");
        // The title that is the first heading, and the heading the chunk starts with, once.
        assert_eq!(embed_text("d.md", "Flow", &h(&["Flow"]), "# Flow\nbody"), "# Flow\nbody");
        assert_eq!(embed_text("d.md", "Flow", &h(&["Flow", "Wake"]), "## Wake\nbody"), "Flow\n## Wake\nbody");
        assert_eq!(embed_text("d.md", "Flow", &h(&["Flow", "Wake"]), "more body"), "Flow > Wake\nmore body");
        assert_eq!(embed_text("d.md", "T", &h(&["A"]), "## Not A\nx"), "T\nA\n## Not A\nx");
    }
}
