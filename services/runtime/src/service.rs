//! The common shape of a service binary's `main` (linkerd2-proxy style): read `COFFER_HOME`,
//! init tracing to `logs/<service>.log`, build a runtime, assemble the [`ServiceCtx`] from what
//! the supervisor passed, run until SIGTERM, drain, exit.
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::authz::Policy;
use crate::grpc::InternalAuthLayer;
use crate::home::CofferHome;
use crate::identity::{Identity, PeerDigests};

/// The async runtime a service runs on; a column of the supervisor's table, passed to the
/// child as [`crate::env::FLAVOR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Two worker threads (tokio's multi-threaded scheduler).
    MultiThread,
    /// Every task on the main thread (tokio's current-thread scheduler): no hand-over of a
    /// woken task to another thread, which is what a request path crossing several processes
    /// on a small machine pays for most. For services whose work is short async steps.
    CurrentThread,
}

impl Flavor {
    /// The value of [`crate::env::FLAVOR`] naming this flavour.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MultiThread => "multi-thread",
            Self::CurrentThread => "current-thread",
        }
    }

    /// The flavour named by [`crate::env::FLAVOR`]; [`Flavor::MultiThread`] when unset.
    ///
    /// # Errors
    /// [`ServiceError::Flavor`] for any other value.
    pub fn from_env() -> Result<Self, ServiceError> {
        match std::env::var(crate::env::FLAVOR) {
            Err(_) => Ok(Self::MultiThread),
            Ok(v) if v == Self::MultiThread.as_str() => Ok(Self::MultiThread),
            Ok(v) if v == Self::CurrentThread.as_str() => Ok(Self::CurrentThread),
            Ok(v) => Err(ServiceError::Flavor(v)),
        }
    }
}

/// Error assembling a service's [`ServiceCtx`] from its environment.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Listen(#[from] crate::listen::ListenError),
    #[error(transparent)]
    Identity(#[from] crate::identity::IdentityError),
    #[error("environment variable {0} is not set: this binary is started by coffer-daemon")]
    Missing(&'static str),
    #[error("no address for {peer}: environment variable {var} is not set")]
    NoAddress { peer: Identity, var: &'static str },
    #[error("the address of {peer} is not usable: {source}")]
    Channel { peer: Identity, source: tonic::transport::Error },
    #[error("COFFER_FLAVOR={0:?} is neither multi-thread nor current-thread")]
    Flavor(String),
}

/// Everything a service needs from the supervisor, handed to its `main` body by
/// [`service_main`]: destructure it (`let ServiceCtx { listener, internal, .. } = ctx;`).
pub struct ServiceCtx {
    /// `COFFER_HOME`.
    pub home: CofferHome,
    /// Who this service is (its row in the supervisor's table).
    pub identity: Identity,
    /// Its internal gRPC listener (inherited, [`crate::env::LISTEN_FD`]); serve it with
    /// [`crate::grpc::serve_with_health`] behind [`Internal::auth_layer`].
    pub listener: tokio::net::TcpListener,
    /// Its own token, the digests it accepts, and the other services' addresses.
    pub internal: Internal,
    /// Cancelled on SIGTERM or SIGINT: drain and return.
    pub shutdown: CancellationToken,
}

/// A service's internal identity: its own token (sent on its calls), the digests of the tokens
/// it accepts (checked on calls it serves), and where the other services listen. Cheap to clone.
#[derive(Clone)]
pub struct Internal {
    token: SecretString,
    peers: Arc<PeerDigests>,
    addrs: Arc<BTreeMap<Identity, String>>,
}

impl Internal {
    /// From parts (tests use made-up tokens and addresses).
    pub fn new(token: SecretString, peers: PeerDigests, addrs: BTreeMap<Identity, String>) -> Self {
        Self { token, peers: Arc::new(peers), addrs: Arc::new(addrs) }
    }

    /// From [`crate::env::INTERNAL_TOKEN`], [`crate::env::PEER_DIGESTS`] and each identity's
    /// address variable ([`Identity::addr_var`]; unset ones are left out).
    ///
    /// # Errors
    /// When the token or the digests are missing or malformed.
    pub fn from_env() -> Result<Self, ServiceError> {
        let token =
            std::env::var(crate::env::INTERNAL_TOKEN).map_err(|_| ServiceError::Missing(crate::env::INTERNAL_TOKEN))?;
        let peers = PeerDigests::from_env()?;
        let addrs = Identity::ALL
            .into_iter()
            .filter_map(|i| std::env::var(i.addr_var()).ok().filter(|a| !a.is_empty()).map(|a| (i, a)))
            .collect();
        Ok(Self::new(SecretString::from(token), peers, addrs))
    }

    /// This service's own token (for clients built by hand, e.g. on another thread's runtime).
    pub fn token(&self) -> &SecretString {
        &self.token
    }

    /// Where `peer` listens (`127.0.0.1:port`).
    ///
    /// # Errors
    /// [`ServiceError::NoAddress`] when the supervisor passed none.
    pub fn addr(&self, peer: Identity) -> Result<&str, ServiceError> {
        self.addrs.get(&peer).map(String::as_str).ok_or(ServiceError::NoAddress { peer, var: peer.addr_var() })
    }

    /// A lazily connecting channel to `peer` that presents this service's token; wrap it in
    /// the generated client (`StoreClient::new(internal.channel(Identity::Store)?)`).
    ///
    /// # Errors
    /// When `peer` has no usable address.
    pub fn channel(&self, peer: Identity) -> Result<crate::grpc::AuthChannel, ServiceError> {
        crate::grpc::channel(self.addr(peer)?, &self.token).map_err(|source| ServiceError::Channel { peer, source })
    }

    /// The server layer for this service's listener: accepts the identities whose digests it
    /// holds, authorizes by `policy`.
    pub fn auth_layer(&self, policy: Policy) -> InternalAuthLayer {
        InternalAuthLayer::new(self.peers.clone(), policy)
    }
}

/// Runs `body(ctx)` as service `identity`: reads `COFFER_HOME`, opens `logs/<identity>.log`,
/// builds the runtime the supervisor's table chose ([`crate::env::FLAVOR`]), assembles the
/// [`ServiceCtx`] from the environment, and runs until `body` returns. `ctx.shutdown` is
/// cancelled on SIGTERM or SIGINT; `body` should then drain and return. Failures are logged and
/// printed to stderr (which the supervisor captures in `logs/<name>.stdio`) and give exit code 1.
pub fn service_main<F, Fut>(identity: Identity, body: F) -> std::process::ExitCode
where
    F: FnOnce(ServiceCtx) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let name = identity.as_str();
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
    let flavor = match Flavor::from_env() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("coffer-{name}: {e}");
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
        tracing::info!(
            service = name,
            pid = std::process::id(),
            version = crate::VERSION,
            flavor = flavor.as_str(),
            "Service starting."
        );
        // The listener is taken inside the runtime: a tokio listener needs its reactor.
        let ctx = ServiceCtx {
            listener: crate::listen::inherited(crate::env::LISTEN_FD)?,
            internal: Internal::from_env()?,
            home,
            identity,
            shutdown,
        };
        body(ctx).await
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

/// Serves only the standard health service on the service's listener (services whose domain
/// RPCs come in later issues).
///
/// # Errors
/// Transport errors from the server.
pub async fn run_health_only(ctx: ServiceCtx) -> anyhow::Result<()> {
    let auth = ctx.internal.auth_layer(Policy::ANY_SERVICE);
    crate::grpc::serve_with_health(ctx.listener, auth, tonic::service::Routes::default(), ctx.shutdown).await?;
    Ok(())
}
