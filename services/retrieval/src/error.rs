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
            Error::Invalid(m) => Status::invalid_argument(m),
            Error::NotFound(m) => Status::not_found(m),
            Error::AlreadyExists(m) => Status::already_exists(m),
            Error::Precondition(m) => Status::failed_precondition(m),
            Error::Unavailable(m) => Status::unavailable(m),
            // The store's verdicts on what the caller sent pass through; the rest say the store
            // is not there (it restarts) or is an internal failure (logged, opaque).
            Error::Store(s) => match s.code() {
                Code::InvalidArgument | Code::NotFound | Code::AlreadyExists | Code::FailedPrecondition => {
                    Status::new(s.code(), s.message().to_owned())
                }
                Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => {
                    Status::unavailable(format!("the store is unavailable: {}", s.message()))
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
}
