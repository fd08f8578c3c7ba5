//! Retrieval's settings (`retrieval.*` rows of `coffer_types::settings`), read from the store's
//! Settings service and kept current by the shared follower
//! ([`coffer_runtime::settings::follow`]).
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coffer_types::settings as s;
use tokio::sync::watch;

/// The embeddings endpoint's settings (`retrieval.embeddings.*`). Its `Debug` shows the URL
/// without user, password or query.
#[derive(Clone, PartialEq, Eq)]
pub struct EmbeddingsSettings {
    /// Base URL; empty = vector engine off.
    pub url: String,
    /// Model name.
    pub model: String,
    /// Credential name whose value is the bearer token; empty = none.
    pub credential: String,
    /// Asked dimension; 0 = whatever the endpoint answers.
    pub dimensions: u32,
    /// Chunks per request.
    pub batch_size: usize,
    /// Requests in flight.
    pub concurrency: usize,
    /// Per-request deadline.
    pub timeout: Duration,
    /// The built-in engine's model (used while `url` is empty); empty = built-in engine off.
    pub builtin_model: String,
    /// Folder of the built-in model's files; empty = `COFFER_HOME/models/<builtin_model>`.
    pub model_dir: String,
    /// Hub a missing built-in model is downloaded from; empty = never download.
    pub hub_url: String,
}

impl std::fmt::Debug for EmbeddingsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = if self.url.is_empty() { String::new() } else { crate::embeddings_client::shown_url_str(&self.url) };
        f.debug_struct("EmbeddingsSettings")
            .field("url", &url)
            .field("model", &self.model)
            .field("credential", &self.credential)
            .field("dimensions", &self.dimensions)
            .field("batch_size", &self.batch_size)
            .field("concurrency", &self.concurrency)
            .field("timeout", &self.timeout)
            .field("builtin_model", &self.builtin_model)
            .field("model_dir", &self.model_dir)
            .field(
                "hub_url",
                &if self.hub_url.is_empty() {
                    String::new()
                } else {
                    crate::embeddings_client::shown_url_str(&self.hub_url)
                },
            )
            .finish()
    }
}

/// Every setting retrieval reads, with defaults applied for unset or unusable values.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Per-engine deadline of a search.
    pub engine_timeout: Duration,
    /// Largest file a KB indexes, bytes.
    pub max_file_bytes: u64,
    /// How often an idle KB is rescanned (`retrieval.rescan_interval_s`); zero = never.
    pub rescan_interval: Duration,
    /// The embeddings endpoint.
    pub embeddings: EmbeddingsSettings,
    /// The sync worker's settings (`sync.*`).
    pub sync: SyncSettings,
    /// The fusion's method, k and engine weights (`retrieval.fusion.method`, `.k`, `.*_weight`).
    pub fusion: crate::fusion::Params,
}

/// The sync worker's settings (`sync.*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSettings {
    /// `sync.auto`: the worker runs.
    pub auto: bool,
    /// `sync.debounce_s`: quiet time after a local change before a sync.
    pub debounce: Duration,
    /// `sync.pull_interval_s`: the longest time between syncs.
    pub pull_interval: Duration,
    /// `sync.machine_name` (empty: the host name).
    pub machine: String,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_values(&HashMap::new())
    }
}

impl Config {
    /// From the store's flat settings map.
    pub fn from_values(values: &HashMap<String, String>) -> Self {
        let int = |setting: &s::Setting| setting.value_or_default(values.get(setting.key).map(String::as_str));
        let text = |setting: &s::Setting| setting.text_or_default(values.get(setting.key).map(String::as_str));
        Self {
            engine_timeout: Duration::from_millis(int(&s::ENGINE_TIMEOUT_MS)),
            max_file_bytes: int(&s::MAX_FILE_BYTES),
            rescan_interval: Duration::from_secs(int(&s::RESCAN_INTERVAL_S)),
            embeddings: EmbeddingsSettings {
                url: text(&s::EMBEDDINGS_URL).trim_end_matches('/').to_owned(),
                model: text(&s::EMBEDDINGS_MODEL),
                credential: text(&s::EMBEDDINGS_CREDENTIAL),
                dimensions: int(&s::EMBEDDINGS_DIMENSIONS) as u32,
                batch_size: int(&s::EMBEDDINGS_BATCH_SIZE) as usize,
                concurrency: int(&s::EMBEDDINGS_CONCURRENCY) as usize,
                timeout: Duration::from_millis(int(&s::EMBEDDINGS_TIMEOUT_MS)),
                builtin_model: text(&s::EMBEDDINGS_BUILTIN_MODEL),
                model_dir: text(&s::EMBEDDINGS_MODEL_DIR),
                hub_url: if hub_offline() {
                    String::new()
                } else {
                    text(&s::EMBEDDINGS_HUB_URL).trim_end_matches('/').to_owned()
                },
            },
            sync: SyncSettings {
                auto: int(&s::SYNC_AUTO) == 1,
                debounce: Duration::from_secs(int(&s::SYNC_DEBOUNCE_S)),
                pull_interval: Duration::from_secs(int(&s::SYNC_PULL_INTERVAL_S)),
                machine: text(&s::SYNC_MACHINE_NAME),
            },
            fusion: crate::fusion::Params {
                method: crate::fusion::Method::parse(&text(&s::FUSION_METHOD)),
                k: int(&s::FUSION_K) as f64,
                grep: int(&s::FUSION_GREP_WEIGHT) as f64,
                keyword: int(&s::FUSION_KEYWORD_WEIGHT) as f64,
                vector: int(&s::FUSION_VECTOR_WEIGHT) as f64,
            },
        }
    }
}

/// `HF_HUB_OFFLINE` is set to `1`, `true`, `yes` or `on` (any case): the Hugging Face tools'
/// variable for "never download", honoured the same way here (the built-in engine's hub is then
/// off whatever `retrieval.embeddings.hub_url` says). The test harness sets it so no test reaches
/// a real hub.
pub fn hub_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// A shared, current [`Config`].
pub type ConfigRx = watch::Receiver<Arc<Config>>;

pub use coffer_runtime::settings::follow;

impl coffer_runtime::settings::FromSettings for Config {
    fn from_settings(values: &HashMap<String, String>) -> Self {
        Self::from_values(values)
    }

    fn log_in_force(&self) {
        tracing::info!(config = ?self, "Retrieval settings in force.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_and_values_are_read() {
        let d = Config::default();
        assert_eq!(d.engine_timeout, Duration::from_millis(2000));
        assert_eq!(d.max_file_bytes, 16 * 1024 * 1024);
        assert_eq!(d.rescan_interval, Duration::from_secs(300));
        assert_eq!(d.embeddings.url, "");
        assert_eq!((d.embeddings.batch_size, d.embeddings.concurrency), (32, 2));
        assert_eq!(d.embeddings.builtin_model, "all-MiniLM-L6-v2", "the built-in engine is on by default");
        let hub = if hub_offline() { "" } else { "https://huggingface.co" };
        assert_eq!((d.embeddings.model_dir.as_str(), d.embeddings.hub_url.as_str()), ("", hub));
        let values: HashMap<String, String> = [
            ("retrieval.embeddings.url", "http://127.0.0.1:9/v1/"),
            ("retrieval.embeddings.model", "m"),
            ("retrieval.embeddings.dimensions", "8"),
            ("retrieval.engine_timeout_ms", "nonsense"),
            ("retrieval.max_file_bytes", "4096"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let c = Config::from_values(&values);
        assert_eq!(c.embeddings.url, "http://127.0.0.1:9/v1", "a trailing slash is dropped");
        assert_eq!((c.embeddings.model.as_str(), c.embeddings.dimensions), ("m", 8));
        assert_eq!(c.engine_timeout, Duration::from_millis(2000), "an unusable value keeps the default");
        assert_eq!(c.max_file_bytes, 4096);
    }

    #[test]
    fn fusion_weights_default_and_are_read() {
        let d = Config::default().fusion;
        assert_eq!((d.grep, d.keyword, d.vector), (1.0, 3.0, 2.0));
        assert_eq!((d.method, d.k), (crate::fusion::Method::Scores, 60.0));
        let values: HashMap<String, String> = [
            ("retrieval.fusion.method", "rrf"),
            ("retrieval.fusion.k", "10"),
            ("retrieval.fusion.keyword_weight", "3"),
            ("retrieval.fusion.vector_weight", "0"),
            ("retrieval.fusion.grep_weight", "-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let c = Config::from_values(&values).fusion;
        assert_eq!((c.method, c.k), (crate::fusion::Method::Rrf, 10.0));
        assert_eq!(c.keyword, 3.0);
        assert_eq!((c.vector, c.grep), (2.0, 1.0), "out of bounds or not a number: the default");
    }

    #[test]
    fn debug_hides_what_a_url_may_carry() {
        let e = EmbeddingsSettings {
            url: "http://alice:hunter2@127.0.0.1:8191/v1?api_key=QUERYSECRET".into(),
            model: "m".into(),
            credential: String::new(),
            dimensions: 0,
            batch_size: 1,
            concurrency: 1,
            timeout: Duration::from_secs(1),
            builtin_model: String::new(),
            model_dir: String::new(),
            hub_url: "https://bob:pw@hub.example/?token=HUBSECRET".into(),
        };
        let shown = format!("{e:?}");
        assert!(shown.contains("http://127.0.0.1:8191/v1"), "{shown}");
        assert!(!shown.contains("hunter2") && !shown.contains("alice") && !shown.contains("QUERYSECRET"), "{shown}");
        assert!(!shown.contains("HUBSECRET") && !shown.contains("pw@"), "{shown}");
    }
}
