//! The turn seam every channel adapter shares (see [`super`]): the owner gate, the commands,
//! and the bound conversation's turns handed to the adapter's [`super::Replier`].
//!
//! Owned by the `telegram` helper; the public API below is the contract the SeaTalk adapter
//! codes against.
use std::sync::Arc;

use coffer_proto::store::ChannelRecord;

use super::{Inbound, Replier};
use crate::engine::Engine;

/// One channel's bridge: created by the coordinator when it starts the channel's adapter,
/// dropped (every follower task with it) when it stops it.
pub struct Bridge {
    #[allow(dead_code)]
    engine: Arc<Engine>,
    #[allow(dead_code)]
    replier: Arc<dyn Replier>,
}

impl Bridge {
    /// A bridge for one channel whose output goes to `replier`.
    pub fn new(engine: Arc<Engine>, replier: Arc<dyn Replier>) -> Arc<Self> {
        Arc::new(Self { engine, replier })
    }

    /// Handles one inbound message of `channel` (the resource as the adapter last read it):
    /// the owner gate, a command, or a message for the bound conversation. Returns once the
    /// message is accepted (a turn started or queued, a command answered); the turn's output
    /// goes to the replier on its own. Errors are answered to the chat as a notice and logged;
    /// the returned error is for the adapter's status only.
    pub async fn handle(&self, _channel: &ChannelRecord, _msg: Inbound) -> Result<(), super::ChannelError> {
        todo!("the telegram helper writes the bridge")
    }
}
