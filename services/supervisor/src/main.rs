//! `coffer-daemon`: the supervisor. See the library for what it does.
fn main() -> std::process::ExitCode {
    coffer_supervisor::main_entry()
}
