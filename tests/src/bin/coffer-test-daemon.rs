//! `coffer-test-daemon`: the real supervisor over Coffer's service table with one change, chosen
//! by its first argument (or `COFFER_TEST_DAEMON_MODE` when there is none):
//!
//! - `on-demand-retrieval` (the default): `retrieval` is marked on demand, so the daemon starts
//!   without it and the control RPC's `StartService`/`StopService` run it (the end-to-end test of
//!   on-demand services: no on-demand service ships yet; `coffer-callback` will be the first);
//! - `scripted-chat`: the chat row runs `coffer-test-chat` (this crate's binary: the real chat
//!   service with the test-only `scripted` agent added to its registry) instead of `coffer-chat`.
//!   `coffer_tests::chat::start_daemon` starts it this way.
use coffer_supervisor::{SERVICES, ServiceSpec, Start};

fn main() -> std::process::ExitCode {
    let mode = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("COFFER_TEST_DAEMON_MODE").ok())
        .unwrap_or_else(|| "on-demand-retrieval".to_owned());
    let table: Vec<ServiceSpec> = match mode.as_str() {
        "on-demand-retrieval" => SERVICES
            .iter()
            .map(|s| if s.name() == "retrieval" { ServiceSpec { start: Start::OnDemand, ..*s } } else { *s })
            .collect(),
        "scripted-chat" => SERVICES
            .iter()
            .map(|s| if s.name() == "chat" { ServiceSpec { binary: "coffer-test-chat", ..*s } } else { *s })
            .collect(),
        other => {
            eprintln!("coffer-test-daemon: unknown mode {other:?} (on-demand-retrieval | scripted-chat)");
            return std::process::ExitCode::from(2);
        }
    };
    coffer_supervisor::main_entry_with(table)
}
