//! Retrieval's one error type, and its one conversion to `tonic::Status` (the status mapping of
//! `proto/retrieval.proto`).
use tonic::{Code, Status};

/// Why a Retrieval request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message names the field and the limit.
    #[error("{0}")]
    Invalid(String),
    /// A KB, fact or skill that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A KB name that is taken.
    #[error("{0}")]
    AlreadyExists(String),
    /// A request that cannot apply in the current state (removing the memory KB).
    #[error("{0}")]
    Precondition(String),
    /// Not ready yet (the store has not answered since start).
    #[error("{0}")]
    Unavailable(String),
    /// The store answered with an error.
    #[error("the store answered {}: {}", .0.code(), .0.message())]
    Store(Status),
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (a path, never a secret).
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Anything else that is not the caller's fault.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// An [`Error::Io`] with its context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }
}

impl From<Status> for Error {
    fn from(s: Status) -> Self {
        Self::Store(s)
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid(m) => Status::invalid_argument(bounded(m)),
            Error::NotFound(m) => Status::not_found(bounded(m)),
            Error::AlreadyExists(m) => Status::already_exists(bounded(m)),
            Error::Precondition(m) => Status::failed_precondition(bounded(m)),
            Error::Unavailable(m) => Status::unavailable(bounded(m)),
            // The store's verdicts on what the caller sent pass through; the rest say the store
            // is not there (it restarts) or is an internal failure (logged, opaque).
            Error::Store(s) => match s.code() {
                Code::InvalidArgument | Code::NotFound | Code::AlreadyExists | Code::FailedPrecondition => {
                    Status::new(s.code(), bounded(s.message().to_owned()))
                }
                Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => {
                    Status::unavailable(bounded(format!("the store is unavailable: {}", s.message())))
                }
                _ => {
                    tracing::error!(code = %s.code(), error = %s.message(), "Store call failed.");
                    Status::internal("internal error in coffer-retrieval (see `coffer logs retrieval`)")
                }
            },
            e @ (Error::Io { .. } | Error::Internal(_)) => {
                tracing::error!(error = %e, "Retrieval request failed.");
                Status::internal("internal error in coffer-retrieval (see `coffer logs retrieval`)")
            }
        }
    }
}

/// Most characters of a caller's value an error message quotes ([`shown`]).
pub const SHOWN_CHARS: usize = 120;

/// Longest message a `Status` from this service carries, bytes. The message travels as an
/// HTTP/2 header (`grpc-message`, percent-encoded): one holding a caller's 100 KB value would
/// break the connection ("h2 protocol error") instead of reaching the caller.
pub const MAX_STATUS_MESSAGE_BYTES: usize = 2048;

/// `value` as an error message quotes a caller's value: in double quotes, `"`, `\` and control
/// characters escaped as JSON writes them (`\n`, `\u001b`: the CLI's escapes, docs/CLI.md),
/// at most [`SHOWN_CHARS`] characters, ending in `…` (inside the quotes) when cut.
pub fn shown(value: &str) -> String {
    shown_at(value, SHOWN_CHARS)
}

/// [`shown`] with at most `max` characters of `value`.
pub fn shown_at(value: &str, max: usize) -> String {
    let mut out = String::with_capacity(value.len().min(max * 4) + 4);
    out.push('"');
    for (n, c) in value.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `message` cut to at most [`MAX_STATUS_MESSAGE_BYTES`] bytes (at a character boundary,
/// ending in `…` when cut): every status this service answers goes through it.
fn bounded(message: String) -> String {
    if message.len() <= MAX_STATUS_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_STATUS_MESSAGE_BYTES - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Shorthand for retrieval results.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_follows_the_proto() {
        assert_eq!(Status::from(Error::Invalid("query is empty".into())).code(), Code::InvalidArgument);
        assert_eq!(Status::from(Error::NotFound("no KB".into())).code(), Code::NotFound);
        assert_eq!(Status::from(Error::AlreadyExists("taken".into())).code(), Code::AlreadyExists);
        assert_eq!(Status::from(Error::Precondition("memory".into())).code(), Code::FailedPrecondition);
        assert_eq!(Status::from(Error::Store(Status::unavailable("down"))).code(), Code::Unavailable);
        assert_eq!(Status::from(Error::Store(Status::already_exists("kb x exists"))).message(), "kb x exists");
        let s = Status::from(Error::Store(Status::internal("SQL details")));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("SQL"), "opaque: {}", s.message());
    }

    #[test]
    fn a_status_message_is_bounded_whatever_the_caller_sent() {
        let huge = "é".repeat(100_000);
        for e in
            [Error::Invalid(huge.clone()), Error::NotFound(huge.clone()), Error::Store(Status::invalid_argument(&huge))]
        {
            let s = Status::from(e);
            assert!(
                s.message().len() <= MAX_STATUS_MESSAGE_BYTES && s.message().ends_with('…'),
                "{}",
                s.message().len()
            );
        }
        assert_eq!(Status::from(Error::Invalid("short".into())).message(), "short");
    }

    #[test]
    fn shown_quotes_clips_with_an_ellipsis_and_escapes_as_json_does() {
        assert_eq!(shown("notes"), "\"notes\"");
        assert_eq!(shown("a\u{1b}[31m\"b\\\n"), "\"a\\u001b[31m\\\"b\\\\\\n\"");
        let long = "x".repeat(100_000);
        assert_eq!(shown(&long), format!("\"{}…\"", "x".repeat(SHOWN_CHARS)));
        assert_eq!(shown(&"x".repeat(SHOWN_CHARS)), format!("\"{}\"", "x".repeat(SHOWN_CHARS)));
        assert_eq!(shown_at("日本語です", 3), "\"日本語…\"");
    }
}
