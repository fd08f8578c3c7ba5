//! The CLI's one error type and the one mapping from outcomes to process exit codes.
//!
//! Exit codes (design, "Wire contracts"): 0 ok, 1 error, 2 usage, 3 not found, 4 conflict,
//! 5 daemon unreachable. clap exits with 2 on its own usage errors before any of this runs.
use coffer_runtime::connect::ConnectError;
use serde_json::Value;

/// Process exit codes of `coffer`.
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const UNREACHABLE: u8 = 5;
}

/// Exit code for an HTTP status the daemon answered with: 2xx → 0, 404 → 3, 409 → 4, anything
/// else → 1. The only place HTTP statuses become exit codes.
pub fn exit_code_for_status(status: u16) -> u8 {
    match status {
        200..=299 => exit::OK,
        404 => exit::NOT_FOUND,
        409 => exit::CONFLICT,
        _ => exit::ERROR,
    }
}

/// A non-2xx answer from the REST API, decoded from the error envelope
/// `{"error":{"code","message","details"}}` when the body is one.
#[derive(Debug, Clone)]
pub struct ApiFailure {
    /// HTTP status.
    pub status: u16,
    /// Envelope code (`NOT_FOUND`, `CONFLICT`, …); `HTTP_<status>` when the body was no envelope.
    pub code: String,
    pub message: String,
    pub details: Value,
    /// The `X-Coffer-Trace` header of the response, when present.
    pub trace: Option<String>,
    /// What the user can do about it, printed as a second `hint:` line (set by the command that
    /// knows, see [`CliError::with_hint`]).
    pub hint: Option<String>,
}

impl ApiFailure {
    /// Decodes a failed response body. A body that is not an envelope (a proxy, a panic page)
    /// keeps its first 200 characters as the message.
    pub fn from_body(status: u16, trace: Option<String>, body: &str) -> Self {
        let envelope = serde_json::from_str::<Value>(body).ok().and_then(|v| v.get("error").cloned());
        if let Some(e) = envelope.filter(Value::is_object) {
            let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_owned);
            return Self {
                status,
                code: text("code").unwrap_or_else(|| format!("HTTP_{status}")),
                message: text("message").unwrap_or_else(|| format!("HTTP {status}")),
                details: e.get("details").cloned().unwrap_or(Value::Null),
                trace,
                hint: None,
            };
        }
        let snippet: String = body.trim().chars().take(200).collect();
        let message = if snippet.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {snippet}") };
        Self { status, code: format!("HTTP_{status}"), message, details: Value::Null, trace, hint: None }
    }
}

/// Everything a command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The daemon could not be found or started (exit 5).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A command that never starts the daemon found none running (exit 5).
    #[error("the Coffer daemon is not running; start it with `coffer daemon start`")]
    NotRunning,
    /// The daemon did not answer on its port: refused, reset, timed out (exit 5).
    #[error("cannot reach the Coffer daemon: {0}")]
    Unreachable(String),
    /// The daemon answered with an error status (exit from [`exit_code_for_status`]).
    #[error("{}", .0.message)]
    Api(Box<ApiFailure>),
    /// Something the command looked up locally or in a body does not exist (exit 3), e.g.
    /// `settings get KEY` of an unset key. API 404s are [`CliError::Api`].
    #[error("{0}")]
    NotFound(String),
    /// The command line is valid for clap but not for the command (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Any other failure (exit 1).
    #[error("{0}")]
    Failed(String),
    /// The command already printed its result; exit with this code and print nothing more
    /// (`daemon status` when no daemon runs).
    #[error("exit {0}")]
    Quiet(u8),
    /// stdout was closed by the reader (`coffer logs | head`): stop quietly, exit 0.
    #[error("stdout closed")]
    StdoutClosed,
}

impl CliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Connect(_) | CliError::NotRunning | CliError::Unreachable(_) => exit::UNREACHABLE,
            CliError::Api(f) => exit_code_for_status(f.status),
            CliError::Usage(_) => exit::USAGE,
            CliError::NotFound(_) => exit::NOT_FOUND,
            CliError::Failed(_) => exit::ERROR,
            CliError::Quiet(code) => *code,
            CliError::StdoutClosed => exit::OK,
        }
    }

    /// The line printed on stderr, or `None` when nothing should be printed.
    /// API errors read `error: <message> (trace <id>)`, followed by `hint: <hint>` when set.
    pub fn render(&self) -> Option<String> {
        match self {
            CliError::Quiet(_) | CliError::StdoutClosed => None,
            CliError::Api(f) => {
                let mut s = match &f.trace {
                    Some(t) => format!("error: {} (trace {t})", f.message),
                    None => format!("error: {}", f.message),
                };
                if let Some(h) = &f.hint {
                    s.push_str("\nhint: ");
                    s.push_str(h);
                }
                Some(s)
            }
            other => Some(format!("error: {other}")),
        }
    }

    /// The envelope code of an API error (`NOT_FOUND`, `TOOL_DISABLED`, …); `None` for other
    /// errors.
    pub fn api_code(&self) -> Option<&str> {
        match self {
            CliError::Api(f) => Some(&f.code),
            _ => None,
        }
    }

    /// The envelope `details` of an API error; `None` for other errors.
    pub fn api_details(&self) -> Option<&Value> {
        match self {
            CliError::Api(f) => Some(&f.details),
            _ => None,
        }
    }

    /// Adds a `hint:` line to an API error; other errors are returned unchanged.
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        if let CliError::Api(f) = &mut self {
            f.hint = Some(hint.into());
        }
        self
    }
}

impl From<ApiFailure> for CliError {
    fn from(f: ApiFailure) -> Self {
        CliError::Api(Box::new(f))
    }
}

impl From<reqwest::Error> for CliError {
    /// Transport failures (connect, timeout, reset mid-request) mean the daemon is unreachable;
    /// anything else (a body that does not decode) is a plain error.
    fn from(e: reqwest::Error) -> Self {
        if e.is_connect() || e.is_timeout() || e.is_request() {
            CliError::Unreachable(error_chain(&e))
        } else {
            CliError::Failed(error_chain(&e))
        }
    }
}

/// `e` and its sources joined with `: ` (reqwest hides the useful part in the source chain).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let part = c.to_string();
        if !s.contains(&part) {
            s.push_str(": ");
            s.push_str(&part);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_statuses_map_to_exit_codes() {
        assert_eq!(exit_code_for_status(200), 0);
        assert_eq!(exit_code_for_status(202), 0);
        assert_eq!(exit_code_for_status(204), 0);
        assert_eq!(exit_code_for_status(404), 3);
        assert_eq!(exit_code_for_status(409), 4);
        for s in [400, 401, 403, 413, 500, 502, 503, 504] {
            assert_eq!(exit_code_for_status(s), 1, "{s}");
        }
    }

    #[test]
    fn errors_map_to_exit_codes() {
        let api = |status| CliError::from(ApiFailure::from_body(status, None, ""));
        assert_eq!(api(404).exit_code(), exit::NOT_FOUND);
        assert_eq!(api(409).exit_code(), exit::CONFLICT);
        assert_eq!(api(500).exit_code(), exit::ERROR);
        assert_eq!(CliError::Unreachable("refused".into()).exit_code(), exit::UNREACHABLE);
        let timeout = ConnectError::Timeout(std::time::Duration::from_secs(1), "x".into());
        assert_eq!(CliError::from(timeout).exit_code(), exit::UNREACHABLE);
        assert_eq!(CliError::Usage("x".into()).exit_code(), exit::USAGE);
        assert_eq!(CliError::NotFound("x".into()).exit_code(), exit::NOT_FOUND);
        assert_eq!(CliError::Failed("x".into()).exit_code(), exit::ERROR);
        assert_eq!(CliError::Quiet(5).exit_code(), 5);
        assert_eq!(CliError::StdoutClosed.exit_code(), exit::OK);
    }

    #[test]
    fn envelope_is_decoded_and_rendered_with_trace() {
        let body = r#"{"error":{"code":"NOT_FOUND","message":"no server \"x\"","details":{"name":"x"}}}"#;
        let f = ApiFailure::from_body(404, Some("abc123".into()), body);
        assert_eq!(f.code, "NOT_FOUND");
        assert_eq!(f.details["name"], "x");
        assert_eq!(CliError::from(f).render().unwrap(), r#"error: no server "x" (trace abc123)"#);
    }

    #[test]
    fn hints_render_on_a_second_line() {
        let body = r#"{"error":{"code":"TOOL_DISABLED","message":"Tool x is disabled","details":{}}}"#;
        let e = CliError::from(ApiFailure::from_body(403, Some("t1".into()), body)).with_hint("coffer tools enable x");
        assert_eq!(e.api_code(), Some("TOOL_DISABLED"));
        assert!(e.api_details().is_some_and(|d| d.is_object()));
        assert_eq!(e.render().unwrap(), "error: Tool x is disabled (trace t1)\nhint: coffer tools enable x");
        assert_eq!(CliError::Failed("x".into()).with_hint("h").render().unwrap(), "error: x");
    }

    #[test]
    fn non_envelope_body_keeps_a_snippet() {
        let f = ApiFailure::from_body(502, None, "  Bad Gateway\n");
        assert_eq!(f.code, "HTTP_502");
        assert_eq!(f.message, "HTTP 502: Bad Gateway");
        assert_eq!(ApiFailure::from_body(500, None, "").message, "HTTP 500");
        assert_eq!(CliError::from(f).render().unwrap(), "error: HTTP 502: Bad Gateway");
    }

    #[test]
    fn quiet_errors_print_nothing() {
        assert!(CliError::Quiet(5).render().is_none());
        assert!(CliError::StdoutClosed.render().is_none());
    }
}
