//! The shim's stdin and stdout as async byte streams that the runtime polls directly.
//!
//! `tokio::io::stdin`/`stdout` do every read and write on a blocking-pool thread and hand the
//! result over, which costs two thread wake-ups per call on a busy session. MCP clients start
//! the shim with pipes (Python's `subprocess`, Rust's `Command`) or socket pairs (Node's
//! `child_process`), which can be made non-blocking and registered with the reactor instead:
//! a FIFO becomes a [`tokio::net::unix::pipe`] end, a socket a [`tokio::net::UnixStream`].
//! Anything else (a terminal, a regular file, `/dev/null`) keeps tokio's blocking-pool streams.
//!
//! Making a descriptor non-blocking changes its open file description, which the client's end
//! of a pipe does not share; the shim only does it for FIFOs and sockets.
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

/// Standard input, read through the reactor when it is a pipe or a socket.
pub type Stdin = Pin<Box<dyn AsyncRead + Send>>;
/// Standard output, written through the reactor when it is a pipe or a socket.
pub type Stdout = Pin<Box<dyn AsyncWrite + Send>>;

/// What kind of file a standard descriptor is.
enum Kind {
    Fifo,
    Socket,
    Other,
}

fn kind(fd: impl AsFd) -> Kind {
    match nix::sys::stat::fstat(fd) {
        Ok(st) => match nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT {
            nix::sys::stat::SFlag::S_IFIFO => Kind::Fifo,
            nix::sys::stat::SFlag::S_IFSOCK => Kind::Socket,
            _ => Kind::Other,
        },
        Err(_) => Kind::Other,
    }
}

/// A duplicate of `fd` in non-blocking mode, for the reactor.
fn nonblocking_dup(fd: impl AsFd) -> io::Result<OwnedFd> {
    let owned = fd.as_fd().try_clone_to_owned()?;
    let flags = nix::fcntl::fcntl(&owned, nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&owned, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(owned)
}

/// `fd` made non-blocking and wrapped by `fifo` or `socket` for the reactor; `None` (stay on the
/// blocking pool) for any other kind of file or when that fails.
fn through_reactor<S>(
    fd: BorrowedFd<'_>,
    name: &str,
    fifo: impl FnOnce(OwnedFd) -> io::Result<S>,
    socket: impl FnOnce(OwnedFd) -> io::Result<S>,
) -> Option<S> {
    let wrapped = match kind(fd) {
        Kind::Fifo => nonblocking_dup(fd).and_then(fifo),
        Kind::Socket => nonblocking_dup(fd).and_then(socket),
        Kind::Other => return None,
    };
    wrapped.map_err(|err| tracing::debug!(error = %err, "{name} stays on the blocking pool.")).ok()
}

fn unix_stream(fd: OwnedFd) -> io::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}

/// The process's standard input. Must be called inside the runtime.
pub fn stdin() -> Stdin {
    through_reactor(
        io::stdin().as_fd(),
        "stdin",
        |fd| Ok(Box::pin(tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(fd)?) as Stdin),
        |fd| Ok(Box::pin(unix_stream(fd)?) as Stdin),
    )
    .unwrap_or_else(|| Box::pin(tokio::io::stdin()))
}

/// The process's standard output. Must be called inside the runtime.
pub fn stdout() -> Stdout {
    through_reactor(
        io::stdout().as_fd(),
        "stdout",
        |fd| Ok(Box::pin(tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(fd)?) as Stdout),
        |fd| Ok(Box::pin(unix_stream(fd)?) as Stdout),
    )
    .unwrap_or_else(|| Box::pin(tokio::io::stdout()))
}
