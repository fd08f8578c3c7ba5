//! Listeners inherited from the supervisor as file descriptors, so that a restarted service
//! comes back on the same address.
use std::net::TcpListener as StdListener;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Error taking an inherited listener.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("environment variable {0} is not set: this binary is started by coffer-daemon")]
    Missing(&'static str),
    #[error("environment variable {var} is not a file descriptor number: {value:?}")]
    Invalid { var: &'static str, value: String },
    #[error("inherited descriptor {fd} is not a usable listening socket: {source}")]
    Unusable { fd: RawFd, source: std::io::Error },
}

/// Takes ownership of the TCP listener whose descriptor number is in environment variable `var`
/// and returns it as a non-blocking tokio listener.
///
/// # Errors
/// [`ListenError`] when the variable is missing or the descriptor is not an open socket.
pub fn inherited(var: &'static str) -> Result<tokio::net::TcpListener, ListenError> {
    let value = std::env::var(var).map_err(|_| ListenError::Missing(var))?;
    let fd: RawFd = value.parse().map_err(|_| ListenError::Invalid { var, value: value.clone() })?;
    // Validate before taking ownership: the fd must be open.
    nix::fcntl::fcntl(
        unsafe_borrow(fd).map_err(|source| ListenError::Unusable { fd, source })?,
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .map_err(|e| ListenError::Unusable { fd, source: e.into() })?;
    let owned = take_fd(fd)?;
    let std_listener = StdListener::from(owned);
    std_listener.set_nonblocking(true).map_err(|source| ListenError::Unusable { fd, source })?;
    std_listener.local_addr().map_err(|source| ListenError::Unusable { fd, source })?;
    tokio::net::TcpListener::from_std(std_listener).map_err(|source| ListenError::Unusable { fd, source })
}

/// Takes ownership of the Unix-domain listener whose descriptor number is in environment
/// variable `var`, when `var` is set (`None` when it is not: the supervisor bound no socket).
///
/// # Errors
/// [`ListenError`] when the value is not a descriptor number or not an open listening socket.
pub fn inherited_unix(var: &'static str) -> Result<Option<tokio::net::UnixListener>, ListenError> {
    let Ok(value) = std::env::var(var) else { return Ok(None) };
    let fd: RawFd = value.parse().map_err(|_| ListenError::Invalid { var, value: value.clone() })?;
    nix::fcntl::fcntl(
        unsafe_borrow(fd).map_err(|source| ListenError::Unusable { fd, source })?,
        nix::fcntl::FcntlArg::F_GETFD,
    )
    .map_err(|e| ListenError::Unusable { fd, source: e.into() })?;
    let listener = std::os::unix::net::UnixListener::from(take_fd(fd)?);
    listener.set_nonblocking(true).map_err(|source| ListenError::Unusable { fd, source })?;
    listener.local_addr().map_err(|source| ListenError::Unusable { fd, source })?;
    tokio::net::UnixListener::from_std(listener).map(Some).map_err(|source| ListenError::Unusable { fd, source })
}

#[allow(unsafe_code)]
fn unsafe_borrow(fd: RawFd) -> Result<std::os::fd::BorrowedFd<'static>, std::io::Error> {
    if fd < 0 {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: the fd number came from our parent, which placed an open listener there before
    // exec; it stays open for the life of this process (we take ownership right after).
    Ok(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
}

#[allow(unsafe_code)]
fn take_fd(fd: RawFd) -> Result<OwnedFd, ListenError> {
    // SAFETY: fd was validated as open by F_GETFD, and nothing else in this process owns it:
    // the supervisor hands each inherited descriptor to exactly one consumer.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // It came across exec without close-on-exec (that is how it was passed); set it now, so
    // processes this service starts (the gateway's upstream servers) never hold a listener:
    // a child left running would keep the port and the socket after the daemon stopped.
    nix::fcntl::fcntl(&owned, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
        .map_err(|e| ListenError::Unusable { fd, source: e.into() })?;
    Ok(owned)
}
