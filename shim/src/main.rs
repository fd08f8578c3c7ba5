//! `coffer-mcp-shim`: the stdio MCP server that MCP clients launch. A thin wrapper around the
//! `coffer_shim` library: logging to stderr, signals, detect-or-spawn, run until stdin ends.
#![deny(clippy::print_stdout)]

use std::process::ExitCode;

use coffer_shim::{Config, DaemonConnector};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Every forwarded message allocates and frees its buffers: mimalloc does that cheaper than the
/// system allocator (see docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `coffer-mcp-shim --help` prints (and nothing starts).
const USAGE: &str = "\
coffer-mcp-shim: the stdio MCP server an MCP client starts to reach Coffer. It relays MCP
messages between stdin/stdout and the Coffer daemon (started on demand).

Usage: coffer-mcp-shim [--profile NAME]

Options:
  --profile NAME  Use this Coffer profile's tools [default: $COFFER_PROFILE, else the default]
  -h, --help      Print this help and exit
  -V, --version   Print the version and exit

Add it to an MCP client with `coffer connect CLIENT`; Coffer's home is $COFFER_HOME (~/.coffer).
";

fn main() -> ExitCode {
    // --help and --version answer and exit; nothing is started, stdin is not read.
    if let Some(a) = std::env::args().skip(1).find(|a| matches!(a.as_str(), "-h" | "--help" | "-V" | "--version")) {
        let text = if a.starts_with("-h") || a == "--help" {
            USAGE.to_owned()
        } else {
            format!("coffer-mcp-shim {}\n", env!("CARGO_PKG_VERSION"))
        };
        return match std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        };
    }
    // stdout is the protocol: logs go to stderr only (the MCP client usually keeps it).
    coffer_runtime::logging::init_stderr("warn");
    if let Err(e) = coffer_shim::profile::parse_args(std::env::args().skip(1)).and_then(coffer_shim::profile::init) {
        tracing::error!("{e}");
        return ExitCode::from(2);
    }
    // A relay on the request path: ask for short time slices (see `coffer_runtime::sched`).
    let slice = coffer_runtime::sched::request_short_slice();
    tracing::debug!(?slice, "Scheduler time-slice request.");
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(error = %err, "Cannot start the async runtime.");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        let (mut term, mut int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
        tokio::spawn(async move {
            match (term.as_mut(), int.as_mut()) {
                (Ok(term), Ok(int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                    on_signal.cancel();
                }
                _ => tracing::warn!("Cannot watch SIGTERM/SIGINT; the shim ends with stdin only."),
            }
        });
        coffer_shim::run(
            coffer_shim::stdio::stdin(),
            coffer_shim::stdio::stdout(),
            DaemonConnector::from_env(),
            Config::default(),
            shutdown,
        )
        .await
    });
    // A read of stdin may still block in tokio's blocking pool (after a signal); do not wait
    // for it. The daemon is never stopped by the shim's exit.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "coffer-mcp-shim stopped.");
            ExitCode::FAILURE
        }
    }
}
