//! `coffer-test-daemon`: the real supervisor over Coffer's service table with one change, for
//! the end-to-end test of on-demand services: `retrieval` is marked on demand (nothing depends
//! on it and it serves only health), so the daemon starts without it and the control RPC's
//! `StartService`/`StopService` run it. No on-demand service ships yet (`coffer-callback` will
//! be the first); this exercises the same path with a real child process.
use coffer_supervisor::{SERVICES, ServiceSpec, Start};

fn main() -> std::process::ExitCode {
    let table: Vec<ServiceSpec> = SERVICES
        .iter()
        .map(|s| if s.name() == "retrieval" { ServiceSpec { start: Start::OnDemand, ..*s } } else { *s })
        .collect();
    coffer_supervisor::main_entry_with(table)
}
