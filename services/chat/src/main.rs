//! `coffer-chat`: thin entry over the library.
fn main() -> std::process::ExitCode {
    coffer_chat::main_entry()
}
