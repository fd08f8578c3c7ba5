//! `coffer-test-chat`: the real chat service with the test-only `scripted` agents added to its
//! registry (`coffer_tests::chat::scripted`), run by `coffer-test-daemon scripted-chat` in place
//! of `coffer-chat`. That adding an agent is one registry entry is what this binary shows: no
//! other change to the engine, the contracts or the schema. It also installs the tests' pause
//! hook (`coffer_tests::chat::tuning`: the engine holds at an armed step until released).
fn main() -> std::process::ExitCode {
    coffer_chat::main_tuned(coffer_tests::chat::registry(), coffer_tests::chat::tuning())
}
