//! Retrieval's settings (`retrieval.*` rows of `coffer_types::settings`), read from the store's
//! Settings service and kept current: re-read whenever the store's change stream reports a
//! setting change, and every few seconds in case the stream is down.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::store::changes_client::ChangesClient;
use coffer_proto::store::settings_client::SettingsClient;
use coffer_proto::store::{ChangeEntity, GetSettingsRequest, HeadRequest, WatchChangesRequest};
use coffer_runtime::grpc::AuthChannel;
use coffer_types::settings as s;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often settings are re-read when no change arrives.
pub const POLL: Duration = Duration::from_secs(5);

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
}

impl std::fmt::Debug for EmbeddingsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = if self.url.is_empty() { String::new() } else { crate::embed::shown_url_str(&self.url) };
        f.debug_struct("EmbeddingsSettings")
            .field("url", &url)
            .field("model", &self.model)
            .field("credential", &self.credential)
            .field("dimensions", &self.dimensions)
            .field("batch_size", &self.batch_size)
            .field("concurrency", &self.concurrency)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Every setting retrieval reads, with defaults applied for unset or unusable values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Per-engine deadline of a search.
    pub engine_timeout: Duration,
    /// Largest file a KB indexes, bytes.
    pub max_file_bytes: u64,
    /// The embeddings endpoint.
    pub embeddings: EmbeddingsSettings,
    /// The sync worker's settings (`sync.*`).
    pub sync: SyncSettings,
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
            embeddings: EmbeddingsSettings {
                url: text(&s::EMBEDDINGS_URL).trim_end_matches('/').to_owned(),
                model: text(&s::EMBEDDINGS_MODEL),
                credential: text(&s::EMBEDDINGS_CREDENTIAL),
                dimensions: int(&s::EMBEDDINGS_DIMENSIONS) as u32,
                batch_size: int(&s::EMBEDDINGS_BATCH_SIZE) as usize,
                concurrency: int(&s::EMBEDDINGS_CONCURRENCY) as usize,
                timeout: Duration::from_millis(int(&s::EMBEDDINGS_TIMEOUT_MS)),
            },
            sync: SyncSettings {
                auto: int(&s::SYNC_AUTO) == 1,
                debounce: Duration::from_secs(int(&s::SYNC_DEBOUNCE_S)),
                pull_interval: Duration::from_secs(int(&s::SYNC_PULL_INTERVAL_S)),
                machine: text(&s::SYNC_MACHINE_NAME),
            },
        }
    }
}

/// A shared, current [`Config`].
pub type ConfigRx = watch::Receiver<Arc<Config>>;

/// Keeps `tx` current until `shutdown`: reads the settings once, then again on every setting
/// change the store streams and every [`POLL`]. A store that is down leaves the last value in
/// force (the defaults before the first read).
pub async fn follow(
    settings: SettingsClient<AuthChannel>,
    changes: ChangesClient<AuthChannel>,
    tx: watch::Sender<Arc<Config>>,
    shutdown: CancellationToken,
) {
    let reload = |mut settings: SettingsClient<AuthChannel>, tx: watch::Sender<Arc<Config>>| async move {
        match settings.get_settings(GetSettingsRequest {}).await {
            Ok(map) => {
                let config = Config::from_values(&map.into_inner().values);
                tx.send_if_modified(|cur| {
                    let changed = **cur != config;
                    if changed {
                        tracing::info!(?config, "Retrieval settings in force.");
                        *cur = Arc::new(config);
                    }
                    changed
                });
            }
            Err(e) => tracing::debug!(error = %e.message(), "Cannot read settings yet."),
        }
    };
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A stream from the current head: every setting change after it wakes a reload.
        let mut ch = changes.clone();
        let stream = async {
            let head = ch.head(HeadRequest {}).await.ok()?.into_inner().seq;
            ch.watch_changes(WatchChangesRequest { from_seq: head }).await.ok().map(|s| s.into_inner())
        }
        .await;
        reload(settings.clone(), tx.clone()).await;
        let Some(mut stream) = stream else {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => continue,
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => reload(settings.clone(), tx.clone()).await,
                msg = stream.message() => match msg {
                    Ok(Some(c)) if c.entity == ChangeEntity::Setting as i32 => reload(settings.clone(), tx.clone()).await,
                    Ok(Some(_)) => {}
                    // Ended or failed (the store restarted): reconnect after the next tick.
                    _ => {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tick.tick() => break,
                        }
                    }
                },
            }
        }
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
        assert_eq!(d.embeddings.url, "");
        assert_eq!((d.embeddings.batch_size, d.embeddings.concurrency), (32, 2));
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
    fn debug_hides_what_a_url_may_carry() {
        let e = EmbeddingsSettings {
            url: "http://alice:hunter2@127.0.0.1:8191/v1?api_key=QUERYSECRET".into(),
            model: "m".into(),
            credential: String::new(),
            dimensions: 0,
            batch_size: 1,
            concurrency: 1,
            timeout: Duration::from_secs(1),
        };
        let shown = format!("{e:?}");
        assert!(shown.contains("http://127.0.0.1:8191/v1"), "{shown}");
        assert!(!shown.contains("hunter2") && !shown.contains("alice") && !shown.contains("QUERYSECRET"), "{shown}");
    }
}
