//! Per-process logging: `tracing` to `COFFER_HOME/logs/<service>.log`, rotated daily, seven
//! files kept. Filter from `COFFER_LOG` (default `info`).
//!
//! Lines caused by a request carry its `trace_id` as a span field, so one id can be followed
//! across the gateway, store and other services' files.
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

use crate::home::CofferHome;

/// Installs the global subscriber writing to `logs/<service>.log`. Keep the returned guard
/// alive until exit so buffered lines are flushed.
///
/// # Errors
/// When the log folder cannot be created or opened.
pub fn init_file(home: &CofferHome, service: &str) -> anyhow::Result<WorkerGuard> {
    std::fs::create_dir_all(home.logs())?;
    let appender = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix(service)
        .filename_suffix("log")
        .max_log_files(7)
        .build(home.logs())?;
    let (writer, guard) = tracing_appender::non_blocking(appender);
    let filter = EnvFilter::try_from_env(crate::env::LOG).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(false).with_target(false).init();
    Ok(guard)
}

/// Installs a subscriber writing to stderr (the shim and the CLI; never stdout).
pub fn init_stderr(default_filter: &str) {
    let filter = EnvFilter::try_from_env(crate::env::LOG).unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}
