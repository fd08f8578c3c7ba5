//! The control RPC (`coffer.control.v1.Control`): status, stop, restart one service.
use std::sync::Arc;

use coffer_proto::control::control_server::{Control, ControlServer};
use coffer_proto::control::{
    RestartServiceReply, RestartServiceRequest, ServiceStatus, StatusReply, StatusRequest, StopReply, StopRequest,
};
use tonic::{Request, Response, Status};

use crate::Shared;

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
        let name = req.into_inner().name;
        let Some(h) = self.shared.services.iter().find(|h| h.name == name) else {
            let known: Vec<_> = self.shared.services.iter().map(|h| h.name).collect();
            return Err(Status::not_found(format!("no service {name:?}; known: {}", known.join(", "))));
        };
        if self.shared.shutdown.is_cancelled() {
            return Err(Status::failed_precondition("daemon is shutting down"));
        }
        h.restart().await;
        let _ = h.wait_healthy(std::time::Duration::from_secs(30)).await;
        Ok(Response::new(RestartServiceReply { service: Some(to_proto(h.view())) }))
    }
}

/// Serves the control RPC until the process exits.
pub(crate) async fn serve(listener: tokio::net::TcpListener, token: crate::Token, shared: Arc<Shared>) {
    let routes = tonic::service::Routes::new(ControlServer::new(ControlService { shared: shared.clone() }));
    // The control server outlives the services' shutdown so status stays answerable; the task is
    // aborted at the very end.
    let never = tokio_util::sync::CancellationToken::new();
    if let Err(e) = coffer_runtime::grpc::serve_with_health(listener, token, routes, never).await {
        tracing::error!(error = %e, "Control RPC server failed.");
    }
}
