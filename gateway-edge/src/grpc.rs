//! The gateway's internal gRPC listener: the `ToolBroker` service (`proto/broker.proto`) over
//! the tool broker ([`crate::mcp::broker`]), beside the standard health service, behind the
//! internal auth layer with the table in [`crate::authz`].
//!
//! This is the one conversion from broker and gateway errors to `tonic::Status`
//! ([`status_of`], [`refused`]); the mapping table is in `proto/broker.proto`.
use std::sync::Arc;

use coffer_proto::gateway::tool_broker_server::{ToolBroker, ToolBrokerServer};
use coffer_proto::gateway::{
    BrokerError as WireError, CallReply, CallToolRequest, Capability, CloseSessionReply, CloseSessionRequest,
    GetPromptRequest, ListReply, ListRequest, ReadResourceRequest, call_reply,
};
use coffer_runtime::identity::Identity;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::mcp::broker::{self, Broker, BrokerError, Failure, Lease};
use crate::mcp::jsonrpc::REQUEST_CANCELLED;
use crate::mcp::session::{Answer, ListKind, RpcError};

/// Largest request message the broker decodes (bytes): the body limit of `/mcp`. Larger ones
/// are refused by tonic with `RESOURCE_EXHAUSTED`.
pub const MAX_REQUEST: usize = crate::MCP_BODY_LIMIT;

/// The routes of the gateway's internal listener (health is added by
/// `coffer_runtime::grpc::serve_with_health`).
pub fn routes(broker: Arc<Broker>) -> tonic::service::Routes {
    tonic::service::Routes::new(
        ToolBrokerServer::new(BrokerService { broker })
            .max_decoding_message_size(MAX_REQUEST)
            .max_encoding_message_size(usize::MAX),
    )
}

/// `coffer.gateway.v1.ToolBroker` over a [`Broker`].
pub struct BrokerService {
    broker: Arc<Broker>,
}

impl BrokerService {
    /// The service over `broker` (tests call its methods directly).
    pub fn new(broker: Arc<Broker>) -> Self {
        Self { broker }
    }

    /// The caller's session under `key`, opened for `actor`.
    fn lease<T>(&self, request: &Request<T>, actor: &str, key: &str) -> Result<Lease, Status> {
        let caller = caller(request)?;
        broker::check_service_actor(actor).map_err(refused)?;
        self.broker.lease(caller, key, actor).map_err(refused)
    }

    async fn list(&self, request: Request<ListRequest>, kind: ListKind) -> Result<Response<ListReply>, Status> {
        let session = self.lease(&request, &request.get_ref().actor, &request.get_ref().session_key)?;
        let items = broker::list_enabled(&session, kind)
            .await
            .into_iter()
            .map(|l| Capability {
                name: l.item[kind.ident()].as_str().unwrap_or_default().to_owned(),
                definition_json: l.item.to_string(),
                server: l.server,
                original_name: l.original,
            })
            .collect();
        Ok(Response::new(ListReply { items, session_id: session.id.clone() }))
    }
}

/// The authenticated caller (the internal auth layer put it in the request's extensions).
fn caller<T>(request: &Request<T>) -> Result<Identity, Status> {
    coffer_runtime::grpc::caller(request)
        .ok_or_else(|| Status::unauthenticated("the internal auth layer did not identify the caller"))
}

/// A request the broker refused before it reached a session.
pub fn refused(e: BrokerError) -> Status {
    match e {
        BrokerError::ActorMismatch { .. } => Status::failed_precondition(e.to_string()),
        BrokerError::TooManySessions { .. } => Status::resource_exhausted(e.to_string()),
        BrokerError::InvalidActor(_)
        | BrokerError::ReservedActor(_)
        | BrokerError::InvalidKey(_)
        | BrokerError::InvalidArguments(_) => Status::invalid_argument(e.to_string()),
    }
}

/// A gateway error as a status: the code by the table in `proto/broker.proto`, the message
/// `<CODE> (MCP <n>): <message>`, and a [`WireError`] in the details.
pub fn status_of(e: &RpcError) -> Status {
    let failure = Failure::of(e);
    let code = match failure {
        Failure::Disabled => tonic::Code::FailedPrecondition,
        Failure::NotFound => tonic::Code::NotFound,
        Failure::Invalid => tonic::Code::InvalidArgument,
        Failure::Unavailable => tonic::Code::Unavailable,
        Failure::Timeout => tonic::Code::DeadlineExceeded,
    };
    with_details(code, failure.code(), e.code, &e.message, e.data.as_ref().map(|d| d.to_string()))
}

fn with_details(code: tonic::Code, name: &str, mcp_code: i64, message: &str, data: Option<String>) -> Status {
    let details =
        WireError { mcp_code, code: name.to_owned(), message: message.to_owned(), data_json: data.unwrap_or_default() };
    Status::with_details(code, format!("{name} (MCP {mcp_code}): {message}"), details.encode_to_vec().into())
}

/// What a call produced, as the reply or a status.
fn reply(answer: Answer, session_id: String) -> Result<Response<CallReply>, Status> {
    let answer = match answer {
        Answer::Result(r) => call_reply::Answer::ResultJson(r.get().to_owned()),
        Answer::UpstreamError(e) => call_reply::Answer::UpstreamErrorJson(e.get().to_owned()),
        Answer::Error(e) => return Err(status_of(&e)),
        // Broker calls carry no JSON-RPC id, so nothing cancels them; kept total.
        Answer::Cancelled => {
            return Err(with_details(
                tonic::Code::Cancelled,
                "CANCELLED",
                REQUEST_CANCELLED,
                "the call was cancelled",
                None,
            ));
        }
    };
    Ok(Response::new(CallReply { answer: Some(answer), session_id }))
}

#[tonic::async_trait]
impl ToolBroker for BrokerService {
    async fn list_tools(&self, request: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        self.list(request, ListKind::Tools).await
    }

    async fn call_tool(&self, request: Request<CallToolRequest>) -> Result<Response<CallReply>, Status> {
        let r = request.get_ref();
        let arguments = broker::parse_arguments(&r.arguments_json).map_err(refused)?;
        let session = self.lease(&request, &r.actor, &r.session_key)?;
        let answer = broker::call(&session, ListKind::Tools, &r.name, arguments.as_deref()).await;
        reply(answer, session.id.clone())
    }

    async fn list_prompts(&self, request: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        self.list(request, ListKind::Prompts).await
    }

    async fn get_prompt(&self, request: Request<GetPromptRequest>) -> Result<Response<CallReply>, Status> {
        let r = request.get_ref();
        let arguments = broker::parse_arguments(&r.arguments_json).map_err(refused)?;
        let session = self.lease(&request, &r.actor, &r.session_key)?;
        let answer = broker::call(&session, ListKind::Prompts, &r.name, arguments.as_deref()).await;
        reply(answer, session.id.clone())
    }

    async fn list_resources(&self, request: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        self.list(request, ListKind::Resources).await
    }

    async fn read_resource(&self, request: Request<ReadResourceRequest>) -> Result<Response<CallReply>, Status> {
        let r = request.get_ref();
        let session = self.lease(&request, &r.actor, &r.session_key)?;
        let answer = broker::read_resource(&session, &r.uri).await;
        reply(answer, session.id.clone())
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionReply>, Status> {
        let caller = caller(&request)?;
        let key = &request.get_ref().session_key;
        broker::check_key(key).map_err(refused)?;
        let closed = self.broker.close(caller, key).await;
        Ok(Response::new(CloseSessionReply { closed }))
    }
}
