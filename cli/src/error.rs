//! The CLI's one error type and the one mapping from outcomes to process exit codes.
//!
//! Exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 conflict,
//! 5 daemon unreachable. clap exits with 2 on its own usage errors before any of this runs.
//!
//! With `--json` every error is also printed on stdout as one JSON document in the shape of the
//! REST error envelope ([`CliError::envelope`]); local errors get an UPPER_SNAKE code of their
//! own ([`codes`]).
use coffer_runtime::connect::ConnectError;
use serde_json::{Value, json};

/// Process exit codes of `coffer`.
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NOT_FOUND: u8 = 3;
    pub const CONFLICT: u8 = 4;
    pub const UNREACHABLE: u8 = 5;
}

/// Envelope codes of errors the CLI finds itself (the REST API's own codes are passed through).
pub mod codes {
    /// The command line is valid for clap but not for the command, or clap refused it (exit 2).
    pub const INVALID_ARGUMENT: &str = "INVALID_ARGUMENT";
    /// Something looked up locally does not exist (exit 3).
    pub const NOT_FOUND: &str = "NOT_FOUND";
    /// A bad local configuration: `--home`/`COFFER_HOME`, `COFFER_PORT`, … (exit 1).
    pub const INVALID_CONFIG: &str = "INVALID_CONFIG";
    /// No daemon runs and the command does not start one (exit 5).
    pub const DAEMON_NOT_RUNNING: &str = "DAEMON_NOT_RUNNING";
    /// The daemon could not be started or does not answer (exit 5).
    pub const DAEMON_UNREACHABLE: &str = "DAEMON_UNREACHABLE";
    /// Any other failure (exit 1).
    pub const ERROR: &str = "ERROR";
}

/// Envelope codes of a 400 answer that mean the user's input was wrong (exit 2, like a clap
/// usage error): an invalid name, a `--since` that does not parse, a bad `--cursor`, …
pub const USAGE_CODES: &[&str] = &["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"];

/// Exit code for an HTTP status the daemon answered with: 2xx → 0, 404 → 3, 409 → 4, anything
/// else → 1 (a 400 can also be 2: see [`exit_code_for_api`]).
pub fn exit_code_for_status(status: u16) -> u8 {
    match status {
        200..=299 => exit::OK,
        404 => exit::NOT_FOUND,
        409 => exit::CONFLICT,
        _ => exit::ERROR,
    }
}

/// Exit code for an error answer: a 400 whose envelope code is one of [`USAGE_CODES`] is a usage
/// error (2); anything else as [`exit_code_for_status`]. The only place API answers become exit
/// codes.
pub fn exit_code_for_api(status: u16, code: &str) -> u8 {
    if status == 400 && USAGE_CODES.contains(&code) { exit::USAGE } else { exit_code_for_status(status) }
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
    /// A bad local configuration that is not about reaching the daemon: `--home` names a file,
    /// `COFFER_PORT` is not a port, … (exit 1). The message names the path or variable.
    #[error("{0}")]
    Config(String),
    /// Any other failure (exit 1).
    #[error("{0}")]
    Failed(String),
    /// `--json`: the command already printed its JSON document, error included; print the
    /// inner error on stderr only (no second document on stdout) and exit with its code.
    #[error("{0}")]
    Printed(Box<CliError>),
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
            // A home that cannot be prepared is a local configuration error, not an unreachable
            // daemon.
            CliError::Connect(ConnectError::Home(_)) => exit::ERROR,
            CliError::Connect(_) | CliError::NotRunning | CliError::Unreachable(_) => exit::UNREACHABLE,
            CliError::Api(f) => exit_code_for_api(f.status, &f.code),
            CliError::Usage(_) => exit::USAGE,
            CliError::NotFound(_) => exit::NOT_FOUND,
            CliError::Config(_) | CliError::Failed(_) => exit::ERROR,
            CliError::Printed(inner) => inner.exit_code(),
            CliError::Quiet(code) => *code,
            CliError::StdoutClosed => exit::OK,
        }
    }

    /// The line printed on stderr, or `None` when nothing should be printed.
    /// API errors read `error: <message> (trace <id>)`, followed by `hint: <hint>` when set.
    pub fn render(&self) -> Option<String> {
        match self {
            CliError::Quiet(_) | CliError::StdoutClosed => None,
            CliError::Printed(inner) => inner.render(),
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

    /// The error as one JSON document for `--json` (printed on stdout): the REST error envelope
    /// `{"error":{"code","message","details"}}`, with `"trace_id"` beside `"error"` when the
    /// daemon gave one. API errors keep the daemon's envelope; local errors get a code from
    /// [`codes`] and empty details. `None` when nothing should be printed.
    pub fn envelope(&self) -> Option<Value> {
        let (code, details, trace) = match self {
            CliError::Quiet(_) | CliError::StdoutClosed | CliError::Printed(_) => return None,
            CliError::Api(f) => {
                let details = if f.details.is_null() { json!({}) } else { f.details.clone() };
                (f.code.as_str(), details, f.trace.as_deref())
            }
            CliError::Connect(ConnectError::Home(_)) | CliError::Config(_) => (codes::INVALID_CONFIG, json!({}), None),
            CliError::Connect(_) | CliError::Unreachable(_) => (codes::DAEMON_UNREACHABLE, json!({}), None),
            CliError::NotRunning => (codes::DAEMON_NOT_RUNNING, json!({}), None),
            CliError::Usage(_) => (codes::INVALID_ARGUMENT, json!({}), None),
            CliError::NotFound(_) => (codes::NOT_FOUND, json!({}), None),
            CliError::Failed(_) => (codes::ERROR, json!({}), None),
        };
        let message = match self {
            CliError::Api(f) => f.message.clone(),
            other => other.to_string(),
        };
        let mut v = json!({"error": {"code": code, "message": message, "details": details}});
        if let Some(t) = trace {
            v["trace_id"] = json!(t);
        }
        Some(v)
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

    /// The error of a command that already printed its `--json` document (which carries the
    /// error): stderr still gets the message, stdout no second document.
    pub fn printed(self) -> Self {
        match self {
            e @ (CliError::Quiet(_) | CliError::StdoutClosed | CliError::Printed(_)) => e,
            e => CliError::Printed(Box::new(e)),
        }
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
        // A request that could not be built (a URL over the HTTP client's limits): the message
        // without the URL, which holds the argument (it may be megabytes).
        if e.is_builder() {
            return CliError::Usage(format!(
                "the request could not be built (an argument is too long or malformed): {}",
                error_chain(&e.without_url())
            ));
        }
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
    fn bad_input_answers_are_usage_errors() {
        for code in ["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"] {
            assert_eq!(exit_code_for_api(400, code), exit::USAGE, "{code}");
            let body = format!(r#"{{"error":{{"code":"{code}","message":"m","details":{{}}}}}}"#);
            assert_eq!(CliError::from(ApiFailure::from_body(400, None, &body)).exit_code(), exit::USAGE);
        }
        // A 400 that is no envelope, or another status with one of those codes, is not.
        assert_eq!(CliError::from(ApiFailure::from_body(400, None, "oops")).exit_code(), exit::ERROR);
        assert_eq!(exit_code_for_api(413, "PAYLOAD_TOO_LARGE"), exit::ERROR);
        assert_eq!(exit_code_for_api(415, "UNSUPPORTED_MEDIA_TYPE"), exit::ERROR);
        assert_eq!(exit_code_for_api(404, "NOT_FOUND"), exit::NOT_FOUND);
        assert_eq!(exit_code_for_api(409, "ALREADY_EXISTS"), exit::CONFLICT);
        assert_eq!(exit_code_for_api(502, "UPSTREAM_UNAVAILABLE"), exit::ERROR);
    }

    #[test]
    fn local_configuration_errors_exit_1_not_5() {
        let home = coffer_runtime::home::HomeError::NotADirectory { path: "/some/file".into() };
        let e = CliError::from(ConnectError::Home(home));
        assert_eq!(e.exit_code(), exit::ERROR);
        assert!(e.render().unwrap().contains("/some/file"));
        assert_eq!(e.envelope().unwrap()["error"]["code"], codes::INVALID_CONFIG);
        assert_eq!(CliError::Config("COFFER_PORT".into()).exit_code(), exit::ERROR);
        let missing = ConnectError::NoDaemonBinary { exe: "/x".into() };
        assert_eq!(CliError::from(missing).exit_code(), exit::UNREACHABLE);
    }

    #[test]
    fn json_envelopes() {
        let body = r#"{"error":{"code":"NOT_FOUND","message":"no server \"x\"","details":{"name":"x"}}}"#;
        let e = CliError::from(ApiFailure::from_body(404, Some("abc".into()), body)).with_hint("h");
        assert_eq!(
            e.envelope().unwrap(),
            json!({"error": {"code": "NOT_FOUND", "message": "no server \"x\"", "details": {"name": "x"}}, "trace_id": "abc"})
        );
        // No trace, no trace_id; a body that is no envelope still gives one.
        let e = CliError::from(ApiFailure::from_body(502, None, "Bad Gateway"));
        assert_eq!(
            e.envelope().unwrap(),
            json!({"error": {"code": "HTTP_502", "message": "HTTP 502: Bad Gateway", "details": {}}})
        );
        let local = |e: CliError| e.envelope().unwrap()["error"]["code"].as_str().unwrap().to_owned();
        assert_eq!(local(CliError::Usage("u".into())), "INVALID_ARGUMENT");
        assert_eq!(local(CliError::NotFound("n".into())), "NOT_FOUND");
        assert_eq!(local(CliError::Failed("f".into())), "ERROR");
        assert_eq!(local(CliError::Config("c".into())), "INVALID_CONFIG");
        assert_eq!(local(CliError::NotRunning), "DAEMON_NOT_RUNNING");
        assert_eq!(local(CliError::Unreachable("r".into())), "DAEMON_UNREACHABLE");
        assert_eq!(CliError::Usage("bad".into()).envelope().unwrap()["error"]["message"], "bad");
        // Already printed, or nothing to print: no document.
        assert!(CliError::Quiet(1).envelope().is_none());
        assert!(CliError::StdoutClosed.envelope().is_none());
        let printed = CliError::Usage("x".into()).printed();
        assert!(printed.envelope().is_none());
        assert_eq!(printed.exit_code(), exit::USAGE);
        assert_eq!(printed.render().unwrap(), "error: x");
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
