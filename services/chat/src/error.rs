//! The chat service's one error type, and its one conversion to `tonic::Status` (the status
//! mapping at the top of `proto/chat.proto`).
use tonic::{Code, Status};

/// Why a Chat request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message names the field and the limit.
    #[error("{0}")]
    Invalid(String),
    /// A conversation or agent that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A request that cannot apply now (agent unavailable, archived conversation).
    #[error("{0}")]
    Precondition(String),
    /// Something that exists already (an agent session imported before); the message names it.
    #[error("{0}")]
    AlreadyExists(String),
    /// A stale `expected_version`.
    #[error("{0}")]
    Aborted(String),
    /// The pending queue is full.
    #[error("{0}")]
    Exhausted(String),
    /// An approval request answered before; the first decision (`ALREADY_EXISTS`, the decision
    /// encoded in the status details).
    #[error("{0}")]
    AlreadyDecided(String, Box<coffer_proto::chat::ApprovalResolved>),
    /// The store answered with an error.
    #[error("the store answered {}: {}", .0.code(), .0.message())]
    Store(Status),
    /// Anything else that is not the caller's fault.
    #[error("{0}")]
    Internal(String),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

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
            Error::Precondition(m) => Status::failed_precondition(m),
            Error::Aborted(m) => Status::aborted(m),
            Error::AlreadyExists(m) => Status::already_exists(m),
            Error::Exhausted(m) => Status::resource_exhausted(m),
            Error::AlreadyDecided(m, first) => {
                Status::with_details(Code::AlreadyExists, m, prost::Message::encode_to_vec(&*first).into())
            }
            // The store's verdicts on what the caller sent pass through; the rest say the store
            // is not there (it restarts) or are internal failures (logged, opaque).
            Error::Store(s) => match s.code() {
                Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::FailedPrecondition
                | Code::Aborted => Status::new(s.code(), s.message().to_owned()),
                Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded => {
                    Status::unavailable(format!("the store is unavailable: {}", s.message()))
                }
                _ => {
                    tracing::error!(code = %s.code(), error = %s.message(), "Store call failed.");
                    Status::internal("internal error in coffer-chat (see logs/chat.log)")
                }
            },
            e @ Error::Internal(_) => {
                tracing::error!(error = %e, "Chat request failed.");
                Status::internal("internal error in coffer-chat (see logs/chat.log)")
            }
        }
    }
}
