//! `coffer`: the command-line client. Everything lives in the library; see `coffer_cli`.
fn main() -> std::process::ExitCode {
    coffer_cli::main_entry()
}
