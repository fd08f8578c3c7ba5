//! The Telegram adapter (see [`super`]): Bot API long polling. Owned by the `telegram` helper.
use super::{AdapterCtx, AdapterHandle};

/// Starts the adapter of one enabled Telegram channel (`ctx.secrets[bot_token_ref]` is the bot
/// token). Called only by the coordinator.
pub fn spawn(_ctx: AdapterCtx) -> AdapterHandle {
    todo!("the telegram helper writes the adapter")
}
