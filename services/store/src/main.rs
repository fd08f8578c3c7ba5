//! `coffer-store`: parse config, init tracing, open and migrate the DB, serve until SIGTERM.
fn main() -> std::process::ExitCode {
    coffer_store::main_entry()
}
