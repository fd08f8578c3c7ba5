//! The common shape of a service binary's `main` (linkerd2-proxy style): read `COFFER_HOME`,
//! init tracing to `logs/<service>.log`, build a runtime, run until SIGTERM, drain, exit.
use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::home::CofferHome;

/// The async runtime a service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Two worker threads (tokio's multi-threaded scheduler).
    MultiThread,
    /// Every task on the main thread (tokio's current-thread scheduler): no hand-over of a
    /// woken task to another thread, which is what a request path crossing several processes
    /// on a small machine pays for most. For services whose work is short async steps.
    CurrentThread,
}

/// Runs `body(home, shutdown)` as service `name` on a [`Flavor::MultiThread`] runtime; see
/// [`service_main_on`].
pub fn service_main<F, Fut>(name: &'static str, body: F) -> std::process::ExitCode
where
    F: FnOnce(CofferHome, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    service_main_on(name, Flavor::MultiThread, body)
}

/// Runs `body(home, shutdown)` as service `name` on a runtime of `flavor`. `shutdown` is
/// cancelled on SIGTERM or SIGINT; `body` should then drain and return. Failures are logged and
/// printed to stderr (which the supervisor captures in `logs/<name>.stdio`) and give exit code 1.
pub fn service_main_on<F, Fut>(name: &'static str, flavor: Flavor, body: F) -> std::process::ExitCode
where
    F: FnOnce(CofferHome, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let home = match CofferHome::from_env() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("coffer-{name}: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let _guard = match crate::logging::init_file(&home, name) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("coffer-{name}: cannot open logs in {}: {e:#}", home.logs().display());
            return std::process::ExitCode::from(1);
        }
    };
    let mut builder = match flavor {
        Flavor::MultiThread => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    };
    let rt = builder.enable_all().build().expect("tokio runtime");
    let result = rt.block_on(async move {
        let shutdown = CancellationToken::new();
        let s2 = shutdown.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            s2.cancel();
        });
        tracing::info!(service = name, pid = std::process::id(), version = crate::VERSION, "Service starting.");
        body(home, shutdown).await
    });
    match result {
        Ok(()) => {
            tracing::info!(service = name, "Service stopped.");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(service = name, error = %format!("{e:#}"), "Service failed.");
            eprintln!("coffer-{name}: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Serves only the standard health service on the inherited listener (services whose domain
/// RPCs come in later issues).
///
/// # Errors
/// When the listener or token is unusable.
pub async fn run_health_only(shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = crate::listen::inherited(crate::env::LISTEN_FD)?;
    let token = crate::grpc::internal_token_from_env()?;
    crate::grpc::serve_with_health(listener, token, tonic::service::Routes::default(), shutdown).await?;
    Ok(())
}
