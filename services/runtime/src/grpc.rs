//! Internal gRPC plumbing: one server layer that authenticates the caller by its per-run internal
//! token, authorizes the method by the server's table and opens a span carrying the caller's
//! trace id; one client interceptor that sends the token, the trace id and how the request
//! behind the call was authenticated ([`current_auth`], which the audit log records).
//!
//! Loopback is not a trust boundary (other local users exist), so every internal RPC must
//! present a token the supervisor generated for this run; each service has its own
//! (see [`crate::identity`]), so a receiver knows who is calling.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use coffer_proto::{AUTH_HEADER, INTERNAL_TOKEN_HEADER, TRACE_HEADER};

use crate::authz::Policy;
use crate::identity::{Identity, PeerDigests};
use secrecy::{ExposeSecret, SecretString};
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument;

tokio::task_local! {
    static TRACE_ID: String;
    static AUTH: String;
}

/// Longest [`current_auth`] value accepted from a peer (bytes).
pub const MAX_AUTH_LEN: usize = 64;

/// Runs `fut` with `auth` as how the current request was authenticated: internal calls made
/// inside it carry it (metadata [`AUTH_HEADER`]). The edge sets it for each authenticated
/// request: `token` (the public token) or `session:<first 12 hex digits of the SHA-256 of the
/// web session's id>`.
pub async fn with_auth<F: Future>(auth: String, fut: F) -> F::Output {
    AUTH.scope(auth, fut).await
}

/// How the request being served was authenticated, if known: what the edge set
/// ([`with_auth`]) and peers forwarded, else `internal:<service>` for an internal call made on
/// a service's own account (the caller's [`Identity`], set by [`InternalAuthLayer`]).
pub fn current_auth() -> Option<String> {
    AUTH.try_with(Clone::clone).ok()
}

/// A forwarded auth value, if it is one: 1-[`MAX_AUTH_LEN`] bytes of `[a-z0-9:_-]`.
fn valid_auth(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_AUTH_LEN
        && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b':' | b'_' | b'-'))
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

/// Server layer: authenticates every call (the presented token must be one whose digest is in
/// its [`PeerDigests`], else `UNAUTHENTICATED` "missing or wrong internal token"), authorizes it
/// against its [`Policy`] (else `PERMISSION_DENIED` "<caller> may not call <method>"), puts the
/// caller's [`Identity`] into the request's extensions (read it with [`caller`]), and runs the
/// call inside span `rpc{trace_id, path, caller}` with the trace id set for onward calls.
#[derive(Clone)]
pub struct InternalAuthLayer {
    peers: Arc<PeerDigests>,
    policy: Policy,
}

impl InternalAuthLayer {
    /// A layer accepting the tokens whose digests are in `peers`, authorizing by `policy`.
    pub fn new(peers: Arc<PeerDigests>, policy: Policy) -> Self {
        Self { peers, policy }
    }
}

impl<S> tower::Layer<S> for InternalAuthLayer {
    type Service = InternalAuth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        InternalAuth { inner, peers: self.peers.clone(), policy: self.policy }
    }
}

/// Service produced by [`InternalAuthLayer`].
#[derive(Clone)]
pub struct InternalAuth<S> {
    inner: S,
    peers: Arc<PeerDigests>,
    policy: Policy,
}

/// The authenticated caller of an internal RPC, as [`InternalAuthLayer`] found it (`None` only
/// for a request that did not pass through the layer, e.g. a handler called directly in a test).
pub fn caller<T>(req: &tonic::Request<T>) -> Option<Identity> {
    req.extensions().get::<Identity>().copied()
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

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let caller = req.headers().get(INTERNAL_TOKEN_HEADER).and_then(|v| self.peers.identify(v.as_bytes()));
        let Some(caller) = caller else {
            let path = req.uri().path().to_owned();
            return Box::pin(async move {
                if let Some(suppressed) = REJECTED.allow() {
                    tracing::warn!(
                        path = %crate::logging::clip(&path),
                        suppressed,
                        "Internal RPC rejected: missing or wrong internal token."
                    );
                }
                Ok(tonic::Status::unauthenticated("missing or wrong internal token").into_http())
            });
        };
        if let Err(refusal) = self.policy.check(caller, req.uri().path()) {
            return Box::pin(async move {
                tracing::warn!(%caller, reason = %refusal, "Internal RPC refused.");
                Ok(tonic::Status::permission_denied(refusal.to_string()).into_http())
            });
        }
        // The connection carries a valid internal token: it is one of Coffer's own, never closed
        // to make room for newcomers (see `crate::limits`).
        if let Some(conn) = req.extensions().get::<crate::limits::ConnHandle>() {
            conn.mark_trusted();
        }
        req.extensions_mut().insert(caller);
        let trace_id = req
            .headers()
            .get(TRACE_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            .map(str::to_owned);
        // How the request behind this call was authenticated: as the peer forwards it (the
        // edge set it), else this call is on the peer's own account.
        let auth = req
            .headers()
            .get(AUTH_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| valid_auth(v))
            .map_or_else(|| format!("internal:{caller}"), str::to_owned);
        // Clone-and-swap so the ready service is the one called (tower's documented pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = req.uri().path().to_owned();
        Box::pin(async move {
            match trace_id {
                Some(id) => {
                    let span = tracing::info_span!("rpc", trace_id = %id, path = %crate::logging::clip(&path), %caller);
                    with_auth(auth, with_trace(id, inner.call(req))).instrument(span).await
                }
                None => {
                    let span = tracing::info_span!("rpc", path = %crate::logging::clip(&path), %caller);
                    with_auth(auth, inner.call(req)).instrument(span).await
                }
            }
        })
    }
}

/// Lines about calls without a valid internal token: anyone on the machine can cause them.
static REJECTED: crate::logging::LogBudget = crate::logging::LogBudget::new(20, 100);

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
        if let Some(auth) = current_auth().filter(|a| valid_auth(a))
            && let Ok(v) = auth.parse()
        {
            req.metadata_mut().insert(AUTH_HEADER, v);
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

/// [`channel`] with HTTP/2 keep-alive pings every `interval` while a call or stream is open,
/// given up after `timeout` without an answer: the supervisor keeps the listener of a stopped
/// or restarting service, so the kernel accepts the connection and nobody answers; the pings
/// turn that into `UNAVAILABLE` within `interval + timeout`.
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn watched_channel(
    addr: &str,
    token: &SecretString,
    interval: std::time::Duration,
    timeout: std::time::Duration,
) -> Result<AuthChannel, tonic::transport::Error> {
    let ch = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(std::time::Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(interval)
        .keep_alive_timeout(timeout)
        .keep_alive_while_idle(false)
        .connect_lazy();
    Ok(InterceptedService::new(ch, ClientAuth::new(token)))
}

/// Awaits one unary call for at most `limit`; a call that takes longer is `DEADLINE_EXCEEDED`
/// naming `service` ("the chat service did not answer within 30 s").
///
/// # Errors
/// The call's status.
pub async fn call_within<T>(
    service: &str,
    limit: std::time::Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => {
            Err(tonic::Status::deadline_exceeded(format!("the {service} did not answer within {} s", limit.as_secs())))
        }
    }
}

/// Serves `routes` plus the standard gRPC health service (`grpc.health.v1.Health`, reporting
/// SERVING for the empty service name) on an inherited listener, behind `auth` (see
/// [`crate::service::ServiceCtx::auth_layer`]), until `shutdown` is cancelled.
///
/// Under [`crate::limits::Limits::GRPC`]: at most 256 connections; one that has not carried a
/// call with a valid internal token within 10 s of its first byte (`COFFER_HEAD_TIMEOUT_MS` when
/// set; 30 s when silent) is closed,
/// and at the cap such connections make room for newcomers; a connection that did is kept and
/// watched by HTTP/2 keep-alive pings (every 30 s, 10 s to answer). Request
/// heads are bounded by the HTTP/2 header-list size (64 KiB). There is no per-request timeout
/// and no per-connection concurrency limit: services hold long streams (chat events, the
/// broker) on one multiplexed connection, and their callers set deadlines.
///
/// # Errors
/// Transport errors from the server.
pub async fn serve_with_health(
    listener: tokio::net::TcpListener,
    auth: InternalAuthLayer,
    routes: tonic::service::Routes,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), tonic::transport::Error> {
    use crate::limits::{Connections, Limits, Peer};
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
    let limits = Limits::GRPC.with_env_head_timeout();
    let conns = Connections::new("grpc", limits);
    let reaper = conns.spawn_reaper(shutdown.child_token());
    let incoming = futures_util::stream::unfold((listener, conns), |(listener, conns)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    if let Some(guard) = conns.admit(Peer::Other) {
                        return Some((Ok::<_, std::io::Error>(guard.track(stream)), (listener, conns)));
                    }
                }
                Err(e) => {
                    // Out of descriptors: closing connections (the reaper) frees some.
                    tracing::debug!(error = %e, "Internal accept failed.");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    });
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .http2_max_header_list_size(limits.max_header_bytes as u32)
        .layer(auth)
        .add_routes(routes.add_service(health))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await;
    reaper.abort();
    served
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::{Allow, Rule, Unlisted};
    use tower::{Layer, Service, ServiceExt};

    const POLICY: Policy = Policy {
        rules: &[Rule { service: "t.v1.S", method: "Write", allow: Allow::Only(&[Identity::Gateway]) }],
        unlisted: Unlisted::Deny,
    };

    struct Fixture {
        gateway: SecretString,
        retrieval: SecretString,
        addr: String,
        shutdown: tokio_util::sync::CancellationToken,
    }

    /// A health-only server on loopback accepting made-up gateway and retrieval tokens.
    async fn serve() -> Fixture {
        let (gateway, retrieval) = (crate::token::random_token(), crate::token::random_token());
        let peers = PeerDigests::from_tokens([(Identity::Gateway, &gateway), (Identity::Retrieval, &retrieval)]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let layer = InternalAuthLayer::new(Arc::new(peers), POLICY);
        tokio::spawn(serve_with_health(listener, layer, tonic::service::Routes::default(), shutdown.clone()));
        Fixture { gateway, retrieval, addr, shutdown }
    }

    /// One unary call of `path` with an empty message, presenting `token` (none when `None`).
    async fn call(addr: &str, token: Option<&SecretString>, path: &'static str) -> tonic::Status {
        let ch = Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy();
        let mut grpc = tonic::client::Grpc::new(ch);
        grpc.ready().await.unwrap();
        let mut req = tonic::Request::new(());
        if let Some(t) = token {
            req.metadata_mut().insert(INTERNAL_TOKEN_HEADER, t.expose_secret().parse().unwrap());
        }
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        match grpc.unary(req, http::uri::PathAndQuery::from_static(path), codec).await {
            Ok(_) => tonic::Status::ok(""),
            Err(s) => s,
        }
    }

    #[tokio::test]
    async fn a_wrong_or_missing_internal_token_is_refused() {
        let f = serve().await;
        let health = "/grpc.health.v1.Health/Check";
        for token in [None, Some(&crate::token::random_token()), Some(&SecretString::from("short"))] {
            let s = call(&f.addr, token, health).await;
            assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
            assert_eq!(s.message(), "missing or wrong internal token");
        }
        assert!(check_health(&f.addr, &f.retrieval).await, "any known identity may ask for health");
        assert!(!check_health(&f.addr, &crate::token::random_token()).await);
        f.shutdown.cancel();
    }

    #[tokio::test]
    async fn a_known_caller_outside_the_rule_is_denied_by_name() {
        let f = serve().await;
        let s = call(&f.addr, Some(&f.retrieval), "/t.v1.S/Write").await;
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
        assert_eq!(s.message(), "retrieval may not call /t.v1.S/Write");
        let s = call(&f.addr, Some(&f.gateway), "/t.v1.S/Unlisted").await;
        assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
        assert_eq!(s.message(), "gateway may not call /t.v1.S/Unlisted: no authorization rule names it");
        // Allowed: the call passes the layer and reaches the router, which has no such service.
        let s = call(&f.addr, Some(&f.gateway), "/t.v1.S/Write").await;
        assert_eq!(s.code(), tonic::Code::Unimplemented, "{s:?}");
        f.shutdown.cancel();
    }

    #[tokio::test]
    async fn the_caller_is_in_the_request_extensions() {
        let gateway = crate::token::random_token();
        let peers = Arc::new(PeerDigests::from_tokens([(Identity::Gateway, &gateway)]));
        let inner = tower::service_fn(|req: http::Request<()>| async move {
            let who = req.extensions().get::<Identity>().map(|i| i.as_str().to_owned()).unwrap_or_default();
            Ok::<_, std::convert::Infallible>(http::Response::new(who))
        });
        let mut svc = InternalAuthLayer::new(peers, Policy::ANY_SERVICE).layer(inner);
        let req = http::Request::builder()
            .uri("/t.v1.S/Read")
            .header(INTERNAL_TOKEN_HEADER, gateway.expose_secret())
            .body(())
            .unwrap();
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(res.into_body(), "gateway");
    }

    /// The handler sees how the request was authenticated: as a peer forwarded it, else the
    /// caller's own identity; a malformed forwarded value is not taken. The client interceptor
    /// sends the current value.
    #[tokio::test]
    async fn the_requests_authentication_is_forwarded_or_the_callers_own() {
        let gateway = crate::token::random_token();
        let peers = Arc::new(PeerDigests::from_tokens([(Identity::Gateway, &gateway)]));
        let inner = tower::service_fn(|_: http::Request<()>| async move {
            Ok::<_, std::convert::Infallible>(http::Response::new(current_auth().unwrap_or_default()))
        });
        let mut svc = InternalAuthLayer::new(peers, Policy::ANY_SERVICE).layer(inner);
        for (forwarded, seen) in [
            (Some("session:0123456789ab"), "session:0123456789ab"),
            (Some("token"), "token"),
            (None, "internal:gateway"),
            (Some("Token with spaces"), "internal:gateway"),
        ] {
            let mut req =
                http::Request::builder().uri("/t.v1.S/Read").header(INTERNAL_TOKEN_HEADER, gateway.expose_secret());
            if let Some(f) = forwarded {
                req = req.header(AUTH_HEADER, f);
            }
            let res = svc.ready().await.unwrap().call(req.body(()).unwrap()).await.unwrap();
            assert_eq!(res.into_body(), seen, "{forwarded:?}");
        }
        use tonic::service::Interceptor as _;
        let mut client = ClientAuth::new(&gateway);
        let sent = with_auth("token".into(), async { client.call(tonic::Request::new(())).unwrap() }).await;
        assert_eq!(sent.metadata().get(AUTH_HEADER).and_then(|v| v.to_str().ok()), Some("token"));
        assert!(client.call(tonic::Request::new(())).unwrap().metadata().get(AUTH_HEADER).is_none());
    }
}
