//! The `coffer.llm.v1.Llm` service (`proto/llm.proto`): probes of a connection
//! (`TestConnection`, `ListModels`) and the internal agent (`Ask`), with the one conversion of
//! their errors to `tonic::Status`.
//!
//! Connections are resolved on each request ([`crate::connections::Connections`]), with the
//! timeouts of the `llm.*` settings in force. A run keeps the endpoint it resolved at its start:
//! a connection edited or deleted mid-run does not change or stop the run in flight (the next
//! run sees the change). At most [`MAX_RUNS`] runs go at once; one more is
//! `RESOURCE_EXHAUSTED`.
use std::sync::Arc;
use std::time::Instant;

use coffer_llm::{ErrorKind, LlmError};
use coffer_proto::gateway::tool_broker_client::ToolBrokerClient;
use coffer_proto::llm::llm_server::Llm;
use coffer_proto::llm::{
    AskReply, AskRequest, ConnectionRef, Failure, FailureKind, ListModelsReply, RunUsage, TestConnectionReply,
    connection_ref,
};
use coffer_runtime::grpc::AuthChannel;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::agent::{self, AgentError, Params};
use super::broker::BrokerTools;
use crate::config::ConfigRx;
use crate::connections::{Connections, ResolveError, Resolved};

/// Internal-agent runs at once; each holds one broker session and one provider request at a
/// time, so a few are plenty for the tools calling it, and a burst cannot fan out unbounded.
pub const MAX_RUNS: usize = 4;
/// Longest question (bytes).
pub const MAX_QUESTION: usize = 16 * 1024;

/// The service; cheap to clone.
#[derive(Clone)]
pub struct LlmService {
    connections: Connections,
    broker: ToolBrokerClient<AuthChannel>,
    config: ConfigRx,
    runs: Arc<Semaphore>,
}

impl LlmService {
    /// Over the store's connections, the gateway's broker and chat's settings.
    pub fn new(connections: Connections, broker: ToolBrokerClient<AuthChannel>, config: ConfigRx) -> Self {
        Self { connections, broker, config, runs: Arc::new(Semaphore::new(MAX_RUNS)) }
    }

    fn llm_config(&self) -> crate::config::LlmConfig {
        self.config.borrow().llm
    }

    /// The connection a probe is for. A draft never reads the credential store: a stored secret
    /// goes only to the base URL of the connection it was saved with, so a draft naming one is
    /// INVALID_ARGUMENT and its key is the one sent with it (`draft_api_key`).
    async fn target(&self, target: ConnectionRef) -> Result<Resolved, Status> {
        let timeouts = self.llm_config().timeouts();
        match target.target {
            Some(connection_ref::Target::Name(name)) => {
                self.connections.get(&name, timeouts).await.map_err(status_of_resolve)
            }
            Some(connection_ref::Target::Draft(draft)) => {
                if !draft.credential_ref.is_empty() {
                    return Err(Status::invalid_argument(
                        "an unsaved connection cannot use a stored credential (credential_ref): send its key with it",
                    ));
                }
                let mut resolved = self.connections.resolve(draft, timeouts).await.map_err(status_of_resolve)?;
                if !target.draft_api_key.is_empty() {
                    resolved.endpoint.secret = Some(secrecy::SecretString::from(target.draft_api_key));
                }
                Ok(resolved)
            }
            None => Err(Status::invalid_argument("target: give a connection name or a draft connection")),
        }
    }
}

/// A resolver's error as the service answers it (the status table of `proto/llm.proto`).
pub fn status_of_resolve(e: ResolveError) -> Status {
    match e {
        ResolveError::NotFound(_) => Status::not_found(e.to_string()),
        ResolveError::NoDefault | ResolveError::CredentialMissing { .. } => Status::failed_precondition(e.to_string()),
        ResolveError::Invalid { .. } => Status::invalid_argument(e.to_string()),
        ResolveError::Store(s) => Status::unavailable(format!("the store is unavailable: {}", s.message())),
    }
}

/// A provider's failure as a reply's `failure`.
pub fn failure_of(e: &LlmError) -> Failure {
    let kind = match e.kind {
        ErrorKind::Auth => FailureKind::Auth,
        ErrorKind::NotFound => FailureKind::NotFound,
        ErrorKind::RateLimited => FailureKind::RateLimited,
        ErrorKind::Server => FailureKind::Server,
        ErrorKind::Unreachable => FailureKind::Unreachable,
        ErrorKind::Timeout => FailureKind::Timeout,
        ErrorKind::Tls => FailureKind::Tls,
        ErrorKind::BadResponse => FailureKind::BadResponse,
    };
    Failure {
        kind: kind.into(),
        message: e.message.clone(),
        http_status: e.http_status.map(u32::from).unwrap_or(0),
        retry_after_ms: e.retry_after.map(|d| d.as_millis() as u64).unwrap_or(0),
    }
}

/// A provider's failure during a run, as `Ask` answers it: FAILED_PRECONDITION for what the
/// person must fix (key, model, URL, TLS), UNAVAILABLE for what may pass (unreachable, 5xx,
/// rate limit — with the wait the provider asked for —, a garbled or cut answer),
/// DEADLINE_EXCEEDED for a timeout or a stalled stream.
pub fn status_of_provider(connection: &str, e: &LlmError) -> Status {
    let msg = format!("the internal agent's connection {connection:?} failed: {}", e.message);
    match e.kind {
        ErrorKind::Auth | ErrorKind::NotFound | ErrorKind::Tls => Status::failed_precondition(msg),
        ErrorKind::RateLimited => match e.retry_after {
            // The provider's message usually says the wait already (coffer-llm writes it).
            Some(d) if !msg.contains("retry after") => {
                Status::unavailable(format!("{msg} (retry after {} s)", d.as_secs_f64().ceil() as u64))
            }
            Some(_) => Status::unavailable(msg),
            None => Status::unavailable(msg),
        },
        ErrorKind::Server | ErrorKind::Unreachable | ErrorKind::BadResponse => Status::unavailable(msg),
        ErrorKind::Timeout => Status::deadline_exceeded(msg),
    }
}

fn ulid() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    ulid::Ulid::from_parts(ms as u64, fastrand::u128(..)).to_string()
}

#[tonic::async_trait]
impl Llm for LlmService {
    async fn test_connection(&self, request: Request<ConnectionRef>) -> Result<Response<TestConnectionReply>, Status> {
        let resolved = self.target(request.into_inner()).await?;
        let model = resolved.record.model.trim().to_owned();
        if model.is_empty() {
            return Err(Status::invalid_argument(format!(
                "LLM connection {:?} names no model to test with",
                resolved.record.name
            )));
        }
        let client = coffer_llm::Client::new(resolved.endpoint);
        let started = Instant::now();
        let reply = match client.test(&model).await {
            Ok(latency) => {
                TestConnectionReply { ok: true, latency_ms: latency.as_millis() as u64, model, failure: None }
            }
            Err(e) => TestConnectionReply {
                ok: false,
                latency_ms: started.elapsed().as_millis() as u64,
                model,
                failure: Some(failure_of(&e)),
            },
        };
        Ok(Response::new(reply))
    }

    async fn list_models(&self, request: Request<ConnectionRef>) -> Result<Response<ListModelsReply>, Status> {
        let resolved = self.target(request.into_inner()).await?;
        let wire = resolved.endpoint.wire.as_str();
        let base = resolved.endpoint.base_url.to_string();
        let client = coffer_llm::Client::new(resolved.endpoint);
        let reply = match client.models().await {
            Ok(mut models) => {
                models.sort();
                models.dedup();
                let hint = if models.is_empty() {
                    format!("{wire} at {base} listed no models; type the model id")
                } else {
                    String::new()
                };
                ListModelsReply { models, hint, failure: None }
            }
            Err(e) if e.kind == ErrorKind::NotFound => ListModelsReply {
                models: Vec::new(),
                hint: format!(
                    "{wire} at {base} has no model listing (404: the endpoint does not offer one, or the base URL is wrong); type the model id"
                ),
                failure: None,
            },
            Err(e) => ListModelsReply {
                models: Vec::new(),
                hint: "the provider could not list its models; type the model id".into(),
                failure: Some(failure_of(&e)),
            },
        };
        Ok(Response::new(reply))
    }

    async fn ask(&self, request: Request<AskRequest>) -> Result<Response<AskReply>, Status> {
        let req = request.into_inner();
        let question = req.question.trim();
        if question.is_empty() {
            return Err(Status::invalid_argument("question: must not be empty"));
        }
        if req.question.len() > MAX_QUESTION {
            return Err(Status::invalid_argument(format!(
                "question: {} bytes is over the limit of {MAX_QUESTION} bytes (16 KiB)",
                req.question.len()
            )));
        }
        let kb = req.kb.trim();
        let Ok(_permit) = self.runs.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "{MAX_RUNS} internal agent runs are already in flight; try again when one has ended"
            )));
        };
        let config = self.llm_config();
        let resolved = self.connections.internal_default(config.timeouts()).await.map_err(status_of_resolve)?;
        let connection = resolved.record.name.clone();
        let model_id = resolved.record.model.trim().to_owned();
        if model_id.is_empty() {
            return Err(Status::failed_precondition(format!(
                "the internal LLM connection {connection:?} names no model: `coffer llm edit {connection} --model ID`"
            )));
        }
        let params = Params {
            model: model_id.clone(),
            question: question.to_owned(),
            kb: (!kb.is_empty()).then(|| kb.to_owned()),
            max_iterations: config.ask_max_iterations.max(1),
            context_tokens: config.ask_context_tokens,
        };
        let run_id = ulid();
        let tools = BrokerTools::new(self.broker.clone(), &run_id);
        let model = coffer_llm::Client::new(resolved.endpoint);
        let started = Instant::now();
        tracing::info!(run = %run_id, connection = %connection, model = %model_id, origin = %req.origin, "Internal agent run started.");
        let outcome = agent::run(&model, &tools, &params).await;
        tools.close().await;
        let took_ms = started.elapsed().as_millis() as u64;
        match outcome {
            Ok(o) => {
                tracing::info!(run = %run_id, stop = o.stop_reason, iterations = o.iterations, tool_calls = o.tool_calls,
                    input_tokens = o.input_tokens, output_tokens = o.output_tokens, took_ms, "Internal agent run ended.");
                Ok(Response::new(AskReply {
                    answer: o.answer,
                    citations: o.citations,
                    stop_reason: o.stop_reason.to_owned(),
                    usage: Some(RunUsage {
                        connection,
                        model: model_id,
                        input_tokens: o.input_tokens,
                        output_tokens: o.output_tokens,
                        iterations: o.iterations,
                        tool_calls: o.tool_calls,
                    }),
                    took_ms,
                }))
            }
            Err(AgentError::Provider(e)) => {
                tracing::info!(run = %run_id, error = %e, took_ms, "Internal agent run failed at its provider.");
                Err(status_of_provider(&connection, &e))
            }
            Err(e @ AgentError::Broker(_)) => {
                tracing::warn!(run = %run_id, error = %e, took_ms, "Internal agent run could not list its tools.");
                Err(Status::unavailable(format!("the internal agent cannot reach its tools: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn err(kind: ErrorKind, status: Option<u16>, retry: Option<u64>) -> LlmError {
        LlmError {
            kind,
            message: "anthropic at http://127.0.0.1:4000 said no".into(),
            http_status: status,
            retry_after: retry.map(Duration::from_secs),
        }
    }

    #[test]
    fn provider_failures_map_to_the_statuses_llm_proto_names() {
        use tonic::Code;
        for (kind, code) in [
            (ErrorKind::Auth, Code::FailedPrecondition),
            (ErrorKind::NotFound, Code::FailedPrecondition),
            (ErrorKind::Tls, Code::FailedPrecondition),
            (ErrorKind::Server, Code::Unavailable),
            (ErrorKind::Unreachable, Code::Unavailable),
            (ErrorKind::BadResponse, Code::Unavailable),
            (ErrorKind::RateLimited, Code::Unavailable),
            (ErrorKind::Timeout, Code::DeadlineExceeded),
        ] {
            let s = status_of_provider("local", &err(kind, None, None));
            assert_eq!(s.code(), code, "{kind:?}");
            assert_eq!(
                s.message(),
                "the internal agent's connection \"local\" failed: anthropic at http://127.0.0.1:4000 said no"
            );
        }
        let s = status_of_provider("local", &err(ErrorKind::RateLimited, Some(429), Some(7)));
        assert!(s.message().ends_with("(retry after 7 s)"), "{}", s.message());
        let f = failure_of(&err(ErrorKind::RateLimited, Some(429), Some(7)));
        assert_eq!((f.kind(), f.http_status, f.retry_after_ms), (FailureKind::RateLimited, 429, 7000));
        let f = failure_of(&err(ErrorKind::Unreachable, None, None));
        assert_eq!((f.kind(), f.http_status, f.retry_after_ms), (FailureKind::Unreachable, 0, 0));
    }

    #[test]
    fn resolver_errors_map_to_not_found_precondition_invalid_and_unavailable() {
        use tonic::Code;
        assert_eq!(status_of_resolve(ResolveError::NotFound("x".into())).code(), Code::NotFound);
        let s = status_of_resolve(ResolveError::NoDefault);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("coffer llm add"), "{}", s.message());
        let s = status_of_resolve(ResolveError::CredentialMissing { connection: "c".into(), credential: "k".into() });
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("coffer credentials set k"), "{}", s.message());
        let s = status_of_resolve(ResolveError::Invalid { connection: "c".into(), problem: "bad".into() });
        assert_eq!(s.code(), Code::InvalidArgument);
        let s = status_of_resolve(ResolveError::Store(tonic::Status::unavailable("down")));
        assert_eq!(s.code(), Code::Unavailable);
    }
}
