//! The SeaTalk adapter (see [`super`]): events forwarded by `coffer-callback`, ack-then-final
//! replies. Owned by the `seatalk` helper.
use std::collections::BTreeMap;

use coffer_proto::control::control_client::ControlClient;
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;

use super::{AdapterCtx, AdapterHandle, ChannelError};

/// Starts the adapter of one enabled SeaTalk channel (`ctx.secrets` holds its app id, app
/// secret and signing secret by reference name); its [`AdapterHandle::inbox`] receives the
/// bodies `coffer-callback` forwarded. Called only by the coordinator.
pub fn spawn(_ctx: AdapterCtx) -> AdapterHandle {
    todo!("the seatalk helper writes the adapter")
}

/// Keeps `coffer-callback` matching the running SeaTalk adapters. The coordinator owns one and
/// calls [`CallbackManager::sync`] after every tick.
#[derive(Default)]
pub struct CallbackManager {}

impl CallbackManager {
    /// Starts `coffer-callback` (the supervisor's `StartService`, with its environment: each
    /// channel's signing secret, the port) when `signing_secrets` (channel name → signing
    /// secret) is not empty, restarts it when the set changed since the last call, stops it
    /// (`StopService`) when it is empty. A call with the same set as the last does nothing.
    pub async fn sync(
        &mut self,
        _control: &mut ControlClient<AuthChannel>,
        _signing_secrets: &BTreeMap<String, SecretString>,
    ) -> Result<(), ChannelError> {
        todo!("the seatalk helper writes the callback's start and stop")
    }
}
