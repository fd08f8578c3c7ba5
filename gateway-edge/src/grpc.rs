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
/// are refused by tonic with `OUT_OF_RANGE` ("decoded message length too large").
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

#[cfg(test)]
mod tests {
    //! The service over loopback behind the real internal auth layer and the gateway's table,
    //! on a fixed snapshot with the in-memory recorder (no upstream: the built-in tools).
    use coffer_proto::gateway::tool_broker_client::ToolBrokerClient;
    use coffer_runtime::grpc::{AuthChannel, InternalAuthLayer};
    use coffer_runtime::home::CofferHome;
    use coffer_runtime::identity::PeerDigests;
    use coffer_types::BUILTIN_SERVER;
    use secrecy::SecretString;
    use serde_json::{Value, json};
    use tokio::sync::mpsc;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::mcp::Shared;
    use crate::mcp::builtin::Registry;
    use crate::mcp::invocations::{Record, Recorder};
    use crate::mcp::resolver::FixedCredentials;
    use crate::snapshot::{Kind, Snapshot, SnapshotHandle};

    struct Fixture {
        chat: ToolBrokerClient<AuthChannel>,
        retrieval: ToolBrokerClient<AuthChannel>,
        broker: Arc<Broker>,
        records: mpsc::UnboundedReceiver<Record>,
        shutdown: CancellationToken,
        _home: tempfile::TempDir,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            self.shutdown.cancel();
        }
    }

    /// The broker served on loopback with `search_tools` disabled when `disabled`.
    async fn serve(disabled: bool) -> Fixture {
        let home = tempfile::tempdir().unwrap();
        let prefs = if disabled {
            [((BUILTIN_SERVER.to_owned(), Kind::Tool, "search_tools".to_owned()), false)].into()
        } else {
            Default::default()
        };
        let snapshot = SnapshotHandle::fixed(Snapshot { prefs, loaded: true, ..Default::default() });
        let (recorder, records) = Recorder::in_memory();
        let shared = Shared::new(
            CofferHome::at(home.path().into()),
            snapshot,
            recorder,
            Arc::new(FixedCredentials::default()),
            Registry::standard(None),
        );
        let broker = Arc::new(Broker::new(shared));
        let (chat, retrieval) = (coffer_runtime::token::random_token(), coffer_runtime::token::random_token());
        let peers = PeerDigests::from_tokens([(Identity::Chat, &chat), (Identity::Retrieval, &retrieval)]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shutdown = CancellationToken::new();
        let layer = InternalAuthLayer::new(Arc::new(peers), crate::authz::POLICY);
        tokio::spawn(coffer_runtime::grpc::serve_with_health(
            listener,
            layer,
            routes(broker.clone()),
            shutdown.clone(),
        ));
        let client = |t: &SecretString| {
            ToolBrokerClient::new(coffer_runtime::grpc::channel(&addr, t).unwrap())
                .max_encoding_message_size(usize::MAX)
        };
        Fixture { chat: client(&chat), retrieval: client(&retrieval), broker, records, shutdown, _home: home }
    }

    fn list(actor: &str, key: &str) -> ListRequest {
        ListRequest { actor: actor.into(), session_key: key.into() }
    }

    fn call(actor: &str, key: &str, name: &str, arguments: &str) -> CallToolRequest {
        CallToolRequest {
            actor: actor.into(),
            session_key: key.into(),
            name: name.into(),
            arguments_json: arguments.into(),
        }
    }

    fn details(s: &Status) -> WireError {
        WireError::decode(s.details()).expect("a BrokerError in the details")
    }

    #[tokio::test]
    async fn chat_lists_and_calls_and_the_invocation_names_its_actor() {
        let mut f = serve(false).await;
        let listed = f.chat.list_tools(list("agent", "conv-1")).await.unwrap().into_inner();
        let search = listed.items.iter().find(|c| c.name == "coffer__search_tools").expect("the built-in");
        assert_eq!((search.server.as_str(), search.original_name.as_str()), (BUILTIN_SERVER, "search_tools"));
        let definition: Value = serde_json::from_str(&search.definition_json).unwrap();
        assert_eq!(definition["name"], "coffer__search_tools");

        let reply = f.chat.call_tool(call("agent", "conv-1", "coffer__search_tools", "{\"query\":\"x\"}")).await;
        let reply = reply.unwrap().into_inner();
        assert_eq!(reply.session_id, listed.session_id, "one session per key");
        let Some(call_reply::Answer::ResultJson(result)) = reply.answer else { panic!("{reply:?}") };
        let result: Value = serde_json::from_str(&result).unwrap();
        assert!(result["content"].is_array(), "{result}");
        let r = f.records.try_recv().unwrap();
        assert_eq!(
            (r.actor.as_ref(), r.session_id.as_str(), r.outcome.as_str()),
            ("agent", reply.session_id.as_str(), "ok")
        );

        // Prompts and resources: none here, but the lists answer.
        assert!(f.chat.list_prompts(list("agent", "conv-1")).await.unwrap().into_inner().items.is_empty());
        assert!(f.chat.list_resources(list("agent", "conv-1")).await.unwrap().into_inner().items.is_empty());
        let e = f
            .chat
            .read_resource(ReadResourceRequest { actor: "agent".into(), session_key: "conv-1".into(), uri: "x".into() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");

        let closed = f.chat.close_session(CloseSessionRequest { session_key: "conv-1".into() }).await.unwrap();
        assert!(closed.into_inner().closed);
        assert_eq!(f.broker.count(), 0);
        let closed = f.chat.close_session(CloseSessionRequest { session_key: "conv-1".into() }).await.unwrap();
        assert!(!closed.into_inner().closed, "closing a key that is not open is no error");
    }

    #[tokio::test]
    async fn gateway_errors_map_to_statuses_with_the_mcp_code() {
        let mut f = serve(true).await;
        let e = f.chat.call_tool(call("agent", "k", "coffer__search_tools", "")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert_eq!(e.message(), "TOOL_DISABLED (MCP -32000): Tool coffer__search_tools is disabled");
        let d = details(&e);
        assert_eq!((d.mcp_code, d.code.as_str()), (-32000, "TOOL_DISABLED"));
        let data: Value = serde_json::from_str(&d.data_json).unwrap();
        assert_eq!((data["tool"].clone(), data["scope"].clone()), (json!("coffer__search_tools"), json!("tool")));
        assert_eq!(f.records.try_recv().unwrap().outcome.as_str(), "disabled");

        for name in ["ghost__echo", "no_separator", "coffer__nope"] {
            let e = f.chat.call_tool(call("agent", "k", name, "")).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::NotFound, "{name}: {e:?}");
            assert!(e.message().starts_with("NOT_FOUND (MCP -32602): Unknown"), "{}", e.message());
            assert_eq!((details(&e).mcp_code, details(&e).code), (-32602, "NOT_FOUND".to_owned()));
        }
        let timeout = status_of(&RpcError::new(crate::mcp::jsonrpc::UPSTREAM_TIMEOUT, "slow"));
        assert_eq!(
            (timeout.code(), timeout.message()),
            (tonic::Code::DeadlineExceeded, "UPSTREAM_TIMEOUT (MCP -32002): slow")
        );
        let gone = status_of(&RpcError::new(crate::mcp::jsonrpc::UPSTREAM_UNAVAILABLE, "down"));
        assert_eq!(gone.code(), tonic::Code::Unavailable);
        assert_eq!(details(&gone).data_json, "", "no data");
    }

    #[tokio::test]
    async fn malformed_requests_and_other_callers_are_refused_and_the_broker_keeps_serving() {
        let mut f = serve(false).await;
        let e = f.retrieval.list_tools(list("agent", "k")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert_eq!(e.message(), "retrieval may not call /coffer.gateway.v1.ToolBroker/ListTools");

        for (actor, key, arguments, needle) in [
            ("", "k", "", "actor must be"),
            ("two words", "k", "", "actor must be"),
            ("mcp", "k", "", "reserved"),
            ("agent", "", "", "session_key must be"),
            ("agent", "k", "not json", "arguments_json must be a JSON object"),
            ("agent", "k", "[1, 2]", "arguments_json must be a JSON object"),
        ] {
            let e = f.chat.call_tool(call(actor, key, "coffer__search_tools", arguments)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{actor:?} {key:?} {arguments:?}: {e:?}");
            assert!(e.message().contains(needle), "{}", e.message());
        }
        let e = f.chat.close_session(CloseSessionRequest { session_key: String::new() }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(f.broker.count(), 0, "no session opened for a refused request");

        // Larger than the request limit: refused by the transport.
        let huge = format!("{{\"text\":\"{}\"}}", "x".repeat(MAX_REQUEST));
        let e = f.chat.call_tool(call("agent", "k", "coffer__search_tools", &huge)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange, "{}", e.message());
        assert!(e.message().contains("message length too large"), "{}", e.message());

        f.chat.list_tools(list("agent", "k")).await.expect("still serving");
        let e = f.chat.list_tools(list("channel:x", "k")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "the key is open for agent: {e:?}");
    }
}
