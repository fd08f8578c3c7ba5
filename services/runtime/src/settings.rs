//! The settings follower every service that reads settings uses: it reads the store's
//! Settings service once, then again on every setting change the store's change stream
//! reports and every [`POLL`] in case the stream is down, and publishes the service's own typed
//! view of them on a `watch` channel.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::store::changes_client::ChangesClient;
use coffer_proto::store::settings_client::SettingsClient;
use coffer_proto::store::{ChangeEntity, GetSettingsRequest, HeadRequest, WatchChangesRequest};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::grpc::AuthChannel;

/// How often settings are re-read when no change arrives.
pub const POLL: Duration = Duration::from_secs(5);

/// A service's typed view of the settings it reads (its `Config`).
pub trait FromSettings: PartialEq + Send + Sync + Sized + 'static {
    /// The view of the store's flat settings map (key → stored text), with defaults applied
    /// for unset or unusable values.
    fn from_settings(values: &HashMap<String, String>) -> Self;

    /// Logs the view that has just come into force (called once per change, not per read).
    fn log_in_force(&self);
}

/// Keeps `tx` current until `shutdown`: reads the settings once, then again on every setting
/// change the store streams and every [`POLL`]. A value is sent only when it differs from the
/// current one. A store that is down leaves the last value in force (the defaults before the
/// first read); failed reads are logged at debug level.
pub async fn follow<C: FromSettings>(
    settings: SettingsClient<AuthChannel>,
    changes: ChangesClient<AuthChannel>,
    tx: watch::Sender<Arc<C>>,
    shutdown: CancellationToken,
) {
    let reload = |mut settings: SettingsClient<AuthChannel>, tx: watch::Sender<Arc<C>>| async move {
        match settings.get_settings(GetSettingsRequest {}).await {
            Ok(map) => {
                let config = C::from_settings(&map.into_inner().values);
                tx.send_if_modified(|cur| {
                    let changed = **cur != config;
                    if changed {
                        config.log_in_force();
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
