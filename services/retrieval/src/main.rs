//! `coffer-retrieval`: thin entry over the library.
fn main() -> std::process::ExitCode {
    coffer_retrieval::main_entry()
}
