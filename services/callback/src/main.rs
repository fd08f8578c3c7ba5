//! `coffer-callback`: thin entry over the library.
fn main() -> std::process::ExitCode {
    coffer_callback::main_entry()
}
