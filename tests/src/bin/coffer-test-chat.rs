//! `coffer-test-chat`: the real chat service with the test-only `scripted` agents added to its
//! registry (`coffer_tests::chat::scripted`), run by `coffer-test-daemon scripted-chat` in place
//! of `coffer-chat`. That adding an agent is one registry entry is what this binary shows: no
//! other change to the engine, the contracts or the schema.
fn main() -> std::process::ExitCode {
    coffer_chat::main_with(coffer_tests::chat::registry())
}
