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
use std::os::fd::{AsFd, OwnedFd};
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

/// The process's standard input. Must be called inside the runtime.
pub fn stdin() -> Stdin {
    let fd = io::stdin();
    let reactor = match kind(&fd) {
        Kind::Fifo => nonblocking_dup(&fd)
            .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked)
            .map(|r| Box::pin(r) as Stdin),
        Kind::Socket => nonblocking_dup(&fd)
            .and_then(|fd| tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)))
            .map(|s| Box::pin(s) as Stdin),
        Kind::Other => return Box::pin(tokio::io::stdin()),
    };
    reactor.unwrap_or_else(|err| {
        tracing::debug!(error = %err, "stdin stays on the blocking pool.");
        Box::pin(tokio::io::stdin())
    })
}

/// The process's standard output. Must be called inside the runtime.
pub fn stdout() -> Stdout {
    let fd = io::stdout();
    let reactor = match kind(&fd) {
        Kind::Fifo => nonblocking_dup(&fd)
            .and_then(tokio::net::unix::pipe::Sender::from_owned_fd_unchecked)
            .map(|w| Box::pin(w) as Stdout),
        Kind::Socket => nonblocking_dup(&fd)
            .and_then(|fd| tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd)))
            .map(|s| Box::pin(s) as Stdout),
        Kind::Other => return Box::pin(tokio::io::stdout()),
    };
    reactor.unwrap_or_else(|err| {
        tracing::debug!(error = %err, "stdout stays on the blocking pool.");
        Box::pin(tokio::io::stdout())
    })
}
