//! The control RPC (`coffer.control.v1.Control`): status, stop the daemon, restart one service,
//! start and stop an on-demand service; with the table of who may call what ([`POLICY`]).
//!
//! Who may call: `Status` any service; `Stop`, `RestartService`, `StartService`, `StopService` the
//! gateway and chat. `StartService.env` takes names `COFFER_CALLBACK_[A-Z0-9_]+` only (not the
//! supervisor's own `COFFER_CALLBACK_ADDR`), at most 64 variables and 64 KiB; `INVALID_ARGUMENT`
//! names the variable, never a value.
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::control::control_server::{Control, ControlServer, SERVICE_NAME};
use coffer_proto::control::{
    RestartServiceReply, RestartServiceRequest, ServiceStatus, StartServiceReply, StartServiceRequest, StatusReply,
    StatusRequest, StopReply, StopRequest, StopServiceReply, StopServiceRequest,
};
use coffer_runtime::authz::{Allow, Policy, Rule, Unlisted};
use coffer_runtime::identity::{Identity, PeerDigests};
use tonic::{Request, Response, Status};

use crate::Shared;
use crate::service::ServiceHandle;
use crate::table::Start;

/// How long `StartService` and `RestartService` wait for the service to become healthy.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// Who may drive the daemon: the gateway (REST `/v1/daemon/*`, `/v1/status`) and chat (it will
/// start and stop `coffer-callback` with the SeaTalk channel); status is for every service.
const OPERATORS: Allow = Allow::Only(&[Identity::Gateway, Identity::Chat]);

/// The control RPC's authorization table; a method not named here is refused.
pub(crate) const POLICY: Policy = Policy {
    rules: &[
        Rule { service: SERVICE_NAME, method: "Status", allow: Allow::AnyService },
        Rule { service: SERVICE_NAME, method: "Stop", allow: OPERATORS },
        Rule { service: SERVICE_NAME, method: "RestartService", allow: OPERATORS },
        Rule { service: SERVICE_NAME, method: "StartService", allow: OPERATORS },
        Rule { service: SERVICE_NAME, method: "StopService", allow: OPERATORS },
    ],
    unlisted: Unlisted::Deny,
};

struct ControlService {
    shared: Arc<Shared>,
}

fn to_proto(v: crate::ServiceStatusView) -> ServiceStatus {
    ServiceStatus {
        name: v.name,
        pid: v.pid,
        state: v.state.as_str().into(),
        uptime_s: v.uptime_s,
        restarts: v.restarts,
        last_error: v.last_error,
        address: v.address,
        on_demand: v.on_demand,
    }
}

impl ControlService {
    /// The handle of service `name`, or `NOT_FOUND` listing the known names.
    fn find(&self, name: &str) -> Result<&ServiceHandle, Status> {
        self.shared.service(name).ok_or_else(|| {
            let known: Vec<_> = self.shared.services.iter().map(|h| h.name).collect();
            Status::not_found(format!("no service {name:?}; known: {}", known.join(", ")))
        })
    }

    /// The handle of on-demand service `name` while the daemon is not shutting down.
    fn find_on_demand(&self, name: &str) -> Result<&ServiceHandle, Status> {
        let h = self.find(name)?;
        if h.spec.start != Start::OnDemand {
            return Err(Status::failed_precondition(format!(
                "{name} runs always; only on-demand services are started and stopped alone (use RestartService)"
            )));
        }
        if self.shared.shutdown.is_cancelled() {
            return Err(Status::failed_precondition("daemon is shutting down"));
        }
        Ok(h)
    }
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        let s = &self.shared;
        Ok(Response::new(StatusReply {
            pid: s.pid,
            version: coffer_runtime::VERSION.into(),
            started_at: s.started_at.clone(),
            port: u32::from(s.port),
            services: s.services.iter().map(|h| to_proto(h.view())).collect(),
        }))
    }

    async fn stop(&self, _: Request<StopRequest>) -> Result<Response<StopReply>, Status> {
        tracing::info!("Stop requested over the control RPC.");
        self.shared.shutdown.cancel();
        Ok(Response::new(StopReply {}))
    }

    async fn restart_service(
        &self,
        req: Request<RestartServiceRequest>,
    ) -> Result<Response<RestartServiceReply>, Status> {
        let h = self.find(&req.into_inner().name)?;
        if self.shared.shutdown.is_cancelled() {
            return Err(Status::failed_precondition("daemon is shutting down"));
        }
        // A stopped on-demand service waits for whoever needs it (and its environment).
        if h.spec.start == Start::OnDemand && !h.is_running().await {
            return Err(Status::failed_precondition(format!(
                "{} runs on demand and is stopped; it starts when it is needed",
                h.name
            )));
        }
        // In a task of its own: the caller may go away meanwhile (the gateway restarting itself
        // is terminated by this very restart), and the restart must still complete.
        let (task_h, ctx) = (h.clone(), self.shared.ctx.clone());
        let _ = tokio::spawn(async move { task_h.restart(&ctx).await }).await;
        let _ = h.wait_healthy(HEALTHY_WITHIN).await;
        Ok(Response::new(RestartServiceReply { service: Some(to_proto(h.view())) }))
    }

    async fn start_service(&self, req: Request<StartServiceRequest>) -> Result<Response<StartServiceReply>, Status> {
        let req = req.into_inner();
        let h = self.find_on_demand(&req.name)?;
        let env = validate_env(req.env)?;
        for dep in h.spec.depends_on {
            let healthy =
                self.shared.service(dep.as_str()).is_some_and(|d| d.view().state == crate::ServiceState::Healthy);
            if !healthy {
                return Err(Status::failed_precondition(format!("{} needs {dep}, which is not healthy", h.name)));
            }
        }
        let names: Vec<&str> = env.keys().map(String::as_str).collect();
        let names = names.join(",");
        let changed = h.set_extra_env(env);
        if h.start(&self.shared.ctx).await {
            tracing::info!(service = h.name, env = %names, "On-demand service started over the control RPC.");
        } else if changed {
            // Running with another environment (a secret changed): restart it with the new one,
            // in a task of its own so a caller that goes away does not cut it short.
            let (task_h, ctx) = (h.clone(), self.shared.ctx.clone());
            let _ = tokio::spawn(async move { task_h.restart(&ctx).await }).await;
            tracing::info!(service = h.name, env = %names, "On-demand service restarted with a new environment.");
        }
        h.wait_healthy(HEALTHY_WITHIN)
            .await
            .map_err(|e| Status::unavailable(format!("{} did not become healthy: {e:#}", h.name)))?;
        Ok(Response::new(StartServiceReply { service: Some(to_proto(h.view())) }))
    }

    async fn stop_service(&self, req: Request<StopServiceRequest>) -> Result<Response<StopServiceReply>, Status> {
        let h = self.find_on_demand(&req.into_inner().name)?;
        for other in &self.shared.services {
            if other.spec.depends_on.contains(&h.spec.identity) && other.is_running().await {
                return Err(Status::failed_precondition(format!("{} needs {}, which is running", other.name, h.name)));
            }
        }
        // In a task of its own, like a restart: a caller that goes away does not cut it short.
        let task_h = h.clone();
        let _ = tokio::spawn(async move { task_h.stop().await }).await;
        // Its secrets leave the supervisor's memory with it.
        h.set_extra_env(std::collections::BTreeMap::new());
        tracing::info!(service = h.name, "On-demand service stopped over the control RPC.");
        Ok(Response::new(StopServiceReply { service: Some(to_proto(h.view())) }))
    }
}

/// The prefix every `StartService` env name carries (`proto/control.proto`).
pub(crate) const ENV_PREFIX: &str = "COFFER_CALLBACK_";
/// Names under the prefix the supervisor sets itself (a caller may not replace them).
const RESERVED_ENV: &[&str] = &[coffer_runtime::env::CALLBACK_ADDR];
/// At most this many variables, of at most this many bytes in all (names and values).
const ENV_MAX_VARS: usize = 64;
const ENV_MAX_BYTES: usize = 64 * 1024;

/// Checks a `StartService` env: names `COFFER_CALLBACK_[A-Z0-9_]+` other than the reserved ones,
/// values without NUL, bounded in count and size. `INVALID_ARGUMENT` names the variable and the
/// rule, never a value.
fn validate_env(
    env: std::collections::HashMap<String, String>,
) -> Result<std::collections::BTreeMap<String, String>, Status> {
    if env.len() > ENV_MAX_VARS {
        return Err(Status::invalid_argument(format!("env has {} variables; at most {ENV_MAX_VARS}", env.len())));
    }
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > ENV_MAX_BYTES {
        return Err(Status::invalid_argument(format!("env is {bytes} bytes; at most {ENV_MAX_BYTES}")));
    }
    for (k, v) in &env {
        let rest = k.strip_prefix(ENV_PREFIX).unwrap_or_default();
        let shape_ok = k.starts_with(ENV_PREFIX)
            && !rest.is_empty()
            && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !shape_ok {
            let shown: String = k.chars().take(64).collect();
            return Err(Status::invalid_argument(format!(
                "env name {shown:?} is not {ENV_PREFIX}[A-Z0-9_]+ (only coffer-callback's variables may be given)"
            )));
        }
        if RESERVED_ENV.contains(&k.as_str()) {
            return Err(Status::invalid_argument(format!("env name {k} is set by the supervisor itself")));
        }
        if v.contains('\0') {
            return Err(Status::invalid_argument(format!("env {k}: the value contains a NUL byte")));
        }
    }
    Ok(env.into_iter().collect())
}

/// Serves the control RPC until the process exits, accepting the identities in `peers`.
pub(crate) async fn serve(listener: tokio::net::TcpListener, peers: Arc<PeerDigests>, shared: Arc<Shared>) {
    let routes = tonic::service::Routes::new(ControlServer::new(ControlService { shared: shared.clone() }));
    // The control server outlives the services' shutdown so status stays answerable; the task is
    // aborted at the very end.
    let never = tokio_util::sync::CancellationToken::new();
    let auth = coffer_runtime::grpc::InternalAuthLayer::new(peers, POLICY);
    if let Err(e) = coffer_runtime::grpc::serve_with_health(listener, auth, routes, never).await {
        tracing::error!(error = %e, "Control RPC server failed.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_proto::control::control_client::ControlClient;
    use secrecy::SecretString;

    struct Fixture {
        addr: String,
        gateway: SecretString,
        retrieval: SecretString,
        shared: Arc<Shared>,
        _home: tempfile::TempDir,
    }

    /// The control RPC on loopback over a table of one on-demand row that is never started,
    /// accepting made-up gateway and retrieval tokens.
    async fn serve_fixture() -> Fixture {
        let home = tempfile::tempdir().unwrap();
        let (gateway, retrieval) = (coffer_runtime::token::random_token(), coffer_runtime::token::random_token());
        let peers = PeerDigests::from_tokens([(Identity::Gateway, &gateway), (Identity::Retrieval, &retrieval)]);
        let spec = crate::table::ServiceSpec { start: Start::OnDemand, ..crate::table::SERVICES[1] };
        let shutdown = tokio_util::sync::CancellationToken::new();
        let shared = Arc::new(Shared {
            pid: 1,
            port: 8000,
            started_at: coffer_runtime::now_rfc3339(),
            shutdown: shutdown.clone(),
            services: vec![ServiceHandle::new(spec, vec![], vec![], "127.0.0.1:1".into())],
            ctx: crate::service::Context {
                home: coffer_runtime::home::CofferHome::at(home.path().to_path_buf()),
                supervisor_token: coffer_runtime::token::random_token(),
                shutdown,
            },
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, Arc::new(peers), shared.clone()));
        Fixture { addr, gateway, retrieval, shared, _home: home }
    }

    fn client(addr: &str, token: &SecretString) -> ControlClient<coffer_runtime::grpc::AuthChannel> {
        ControlClient::new(coffer_runtime::grpc::channel(addr, token).unwrap())
    }

    #[tokio::test]
    async fn the_control_rpc_refuses_a_wrong_token_and_names_a_caller_it_does_not_allow() {
        let f = serve_fixture().await;
        let s = client(&f.addr, &coffer_runtime::token::random_token()).status(StatusRequest {}).await.unwrap_err();
        assert_eq!((s.code(), s.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));

        let mut retrieval = client(&f.addr, &f.retrieval);
        let status = retrieval.status(StatusRequest {}).await.unwrap().into_inner();
        assert_eq!(status.services.len(), 1, "any service may read status");
        for (method, s) in [
            ("Stop", retrieval.stop(StopRequest {}).await.unwrap_err()),
            (
                "StartService",
                retrieval
                    .start_service(StartServiceRequest { name: "retrieval".into(), ..Default::default() })
                    .await
                    .unwrap_err(),
            ),
        ] {
            assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
            assert_eq!(s.message(), format!("retrieval may not call /coffer.control.v1.Control/{method}"));
        }
        assert!(!f.shared.shutdown.is_cancelled(), "a refused Stop stops nothing");
    }

    #[tokio::test]
    async fn an_on_demand_service_shows_stopped_and_only_it_may_be_started_alone() {
        let f = serve_fixture().await;
        let mut gateway = client(&f.addr, &f.gateway);
        let status = gateway.status(StatusRequest {}).await.unwrap().into_inner();
        let s = &status.services[0];
        assert_eq!((s.name.as_str(), s.state.as_str(), s.pid, s.on_demand), ("retrieval", "stopped", 0, true));
        let e =
            gateway.start_service(StartServiceRequest { name: "nope".into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        assert!(e.message().contains("known: retrieval"), "{e:?}");
        // Its dependency (the store) is not in this table's handles: refused before any spawn.
        let e = gateway
            .start_service(StartServiceRequest { name: "retrieval".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert_eq!(e.message(), "retrieval needs store, which is not healthy");
        let e = gateway.restart_service(RestartServiceRequest { name: "retrieval".into() }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "a stopped on-demand service is not restarted: {e:?}");
        // Stopping what is not running is a no-op that reports it stopped.
        let r = gateway.stop_service(StopServiceRequest { name: "retrieval".into() }).await.unwrap().into_inner();
        assert_eq!(r.service.unwrap().state, "stopped");
        gateway.stop(StopRequest {}).await.unwrap();
        assert!(f.shared.shutdown.is_cancelled());
        let e = gateway
            .start_service(StartServiceRequest { name: "retrieval".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::FailedPrecondition, "daemon is shutting down"));
    }

    #[test]
    fn start_service_env_takes_only_callback_names_and_never_echoes_a_value() {
        let env = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let ok = validate_env(env(&[("COFFER_CALLBACK_SECRETS", "{\"a\":\"s3cret\"}"), ("COFFER_CALLBACK_PORT", "9")]))
            .unwrap();
        assert_eq!(ok.keys().collect::<Vec<_>>(), ["COFFER_CALLBACK_PORT", "COFFER_CALLBACK_SECRETS"]);
        for (pairs, says) in [
            (&[("PATH", "s3cret")][..], "env name \"PATH\" is not COFFER_CALLBACK_[A-Z0-9_]+"),
            (&[("COFFER_CALLBACK_", "s3cret")][..], "env name \"COFFER_CALLBACK_\" is not"),
            (&[("COFFER_CALLBACK_a", "s3cret")][..], "env name \"COFFER_CALLBACK_a\" is not"),
            (&[("COFFER_INTERNAL_TOKEN", "s3cret")][..], "env name \"COFFER_INTERNAL_TOKEN\" is not"),
            (&[("COFFER_CALLBACK_ADDR", "s3cret")][..], "env name COFFER_CALLBACK_ADDR is set by the supervisor"),
            (&[("COFFER_CALLBACK_X", "s3\0cret")][..], "env COFFER_CALLBACK_X: the value contains a NUL byte"),
        ] {
            let e = validate_env(env(pairs)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with(says), "{e:?}");
            assert!(!e.message().contains("s3"), "no value in {e:?}");
        }
        let many: std::collections::HashMap<_, _> =
            (0..65).map(|i| (format!("COFFER_CALLBACK_V{i}"), String::new())).collect();
        assert_eq!(validate_env(many).unwrap_err().message(), "env has 65 variables; at most 64");
        let big = env(&[("COFFER_CALLBACK_X", &"x".repeat(70_000))]);
        assert!(validate_env(big).unwrap_err().message().starts_with("env is 70017 bytes"));
    }
}
