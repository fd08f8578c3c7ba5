//! The REST error envelope and its code → HTTP status table (meilisearch-style), plus the one
//! conversion from `tonic::Status` to the envelope.
//!
//! Body: `{"error":{"code":"TOOL_DISABLED","message":"…","details":{…}}}`. 4xx are client
//! mistakes: logged at info (code, status, message) in the request's span, so its trace id finds
//! them, never as errors; 5xx carry an opaque message and the cause is logged with the trace id.
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Every error code the REST surface returns, with its HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    BadRequest,
    InvalidArgument,
    UnknownField,
    Unauthorized,
    Forbidden,
    NotFound,
    MethodNotAllowed,
    Conflict,
    AlreadyExists,
    AlreadyDecided,
    PayloadTooLarge,
    UnsupportedMediaType,
    TooManyRequests,
    ToolDisabled,
    UpstreamUnavailable,
    UpstreamTimeout,
    ServiceUnavailable,
    Internal,
}

impl Code {
    /// The table: code → (wire name, HTTP status).
    pub const fn spec(self) -> (&'static str, StatusCode) {
        match self {
            Code::BadRequest => ("BAD_REQUEST", StatusCode::BAD_REQUEST),
            Code::InvalidArgument => ("INVALID_ARGUMENT", StatusCode::BAD_REQUEST),
            Code::UnknownField => ("UNKNOWN_FIELD", StatusCode::BAD_REQUEST),
            Code::Unauthorized => ("UNAUTHORIZED", StatusCode::UNAUTHORIZED),
            Code::Forbidden => ("FORBIDDEN", StatusCode::FORBIDDEN),
            Code::NotFound => ("NOT_FOUND", StatusCode::NOT_FOUND),
            Code::MethodNotAllowed => ("METHOD_NOT_ALLOWED", StatusCode::METHOD_NOT_ALLOWED),
            Code::Conflict => ("CONFLICT", StatusCode::CONFLICT),
            Code::AlreadyExists => ("ALREADY_EXISTS", StatusCode::CONFLICT),
            Code::AlreadyDecided => ("ALREADY_DECIDED", StatusCode::CONFLICT),
            Code::PayloadTooLarge => ("PAYLOAD_TOO_LARGE", StatusCode::PAYLOAD_TOO_LARGE),
            Code::UnsupportedMediaType => ("UNSUPPORTED_MEDIA_TYPE", StatusCode::UNSUPPORTED_MEDIA_TYPE),
            Code::TooManyRequests => ("TOO_MANY_REQUESTS", StatusCode::TOO_MANY_REQUESTS),
            Code::ToolDisabled => ("TOOL_DISABLED", StatusCode::FORBIDDEN),
            Code::UpstreamUnavailable => ("UPSTREAM_UNAVAILABLE", StatusCode::BAD_GATEWAY),
            Code::UpstreamTimeout => ("UPSTREAM_TIMEOUT", StatusCode::GATEWAY_TIMEOUT),
            Code::ServiceUnavailable => ("SERVICE_UNAVAILABLE", StatusCode::SERVICE_UNAVAILABLE),
            Code::Internal => ("INTERNAL", StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// Every code, for docs and tests.
    pub const ALL: &'static [Code] = &[
        Code::BadRequest,
        Code::InvalidArgument,
        Code::UnknownField,
        Code::Unauthorized,
        Code::Forbidden,
        Code::NotFound,
        Code::MethodNotAllowed,
        Code::Conflict,
        Code::AlreadyExists,
        Code::AlreadyDecided,
        Code::PayloadTooLarge,
        Code::UnsupportedMediaType,
        Code::TooManyRequests,
        Code::ToolDisabled,
        Code::UpstreamUnavailable,
        Code::UpstreamTimeout,
        Code::ServiceUnavailable,
        Code::Internal,
    ];
}

/// A REST error: code, human message, optional details object.
#[derive(Debug)]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: json!({}) }
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(Code::NotFound, what)
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, msg)
    }
    /// 500 with an opaque message; the cause is logged (inside the request's trace span).
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "Internal error.");
        Self::new(Code::Internal, "internal error; see `coffer logs gateway` for this trace id")
    }
}

/// Log lines about client errors: bursts of 50, 5 a second on average; past that, the next
/// line written says how many were suppressed.
static CLIENT_ERRORS: coffer_runtime::logging::LogBudget = coffer_runtime::logging::LogBudget::new(5, 50);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, status) = self.code.spec();
        // A client's mistake is not an error of ours, but its trace id must still find it in the
        // log (the request span carries the id). 5xx were logged with their cause where they
        // arose. Messages never carry a secret (see the module docs), so they can be logged.
        // Anyone on the machine can cause these at will (a 401 needs no token): budgeted, and
        // the message (which may quote the request) clipped.
        if status.is_client_error()
            && let Some(suppressed) = CLIENT_ERRORS.allow()
        {
            let message = coffer_runtime::logging::clip(&self.message);
            tracing::info!(code, status = status.as_u16(), %message, suppressed, "Client error.");
        }
        let body = json!({"error": {"code": code, "message": self.message, "details": self.details}});
        (status, Json(body)).into_response()
    }
}

/// The one conversion from an internal RPC failure to the envelope.
impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code as G;
        match s.code() {
            G::InvalidArgument | G::OutOfRange => ApiError::invalid(s.message()),
            G::NotFound => ApiError::not_found(s.message()),
            G::AlreadyExists => ApiError::new(Code::AlreadyExists, s.message()),
            G::Aborted => ApiError::new(Code::Conflict, s.message()),
            G::FailedPrecondition => ApiError::new(Code::Conflict, s.message()),
            G::PermissionDenied => ApiError::new(Code::Forbidden, s.message()),
            G::Unavailable => {
                tracing::warn!(error = %s.message(), "Internal service unavailable.");
                ApiError::new(Code::ServiceUnavailable, "an internal service is restarting; retry shortly")
            }
            G::DeadlineExceeded => {
                ApiError::new(Code::ServiceUnavailable, "an internal service did not answer in time")
            }
            G::Cancelled => ApiError::new(
                Code::ServiceUnavailable,
                "an internal call was cancelled (a service restarting?); it may or may not have taken effect; retry shortly",
            ),
            G::Unknown if broke_mid_call(&s) => {
                tracing::warn!(error = %s.message(), "Internal service connection broke mid-call.");
                ApiError::new(
                    Code::ServiceUnavailable,
                    "an internal service restarted mid-request; it may or may not have taken effect; retry shortly",
                )
            }
            _ => ApiError::internal(format!("{:?}: {}", s.code(), s.message())),
        }
    }
}

impl ApiError {
    /// The envelope for a failed call to `coffer-retrieval` (`proto/retrieval.proto`'s status
    /// mapping), as [`ApiError::from_service`]. The built-in MCP tools use the same message as
    /// their tool error, so REST and MCP say the same thing.
    pub fn from_retrieval(s: tonic::Status) -> Self {
        Self::from_service("retrieval", s)
    }

    /// The envelope for a failed call to `coffer-chat` (`proto/chat.proto`'s status mapping),
    /// as [`ApiError::from_service`].
    pub fn from_chat(s: tonic::Status) -> Self {
        Self::from_service("chat", s)
    }

    /// The envelope for a failed call to coffer-chat's `Llm` service (`proto/llm.proto`'s status
    /// mapping), as [`ApiError::from_service`]: its service is coffer-chat.
    pub fn from_llm(s: tonic::Status) -> Self {
        Self::from_service("chat", s)
    }

    /// The envelope for a failed call to the internal service `service` (`retrieval`, `chat`):
    /// `INVALID_ARGUMENT` 400, `NOT_FOUND` 404, `ALREADY_EXISTS`, `FAILED_PRECONDITION` and
    /// `ABORTED` (stale version) 409 `CONFLICT`, `RESOURCE_EXHAUSTED` (e.g. a full pending queue)
    /// 429 `TOO_MANY_REQUESTS`, each with the service's message (written for the user: it names
    /// the field and the limit). A service that does not run, is restarting, broke mid-call or
    /// did not answer in time is 503 `SERVICE_UNAVAILABLE` saying so; anything else as
    /// [`From<tonic::Status>`].
    fn from_service(service: &str, s: tonic::Status) -> Self {
        use tonic::Code as G;
        let unavailable = |why: &str| {
            tracing::warn!(service, error = %s.message(), code = ?s.code(), "Internal service unavailable.");
            ApiError::new(
                Code::ServiceUnavailable,
                format!("the {service} service is not running ({why}); see `coffer status`, retry shortly"),
            )
        };
        match s.code() {
            G::InvalidArgument | G::OutOfRange => ApiError::invalid(s.message()),
            G::NotFound => ApiError::not_found(s.message()),
            G::AlreadyExists | G::FailedPrecondition | G::Aborted => ApiError::new(Code::Conflict, s.message()),
            G::ResourceExhausted => ApiError::new(Code::TooManyRequests, s.message()),
            G::Unavailable => unavailable("it is stopped, starting or restarting"),
            G::DeadlineExceeded => unavailable(s.message()),
            G::Cancelled => unavailable("the call was cancelled; it may or may not have taken effect"),
            G::Unknown if broke_mid_call(&s) => {
                unavailable("it stopped during the call; it may or may not have taken effect")
            }
            G::Unimplemented => unavailable("it does not serve this call: is it another version than the gateway?"),
            _ => ApiError::from(s),
        }
    }
}

/// True when a call failed because its connection broke (the service died mid-call): tonic
/// reports that as `Unknown` with a transport or I/O error as the source, not `UNAVAILABLE`.
fn broke_mid_call(s: &tonic::Status) -> bool {
    let m = s.message().to_ascii_lowercase();
    if ["transport error", "connection", "broken pipe", "h2 protocol error", "stream closed", "reset"]
        .iter()
        .any(|needle| m.contains(needle))
    {
        return true;
    }
    let mut source = std::error::Error::source(s);
    while let Some(e) = source {
        if e.is::<tonic::transport::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// JSON body extractor whose rejections are envelopes: the one way request bodies are read.
/// A body must say `Content-Type: application/json` (else 415 `UNSUPPORTED_MEDIA_TYPE`) and fit
/// the limit (413); then [`parse_json`]: malformed JSON → `BAD_REQUEST`, an unknown field →
/// `UNKNOWN_FIELD` naming its path, a missing field or a value of the wrong type →
/// `INVALID_ARGUMENT` naming its path (`coffer_api::body`).
pub struct JsonBody<T>(pub T);

impl<S, T> axum::extract::FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        // A JSON body must say so: a form post (curl's default) or text/plain is refused.
        let ct = req.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if essence != "application/json" && !essence.ends_with("+json") {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                format!(
                    "send the body as JSON with Content-Type: application/json (got {:?})",
                    ct.chars().take(60).collect::<String>()
                ),
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| body_rejection(e.status(), &e.body_text()))?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses a JSON request body into `T` ([`coffer_api::body::parse`]) with envelope errors.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    coffer_api::body::parse(bytes).map_err(ApiError::from)
}

/// The envelope of a refused body: `BAD_REQUEST`, `UNKNOWN_FIELD` or `INVALID_ARGUMENT`, with
/// the body error's message and details.
impl From<coffer_api::body::BodyError> for ApiError {
    fn from(e: coffer_api::body::BodyError) -> Self {
        use coffer_api::body::BodyErrorKind as K;
        let code = match e.kind {
            K::Syntax => Code::BadRequest,
            K::UnknownField => Code::UnknownField,
            K::Invalid => Code::InvalidArgument,
        };
        ApiError::new(code, e.message).with_details(e.details)
    }
}

/// The message of a 413 for a body limit of `limit` bytes: "request body is larger than the
/// limit (2 MiB)" (MiB or KiB when the limit is a whole number of them, else bytes).
pub fn too_large_message(limit: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;
    let size = match limit {
        n if n >= MIB && n % MIB == 0 => format!("{} MiB", n / MIB),
        n if n >= KIB && n % KIB == 0 => format!("{} KiB", n / KIB),
        n => format!("{n} bytes"),
    };
    format!("request body is larger than the limit ({size})")
}

/// The REST envelope of a body over the limit of `limit` bytes (`details.limit_bytes`).
pub fn too_large(limit: usize) -> ApiError {
    ApiError::new(Code::PayloadTooLarge, too_large_message(limit)).with_details(json!({"limit_bytes": limit}))
}

/// Maps a body-read failure (usually the size limit) to the envelope.
pub fn body_rejection(status: StatusCode, text: &str) -> ApiError {
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        too_large(crate::REST_BODY_LIMIT)
    } else {
        ApiError::new(Code::BadRequest, format!("cannot read request body: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_413_names_its_limit() {
        assert_eq!(too_large_message(crate::REST_BODY_LIMIT), "request body is larger than the limit (2 MiB)");
        assert_eq!(too_large_message(crate::MCP_BODY_LIMIT), "request body is larger than the limit (16 MiB)");
        assert_eq!(too_large_message(64 * 1024), "request body is larger than the limit (64 KiB)");
        assert_eq!(too_large_message(1000), "request body is larger than the limit (1000 bytes)");
        assert_eq!(too_large(crate::REST_BODY_LIMIT).details["limit_bytes"], crate::REST_BODY_LIMIT);
    }

    #[test]
    fn codes_are_upper_snake_and_unique() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            let (name, _) = c.spec();
            assert!(name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'), "{name}");
            assert!(seen.insert(name), "{name} twice");
        }
    }

    #[test]
    fn retrieval_statuses_map_to_the_documented_envelopes() {
        use tonic::Status;
        let cases = [
            (Status::invalid_argument("query is empty"), Code::InvalidArgument, Some("query is empty")),
            (Status::not_found("no knowledge base \"x\""), Code::NotFound, Some("no knowledge base \"x\"")),
            (
                Status::already_exists("knowledge base \"x\" exists"),
                Code::Conflict,
                Some("knowledge base \"x\" exists"),
            ),
            (Status::failed_precondition("memory cannot be removed"), Code::Conflict, Some("memory cannot be removed")),
            (Status::unavailable("tcp connect error"), Code::ServiceUnavailable, None),
            (Status::deadline_exceeded("did not answer within 30 s"), Code::ServiceUnavailable, None),
            (Status::unknown("transport error"), Code::ServiceUnavailable, None),
            (Status::unimplemented(""), Code::ServiceUnavailable, None),
        ];
        for (status, code, message) in cases {
            let e = ApiError::from_retrieval(status);
            assert_eq!(e.code, code, "{}", e.message);
            match message {
                Some(m) => assert_eq!(e.message, m),
                None => assert!(e.message.starts_with("the retrieval service is not running ("), "{}", e.message),
            }
        }
        assert_eq!(Code::Conflict.spec(), ("CONFLICT", StatusCode::CONFLICT));
        assert_eq!(ApiError::from_retrieval(tonic::Status::internal("boom")).code, Code::Internal);
    }

    #[test]
    fn chat_statuses_map_to_the_documented_envelopes() {
        use tonic::Status;
        let cases = [
            (Status::invalid_argument("text is empty"), Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (Status::not_found("no conversation \"01X\""), Code::NotFound, StatusCode::NOT_FOUND),
            (Status::failed_precondition("`claude` was not found on PATH"), Code::Conflict, StatusCode::CONFLICT),
            (Status::aborted("version 3 is stale (now 4)"), Code::Conflict, StatusCode::CONFLICT),
            (
                Status::resource_exhausted("the pending queue is full (100)"),
                Code::TooManyRequests,
                StatusCode::TOO_MANY_REQUESTS,
            ),
        ];
        for (status, code, http) in cases {
            let message = status.message().to_owned();
            let e = ApiError::from_chat(status);
            assert_eq!((e.code, e.code.spec().1), (code, http));
            assert_eq!(e.message, message);
        }
        for down in [
            Status::unavailable("tcp connect error"),
            Status::deadline_exceeded("30 s"),
            Status::unknown("transport error"),
        ] {
            let e = ApiError::from_chat(down);
            assert_eq!(e.code, Code::ServiceUnavailable);
            assert!(e.message.starts_with("the chat service is not running ("), "{}", e.message);
        }
        assert_eq!(ApiError::from_chat(tonic::Status::internal("boom")).code, Code::Internal);
    }
}
