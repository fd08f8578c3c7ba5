//! The hostile-local-user suite (issue 32): another uid on the same machine (see
//! `coffer_tests::hostile`) tries to take the owner's console session from another port, read a
//! login link from a command line, exhaust the listeners, fill the disk with logs, and read the
//! vault from an upstream and from an agent (`vault_sandbox`), act as the owner with an agent's
//! token (`agent_token`). Every test asserts that the attack found nothing
//! and that the daemon kept serving its owner.

mod agent_token;
mod basics;
mod console_cookie;
mod listeners;
mod login_link;
mod logs;
mod vault_sandbox;
