//! The embedding worker: keeps every chunk's vector current for the configured model, in the
//! background, never in the way of keyword indexing.
//!
//! It reads `retrieval.embeddings.*` ([`crate::config`]) and picks the engine: the
//! OpenAI-compatible endpoint when `url` is set ([`embeddings_client`]; the credential resolved
//! through the store's `Credentials.ResolveCredentials`), else the built-in engine
//! ([`coffer_embed`]) with `builtin_model`, read from `model_dir` (or
//! `COFFER_HOME/models/<model>`, downloaded from `hub_url` on first use, progress in the
//! engine's status). It learns the dimension (the setting, the first answer's length, or the
//! model's), tells the store (`ConfigureVectors`: a new model or dimension drops every vector, a
//! clean re-embed), then loops: `PendingEmbeddings` → embed (batches, `concurrency` at once for
//! an endpoint, one at a time for the built-in engine, which uses every core; the pending chunks
//! read at once are sorted by length first, so a forward pass pads little) → `PutEmbeddings`,
//! each batch stored as soon as it is computed.
//!
//! The batch size adapts to the measured latency ([`BatchSizer`]): it shrinks when a batch
//! takes more than a quarter of the request time limit (half of it for the built-in engine's
//! one-second goal, but never below one 16-sequence forward pass, whose throughput small
//! batches lose) or times out — a timed-out batch is retried smaller, never dropped — and
//! grows back toward `batch_size` while batches are quick. A vector of the wrong length or with
//! NaN is refused before it reaches the store. An engine that fails is retried with exponential
//! backoff; [`Embeddings::engine`] shows the state, the progress (chunks embedded, rate, batch
//! size) and the last error; a settings change starts over.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
/// The built-in engine's goal for one batch: short enough that a search's query vector never
/// waits long behind background indexing.
const BUILTIN_BATCH_GOAL: Duration = Duration::from_millis(1000);
/// Sequences per forward pass inside the built-in engine (sorted by length, so padding is small).
/// Also the smallest batch the built-in engine is given: a pass of fewer sequences computes
/// far fewer chunks per second (1 sequence: 4.6 chunks/s, 16: 64.7, on the same loaded machine,
/// `docs/BENCHMARKS.md`), so shrinking the batch toward the latency goal on a busy machine
/// made the first index ~15× slower (Cranfield: batch 2, ~1 chunk/s through the daemon).
const BUILTIN_PASS: usize = 16;
/// Batches' worth of pending chunks the built-in engine's loop reads at once and sorts by length
/// before cutting them into batches: a forward pass pads every input to its longest, and chunks in
/// id order mix a heading-only chunk with a 256-token one. Each batch still takes the engine's
/// turn alone, so a search's query vector waits for one batch at most.
const BUILTIN_WINDOW: usize = 8;

/// The built-in engine: one loaded model, one call at a time (a call already uses every core).
pub struct Builtin {
    engine: Arc<coffer_embed::Engine>,
    turn: tokio::sync::Mutex<()>,
}

/// What computes vectors.
pub enum Embedder {
    /// An OpenAI-compatible endpoint.
    Endpoint(embeddings_client::Embedder),
    /// The built-in engine.
    Builtin(Builtin),
}

impl Embedder {
    /// One unit vector per input, in input order.
    ///
    /// # Errors
    /// The endpoint's or the engine's error, as a message (never a key).
    pub async fn embed(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, String> {
        self.embed_typed(inputs).await.map_err(|e| e.to_string())
    }

    async fn embed_typed(&self, inputs: &[String]) -> Result<Vec<Vec<f32>>, EmbedFailure> {
        match self {
            Embedder::Endpoint(e) => e.embed(inputs).await.map_err(|e| match e {
                embeddings_client::EmbedError::Timeout(_) => EmbedFailure::Timeout(e.to_string()),
                e => EmbedFailure::Other(e.to_string()),
            }),
            Embedder::Builtin(b) => {
                let _turn = b.turn.lock().await;
                let engine = b.engine.clone();
                let inputs = inputs.to_vec();
                tokio::task::spawn_blocking(move || engine.embed(&inputs, BUILTIN_PASS))
                    .await
                    .map_err(|e| EmbedFailure::Other(format!("the built-in engine stopped: {e}")))?
                    .map_err(|e| EmbedFailure::Other(format!("the built-in engine failed: {e}")))
            }
        }
    }
}

enum EmbedFailure {
    Timeout(String),
    Other(String),
}

impl std::fmt::Display for EmbedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmbedFailure::Timeout(m) | EmbedFailure::Other(m) => f.write_str(m),
        }
    }
}

/// A configured, working engine: what the vector engine queries with.
pub struct Ready {
    /// The engine.
    pub embedder: Embedder,
    /// Model name.
    pub model: String,
    /// Vector length.
    pub dimension: u32,
    /// The endpoint's base URL, or the built-in model's folder (what a settings change is
    /// compared against).
    pub url: String,
}

impl Ready {
    /// Where vectors come from, for status: `at http://host:port/v1` or `built-in, from <dir>`.
    fn source(&self) -> String {
        match &self.embedder {
            Embedder::Endpoint(_) => format!("at {}", embeddings_client::shown_url_str(&self.url)),
            Embedder::Builtin(_) => format!("built-in, from {}", self.url),
        }
    }
}

/// The batch size in force: starts at the setting, halves when a batch is slow or times out,
/// grows by half again (up to the setting) while batches take under half the goal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchSizer {
    size: usize,
    min: usize,
    max: usize,
    goal: Duration,
}

impl BatchSizer {
    /// `max` chunks at most (at least 1), aiming at `goal` per batch.
    pub fn new(max: usize, goal: Duration) -> Self {
        let max = max.max(1);
        Self { size: max, min: 1, max, goal }
    }

    /// Never below `min` chunks (at most the setting): for an engine whose throughput collapses
    /// with small batches, the goal gives way.
    pub fn at_least(mut self, min: usize) -> Self {
        self.min = min.clamp(1, self.max);
        self
    }

    /// The size to send now.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A batch of `n` chunks took `took`.
    pub fn took(&mut self, n: usize, took: Duration) {
        if took > self.goal && self.size > self.min {
            // Scale to the goal, at least halving.
            let per = took.as_secs_f64() / n.max(1) as f64;
            let fit = (self.goal.as_secs_f64() / per.max(1e-9)).floor() as usize;
            self.size = fit.clamp(self.min, (self.size / 2).max(self.min));
        } else if took < self.goal / 2 && n >= self.size && self.size < self.max {
            self.size = (self.size + self.size.div_ceil(2)).min(self.max);
        }
    }

    /// A batch timed out: halve.
    pub fn timed_out(&mut self) {
        self.size = (self.size / 2).max(self.min);
    }
}

/// Progress of the embedding loop, for status.
#[derive(Debug, Clone, Default)]
struct Progress {
    /// Chunks embedded and stored since the engine became ready.
    embedded: u64,
    /// Chunks per second of the last batch.
    rate: f64,
    /// The batch size in force.
    batch: usize,
    /// The last error and when (it stays shown after a recovery, with its age).
    last_error: Option<(String, Instant)>,
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

/// What keeps the vector engine off, if anything: the endpoint needs both its URL and the
/// model (half a configuration never embeds; the message names what is missing); without an
/// endpoint, the built-in engine needs a model name, and its files or a hub to fetch them from.
pub fn missing(settings: &EmbeddingsSettings) -> Option<String> {
    let (url, model) = (settings.url.trim(), settings.model.trim());
    match (url.is_empty(), model.is_empty()) {
        (false, true) => Some(
            "retrieval.embeddings.model is not set (retrieval.embeddings.url is): set both to use the embeddings endpoint"
                .into(),
        ),
        (false, false) => None,
        (true, _) if settings.builtin_model.trim().is_empty() => Some(
            "retrieval.embeddings.url and retrieval.embeddings.builtin_model are empty (no endpoint, built-in engine off)"
                .into(),
        ),
        (true, _) if settings.model_dir.trim().is_empty() && settings.hub_url.trim().is_empty() => Some(format!(
            "the built-in model {} is not in COFFER_HOME/models/ and downloads are off (retrieval.embeddings.hub_url is empty or HF_HUB_OFFLINE is set): put its files (config.json, tokenizer.json, model.safetensors) in a folder and set retrieval.embeddings.model_dir",
            settings.builtin_model.trim()
        )),
        (true, _) => None,
    }
}

#[derive(Debug, Clone)]
enum State {
    Off(String),
    Starting,
    Downloading(String),
    Ready,
    Failing(String),
}

/// The worker's shared face: whether vectors can be queried, and what status shows.
pub struct Embeddings {
    state: Mutex<State>,
    ready: Mutex<Option<Arc<Ready>>>,
    progress: Mutex<Progress>,
    /// Woken when chunks were added (the indexer) or settings changed.
    pub wake: Arc<Notify>,
}

impl Embeddings {
    /// Off until [`Embeddings::run`] configures it.
    pub fn new(wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::Off("not configured yet".into())),
            ready: Mutex::new(None),
            progress: Mutex::new(Progress::default()),
            wake,
        })
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
            State::Starting => Some("the embeddings engine is starting".into()),
            State::Downloading(what) => Some(what.clone()),
            State::Failing(why) => Some(why.clone()),
        }
    }

    /// The vector engine's row of `Status`: the model and where vectors come from, then the
    /// progress (`embedded N chunks, R chunks/s, batch B`) and the last error with its age, or
    /// why it is off, starting, downloading (with a percentage) or failing.
    pub fn engine(&self) -> EngineConfig {
        let state = self.state.lock().expect("embeddings").clone();
        let ready = self.ready();
        let progress = self.progress.lock().expect("embeddings").clone();
        let (enabled, mut detail) = match (state, ready) {
            (State::Off(why), _) => (false, format!("off: {why}")),
            (State::Starting, _) | (State::Ready, None) => (false, "starting".into()),
            (State::Downloading(what), _) => (false, what),
            (State::Ready, Some(r)) => (true, format!("{} ({}) {}", r.model, r.dimension, r.source())),
            (State::Failing(why), Some(r)) => {
                (true, format!("{} ({}) {}; failing: {why}", r.model, r.dimension, r.source()))
            }
            (State::Failing(why), None) => (false, format!("failing: {why}")),
        };
        if enabled && progress.batch > 0 {
            detail.push_str(&format!(
                "; embedded {} chunks, {:.1} chunks/s, batch {}",
                progress.embedded, progress.rate, progress.batch
            ));
        }
        if let Some((error, at)) = &progress.last_error
            && !detail.contains(error.as_str())
        {
            detail.push_str(&format!("; last error {} s ago: {error}", at.elapsed().as_secs()));
        }
        EngineConfig { name: "vector".into(), enabled, detail }
    }

    fn set(&self, s: State) {
        *self.state.lock().expect("embeddings") = s;
    }

    /// A batch of `n` vectors computed in `took` was stored; the next batch has `batch`
    /// inputs. An error of an earlier batch is over then: status no longer shows it.
    fn stored(&self, n: usize, took: Duration, batch: usize) {
        let mut p = self.progress.lock().expect("embeddings");
        p.embedded += n as u64;
        p.rate = n as f64 / took.as_secs_f64().max(1e-6);
        p.batch = batch;
        p.last_error = None;
    }

    /// Runs until `shutdown`: configures from the settings and embeds pending chunks.
    pub async fn run(
        self: Arc<Self>,
        mut config: ConfigRx,
        index: Index,
        credentials: CredentialsClient<AuthChannel>,
        models: PathBuf,
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
                r = self.serve(&settings, index.clone(), credentials.clone(), &models) => r.map_err(Some),
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
                    self.progress.lock().expect("embeddings").last_error = Some((why.clone(), Instant::now()));
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
        credentials: CredentialsClient<AuthChannel>,
        models: &Path,
    ) -> Result<(), String> {
        let Some(choice) = choose(settings, models) else {
            *self.ready.lock().expect("embeddings") = None;
            self.set(State::Off(missing(settings).unwrap_or_else(|| "no embedding engine is configured".into())));
            return std::future::pending().await;
        };
        let keep_ready = self.ready().is_some_and(|r| r.url == choice.source() && r.model == choice.model(settings));
        if !keep_ready {
            self.set(State::Starting);
        }
        let (embedder, model, source, goal, concurrency, min_batch, window) = match choice {
            Choice::Endpoint => {
                let embedder = self.endpoint(settings, credentials).await?;
                let concurrency = settings.concurrency;
                (
                    embedder,
                    settings.model.clone(),
                    settings.url.clone(),
                    settings.timeout / 4,
                    concurrency,
                    1,
                    concurrency,
                )
            }
            Choice::Builtin { dir, download } => {
                let embedder = self.builtin(settings, &dir, download).await?;
                let source = dir.display().to_string();
                (embedder, settings.builtin_model.clone(), source, BUILTIN_BATCH_GOAL, 1, BUILTIN_PASS, BUILTIN_WINDOW)
            }
        };
        let dimension = match &embedder {
            Embedder::Builtin(b) => b.engine.dimension() as u32,
            Embedder::Endpoint(_) if settings.dimensions > 0 => settings.dimensions,
            Embedder::Endpoint(_) => {
                let probe = embedder.embed(&["dimension probe".to_owned()]).await?;
                let first = probe.first().ok_or("the embeddings endpoint answered no vector")?;
                if first.is_empty() {
                    return Err("the embeddings endpoint answered an empty vector".into());
                }
                first.len() as u32
            }
        };
        let reply = index
            .configure_vectors(ConfigureVectorsRequest { model: model.clone(), dimension })
            .await
            .map_err(|e| format!("the store refused the vector configuration: {}", e.message()))?
            .into_inner();
        if reply.reset {
            tracing::info!(model = %model, dimension, dropped = reply.dropped, "Vectors reset: re-embedding every chunk.");
        }
        let ready = Arc::new(Ready { embedder, model, dimension, url: source });
        *self.ready.lock().expect("embeddings") = Some(ready.clone());
        self.set(State::Ready);
        let mut sizer = BatchSizer::new(settings.batch_size, goal).at_least(min_batch);
        {
            let mut p = self.progress.lock().expect("embeddings");
            p.embedded = 0;
            p.batch = sizer.size();
        }
        loop {
            let limit = (sizer.size() * window.max(1)).clamp(1, 4096) as u32;
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
            let batches = length_sorted_batches(
                pending
                    .into_iter()
                    .filter_map(|h| h.chunk.map(|c| (c.id, embed_text(&c.path, &c.title, &c.heading_path, &c.text))))
                    .collect(),
                sizer.size(),
            );
            let mut results = futures_util::stream::iter(batches)
                .map(|batch| {
                    let ready = ready.clone();
                    async move {
                        let texts: Vec<String> = batch.iter().map(|(_, t)| t.clone()).collect();
                        let started = Instant::now();
                        let vectors = ready.embedder.embed_typed(&texts).await?;
                        let took = started.elapsed();
                        if vectors.len() != batch.len() {
                            return Err(EmbedFailure::Other(format!(
                                "the engine answered {} vectors for {} inputs",
                                vectors.len(),
                                batch.len()
                            )));
                        }
                        let embeddings = batch
                            .iter()
                            .zip(vectors)
                            .map(|((id, _), v)| {
                                check_vector(&v, ready.dimension).map(|()| Embedding { chunk_id: *id, vector: v })
                            })
                            .collect::<Result<Vec<_>, String>>()
                            .map_err(EmbedFailure::Other)?;
                        Ok((embeddings, took))
                    }
                })
                .buffer_unordered(concurrency.max(1));
            let mut first_error = None;
            // Each batch is stored as soon as it is computed: a later batch's failure loses
            // nothing already embedded.
            while let Some(r) = results.next().await {
                match r {
                    Ok((embeddings, took)) => {
                        let n = embeddings.len();
                        index
                            .put_embeddings(PutEmbeddingsRequest {
                                model: ready.model.clone(),
                                dimension: ready.dimension,
                                embeddings,
                            })
                            .await
                            .map_err(|e| format!("the store refused vectors: {}", e.message()))?;
                        sizer.took(n, took);
                        self.stored(n, took, sizer.size());
                    }
                    Err(EmbedFailure::Timeout(e)) if sizer.size() > 1 => {
                        // Retried smaller on the next round, not dropped.
                        sizer.timed_out();
                        tracing::info!(batch = sizer.size(), error = %e, "Embedding batch timed out; retrying smaller batches.");
                        let mut p = self.progress.lock().expect("embeddings");
                        p.batch = sizer.size();
                        p.last_error = Some((e, Instant::now()));
                    }
                    Err(e) => {
                        first_error.get_or_insert(e.to_string());
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
            self.set(State::Ready);
        }
    }

    /// The endpoint client for `settings` (its credential resolved).
    async fn endpoint(
        &self,
        settings: &EmbeddingsSettings,
        mut credentials: CredentialsClient<AuthChannel>,
    ) -> Result<Embedder, String> {
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
        Ok(Embedder::Endpoint(embedder))
    }

    /// The built-in engine with the model in `dir`, downloaded first when `download` (the
    /// state shows the progress).
    async fn builtin(&self, settings: &EmbeddingsSettings, dir: &Path, download: bool) -> Result<Embedder, String> {
        if let Some(r) = self.ready()
            && r.url == dir.display().to_string()
            && r.model == settings.builtin_model
            && let Embedder::Builtin(b) = &r.embedder
        {
            return Ok(Embedder::Builtin(Builtin { engine: b.engine.clone(), turn: tokio::sync::Mutex::new(()) }));
        }
        if download {
            let model =
                coffer_embed::catalogue::find(&settings.builtin_model).ok_or_else(|| unknown_model(settings))?;
            let name = model.name;
            let mut shown_at = Instant::now() - Duration::from_secs(1);
            tracing::info!(model = name, folder = %dir.display(), hub = %embeddings_client::shown_url_str(&settings.hub_url), "Downloading the built-in embedding model.");
            self.set(State::Downloading(format!(
                "downloading {name} from {}",
                embeddings_client::shown_url_str(&settings.hub_url)
            )));
            coffer_embed::hub::ensure_model(model, &settings.hub_url, dir, |p| {
                if shown_at.elapsed() >= Duration::from_millis(250) {
                    shown_at = Instant::now();
                    self.set(State::Downloading(download_line(name, p)));
                }
            })
            .await
            .map_err(|e| e.to_string())?;
            tracing::info!(model = name, folder = %dir.display(), "Built-in embedding model downloaded.");
        }
        let owned = dir.to_owned();
        let engine = tokio::task::spawn_blocking(move || coffer_embed::Engine::load(&owned))
            .await
            .map_err(|e| format!("loading the built-in model stopped: {e}"))?
            .map_err(|e| format!("the built-in model cannot be loaded: {e}"))?;
        Ok(Embedder::Builtin(Builtin { engine: Arc::new(engine), turn: tokio::sync::Mutex::new(()) }))
    }
}

/// `downloading all-MiniLM-L6-v2: model.safetensors 41% (37.2 of 90.9 MB)`.
fn download_line(model: &str, p: &coffer_embed::hub::Progress) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    match (p.done * 100).checked_div(p.total) {
        Some(pct) => {
            format!("downloading {model}: {} {pct}% ({:.1} of {:.1} MB)", p.file, mb(p.done), mb(p.total))
        }
        None => format!("downloading {model}: {} {:.1} MB", p.file, mb(p.done)),
    }
}

fn unknown_model(settings: &EmbeddingsSettings) -> String {
    let names: Vec<&str> = coffer_embed::catalogue::MODELS.iter().map(|m| m.name).collect();
    format!(
        "retrieval.embeddings.builtin_model {:?} is not a model the built-in engine can download (one of {}); set retrieval.embeddings.model_dir to a folder holding its files to use another BERT-style model",
        settings.builtin_model,
        names.join(", ")
    )
}

/// Which engine the settings pick.
#[derive(Debug, Clone, PartialEq)]
enum Choice {
    /// The OpenAI-compatible endpoint (`url` and `model` set).
    Endpoint,
    /// The built-in engine, its model in `dir`; `download`: fetch it from the hub first.
    Builtin { dir: PathBuf, download: bool },
}

impl Choice {
    fn source(&self) -> String {
        match self {
            Choice::Endpoint => String::new(),
            Choice::Builtin { dir, .. } => dir.display().to_string(),
        }
    }

    fn model(&self, settings: &EmbeddingsSettings) -> String {
        match self {
            Choice::Endpoint => settings.model.clone(),
            Choice::Builtin { .. } => settings.builtin_model.clone(),
        }
    }
}

/// The engine `settings` pick, `None` when vectors are off (see [`missing`] for why). The
/// endpoint wins when its URL is set; else the built-in model, from `model_dir`, or from
/// `models/<name>` (downloaded first when its files are not all there and a hub is set).
fn choose(settings: &EmbeddingsSettings, models: &Path) -> Option<Choice> {
    if !settings.url.trim().is_empty() {
        return (!settings.model.trim().is_empty()).then_some(Choice::Endpoint);
    }
    let name = settings.builtin_model.trim();
    if name.is_empty() {
        return None;
    }
    if !settings.model_dir.trim().is_empty() {
        return Some(Choice::Builtin { dir: PathBuf::from(settings.model_dir.trim()), download: false });
    }
    let dir = models.join(name);
    let complete = coffer_embed::engine::REQUIRED_FILES.iter().all(|f| dir.join(f).is_file());
    if complete {
        return Some(Choice::Builtin { dir, download: false });
    }
    if settings.hub_url.trim().is_empty() {
        return None;
    }
    Some(Choice::Builtin { dir, download: true })
}

/// `inputs` (chunk id, text to embed) cut into batches of at most `size`, shortest texts first
/// (byte length, a proxy for token count): every input of a forward pass is padded to the
/// pass's longest, so similar lengths together waste the least. Ties keep id order.
pub fn length_sorted_batches(mut inputs: Vec<(i64, String)>, size: usize) -> Vec<Vec<(i64, String)>> {
    inputs.sort_by_key(|(_, text)| text.len());
    inputs.chunks(size.max(1)).map(<[_]>::to_vec).collect()
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

    fn with(url: &str, model: &str) -> EmbeddingsSettings {
        EmbeddingsSettings {
            url: url.into(),
            model: model.into(),
            credential: String::new(),
            dimensions: 0,
            batch_size: 1,
            concurrency: 1,
            timeout: Duration::from_secs(1),
            builtin_model: String::new(),
            model_dir: String::new(),
            hub_url: String::new(),
        }
    }

    #[test]
    fn pending_chunks_are_batched_by_length_and_none_is_lost() {
        let lengths = [300, 5, 120, 5, 40, 300, 1, 77, 200];
        let inputs: Vec<(i64, String)> = lengths.iter().enumerate().map(|(i, n)| (i as i64, "x".repeat(*n))).collect();
        let batches = length_sorted_batches(inputs, 4);
        let shape: Vec<Vec<(i64, usize)>> =
            batches.iter().map(|b| b.iter().map(|(id, t)| (*id, t.len())).collect()).collect();
        assert_eq!(
            shape,
            vec![vec![(6, 1), (1, 5), (3, 5), (4, 40)], vec![(7, 77), (2, 120), (8, 200), (0, 300)], vec![(5, 300)],],
            "shortest first, ties in id order, every chunk once"
        );
        assert_eq!(length_sorted_batches(vec![(1, "a".into())], 0).len(), 1, "a size of 0 is taken as 1");
        assert!(length_sorted_batches(Vec::new(), 16).is_empty());
    }

    #[test]
    fn half_a_configuration_keeps_the_engine_off_and_says_what_is_missing() {
        let off = missing(&with("", "")).unwrap();
        assert!(off.contains("built-in engine off"), "{off}");
        let no_model = missing(&with("http://127.0.0.1:9/v1", "")).unwrap();
        assert!(
            no_model.starts_with("retrieval.embeddings.model is not set") && no_model.contains("set both"),
            "{no_model}"
        );
        assert!(missing(&with("http://127.0.0.1:9/v1", "  ")).is_some(), "a blank model is no model");
        assert_eq!(missing(&with("http://127.0.0.1:9/v1", "bge-small")), None);
        let models = Path::new("/nonexistent/models");
        assert_eq!(choose(&with("http://127.0.0.1:9/v1", "bge-small"), models), Some(Choice::Endpoint));
        assert_eq!(choose(&with("", ""), models), None);
    }

    #[test]
    fn without_an_endpoint_the_builtin_engine_is_chosen_and_downloads_only_what_is_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = with("", "");
        s.builtin_model = "all-MiniLM-L6-v2".into();
        s.hub_url = "https://hub.example".into();
        let dir = tmp.path().join("all-MiniLM-L6-v2");
        assert_eq!(choose(&s, tmp.path()), Some(Choice::Builtin { dir: dir.clone(), download: true }));
        std::fs::create_dir_all(&dir).unwrap();
        for f in coffer_embed::engine::REQUIRED_FILES {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        assert_eq!(choose(&s, tmp.path()), Some(Choice::Builtin { dir: dir.clone(), download: false }));
        // No hub and no files: off, saying what to do.
        s.hub_url.clear();
        std::fs::remove_file(dir.join("model.safetensors")).unwrap();
        assert_eq!(choose(&s, tmp.path()), None);
        assert!(missing(&s).unwrap().contains("set retrieval.embeddings.model_dir"));
        // A folder the user names is used as it is, never downloaded into.
        s.model_dir = "/srv/models/minilm".into();
        assert_eq!(
            choose(&s, tmp.path()),
            Some(Choice::Builtin { dir: PathBuf::from("/srv/models/minilm"), download: false })
        );
        assert_eq!(missing(&s), None);
        // An endpoint wins over the built-in engine.
        s.url = "http://127.0.0.1:9/v1".into();
        s.model = "m".into();
        assert_eq!(choose(&s, tmp.path()), Some(Choice::Endpoint));
        let unknown = unknown_model(&EmbeddingsSettings { builtin_model: "gte-huge".into(), ..with("", "") });
        assert!(
            unknown.contains("\"gte-huge\"") && unknown.contains("paraphrase-multilingual-MiniLM-L12-v2"),
            "{unknown}"
        );
    }

    #[test]
    fn the_batch_size_follows_the_measured_latency() {
        let mut b = BatchSizer::new(32, Duration::from_secs(1));
        assert_eq!(b.size(), 32);
        // 32 chunks in 4 s: 125 ms each, 8 fit the goal.
        b.took(32, Duration::from_secs(4));
        assert_eq!(b.size(), 8);
        // Slightly slow: at least halved.
        b.took(8, Duration::from_millis(1100));
        assert_eq!(b.size(), 4);
        b.timed_out();
        assert_eq!(b.size(), 2);
        b.timed_out();
        b.timed_out();
        assert_eq!(b.size(), 1, "never below 1");
        // Quick batches grow it back, never past the setting.
        for _ in 0..20 {
            let n = b.size();
            b.took(n, Duration::from_millis(100));
        }
        assert_eq!(b.size(), 32);
        // A short last batch (fewer pending chunks) says nothing about growing.
        let mut c = BatchSizer::new(32, Duration::from_secs(1));
        c.took(32, Duration::from_secs(2));
        let before = c.size();
        c.took(3, Duration::from_millis(10));
        assert_eq!(c.size(), before);
        // The built-in engine's floor: slow batches do not take it below one forward pass.
        let mut d = BatchSizer::new(32, Duration::from_secs(1)).at_least(16);
        d.took(32, Duration::from_secs(8));
        assert_eq!(d.size(), 16);
        d.took(16, Duration::from_secs(8));
        d.timed_out();
        assert_eq!(d.size(), 16, "never below the floor");
        assert_eq!(
            BatchSizer::new(4, Duration::from_secs(1)).at_least(16).size(),
            4,
            "the floor is at most the setting"
        );
    }

    #[test]
    fn vectors_are_checked_for_length_and_finiteness() {
        assert_eq!(check_vector(&[0.1, 0.2], 2), Ok(()));
        assert!(check_vector(&[0.1], 2).unwrap_err().contains("1 dimensions; expected 2"));
        assert!(check_vector(&[0.1, f32::NAN], 2).unwrap_err().contains("NaN"));
        assert!(check_vector(&[f32::INFINITY, 0.0], 2).is_err());
    }

    #[test]
    fn the_settings_check_names_the_files_the_engine_reads() {
        assert_eq!(coffer_types::settings::EMBEDDINGS_MODEL_FILES, coffer_embed::engine::REQUIRED_FILES);
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
        e.progress.lock().unwrap().last_error = Some(("connection refused".into(), Instant::now()));
        assert!(!e.engine().detail.contains("last error"), "the error shown once");
        // A batch stored after an error: the error is over, no longer shown as the last one.
        e.set(State::Starting);
        e.progress.lock().unwrap().last_error = Some(("connection refused".into(), Instant::now()));
        assert!(e.engine().detail.contains("last error"), "{}", e.engine().detail);
        e.stored(8, Duration::from_millis(10), 16);
        assert!(!e.engine().detail.contains("last error"), "a stale error after a success: {}", e.engine().detail);
        e.set(State::Downloading("downloading all-MiniLM-L6-v2: model.safetensors 41% (37.2 of 90.9 MB)".into()));
        assert!(e.engine().detail.starts_with("downloading all-MiniLM-L6-v2"));
        assert!(!e.engine().enabled);
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
