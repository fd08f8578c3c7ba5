//! Internal gRPC plumbing: one server layer that checks the per-run internal token and opens a
//! span carrying the caller's trace id; one client interceptor that sends both.
//!
//! Loopback is not a trust boundary (other local users exist), so every internal RPC must
//! present the token the supervisor generated for this run.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use coffer_proto::{INTERNAL_TOKEN_HEADER, TRACE_HEADER};
use secrecy::{ExposeSecret, SecretString};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument;

tokio::task_local! {
    static TRACE_ID: String;
}

/// Runs `fut` with `trace_id` as the current trace id: internal calls made inside it carry it.
pub async fn with_trace<F: Future>(trace_id: String, fut: F) -> F::Output {
    TRACE_ID.scope(trace_id, fut).await
}

/// The trace id of the request being served, if any.
pub fn current_trace() -> Option<String> {
    TRACE_ID.try_with(Clone::clone).ok()
}

/// A new trace id: 16 hex characters. Trace ids only need to be unique in practice, not
/// unpredictable, so they come from `fastrand`'s per-thread generator (seeded from the OS
/// once) rather than a `getrandom` system call on every request.
pub fn new_trace_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// Server layer: rejects calls without the internal token (`UNAUTHENTICATED`), and runs each
/// accepted call inside span `rpc{trace_id, path}` with the trace id set for onward calls.
#[derive(Clone)]
pub struct InternalAuthLayer {
    token: Arc<SecretString>,
}

impl InternalAuthLayer {
    pub fn new(token: SecretString) -> Self {
        Self { token: Arc::new(token) }
    }
}

impl<S> tower::Layer<S> for InternalAuthLayer {
    type Service = InternalAuth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        InternalAuth { inner, token: self.token.clone() }
    }
}

/// Service produced by [`InternalAuthLayer`].
#[derive(Clone)]
pub struct InternalAuth<S> {
    inner: S,
    token: Arc<SecretString>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for InternalAuth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let presented = req.headers().get(INTERNAL_TOKEN_HEADER).map(|v| v.as_bytes().to_vec());
        let ok = presented.is_some_and(|p| crate::token::token_matches(&self.token, &p));
        if !ok {
            let path = req.uri().path().to_owned();
            return Box::pin(async move {
                tracing::warn!(%path, "Internal RPC rejected: missing or wrong internal token.");
                Ok(tonic::Status::unauthenticated("missing or wrong internal token").into_http())
            });
        }
        let trace_id = req
            .headers()
            .get(TRACE_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            .map(str::to_owned);
        // Clone-and-swap so the ready service is the one called (tower's documented pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req.uri().path().to_owned();
        Box::pin(async move {
            match trace_id {
                Some(id) => {
                    let span = tracing::info_span!("rpc", trace_id = %id, path = %path);
                    with_trace(id, inner.call(req)).instrument(span).await
                }
                None => inner.call(req).instrument(tracing::info_span!("rpc", path = %path)).await,
            }
        })
    }
}

/// Client interceptor adding the internal token and the current trace id to every call.
#[derive(Clone)]
pub struct ClientAuth {
    token: MetadataValue<tonic::metadata::Ascii>,
}

impl ClientAuth {
    pub fn new(token: &SecretString) -> Self {
        let token = token.expose_secret().parse().expect("hex token is valid ASCII metadata");
        Self { token }
    }
}

impl tonic::service::Interceptor for ClientAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert(INTERNAL_TOKEN_HEADER, self.token.clone());
        if let Some(id) = current_trace()
            && let Ok(v) = id.parse()
        {
            req.metadata_mut().insert(TRACE_HEADER, v);
        }
        Ok(req)
    }
}

/// An authenticated lazy channel to an internal service.
pub type AuthChannel = InterceptedService<Channel, ClientAuth>;

/// A lazily connecting channel to `addr` (`127.0.0.1:port`) that reconnects after the peer
/// restarts. Requests fail with `UNAVAILABLE` while the peer is down.
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn channel(addr: &str, token: &SecretString) -> Result<AuthChannel, tonic::transport::Error> {
    let ch = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(std::time::Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy();
    Ok(InterceptedService::new(ch, ClientAuth::new(token)))
}

/// The internal token from the environment (set by the supervisor).
///
/// # Errors
/// When `COFFER_INTERNAL_TOKEN` is missing.
pub fn internal_token_from_env() -> anyhow::Result<SecretString> {
    let v = std::env::var(crate::env::INTERNAL_TOKEN).map_err(|_| {
        anyhow::anyhow!("{} is not set: this binary is started by coffer-daemon", crate::env::INTERNAL_TOKEN)
    })?;
    Ok(SecretString::from(v))
}

/// Serves `routes` plus the standard gRPC health service (`grpc.health.v1.Health`, reporting
/// SERVING for the empty service name) on an inherited listener, behind the internal auth
/// layer, until `shutdown` is cancelled.
///
/// # Errors
/// Transport errors from the server.
pub async fn serve_with_health(
    listener: tokio::net::TcpListener,
    token: SecretString,
    routes: tonic::service::Routes,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    tonic::transport::Server::builder()
        .layer(InternalAuthLayer::new(token))
        .add_routes(routes.add_service(health))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown.cancelled_owned(),
        )
        .await
}

/// Asks the standard gRPC health service at `addr` once; true when it reports SERVING.
pub async fn check_health(addr: &str, token: &SecretString) -> bool {
    let Ok(ch) = channel(addr, token) else { return false };
    let mut client = tonic_health::pb::health_client::HealthClient::new(ch);
    let req = tonic_health::pb::HealthCheckRequest { service: String::new() };
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(1), client.check(req)).await,
        Ok(Ok(r)) if r.get_ref().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    )
}
