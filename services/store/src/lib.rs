//! The store service (`coffer-store`): the only process that opens `coffer.db` read-write.
//! It migrates the database before it reports healthy, serialises every write through one
//! writer thread, and streams committed changes to the other services.
//!
//! It serves one gRPC service per domain of `coffer.db` (registry, credentials, settings, audit,
//! invocations, changes, maintenance, the retrieval indexes `index` and the chat service's
//! `conversations`; see [`domain`]), all on
//! its one listener. SQL lives only in those modules, in [`db`] (the writer/reader plumbing and
//! migrations), and in the maintenance domain's workers [`retention`] and [`backup`].

pub mod authz;
pub mod backup;
pub mod credential_crypto;
pub mod db;
pub mod domain;
pub mod fts_rank;
pub mod retention;

use coffer_runtime::identity::Identity;
use coffer_runtime::service::ServiceCtx;

/// Process entry for `coffer-store`.
pub fn main_entry() -> std::process::ExitCode {
    // The store is a background service: nothing on the MCP request path waits on it (policy
    // is a snapshot in the gateway, invocation records are queued). Set before the runtime
    // starts its threads, so that all of them (and the writer thread) inherit it.
    let (priority, warning) = coffer_runtime::sched::background_priority();
    coffer_runtime::service::service_main(Identity::Store, move |ctx| async move {
        if let Some(warning) = warning {
            tracing::warn!("{warning}.");
        }
        tracing::debug!(?priority, "Background priority.");
        run(ctx).await
    })
}

/// Opens and migrates the DB, then serves every store service ([`domain::routes`]) and health on
/// the service's listener until `shutdown`, each call authorized by [`authz::POLICY`].
///
/// # Errors
/// When the database is unusable or the server fails.
pub async fn run(ctx: ServiceCtx) -> anyhow::Result<()> {
    let ServiceCtx { home, listener, internal, shutdown, .. } = ctx;
    let db = db::Db::open(&home.db())?;
    tracing::info!(path = %home.db().display(), head = db.head(), "Database open and migrated.");
    let vault = credential_crypto::CredentialCrypto::new(home.secret_key());
    // Retention runs beside the RPCs, through the same single writer: a pass now, then hourly.
    let retention = retention::spawn(db.clone(), shutdown.clone());
    let routes = domain::routes(&db, vault);
    coffer_runtime::grpc::serve_with_health(listener, internal.auth_layer(authz::POLICY), routes, shutdown.clone())
        .await?;
    // The worker stops between two batches once shutdown is cancelled.
    shutdown.cancel();
    let _ = retention.await;
    // Fold the WAL back into the main file so a stopped Coffer is one self-contained coffer.db.
    if let Err(e) = db.checkpoint().await {
        tracing::warn!(error = %e, "WAL checkpoint at shutdown failed.");
    }
    Ok(())
}
